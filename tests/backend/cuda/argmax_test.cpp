// Parity of the CUDA argmax_rows (greedy sampling on the device) with the CPU reference: fresh random logits of
// vocabulary widths up to Gemma's, F32 and BF16 rows, planted ties, NaN-poisoned outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "backend/ops.h"
#include "cuda_test_util.h"

namespace se {
namespace {

using test::poisoned;
using test::random_host;
using test::upload;

TEST(CudaArgmaxTest, MatchesCpuIdsAndLogprobs) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 900;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (auto [rows, width] : {std::pair{1, 96}, {3, 1000}, {8, 49152}, {17, 262144}}) {
      Tensor x = random_host({rows, width}, seed++, dtype, 4.0f);
      // A planted tie in row 0: the maximum twice, the lower index must win on both backends.
      float* row0 = x.data<float>();
      row0[width - 1] = row0[width / 2] = 100.0f;
      Tensor ids_ref = Tensor::empty(DType::kI32, {rows});
      Tensor logprobs_ref = Tensor::empty(DType::kF32, {rows});
      argmax_rows(ids_ref.view(), logprobs_ref.view(), x.view());
      Tensor ids = poisoned(DType::kI32, {rows});
      Tensor logprobs = poisoned(DType::kF32, {rows});
      argmax_rows(ids.view(), logprobs.view(), upload(x, dtype).view());
      const Tensor ids_got = cuda::to_host(ids);
      const Tensor logprobs_got = cuda::to_host(logprobs);
      double max_err = 0.0;
      for (int r = 0; r < rows; ++r) {
        EXPECT_EQ(ids_got.data<int32_t>()[r], ids_ref.data<int32_t>()[r]) << "row " << r << " width " << width;
        const double ref = logprobs_ref.data<float>()[r];
        const double got = logprobs_got.data<float>()[r];
        max_err = std::isfinite(got) ? std::max(max_err, std::abs(got - ref) / std::max(1.0, std::abs(ref)))
                                     : INFINITY;
      }
      EXPECT_EQ(ids_got.data<int32_t>()[0], width / 2);
      std::printf("PARITY argmax_rows       %-4s [%d, %d] logprob rel_err %.3e\n", dtype_name(dtype).data(), rows,
                  width, max_err);
      EXPECT_LT(max_err, 1e-5);
    }
  }
}

}  // namespace
}  // namespace se
