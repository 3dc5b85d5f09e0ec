// Parity of the mixture-of-experts kernels (backend/moe_ops.h) with their CPU twins, on ragged expert loads: one
// expert takes most rows (several row tiles of the grouped GEMM, several passes of the decode GEMV), some take one,
// some none; decode (one row) included. The cases reach each grouped GEMM: the decode GEMV (t <= 64), the
// tensor-core GEMM (larger t) and the scalar one (K not a multiple of 8), K tails past a 32-wide step included, and
// block-scaled FP8 experts in the first two. The routing and the grouping must match exactly; the grouped GEMMs
// (bf16 operands the CPU sees exactly, fp32 accumulation) and the weighted sum within fp32 tolerance.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <set>
#include <vector>

#include "backend/moe_ops.h"
#include "backend/ops.h"
#include "../fp8_experts.h"
#include "cuda_test_util.h"

namespace se {
namespace {

using test::download_f32;
using test::FastRng;
using test::poisoned;
using test::random_host;
using test::relative_error;
using test::upload;

struct MoeCase {
  int64_t t, experts, k, hidden, inter;
  bool normalize;
};

// Router logits with a ragged load: expert 0 leads most rows by a wide margin, the upper quarter of the experts is
// never in reach, and the rest are spaced so that no two of a row's probabilities tie.
Tensor ragged_logits(const MoeCase& c, uint64_t seed) {
  Tensor logits = Tensor::empty(DType::kF32, {c.t, c.experts});
  FastRng rng(seed);
  const int64_t reachable = c.experts - c.experts / 4;
  for (int64_t r = 0; r < c.t; ++r) {
    // A random order of the reachable experts, 0.25 apart in logit.
    std::vector<int64_t> order(static_cast<size_t>(reachable));
    for (int64_t e = 0; e < reachable; ++e) order[static_cast<size_t>(e)] = e;
    for (int64_t i = reachable - 1; i > 0; --i)
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(rng.next() % static_cast<uint64_t>(i + 1))]);
    float* row = logits.data<float>() + r * c.experts;
    for (int64_t i = 0; i < reachable; ++i) row[order[static_cast<size_t>(i)]] = -0.25f * static_cast<float>(i);
    if (r % 5 != 4) row[0] = 4.0f;  // expert 0 first in four rows of five
    for (int64_t e = reachable; e < c.experts; ++e) row[e] = -30.0f;
  }
  return logits;
}

Tensor host_i32(Shape shape) { return Tensor::empty(DType::kI32, shape); }
Tensor download(const Tensor& device) { return cuda::to_host(device); }

void expect_equal_i32(const Tensor& got, const Tensor& want, const char* what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  EXPECT_EQ(0, std::memcmp(got.raw(), want.raw(), got.nbytes())) << what << " differs";
}

