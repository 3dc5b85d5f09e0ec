// Parity of the CUDA sample_rows with the CPU reference: the same logits and the same uniform draw must pick the
// same token under every filter combination (temperature, top-k, top-p, min-p, greedy rows as top-1), at widths
// up to Llama 3's vocabulary, F32 and BF16 logits, with planted ties and NaN-poisoned outputs. Fp64 walks on both
// sides leave only draws within rounding of a boundary to differ: at most 1% of rows may.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/ops.h"
#include "cuda_test_util.h"

namespace se {
namespace {

using test::poisoned;
using test::random_host;
using test::upload;

std::vector<RowSampling> random_settings(int rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const float temperatures[] = {0.3f, 0.7f, 1.0f, 1.6f};
  const int32_t top_ks[] = {0, 0, 1, 20, 1000};
  const float top_ps[] = {1.0f, 1.0f, 0.95f, 0.5f};
  const float min_ps[] = {0.0f, 0.0f, 0.05f};
  std::vector<RowSampling> settings;
  for (int r = 0; r < rows; ++r)
    settings.push_back({temperatures[rng() % 4], top_ks[rng() % 5], top_ps[rng() % 4], min_ps[rng() % 3],
                        uniform(rng)});
  return settings;
}

TEST(CudaSampleRowsTest, SameDrawPicksTheSameTokenAsTheCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 4100;
  int total_rows = 0;
  int total_mismatches = 0;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (auto [rows, width] : {std::pair{1, 96}, {9, 1000}, {64, 49152}, {40, 128256}}) {
      Tensor x = random_host({rows, width}, seed++, dtype, 4.0f);
      // A planted tie in row 0 at the top: a top-1 row must take the lower id on both backends.
      float* row0 = x.data<float>();
      row0[width - 1] = row0[width / 2] = 100.0f;
      std::vector<RowSampling> settings = random_settings(rows, seed++);
      settings[0].top_k = 1;
      Tensor ids_ref = Tensor::empty(DType::kI32, {rows});
      Tensor logprobs_ref = Tensor::empty(DType::kF32, {rows});
      sample_rows(ids_ref.view(), logprobs_ref.view(), x.view(), settings);
      Tensor ids = poisoned(DType::kI32, {rows});
      Tensor logprobs = poisoned(DType::kF32, {rows});
      sample_rows(ids.view(), logprobs.view(), upload(x, dtype).view(), settings);
      const Tensor ids_got = cuda::to_host(ids);
      const Tensor logprobs_got = cuda::to_host(logprobs);
      int mismatches = 0;
      double max_err = 0.0;
      for (int r = 0; r < rows; ++r) {
        const int32_t want = ids_ref.data<int32_t>()[r];
        const int32_t got = ids_got.data<int32_t>()[r];
        ASSERT_TRUE(got >= 0 && got < width) << "row " << r << " picked " << got;
        if (got != want) {
          ++mismatches;
          continue;
        }
        const double ref = logprobs_ref.data<float>()[r];
        const double val = logprobs_got.data<float>()[r];
        max_err = std::isfinite(val) ? std::max(max_err, std::abs(val - ref) / std::max(1.0, std::abs(ref)))
                                     : INFINITY;
      }
      EXPECT_EQ(ids_got.data<int32_t>()[0], width / 2);
      std::printf("PARITY sample_rows       %-4s [%d, %d] %d/%d tokens differ, logprob rel_err %.3e\n",
                  dtype_name(dtype).data(), rows, width, mismatches, rows, max_err);
      EXPECT_LT(max_err, 1e-5);
      total_rows += rows;
      total_mismatches += mismatches;
    }
  }
  EXPECT_LE(total_mismatches * 100, total_rows) << total_mismatches << " of " << total_rows << " rows differ";
}

}  // namespace
}  // namespace se
