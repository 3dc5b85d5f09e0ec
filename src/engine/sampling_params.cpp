#include "engine/sampling_params.h"

#include <cmath>

namespace se {

Status SamplingParams::validate() const {
  if (max_tokens < 1) return invalid_argument("max_tokens must be at least 1, got {}", max_tokens);
  if (!std::isfinite(temperature) || temperature < 0.0f || temperature > 100.0f)
    return invalid_argument("temperature must be in [0, 100], got {}", temperature);
  if (!std::isfinite(top_p) || top_p <= 0.0f || top_p > 1.0f)
    return invalid_argument("top_p must be in (0, 1], got {}", top_p);
  if (top_k < -1) return invalid_argument("top_k must be -1, 0 (off) or positive, got {}", top_k);
  if (!std::isfinite(min_p) || min_p < 0.0f || min_p > 1.0f)
    return invalid_argument("min_p must be in [0, 1], got {}", min_p);
  if (logprobs > kMaxLogprobs) return invalid_argument("logprobs must be at most {}, got {}", kMaxLogprobs, logprobs);
  if (static_cast<int>(stop.size()) > kMaxStopStrings)
    return invalid_argument("at most {} stop strings are allowed, got {}", kMaxStopStrings, stop.size());
  for (const std::string& s : stop)
    if (s.empty()) return invalid_argument("stop strings must not be empty");
  for (int32_t id : stop_token_ids)
    if (id < 0) return invalid_argument("stop_token_ids must be non-negative, got {}", id);
  return Status::ok();
}

}  // namespace se