TEST(CudaMoeTest, RaggedExpertLoadsMatchCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  const MoeCase cases[] = {{37, 16, 4, 96, 40, true},    {1, 128, 8, 256, 96, true},
                           {64, 128, 8, 256, 96, false}, {5, 8, 8, 32, 16, true},  // every expert chosen by every row
                           {24, 16, 4, 96, 64, true},    {300, 16, 4, 128, 72, false},
                           {100, 16, 4, 128, 64, true},  {9, 16, 4, 36, 20, true}};
  uint64_t seed = 1;
  for (const MoeCase& c : cases) {
    const int64_t pairs = c.t * c.k;
    const Tensor logits = ragged_logits(c, seed++);
    const Tensor x = random_host({c.t, c.hidden}, seed++, DType::kBF16);
    const Tensor w_gate_up = random_host({c.experts, 2 * c.inter, c.hidden}, seed++, DType::kBF16, 0.05f);
    const Tensor w_down = random_host({c.experts, c.hidden, c.inter}, seed++, DType::kBF16, 0.05f);
    const Tensor h0 = random_host({c.t, c.hidden}, seed++, DType::kF32);

    // The CPU reference, step by step.
    Tensor ids = host_i32({c.t, c.k}), gates = Tensor::empty(DType::kF32, {c.t, c.k});
    route_experts(ids.view(), gates.view(), logits.view(), c.normalize);
    Tensor offsets = host_i32({c.experts + 1}), rows = host_i32({pairs}), slots = host_i32({pairs});
    group_by_expert(offsets.view(), rows.view(), slots.view(), ids.view());
    Tensor xe = Tensor::empty(DType::kF32, {pairs, c.hidden});
    embedding(xe.view(), x.view(), rows.view());
    Tensor gate_up = Tensor::empty(DType::kF32, {pairs, 2 * c.inter});
    grouped_linear(gate_up.view(), xe.view(), w_gate_up.view(), offsets.view(), c.t);
    Tensor act = Tensor::empty(DType::kF32, {pairs, c.inter});
    gated_activation(act.view(), gate_up.view(), Activation::kSilu);
    Tensor y = Tensor::empty(DType::kF32, {pairs, c.hidden});
    grouped_linear(y.view(), act.view(), w_down.view(), offsets.view(), c.t);
    Tensor h = h0.clone();
    moe_combine(h.view(), y.view(), gates.view(), slots.view());

    // The load is ragged as intended.
    std::set<int64_t> unused;
    int64_t most = 0;
    for (int64_t e = 0; e < c.experts; ++e) {
      const int64_t n = offsets.data<int32_t>()[e + 1] - offsets.data<int32_t>()[e];
      if (n == 0) unused.insert(e);
      most = std::max(most, n);
    }
    if (c.k < c.experts) EXPECT_FALSE(unused.empty());

    // The GPU, each op fed the CPU's inputs so that a difference points at one kernel.
    Tensor d_ids = poisoned(DType::kI32, {c.t, c.k}), d_gates = poisoned(DType::kF32, {c.t, c.k});
    route_experts(d_ids.view(), d_gates.view(), upload(logits, DType::kF32).view(), c.normalize);
    expect_equal_i32(download(d_ids), ids, "route_experts ids");
    const double gate_err = relative_error(download_f32(d_gates), gates);
    EXPECT_LT(gate_err, 1e-6);

    const Tensor d_ids_ref = cuda::to_device(ids);
    Tensor d_offsets = poisoned(DType::kI32, {c.experts + 1}), d_rows = poisoned(DType::kI32, {pairs}),
           d_slots = poisoned(DType::kI32, {pairs});
    group_by_expert(d_offsets.view(), d_rows.view(), d_slots.view(), d_ids_ref.view());
    expect_equal_i32(download(d_offsets), offsets, "group_by_expert offsets");
    expect_equal_i32(download(d_rows), rows, "group_by_expert rows");
    expect_equal_i32(download(d_slots), slots, "group_by_expert slots");

    const Tensor d_offsets_ref = cuda::to_device(offsets);
    const Tensor d_xe = upload(xe, DType::kBF16);
    double gemm_err = 0;
    for (DType out_dtype : {DType::kF32, DType::kBF16}) {
      Tensor d_gate_up = poisoned(out_dtype, {pairs, 2 * c.inter});
      grouped_linear(d_gate_up.view(), d_xe.view(), upload(w_gate_up, DType::kBF16).view(), d_offsets_ref.view(), c.t);
      const double err = relative_error(download_f32(d_gate_up), gate_up);
      EXPECT_LT(err, test::tolerance(out_dtype)) << dtype_name(out_dtype);
      if (out_dtype == DType::kF32) gemm_err = err;
    }
    // f32 operands (the decode GEMV and the scalar GEMM take them): the CPU's exact inputs.
    Tensor d_gate_up_f32 = poisoned(DType::kF32, {pairs, 2 * c.inter});
    grouped_linear(d_gate_up_f32.view(), upload(xe, DType::kF32).view(), upload(w_gate_up, DType::kF32).view(),
                   d_offsets_ref.view(), c.t);
    EXPECT_LT(relative_error(download_f32(d_gate_up_f32), gate_up), 1e-5) << "f32 operands";
    // Block-scaled FP8 experts (blocks of 32) where the shapes tile: codes and scales as stored, against the CPU twin
    // over the same codes and the GPU's bf16 inputs.
    double fp8_err = -1;
    if (c.hidden % 32 == 0 && c.inter % 32 == 0) {
      const test::Fp8Experts w8 = test::random_fp8_experts(c.experts, 2 * c.inter, c.hidden, 32, seed++);
      Tensor want = Tensor::empty(DType::kF32, {pairs, 2 * c.inter});
      grouped_linear(want.view(), xe.view(), w8.codes.view(), offsets.view(), c.t, w8.scales.view());
      Tensor got = poisoned(DType::kF32, {pairs, 2 * c.inter});
      grouped_linear(got.view(), d_xe.view(), cuda::to_device(w8.codes).view(), d_offsets_ref.view(), c.t,
                     cuda::to_device(w8.scales).view());
      fp8_err = relative_error(download_f32(got), want);
      EXPECT_LT(fp8_err, 1e-5) << "FP8 experts";
    }
    // The down projection over activations the CPU rounds to bf16 first, as the GPU's act buffer holds them.
    Tensor act_bf16 = Tensor::empty(DType::kF32, act.shape());
    for (int64_t i = 0; i < act.numel(); ++i)
      act_bf16.data<float>()[i] = test::representable(act.data<float>()[i], DType::kBF16);
    Tensor y_bf16 = Tensor::empty(DType::kF32, {pairs, c.hidden});
    grouped_linear(y_bf16.view(), act_bf16.view(), w_down.view(), offsets.view(), c.t);
    Tensor d_y = poisoned(DType::kF32, {pairs, c.hidden});
    grouped_linear(d_y.view(), upload(act_bf16, DType::kBF16).view(), upload(w_down, DType::kBF16).view(),
                   d_offsets_ref.view(), c.t);
    const double down_err = relative_error(download_f32(d_y), y_bf16);
    EXPECT_LT(down_err, 1e-5);

    Tensor d_h = upload(h0, DType::kF32);
    moe_combine(d_h.view(), upload(y, DType::kF32).view(), upload(gates, DType::kF32).view(),
                cuda::to_device(slots).view());
    const double combine_err = relative_error(download_f32(d_h), h);
    EXPECT_LT(combine_err, 1e-6);
    std::printf(
        "PARITY moe t=%-3lld experts=%-3lld k=%lld unused=%zu most=%lld gate %.2e gate_up %.2e down %.2e "
        "combine %.2e fp8 %.2e\n",
        static_cast<long long>(c.t), static_cast<long long>(c.experts), static_cast<long long>(c.k), unused.size(),
        static_cast<long long>(most), gate_err, gemm_err, down_err, combine_err, fp8_err);
  }
}

}  // namespace
}  // namespace se
