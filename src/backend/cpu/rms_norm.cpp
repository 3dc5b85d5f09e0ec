#include <cmath>

#include "backend/cpu/cpu_ops.h"

namespace se::cpu {

namespace {
void normalize_row(float* out, const float* x, const float* w, int64_t dim, float eps) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < dim; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(sum_sq / static_cast<double>(dim)) + eps);
  for (int64_t i = 0; i < dim; ++i) out[i] = x[i] * inv * w[i];
}
}  // namespace

void rms_norm(TensorView out, TensorView x, TensorView weight, float eps) {
  const int64_t dim = x.shape[x.shape.rank() - 1];
  const int64_t rows = x.numel() / dim;
#pragma omp parallel for if (rows > 4)
  for (int64_t r = 0; r < rows; ++r) {
    normalize_row(out.ptr<float>() + r * dim, x.ptr<float>() + r * dim, weight.ptr<float>(), dim, eps);
  }
}

void add_rms_norm(TensorView out, TensorView residual, TensorView x, TensorView weight, float eps) {
  const int64_t dim = x.shape[x.shape.rank() - 1];
  const int64_t rows = x.numel() / dim;
#pragma omp parallel for if (rows > 4)
  for (int64_t r = 0; r < rows; ++r) {
    float* res = residual.ptr<float>() + r * dim;
    const float* add = x.ptr<float>() + r * dim;
    for (int64_t i = 0; i < dim; ++i) res[i] += add[i];
    normalize_row(out.ptr<float>() + r * dim, res, weight.ptr<float>(), dim, eps);
  }
}

}  // namespace se::cpu
