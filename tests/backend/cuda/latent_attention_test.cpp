// Multi-head latent attention's ops on the GPU against the CPU: rope_latent_heads; absorb_latent_queries then
// paged_latent_attention (bf16 latent pages, device tables) against both the CPU kernels and the float64 reference of
// the naive expanded form (latent_attention_case.h) over the same bf16-representable values, on ragged batches of
// decode rows and prefill chunks, page sizes 16 and 64, DeepSeek-V2-Lite's widths and small ones (several rows per
// CTA, a head count that leaves CTAs part empty), long decode rows whose keys split over CTAs, token and page
// selections and a sliding window. The latent store's row writes and row moves touch only the rows they name (its
// pages have no V half). Outputs start poisoned (NaN).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "../latent_attention_case.h"
#include "backend/cuda/cuda_ops.h"
#include "cuda_test_util.h"

namespace se {
namespace {

Tensor device_i32(const std::vector<int32_t>& v) {
  Tensor host = Tensor::empty(DType::kI32, {std::max<int64_t>(1, static_cast<int64_t>(v.size()))});
  std::copy(v.begin(), v.end(), host.data<int32_t>());
  return cuda::to_device(host);
}

// The device twin of a host view: bf16 pages, device tables (the tensors that hold them kept in `tables`).
AttentionView device_view(const AttentionView& host, const Tensor& pool, const std::vector<std::vector<int32_t>>& pages,
                          const std::vector<int32_t>& lengths, const std::vector<int32_t>& q_indptr,
                          const std::vector<std::vector<int32_t>>& selected, const std::vector<int32_t>& num_selected,
                          std::vector<Tensor>& tables) {
  std::vector<SeqKvView> seqs;
  for (size_t s = 0; s < pages.size(); ++s) {
    const Tensor& ids = tables.emplace_back(device_i32(pages[s]));
    const Tensor& length = tables.emplace_back(device_i32({lengths[s]}));
    SeqKvView v{ids.data<int32_t>(), host.seqs[s].stride, length.data<int32_t>()};
    if (host.seqs[s].selected != nullptr) {
      v.selected = tables.emplace_back(device_i32(selected[s])).data<int32_t>();
      v.selected_stride = host.seqs[s].selected_stride;
      v.num_selected = tables.emplace_back(device_i32({num_selected[s]})).data<int32_t>();
    }
    seqs.push_back(v);
  }
  Tensor& d_seqs = tables.emplace_back(
      Tensor::empty(DType::kU8, {static_cast<int64_t>(sizeof(SeqKvView) * seqs.size())}, cuda::cuda_allocator()));
  cuda::copy_bytes(d_seqs.raw(), seqs.data(), sizeof(SeqKvView) * seqs.size());
  AttentionView view = host;
  view.kv_base = const_cast<void*>(pool.raw());
  view.kv_device = view.tables_device = Device::kCuda;
  view.kv_dtype = DType::kBF16;
  view.page_bytes = static_cast<size_t>(host.page_size) * host.head_dim * 2;
  view.q_indptr = tables.emplace_back(device_i32(q_indptr)).data<int32_t>();
  view.seqs = static_cast<const SeqKvView*>(d_seqs.raw());
  return view;
}

struct Errors {
  double vs_cpu, vs_expanded;
};

Errors gpu_errors(const test::LatentShape& shape, const std::vector<test::PagedSeq>& seqs,
                  const AttentionParams& params, uint64_t seed,
                  test::LatentSelection selection = test::LatentSelection::kNone) {
  const test::LatentCase c(shape, seqs, seed, selection, [](float x) { return test::representable(x, DType::kBF16); });
  const std::vector<double> expanded = c.expanded_reference(params);
  Tensor cpu_latent = Tensor::empty(DType::kF32, {c.total_rows(), shape.heads, shape.width()});
  absorb_latent_queries(cpu_latent.view(), c.q.view(), c.kv_b.view());
  Tensor cpu_out = Tensor::empty(DType::kF32, {c.total_rows(), shape.heads, shape.value});
  paged_latent_attention(cpu_out.view(), cpu_latent.view(), c.view(), c.kv_b.view(), params);

  const Tensor pool = test::upload(c.pool, DType::kBF16);
  const Tensor kv_b = test::upload(c.kv_b, DType::kBF16);
  const Tensor q = test::upload(c.q, DType::kF32);
  std::vector<Tensor> tables;
  const AttentionView view =
      device_view(c.view(), pool, c.page_ids, c.lengths, c.q_indptr, c.selected, c.num_selected, tables);
  Tensor q_latent = test::poisoned(DType::kF32, {c.total_rows(), shape.heads, shape.width()});
  absorb_latent_queries(q_latent.view(), q.view(), kv_b.view());
  Tensor out = test::poisoned(DType::kF32, {c.total_rows(), shape.heads, shape.value});
  paged_latent_attention(out.view(), q_latent.view(), view, kv_b.view(), params);
  const Tensor got = test::download_f32(out);
  return {test::relative_error(got, cpu_out), test::relative_error(got.data<float>(), expanded.data(), got.numel())};
}

// DeepSeek-V2-Lite's attention: 16 heads, q_nope 128, q_rope 64, v 128, a latent of 512 (rows of 576).
constexpr test::LatentShape kLite{.heads = 16, .nope = 128, .rope = 64, .value = 128, .rank = 512, .page_size = 16};

TEST(CudaLatentAttentionTest, DeepSeekV2LiteShapesMatchTheCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  AttentionParams params;
  params.scale = 1.0f / std::sqrt(192.0f);
  for (const int32_t page_size : {16, 64}) {
    test::LatentShape shape = kLite;
    shape.page_size = page_size;
    // Decode rows of several lengths, prefill chunks (one over earlier chunks' pages), and a lone long decode row
    // whose keys split over many CTAs.
    for (const auto& batch : {std::vector<test::PagedSeq>{{1, 1}, {1, 37}, {1, 300}, {17, 17}, {5, 130}},
                              std::vector<test::PagedSeq>{{1, 3000}}}) {
      const Errors e = gpu_errors(shape, batch, params, 31 + page_size);
      std::printf("PARITY paged_latent_attention V2-Lite page %-3d %zu seqs  vs cpu %.3e  vs expanded %.3e\n",
                  page_size, batch.size(), e.vs_cpu, e.vs_expanded);
      EXPECT_LT(e.vs_cpu, 1e-4) << page_size;
      EXPECT_LT(e.vs_expanded, 1e-4) << page_size;
    }
  }
}

TEST(CudaLatentAttentionTest, FewAndUnevenHeads) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  AttentionParams params;
  params.scale = 0.2f;
  const std::vector<test::PagedSeq> batch = {{1, 1}, {1, 50}, {9, 9}, {3, 70}, {1, 129}};
  // Four heads: four rows a CTA. 24 heads: two CTAs a row, the second half empty.
  for (const test::LatentShape& shape :
       {test::LatentShape{.heads = 4, .nope = 32, .rope = 16, .value = 24, .rank = 64, .page_size = 16},
        test::LatentShape{.heads = 24, .nope = 16, .rope = 16, .value = 16, .rank = 128, .page_size = 64}}) {
    const Errors e = gpu_errors(shape, batch, params, 41);
    EXPECT_LT(e.vs_cpu, 1e-4) << shape.heads;
    EXPECT_LT(e.vs_expanded, 1e-4) << shape.heads;
  }
}

TEST(CudaLatentAttentionTest, SelectionsAndSlidingWindow) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  AttentionParams params;
  params.scale = 1.0f / std::sqrt(192.0f);
  const std::vector<test::PagedSeq> decode = {{1, 1}, {1, 40}, {1, 333}, {1, 1000}};
  for (const test::LatentSelection selection : {test::LatentSelection::kTokens, test::LatentSelection::kPages}) {
    const Errors e = gpu_errors(kLite, decode, params, 51, selection);
    EXPECT_LT(e.vs_cpu, 1e-4);
    EXPECT_LT(e.vs_expanded, 1e-4);
  }
  params.sliding_window = 100;
  const Errors e = gpu_errors(kLite, {{1, 20}, {1, 300}, {6, 250}}, params, 52);
  EXPECT_LT(e.vs_cpu, 1e-4);
  EXPECT_LT(e.vs_expanded, 1e-4);
}

