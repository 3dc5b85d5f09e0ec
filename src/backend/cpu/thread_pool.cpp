#include "backend/cpu/thread_pool.h"

#include <omp.h>

namespace se::cpu {

void release_calling_thread_workers() {
  // A hard pause frees the calling thread's pool (libgomp; outside a parallel region, which is the only use here).
  omp_pause_resource_all(omp_pause_hard);
}

}  // namespace se::cpu
