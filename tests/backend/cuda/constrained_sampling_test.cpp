// Parity of the CUDA constrained-decoding ops with their CPU twins: the masked rows bit-exact (F32 and BF16, widths
// that are and are not multiples of 64, up to Gemma's vocabulary) and each sampled id's logprob within fp32
// rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "backend/ops.h"
#include "cuda_test_util.h"

namespace se {
namespace {

using test::poisoned;
using test::random_host;
using test::upload;

TEST(CudaConstrainedSamplingTest, MaskAndTokenLogprobsMatchCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 7100;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (auto [rows, width] : {std::pair{1, 64}, {3, 1000}, {8, 49152}, {5, 262145}}) {
      const Tensor x = random_host({rows, width}, seed++, dtype, 4.0f);
      const int64_t words = (width + 63) / 64;
      Tensor allowed = Tensor::empty(DType::kI64, {rows, words});
      std::mt19937_64 rng(seed++);
      auto* bits = reinterpret_cast<uint64_t*>(allowed.data<int64_t>());
      // Rows with few allowed tokens (a grammar inside a string allows many, between tokens few), one all-allowed.
      for (int64_t i = 0; i < rows * words; ++i) bits[i] = i < words ? ~uint64_t{0} : rng() & rng() & rng();
      Tensor masked_ref = Tensor::empty(DType::kF32, {rows, width});
      mask_refused_tokens(masked_ref.view(), x.view(), allowed.view());
      Tensor masked = poisoned(dtype, {rows, width});
      const Tensor x_device = upload(x, dtype);
      mask_refused_tokens(masked.view(), x_device.view(), cuda::to_device(allowed).view());
      const Tensor masked_got = test::download_f32(masked);
      int64_t mismatches = 0;
      for (int64_t i = 0; i < masked_ref.numel(); ++i) {
        const float a = masked_got.data<float>()[i], b = masked_ref.data<float>()[i];
        mismatches += (a == b || (std::isinf(a) && std::isinf(b) && a < 0 && b < 0)) ? 0 : 1;
      }
      EXPECT_EQ(mismatches, 0) << dtype_name(dtype) << " [" << rows << ", " << width << "]";

      // The masked rows' greedy ids, and their logprobs under the unmasked rows.
      Tensor ids_ref = Tensor::empty(DType::kI32, {rows});
      Tensor unused = Tensor::empty(DType::kF32, {rows});
      argmax_rows(ids_ref.view(), unused.view(), masked_ref.view());
      Tensor logprobs_ref = Tensor::empty(DType::kF32, {rows});
      token_logprobs(logprobs_ref.view(), x.view(), ids_ref.view());
      Tensor logprobs = poisoned(DType::kF32, {rows});
      token_logprobs(logprobs.view(), x_device.view(), cuda::to_device(ids_ref).view());
      const Tensor logprobs_got = cuda::to_host(logprobs);
      double max_err = 0.0;
      for (int r = 0; r < rows; ++r) {
        const double ref = logprobs_ref.data<float>()[r], got = logprobs_got.data<float>()[r];
        max_err = std::isfinite(got) ? std::max(max_err, std::abs(got - ref) / std::max(1.0, std::abs(ref))) : INFINITY;
      }
      std::printf("PARITY token_logprobs    %-4s [%d, %d] rel_err %.3e\n", std::string(dtype_name(dtype)).c_str(), rows,
                  width, max_err);
      EXPECT_LT(max_err, 1e-5);
    }
  }
}

}  // namespace
}  // namespace se
