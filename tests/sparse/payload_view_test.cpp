// The AttentionView can describe the KV stores of the families that arrive later: quantized pages plus a
// full-precision residual window (KIVI) and low-rank latents expanded at attention time (Palu). Each test double
// below builds such a store and its view; a reader that knows only the view's documented layout reconstructs
// the keys and values and must get the attention output of the original K/V (exactly up to quantization error,
// resp. float rounding). Nothing here is engine code: it pins the contract down before those methods land.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/attention_view.h"
#include "backend/ops.h"

namespace se {
namespace {

constexpr int kPageSize = 4;
constexpr int kHeadDim = 8;

std::vector<float> random_rows(int rows, int cols, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(rows) * cols);
  for (float& v : x) v = normal(rng);
  return x;
}

// softmax(q . k_j / sqrt(D)) . v over `n` tokens, one head.
std::vector<float> attend(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                          int n) {
  std::vector<float> logits(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) {
    float dot = 0;
    for (int d = 0; d < kHeadDim; ++d) dot += q[d] * k[j * kHeadDim + d];
    logits[j] = dot / std::sqrt(static_cast<float>(kHeadDim));
  }
  const float mx = *std::max_element(logits.begin(), logits.end());
  std::vector<float> out(kHeadDim, 0.0f);
  float denom = 0;
  for (int j = 0; j < n; ++j) {
    const float p = std::exp(logits[j] - mx);
    denom += p;
    for (int d = 0; d < kHeadDim; ++d) out[d] += p * v[j * kHeadDim + d];
  }
  for (float& o : out) o /= denom;
  return out;
}

// KIVI-shaped store of one stream: full pages older than the residual window hold 8-bit codes, K grouped per
// channel over the page's tokens, V per token over its channels; the rest stays fp32 in explicit pages.
struct QuantizedStoreDouble {
  std::vector<uint8_t> codes;     // [num_pages][2][page_size][head_dim]
  std::vector<float> params;      // [num_pages][(head_dim + page_size) * 2]: K per channel, then V per token
  std::vector<float> residual;    // explicit pages [num_pages][2][page_size][head_dim]
  std::vector<int32_t> quantized_pages, residual_pages;
  int32_t num_quantized = 0, num_residual = 0;
  std::vector<SeqKvView> seqs, residual_seqs;
  int32_t q_indptr[2] = {0, 0};

  static std::pair<float, float> range_of(const float* x, int n, int stride) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; ++i) lo = std::min(lo, x[i * stride]), hi = std::max(hi, x[i * stride]);
    return {lo, hi};
  }
  static uint8_t encode(float x, float scale, float lo) {
    return static_cast<uint8_t>(std::lrint(std::clamp((x - lo) / scale, 0.0f, 255.0f)));
  }

  AttentionView build(const std::vector<float>& k, const std::vector<float>& v, int n, int residual_len) {
    num_quantized = (n - residual_len) / kPageSize * kPageSize;
    num_residual = n - num_quantized;
    const int qp = num_quantized / kPageSize, rp = (num_residual + kPageSize - 1) / kPageSize;
    const size_t page_params = 2 * (kHeadDim + kPageSize);
    codes.assign(static_cast<size_t>(qp) * 2 * kPageSize * kHeadDim, 0);
    params.assign(static_cast<size_t>(qp) * page_params, 0);
    residual.assign(static_cast<size_t>(rp) * 2 * kPageSize * kHeadDim, 0);
    for (int p = 0; p < qp; ++p) {
      uint8_t* c = codes.data() + static_cast<size_t>(p) * 2 * kPageSize * kHeadDim;
      float* prm = params.data() + p * page_params;
      const float* kp = k.data() + p * kPageSize * kHeadDim;
      const float* vp = v.data() + p * kPageSize * kHeadDim;
      for (int d = 0; d < kHeadDim; ++d) {  // K: one group per channel over the page's tokens
        auto [lo, hi] = range_of(kp + d, kPageSize, kHeadDim);
        const float scale = std::max(hi - lo, 1e-8f) / 255.0f;
        prm[2 * d] = scale, prm[2 * d + 1] = lo;
        for (int t = 0; t < kPageSize; ++t) c[t * kHeadDim + d] = encode(kp[t * kHeadDim + d], scale, lo);
      }
      for (int t = 0; t < kPageSize; ++t) {  // V: one group per token over its channels
        auto [lo, hi] = range_of(vp + t * kHeadDim, kHeadDim, 1);
        const float scale = std::max(hi - lo, 1e-8f) / 255.0f;
        prm[2 * kHeadDim + 2 * t] = scale, prm[2 * kHeadDim + 2 * t + 1] = lo;
        for (int d = 0; d < kHeadDim; ++d)
          c[(kPageSize + t) * kHeadDim + d] = encode(vp[t * kHeadDim + d], scale, lo);
      }
    }
    for (int t = 0; t < num_residual; ++t)
      for (int kv = 0; kv < 2; ++kv)
        std::copy_n((kv == 0 ? k : v).data() + (num_quantized + t) * kHeadDim, kHeadDim,
                    residual.data() + ((t / kPageSize) * 2 * kPageSize + kv * kPageSize + t % kPageSize) * kHeadDim);
    quantized_pages.resize(static_cast<size_t>(qp));
    residual_pages.resize(static_cast<size_t>(rp));
    for (int p = 0; p < qp; ++p) quantized_pages[p] = p;
    for (int p = 0; p < rp; ++p) residual_pages[p] = p;
    seqs = {SeqKvView{quantized_pages.data(), qp, &num_quantized}};
    residual_seqs = {SeqKvView{residual_pages.data(), rp, &num_residual}};

    AttentionView view;
    view.kv_base = residual.data();
    view.page_bytes = 2 * kPageSize * kHeadDim * sizeof(float);
    view.page_size = kPageSize;
    view.head_dim = kHeadDim;
    view.num_kv_heads = 1;
    view.num_seqs = 1;
    view.q_indptr = q_indptr;
    view.seqs = seqs.data();
    view.payload = KvPayload::kQuantized;
    view.quantized = QuantizedKvView{codes.data(), 2 * kPageSize * kHeadDim, params.data(), page_params * sizeof(float),
                                     8, kPageSize, kHeadDim, residual_seqs.data()};
    return view;
  }
};

