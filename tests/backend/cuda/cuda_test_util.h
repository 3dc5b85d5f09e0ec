// Helpers for the CUDA parity tests: fast seeded random host data (optionally rounded to bf16 so
// the CPU reference sees exactly the GPU's inputs), uploads, NaN-poisoned device outputs, and the
// relative error
// ||gpu - cpu|| / ||cpu|| (infinite when the GPU output holds a NaN or Inf, e.g. an element never
// written).
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "backend/cuda/cuda_allocator.h"
#include "backend/device_memory.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "tensor/tensor.h"

namespace se::test {

// splitmix64: fast enough for the hundreds of millions of values the long-context cases need.
class FastRng {
 public:
  explicit FastRng(uint64_t seed) : state_(seed * 0x9e3779b97f4a7c15ull + 1) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [-scale * sqrt(3), scale * sqrt(3)): variance scale^2.
  float uniform(float scale = 1.0f) {
    const float u = static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    return (2.0f * u - 1.0f) * 1.7320508f * scale;
  }

 private:
  uint64_t state_;
};

// The value `dtype` stores for v.
inline float representable(float v, DType dtype) {
  if (dtype == DType::kBF16) return bf16_to_f32(f32_to_bf16(v));
  if (dtype == DType::kF16) return f16_to_f32(f32_to_f16(v));
  return v;
}

// A host F32 tensor of random values that `dtype` represents exactly.
inline Tensor random_host(Shape shape, uint64_t seed, DType dtype, float scale = 1.0f) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  FastRng rng(seed);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = representable(rng.uniform(scale), dtype);
  return t;
}

// A device tensor of `dtype` holding the host F32 values (converted).
inline Tensor upload(const Tensor& host_f32, DType dtype) {
  Tensor converted = Tensor::empty(dtype, host_f32.shape());
  convert_from_f32(host_f32.data<float>(), converted.raw(), dtype,
                   static_cast<size_t>(host_f32.numel()));
  return cuda::to_device(converted);
}

// The device tensor's values as a host F32 tensor (waits for the stream).
inline Tensor download_f32(const Tensor& device) { return cuda::to_host(device).to_f32(); }

// An uninitialized device tensor filled with NaN (all-ones bytes are NaN in f32, f16 and bf16).
inline Tensor poisoned(DType dtype, Shape shape) {
  Tensor t = Tensor::empty(dtype, shape, cuda::cuda_allocator());
  SE_CUDA_CHECK(cudaMemsetAsync(t.raw(), 0xff, t.nbytes(), cuda::CudaContext::current().stream()));
  return t;
}

inline double relative_error(const Tensor& got, const Tensor& ref) {
  SE_CHECK(got.numel() == ref.numel(), "relative_error: {} vs {}", got.describe(), ref.describe());
  double num = 0, den = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double a = got.data<float>()[i];
    const double b = ref.data<float>()[i];
    if (!std::isfinite(a)) return std::numeric_limits<double>::infinity();
    num += (a - b) * (a - b);
    den += b * b;
  }
  return std::sqrt(num / (den + 1e-30));
}

// True when a CUDA device the kernels run on is visible: the `cuda` tests skip on machines without one (CI builds
// them only).
inline bool has_cuda_device() { return cuda_device_status().is_ok(); }
#define SE_SKIP_WITHOUT_CUDA_DEVICE() \
  if (!::se::test::has_cuda_device()) GTEST_SKIP() << ::se::cuda_device_status().message()

// Tolerances (METHOD.md): fp32 arithmetic ~1e-5; a bf16 store or bf16 operands ~1e-2.
inline double tolerance(DType dtype) { return dtype == DType::kBF16 ? 1e-2 : 1e-5; }

}  // namespace se::test
