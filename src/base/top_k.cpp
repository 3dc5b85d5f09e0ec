#include "base/top_k.h"

#include <algorithm>
#include <functional>
#include <numeric>

namespace se {

void top_k_ascending(const float* scores, int32_t n, int32_t k, std::vector<int32_t>& out) {
  k = std::clamp(k, 0, n);
  out.clear();
  if (k == n) {
    out.resize(static_cast<size_t>(n));
    std::iota(out.begin(), out.end(), 0);
    return;
  }
  if (k == 0) return;
  // The k-th largest value is the threshold: everything above it is kept, and of the values equal to it, the
  // lowest indices fill the rest. One selection and two scans instead of a sort.
  thread_local std::vector<float> values;
  values.assign(scores, scores + n);
  std::nth_element(values.begin(), values.begin() + (k - 1), values.end(), std::greater<float>());
  const float threshold = values[static_cast<size_t>(k - 1)];
  int32_t num_above = 0;
  for (int32_t i = 0; i < n; ++i) num_above += scores[i] > threshold ? 1 : 0;
  int32_t ties_left = k - num_above;
  out.reserve(static_cast<size_t>(k));
  for (int32_t i = 0; i < n; ++i) {
    if (scores[i] > threshold) {
      out.push_back(i);
    } else if (scores[i] == threshold && ties_left > 0) {
      out.push_back(i);
      --ties_left;
    }
  }
}

std::vector<int32_t> top_k_ascending(const float* scores, int32_t n, int32_t k) {
  std::vector<int32_t> out;
  top_k_ascending(scores, n, k, out);
  return out;
}

}  // namespace se