// Rebuilds the K/V of sequence 0, KV head 0 from a kQuantized view, knowing only its documented layout.
void read_quantized(const AttentionView& view, std::vector<float>& k, std::vector<float>& v) {
  const QuantizedKvView& qv = view.quantized;
  const SeqKvView& q_seq = view.seqs[0];
  const SeqKvView& r_seq = qv.residual[0];
  const int ps = view.page_size, dim = view.head_dim;
  k.clear(), v.clear();
  for (int t = 0; t < q_seq.num_tokens[0]; ++t) {
    const int32_t page = q_seq.page_ids[t / ps];
    const auto* codes = static_cast<const uint8_t*>(qv.codes_base) + page * qv.page_code_bytes;
    const float* prm = reinterpret_cast<const float*>(reinterpret_cast<const char*>(qv.params_base) +
                                                      page * qv.page_param_bytes);
    const int off = t % ps;
    for (int d = 0; d < dim; ++d) k.push_back(codes[off * dim + d] * prm[2 * d] + prm[2 * d + 1]);
    for (int d = 0; d < dim; ++d)
      v.push_back(codes[(ps + off) * dim + d] * prm[2 * dim + 2 * off] + prm[2 * dim + 2 * off + 1]);
  }
  for (int t = 0; t < r_seq.num_tokens[0]; ++t) {
    const float* kr = view.element<float>(r_seq.page_ids[t / ps], 0, t % ps);
    const float* vr = view.element<float>(r_seq.page_ids[t / ps], 1, t % ps);
    k.insert(k.end(), kr, kr + dim);
    v.insert(v.end(), vr, vr + dim);
  }
}

TEST(PayloadViewTest, QuantizedPagesWithResidualWindowReproduceAttention) {
  std::mt19937 rng(3);
  for (int n : {5, 16, 37}) {
    const std::vector<float> k = random_rows(n, kHeadDim, rng), v = random_rows(n, kHeadDim, rng);
    const std::vector<float> q = random_rows(1, kHeadDim, rng);
    QuantizedStoreDouble store;
    const AttentionView view = store.build(k, v, n, /*residual_len=*/6);
    std::vector<float> k_read, v_read;
    read_quantized(view, k_read, v_read);
    ASSERT_EQ(k_read.size(), k.size());
    for (size_t i = static_cast<size_t>(store.num_quantized) * kHeadDim; i < k.size(); ++i)
      EXPECT_EQ(k_read[i], k[i]) << "the residual window is full precision";
    for (size_t i = 0; i < k.size(); ++i) EXPECT_NEAR(k_read[i], k[i], 0.02) << i;
    const std::vector<float> want = attend(q, k, v, n), got = attend(q, k_read, v_read, n);
    for (int d = 0; d < kHeadDim; ++d) EXPECT_NEAR(got[d], want[d], 0.03);
  }
}

