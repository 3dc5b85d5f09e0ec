#include <cblas.h>

#include "backend/cpu/cpu_ops.h"

namespace se::cpu {

void linear(TensorView out, TensorView x, TensorView w, const TensorView* bias) {
  const int64_t k = w.shape[1];
  const int64_t n = w.shape[0];
  const int64_t m = x.numel() / k;
  float* y = out.ptr<float>();
  if (m == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n), static_cast<int>(k), 1.0f, w.ptr<float>(),
                static_cast<int>(k), x.ptr<float>(), 1, 0.0f, y, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, x.ptr<float>(), static_cast<int>(k), w.ptr<float>(),
                static_cast<int>(k), 0.0f, y, static_cast<int>(n));
  }
  if (bias != nullptr) {
    const float* b = bias->ptr<float>();
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) y[r * n + c] += b[c];
  }
}

}  // namespace se::cpu
