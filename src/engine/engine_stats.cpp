#include "engine/engine_stats.h"

#include <algorithm>

namespace se {

void LatencyHistogram::observe(double seconds) {
  const size_t bucket =
      static_cast<size_t>(std::lower_bound(bounds.begin(), bounds.end(), seconds) - bounds.begin());
  ++counts[bucket];
  sum += seconds;
  ++count;
}

}  // namespace se