TEST(CudaLatentAttentionTest, RopeLatentHeadsMatchesTheCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  RopeParams rope;
  rope.rotary_dim = 64;
  rope.scaling = RopeScaling::kYarn;
  rope.factor = 40.0f;
  rope.original_max_position = 4096;
  rope.attention_factor = 1.3f;
  Tensor positions = Tensor::empty(DType::kI32, {6});
  for (int32_t t = 0; t < 6; ++t) positions.data<int32_t>()[t] = 1000 * t + 7;
  const Tensor d_positions = cuda::to_device(positions);
  const Tensor weight = test::random_host({512}, 62, DType::kF32);
  const Tensor d_weight = cuda::to_device(weight);
  // The queries of 16 heads in place, and the latent rows normed into f32 and bf16.
  for (const int64_t heads : {16, 1}) {
    const Tensor x = test::random_host({6, heads, heads == 1 ? 576 : 192}, 61 + heads, DType::kF32);
    const TensorView host_norm = weight.view(), device_norm = d_weight.view();
    const bool normed = heads == 1;
    Tensor want = Tensor::empty(DType::kF32, x.shape());
    rope_latent_heads(want.view(), x.view(), positions.view(), rope, normed ? &host_norm : nullptr, 1e-6f);
    for (const DType out_dtype : {DType::kF32, DType::kBF16}) {
      Tensor in = test::upload(x, DType::kF32);
      Tensor out = out_dtype == DType::kF32 ? in : test::poisoned(out_dtype, x.shape());
      rope_latent_heads(out.view(), in.view(), d_positions.view(), rope, normed ? &device_norm : nullptr, 1e-6f);
      EXPECT_LT(test::relative_error(test::download_f32(out), want), test::tolerance(out_dtype)) << heads;
    }
  }
}

