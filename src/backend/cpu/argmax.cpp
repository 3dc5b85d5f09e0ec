#include <cmath>

#include "backend/cpu/cpu_ops.h"

namespace se::cpu {

void argmax_rows(TensorView ids, TensorView logprobs, TensorView x) {
  const int64_t rows = ids.numel();
  const int64_t width = x.shape[x.shape.rank() - 1];
#pragma omp parallel for if (rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.ptr<float>() + r * width;
    int64_t best = 0;
    for (int64_t i = 1; i < width; ++i)
      if (row[i] > row[best]) best = i;
    double sum = 0.0;
    for (int64_t i = 0; i < width; ++i) sum += std::exp(static_cast<double>(row[i]) - row[best]);
    ids.ptr<int32_t>()[r] = static_cast<int32_t>(best);
    logprobs.ptr<float>()[r] = static_cast<float>(-std::log(sum));
  }
}

}  // namespace se::cpu
