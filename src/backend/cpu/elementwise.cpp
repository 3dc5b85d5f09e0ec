#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_ops.h"

namespace se::cpu {

namespace {
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
// GELU with the tanh approximation (`gelu_pytorch_tanh`).
inline float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}
}  // namespace

void gated_activation(TensorView out, TensorView gate_up, Activation act) {
  const int64_t width = out.shape[out.shape.rank() - 1];
  const int64_t rows = out.numel() / width;
#pragma omp parallel for if (rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = gate_up.ptr<float>() + r * 2 * width;
    const float* up = gate + width;
    float* y = out.ptr<float>() + r * width;
    if (act == Activation::kSilu) {
      for (int64_t i = 0; i < width; ++i) y[i] = silu(gate[i]) * up[i];
    } else {
      for (int64_t i = 0; i < width; ++i) y[i] = gelu_tanh(gate[i]) * up[i];
    }
  }
}

void add_inplace(TensorView x, TensorView y) {
  const int64_t n = x.numel();
  float* a = x.ptr<float>();
  const float* b = y.ptr<float>();
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
}

void scale_inplace(TensorView x, float s) {
  const int64_t n = x.numel();
  float* a = x.ptr<float>();
  for (int64_t i = 0; i < n; ++i) a[i] *= s;
}

void softcap_inplace(TensorView x, float cap) {
  const int64_t n = x.numel();
  float* a = x.ptr<float>();
  for (int64_t i = 0; i < n; ++i) a[i] = cap * std::tanh(a[i] / cap);
}

void convert(TensorView dst, TensorView src) {
  const auto n = static_cast<size_t>(src.numel());
  if (src.dtype == dst.dtype) {
    std::memmove(dst.data, src.data, n * dtype_size(src.dtype));
  } else if (src.dtype == DType::kF32) {
    convert_from_f32(src.ptr<float>(), dst.data, dst.dtype, n);
  } else {
    convert_to_f32(src.data, src.dtype, dst.ptr<float>(), n);
  }
}

}  // namespace se::cpu
