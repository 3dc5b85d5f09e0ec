// Constrained decoding on the CPU: the reference the CUDA twins (cuda/constrained_sampling.cu) are tested against.
#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/cpu_ops.h"

namespace se::cpu {

void mask_refused_tokens(TensorView out, TensorView x, TensorView allowed) {
  const int64_t rows = x.shape[0], width = x.shape[1], words = allowed.shape[1];
  constexpr float kRefused = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x.ptr<float>() + r * width;
    float* o = out.ptr<float>() + r * width;
    const auto* bits = reinterpret_cast<const uint64_t*>(allowed.ptr<int64_t>() + r * words);
    for (int64_t i = 0; i < width; ++i) o[i] = (bits[i / 64] >> (i % 64)) & 1 ? in[i] : kRefused;
  }
}

void token_logprobs(TensorView logprobs, TensorView x, TensorView ids) {
  const int64_t rows = x.shape[0], width = x.shape[1];
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.ptr<float>() + r * width;
    float max = row[0];
    for (int64_t i = 1; i < width; ++i) max = std::max(max, row[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < width; ++i) sum += std::exp(static_cast<double>(row[i]) - max);
    logprobs.ptr<float>()[r] =
        static_cast<float>(static_cast<double>(row[ids.ptr<int32_t>()[r]]) - max - std::log(sum));
  }
}

}  // namespace se::cpu
