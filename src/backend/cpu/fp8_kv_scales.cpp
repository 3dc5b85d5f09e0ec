// fp8_kv_scales on the CPU: each KV head's largest magnitude over the batch's rows, made a scale as
// calculate_kv_scales does (fp8_kv.h).
#include <cmath>

#include "backend/cpu/cpu_ops.h"
#include "backend/quant/fp8_kv.h"

namespace se::cpu {

namespace {
// max |x[r, h, :]| over the rows of x [T, Hkv, D].
float head_abs_max(TensorView x, int64_t h) {
  const int64_t rows = x.shape[0], heads = x.shape[1], dim = x.shape[2];
  float m = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.ptr<float>() + (r * heads + h) * dim;
    for (int64_t d = 0; d < dim; ++d) m = std::fmax(m, std::fabs(row[d]));
  }
  return m;
}
}  // namespace

void fp8_kv_scales(TensorView k_scales, TensorView v_scales, TensorView k, TensorView v) {
  for (int64_t h = 0; h < k.shape[1]; ++h) {
    k_scales.ptr<float>()[h] = fp8_scale_from_max(head_abs_max(k, h), kFp8KeyScaleDivisor);
    v_scales.ptr<float>()[h] = fp8_scale_from_max(head_abs_max(v, h), kFp8ValueScaleDivisor);
  }
}

}  // namespace se::cpu