TEST(PayloadViewTest, LowRankLatentsExpandToTheRotatedKeysAndValues) {
  constexpr int kRank = 3, kTokens = 11;
  std::mt19937 rng(5);
  const std::vector<float> up_k = random_rows(kHeadDim, kRank, rng), up_v = random_rows(kHeadDim, kRank, rng);
  const std::vector<float> latents = random_rows(kTokens, 2 * kRank, rng);  // per token: h_k then h_v
  // The store: latents in pages (2 * rank values per token instead of 2 * head_dim), positions beside them;
  // tokens 2 and 7 were evicted earlier, so the positions are not the slots.
  const std::vector<int32_t> kept = {0, 1, 3, 4, 5, 6, 8, 9, 10};
  const int n = static_cast<int>(kept.size());
  const int num_pages = (n + kPageSize - 1) / kPageSize;
  std::vector<float> pages(static_cast<size_t>(num_pages) * 2 * kPageSize * kRank, 0.0f);
  std::vector<int32_t> positions(static_cast<size_t>(num_pages) * kPageSize, 0);
  for (int t = 0; t < n; ++t)
    for (int kv = 0; kv < 2; ++kv) {
      std::copy_n(latents.data() + kept[t] * 2 * kRank + kv * kRank, kRank,
                  pages.data() + ((t / kPageSize) * 2 * kPageSize + kv * kPageSize + t % kPageSize) * kRank);
      positions[static_cast<size_t>(t)] = kept[t];
    }
  std::vector<int32_t> page_ids(static_cast<size_t>(num_pages));
  for (int p = 0; p < num_pages; ++p) page_ids[p] = p;
  int32_t num_tokens = n, q_indptr[2] = {0, 0};
  const SeqKvView seq{page_ids.data(), num_pages, &num_tokens};
  AttentionView view;
  view.kv_base = pages.data();
  view.page_bytes = 2 * kPageSize * kRank * sizeof(float);
  view.page_size = kPageSize;
  view.head_dim = kRank;  // a stored token is `rank` values wide
  view.num_kv_heads = 1;
  view.num_seqs = 1;
  view.q_indptr = q_indptr;
  view.seqs = &seq;
  view.payload = KvPayload::kLowRankLatent;
  view.latent = LatentKvView{up_k.data(), up_v.data(), kRank, positions.data()};

  // Reader: expand each stored latent and rotate its key at its original position.
  RopeParams rope_params;
  rope_params.rotary_dim = kHeadDim;
  Tensor k_read = Tensor::empty(DType::kF32, {n, 1, kHeadDim}), v_read = Tensor::empty(DType::kF32, {n, 1, kHeadDim});
  Tensor pos = Tensor::empty(DType::kI32, {n});
  for (int t = 0; t < n; ++t) {
    const int32_t page = seq.page_ids[t / kPageSize];
    const float* hk = view.element<float>(page, 0, t % kPageSize);
    const float* hv = view.element<float>(page, 1, t % kPageSize);
    for (int d = 0; d < kHeadDim; ++d) {
      float sk = 0, sv = 0;
      for (int r = 0; r < kRank; ++r) sk += view.latent.up_k[d * kRank + r] * hk[r], sv += view.latent.up_v[d * kRank + r] * hv[r];
      k_read.data<float>()[t * kHeadDim + d] = sk;
      v_read.data<float>()[t * kHeadDim + d] = sv;
    }
    pos.data<int32_t>()[t] = view.latent.positions_base[page * kPageSize + t % kPageSize];
  }
  rope(k_read.view(), pos.view(), rope_params);

  // Oracle: the full-rank keys of the kept tokens, rotated at their positions.
  Tensor k_want = Tensor::empty(DType::kF32, {n, 1, kHeadDim});
  std::vector<float> v_want;
  for (int t = 0; t < n; ++t)
    for (int d = 0; d < kHeadDim; ++d) {
      float sk = 0, sv = 0;
      for (int r = 0; r < kRank; ++r)
        sk += up_k[d * kRank + r] * latents[kept[t] * 2 * kRank + r],
            sv += up_v[d * kRank + r] * latents[kept[t] * 2 * kRank + kRank + r];
      k_want.data<float>()[t * kHeadDim + d] = sk;
      v_want.push_back(sv);
    }
  Tensor want_pos = Tensor::empty(DType::kI32, {n});
  for (int t = 0; t < n; ++t) want_pos.data<int32_t>()[t] = kept[t];
  rope(k_want.view(), want_pos.view(), rope_params);
  for (int64_t i = 0; i < k_want.numel(); ++i) EXPECT_FLOAT_EQ(k_read.data<float>()[i], k_want.data<float>()[i]);
  for (size_t i = 0; i < v_want.size(); ++i) EXPECT_FLOAT_EQ(v_read.data<float>()[i], v_want[i]);
}

TEST(PayloadViewTest, ExplicitOnlyOpsRejectOtherPayloads) {
  AttentionView view;
  view.payload = KvPayload::kQuantized;
  Tensor q = Tensor::empty(DType::kF32, {1, 1, kHeadDim}), out = Tensor::empty(DType::kF32, {1, 1, kHeadDim});
  EXPECT_DEATH(paged_attention(out.view(), q.view(), view, AttentionParams{}), "payloads are not implemented");
}

}  // namespace
}  // namespace se
