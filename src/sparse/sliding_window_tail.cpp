#include "sparse/sliding_window_tail.h"

#include <algorithm>
#include <numeric>

#include "base/check.h"

namespace se {

void keep_sliding_window_tail(int32_t num_tokens, int32_t sliding_window, int32_t count, std::vector<int32_t>& kept) {
  SE_CHECK(sliding_window > 0, "keep_sliding_window_tail: window {}", sliding_window);
  const int32_t n = std::max(0, std::min({count, sliding_window - 1, num_tokens}));
  kept.resize(static_cast<size_t>(n));
  std::iota(kept.begin(), kept.end(), num_tokens - n);
}

}  // namespace se
