// Parity of the cuBLASLt linear with the CPU (OpenBLAS) reference: bf16 weights and activations
// with bf16 or f32 output, and the all-f32 path; with and without bias; repeated shapes reuse the
// cached plan.
#include <gtest/gtest.h>

#include <cstdio>
#include <tuple>

#include "backend/ops.h"
#include "cuda_test_util.h"

namespace se {
namespace {

using test::download_f32;
using test::poisoned;
using test::random_host;
using test::relative_error;
using test::upload;

struct LinearCase {
  int64_t m, n, k;
  bool bias;
};

TEST(CudaLinearTest, MatchesCpuAcrossShapesAndDtypes) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  // Decode rows, a prefill chunk, odd sizes; (M, N, K) from SmolLM2-135M, Llama-3.1-8B and a
  // vocabulary head.
  const LinearCase cases[] = {{1, 576, 576, false},     {1, 1536, 576, true},
                              {7, 4096, 4096, false},   {37, 1000, 264, true},
                              {64, 14336, 4096, false}, {256, 576, 1536, true},
                              {3, 49152, 576, false},   {1, 4096, 4096, false}};
  const std::pair<DType, DType> dtypes[] = {
      {DType::kBF16, DType::kBF16}, {DType::kBF16, DType::kF32}, {DType::kF32, DType::kF32}};
  uint64_t seed = 1;
  for (const auto& [in, out_dtype] : dtypes) {
    for (const LinearCase& c : cases) {
      const Tensor x = random_host({c.m, c.k}, seed++, in);
      const Tensor w = random_host({c.n, c.k}, seed++, in, 0.05f);
      const Tensor b = random_host({c.n}, seed++, out_dtype);
      const TensorView b_host = b.view();
      Tensor ref = Tensor::empty(DType::kF32, {c.m, c.n});
      linear(ref.view(), x.view(), w.view(), c.bias ? &b_host : nullptr);

      const Tensor x_dev = upload(x, in);
      const Tensor w_dev = upload(w, in);
      const Tensor b_dev = upload(b, out_dtype);
      const TensorView b_view = b_dev.view();
      for (int run = 0; run < 2; ++run) {  // the second run goes through the cached plan
        Tensor out = poisoned(out_dtype, {c.m, c.n});
        linear(out.view(), x_dev.view(), w_dev.view(), c.bias ? &b_view : nullptr);
        const double err = relative_error(download_f32(out), ref);
        std::printf(
            "PARITY linear %-4s->%-4s M=%-4lld N=%-6lld K=%-5lld bias=%d run=%d rel_err %.3e\n",
            dtype_name(in).data(), dtype_name(out_dtype).data(), static_cast<long long>(c.m),
            static_cast<long long>(c.n), static_cast<long long>(c.k), c.bias, run, err);
        // bf16 output: one rounding of every element; f32 out of bf16 inputs: fp32 accumulation
        // only.
        const double tol = out_dtype == DType::kBF16 ? 1e-2 : 1e-5;
        EXPECT_LT(err, tol) << "M=" << c.m << " N=" << c.n << " K=" << c.k;
      }
    }
  }
}

// linear_add on the GPU: cuBLASLt's beta = 1 into an f32 residual, against the CPU's linear_add.
TEST(CudaLinearTest, LinearAddMatchesCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 900;
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 4096, 4096}, {8, 4096, 14336}, {37, 576, 1536}}) {
    const Tensor x = random_host({m, k}, seed++, DType::kBF16);
    const Tensor w = random_host({n, k}, seed++, DType::kBF16, 0.05f);
    const Tensor residual = random_host({m, n}, seed++, DType::kF32, 4.0f);
    Tensor ref = residual.clone();
    linear_add(ref.view(), x.view(), w.view());
    Tensor out = upload(residual, DType::kF32);
    linear_add(out.view(), upload(x, DType::kBF16).view(), upload(w, DType::kBF16).view());
    const double err = relative_error(download_f32(out), ref);
    std::printf("PARITY linear_add bf16->f32 M=%-4lld N=%-6lld K=%-5lld rel_err %.3e\n", static_cast<long long>(m),
                static_cast<long long>(n), static_cast<long long>(k), err);
    EXPECT_LT(err, 1e-5) << "M=" << m << " N=" << n << " K=" << k;
  }
}

}  // namespace
}  // namespace se
