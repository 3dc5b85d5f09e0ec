#include "backend/cuda/host_tables.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"

namespace se::cuda {

namespace {
size_t align16(size_t n) { return (n + 15) / 16 * 16; }
}  // namespace

StagedTables stage_host_tables(const void* host, size_t table_bytes, size_t result_bytes) {
  CudaContext& context = CudaContext::current();
  char* scratch = static_cast<char*>(context.scratch(align16(table_bytes) + result_bytes));
  // Through the pinned ring, so the copy neither waits for the stream (as a pageable source may) nor
  // keeps `host`: the caller may refill its buffer at once, while the device copy stays ordered on
  // the stream after earlier scratch readers.
  if (table_bytes > 0) {
    void* pinned = context.host_staging(table_bytes);
    std::memcpy(pinned, host, table_bytes);
    SE_CUDA_CHECK(
        cudaMemcpyAsync(scratch, pinned, table_bytes, cudaMemcpyHostToDevice, context.stream()));
  }
  return StagedTables{scratch, scratch + align16(table_bytes)};
}

void fetch_results(void* host, const void* device, size_t nbytes) {
  CudaContext& context = CudaContext::current();
  if (nbytes > 0)
    SE_CUDA_CHECK(cudaMemcpyAsync(host, device, nbytes, cudaMemcpyDeviceToHost, context.stream()));
  context.synchronize();
}

}  // namespace se::cuda
