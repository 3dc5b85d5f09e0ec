// paged_low_rank_attention on the GPU (bf16 latent pages, f32 factors, device tables) against the CPU reference of
// low_rank_case.h over the same bf16-representable values: ragged prefill and decode rows, with the biases and the
// key norm, partial rotary, a sliding window and a softcap; outputs start poisoned (NaN).
#include <gtest/gtest.h>

#include "../low_rank_case.h"
#include "backend/cuda/cuda_ops.h"
#include "cuda_test_util.h"

namespace se {
namespace {

Tensor device_i32(const std::vector<int32_t>& v) {
  Tensor host = Tensor::empty(DType::kI32, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), host.data<int32_t>());
  return cuda::to_device(host);
}

double gpu_error(const test::LowRankShape& shape, const RopeParams& rope, const AttentionParams& params,
                 uint64_t seed) {
  const std::vector<test::PagedSeq> batch = {{5, 13}, {1, 9}, {40, 40}, {1, 1}, {1, 300}};
  const test::LowRankCase c(shape, batch, seed, [](float x) { return test::representable(x, DType::kBF16); });
  const Tensor want = c.reference(rope, params);

  // The same store on the device: bf16 pages, f32 factors, device tables.
  const Tensor pool = test::upload(c.pool, DType::kBF16);
  const Tensor up_k = cuda::to_device(c.up_k), up_v = cuda::to_device(c.up_v);
  const Tensor k_bias = cuda::to_device(c.k_bias), v_bias = cuda::to_device(c.v_bias);
  const Tensor k_norm = cuda::to_device(c.k_norm);
  const Tensor q_indptr = device_i32(c.q_indptr);
  std::vector<Tensor> tables;
  std::vector<SeqKvView> seqs;
  for (size_t s = 0; s < batch.size(); ++s) {
    const Tensor& ids = tables.emplace_back(device_i32(c.page_ids[s]));
    const Tensor& lengths = tables.emplace_back(device_i32(c.lengths[s]));
    seqs.push_back(SeqKvView{ids.data<int32_t>(), c.seq_views[s].stride, lengths.data<int32_t>()});
  }
  Tensor d_seqs =
      Tensor::empty(DType::kU8, {static_cast<int64_t>(sizeof(SeqKvView) * seqs.size())}, cuda::cuda_allocator());
  cuda::copy_bytes(d_seqs.raw(), seqs.data(), sizeof(SeqKvView) * seqs.size());
  AttentionView view = c.view();
  view.kv_base = pool.raw();
  view.kv_device = view.tables_device = Device::kCuda;
  view.kv_dtype = DType::kBF16;
  view.page_bytes = static_cast<size_t>(shape.page_size) * shape.width() * 2;
  view.q_indptr = q_indptr.data<int32_t>();
  view.seqs = static_cast<const SeqKvView*>(d_seqs.raw());
  view.latent.up_k = up_k.data<float>();
  view.latent.up_v = up_v.data<float>();
  view.latent.k_bias = shape.bias ? k_bias.data<float>() : nullptr;
  view.latent.v_bias = shape.bias ? v_bias.data<float>() : nullptr;
  view.latent.k_norm = shape.k_norm ? k_norm.data<float>() : nullptr;

  const Tensor q = test::upload(c.q, DType::kF32);
  Tensor out = test::poisoned(DType::kF32, {c.total_rows(), shape.heads(), shape.head_dim});
  paged_low_rank_attention(out.view(), q.view(), view, rope, params);
  return test::relative_error(test::download_f32(out), want);
}

TEST(CudaLowRankAttentionTest, MatchesTheCpuReference) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  RopeParams rope;
  rope.rotary_dim = 16;
  AttentionParams params;
  params.scale = 0.25f;
  test::LowRankShape shape;
  EXPECT_LT(gpu_error(shape, rope, params, 1), 1e-4);
  shape = {.groups = 2, .group_heads = 2, .head_dim = 64, .k_rank = 64, .v_rank = 48, .queries_per_kv = 3};
  rope.rotary_dim = 64;
  EXPECT_LT(gpu_error(shape, rope, params, 2), 1e-4);
  shape.bias = shape.k_norm = false;
  rope.rotary_dim = 32;
  params.sliding_window = 7;
  params.logit_softcap = 5.0f;
  EXPECT_LT(gpu_error(shape, rope, params, 3), 1e-4);
}

}  // namespace
}  // namespace se