// A pool of three pages of 4 rows of 16 values: the stream's pages 0 and 1 hold 8 tokens, page 2 is bystander.
struct LatentPool {
  static constexpr int32_t kPageSize = 4, kWidth = 16, kPages = 3;
  Tensor host = test::random_host({kPages, kPageSize, kWidth}, 71, DType::kBF16);
  Tensor device = test::upload(host, DType::kBF16);
  std::vector<int32_t> pages = {0, 1};
  AttentionView view() const {
    AttentionView v;
    v.kv_base = const_cast<void*>(device.raw());
    v.kv_device = Device::kCuda;
    v.kv_dtype = DType::kBF16;
    v.page_bytes = size_t{kPageSize} * kWidth * 2;
    v.page_size = kPageSize;
    v.head_dim = kWidth;
    v.num_kv_heads = 1;
    v.payload = KvPayload::kSharedLatent;
    return v;
  }
  const float* row(const Tensor& t, int32_t token) const {
    return t.data<float>() +
           (int64_t{pages[static_cast<size_t>(token / kPageSize)]} * kPageSize + token % kPageSize) * kWidth;
  }
};

TEST(CudaLatentStoreTest, RowCopiesMoveOneRowPerToken) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  LatentPool pool;
  const std::vector<int32_t> kept = {0, 2, 5, 7};
  const StreamCompaction stream{pool.pages.data(), kept};
  compact_kv(pool.view(), std::span<const StreamCompaction>(&stream, 1));
  const KvRowMove move{1, 3, 2, 1};  // page 1 slot 3 (token 7) to page 2 slot 1
  move_kv_rows(pool.view(), std::span<const KvRowMove>(&move, 1));
  const Tensor got = test::download_f32(pool.device);
  Tensor want = pool.host.to_f32();
  for (size_t i = 0; i < kept.size(); ++i)
    std::memcpy(want.data<float>() + i * LatentPool::kWidth, pool.row(pool.host, kept[i]),
                sizeof(float) * LatentPool::kWidth);
  std::memcpy(want.data<float>() + (2 * LatentPool::kPageSize + 1) * LatentPool::kWidth, pool.row(pool.host, 7),
              sizeof(float) * LatentPool::kWidth);
  EXPECT_EQ(test::relative_error(got, want), 0.0);  // page 1 and the rest of page 2 unchanged
}

TEST(CudaLatentStoreTest, WriteKvWritesTheRowsAlone) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  LatentPool pool;
  // One sequence of 6 tokens, its last 5 new: tokens 1..5 land in page 0 slots 1..3 and page 1 slots 0..1.
  std::vector<Tensor> tables;
  const std::vector<int32_t> q_indptr = {0, 5}, lengths = {6};
  const SeqKvView host_seq{pool.pages.data(), 2, lengths.data()};
  AttentionView host = pool.view();
  host.num_seqs = 1;
  host.seqs = &host_seq;
  const AttentionView view = device_view(host, pool.device, {pool.pages}, lengths, q_indptr, {{}}, {0}, tables);
  const Tensor rows = test::random_host({5, 1, LatentPool::kWidth}, 72, DType::kBF16);
  const Tensor d_rows = test::upload(rows, DType::kF32);
  write_kv(view, d_rows.view(), d_rows.view());
  const Tensor got = test::download_f32(pool.device);
  Tensor want = pool.host.to_f32();
  for (int32_t r = 0; r < 5; ++r)
    std::memcpy(const_cast<float*>(pool.row(want, r + 1)), rows.data<float>() + r * LatentPool::kWidth,
                sizeof(float) * LatentPool::kWidth);
  EXPECT_EQ(test::relative_error(got, want), 0.0);
}

}  // namespace
}  // namespace se
