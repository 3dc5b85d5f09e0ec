// The AttentionView describes the KV stores of the other method families: quantized pages plus a full-precision
// residual window (KIVI) here (Palu's low-rank latents: low_rank_attention_test). The test double below builds
// such a store and its view; a reader that knows only the view's documented layout reconstructs the keys and
// values and must get the attention output of the original K/V (exactly up to quantization error, resp. float
// rounding), and paged_attention, where it reads that payload, must agree with that reader.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/attention_view.h"
#include "backend/ops.h"
#include "backend/quant/kivi_quant.h"
#include "backend/quant/quantized_kv_layout.h"
#include "kv/kivi_residual_window.h"

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

// KIVI store of one stream (one KV head) in attention_view.h's kKivi layout: quantized pages of kGroup tokens
// (K per channel, V per token, fp16 scale and minimum), the full-precision residual in explicit pages starting
// where the slid window left it. The residual window decides what is quantized.
struct KiviStoreDouble {
  static constexpr int kBits = 8, kGroup = 4, kResidual = 8;
  const KiviPageLayout layout = kivi_page_layout(kGroup, kHeadDim, kHeadDim, kBits);
  std::vector<char> pages;
  std::vector<float> residual;  // explicit pages [num_pages][2][page_size][head_dim]
  std::vector<int32_t> quantized_pages, residual_pages;
  int32_t num_tokens = 0, num_keys = 0, num_values = 0, num_full = 0, first_slot = 0;
  std::vector<SeqKvView> seqs;
  std::vector<KiviSeqView> kivi_seqs;
  int32_t q_indptr[2] = {0, 1};

  AttentionView build(const std::vector<float>& k, const std::vector<float>& v, int n) {
    KiviResidualWindow window(kResidual);
    window.append(n);
    num_tokens = n;
    num_keys = static_cast<int32_t>(window.quantized_keys());
    num_values = static_cast<int32_t>(window.quantized_values());
    num_full = n - num_values;
    first_slot = num_values % kPageSize;
    const int qp = num_keys / kGroup, rp = (num_full + first_slot + kPageSize - 1) / kPageSize;
    pages.assign(static_cast<size_t>(qp) * layout.page_bytes, 0);
    residual.assign(static_cast<size_t>(rp) * 2 * kPageSize * kHeadDim, 0);
    for (int p = 0; p < qp; ++p) {
      char* page = pages.data() + static_cast<size_t>(p) * layout.page_bytes;
      for (int c = 0; c < kHeadDim; ++c)
        kivi_quantize_row(k.data() + p * kGroup * kHeadDim + c, kGroup, kHeadDim, kGroup, kBits,
                          reinterpret_cast<uint32_t*>(page + layout.key_codes) + c * layout.key_words,
                          reinterpret_cast<uint16_t*>(page + layout.key_scale) + c,
                          reinterpret_cast<uint16_t*>(page + layout.key_min) + c);
      for (int t = 0; t < kGroup && p * kGroup + t < num_values; ++t)
        kivi_quantize_row(v.data() + (p * kGroup + t) * kHeadDim, kHeadDim, 1, kHeadDim, kBits,
                          reinterpret_cast<uint32_t*>(page + layout.value_codes) + t * layout.value_words,
                          reinterpret_cast<uint16_t*>(page + layout.value_scale) + t * layout.value_groups,
                          reinterpret_cast<uint16_t*>(page + layout.value_min) + t * layout.value_groups);
    }
    for (int j = num_values; j < n; ++j) {
      const int slot = j - num_values + first_slot;
      for (int kv = 0; kv < 2; ++kv)
        std::copy_n((kv == 0 ? k : v).data() + j * kHeadDim, kHeadDim,
                    residual.data() + ((slot / kPageSize) * 2 * kPageSize + kv * kPageSize + slot % kPageSize) *
                                          kHeadDim);
    }
    quantized_pages.resize(static_cast<size_t>(qp));
    residual_pages.resize(static_cast<size_t>(rp));
    for (int p = 0; p < qp; ++p) quantized_pages[p] = p;
    for (int p = 0; p < rp; ++p) residual_pages[p] = p;
    seqs = {SeqKvView{quantized_pages.data(), qp, &num_tokens}};
    kivi_seqs = {KiviSeqView{&num_keys, &num_values, SeqKvView{residual_pages.data(), rp, &num_full}, &first_slot}};

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
    view.quantized.scheme = KvQuantScheme::kKivi;
    view.quantized.quantized_base = pages.data();
    view.quantized.quantized_page_bytes = layout.page_bytes;
    view.quantized.bits = kBits;
    view.quantized.group_size = kGroup;
    view.quantized.value_group_size = kHeadDim;
    view.quantized.kivi_seqs = kivi_seqs.data();
    return view;
  }
};

// Rebuilds the K/V of sequence 0, KV head 0 from a kKivi view, knowing only its documented layout.
void read_quantized(const AttentionView& view, std::vector<float>& k, std::vector<float>& v) {
  const QuantizedKvView& qv = view.quantized;
  const KiviSeqView& kivi = qv.kivi_seqs[0];
  const int ps = view.page_size, dim = view.head_dim, g = qv.group_size, b = qv.bits;
  const int key_words = (g * b + 31) / 32, value_words = (dim * b + 31) / 32;
  const int value_groups = dim / qv.value_group_size;
  auto part = [&](int32_t j, size_t offset) {
    return static_cast<const char*>(qv.quantized_base) +
           static_cast<size_t>(view.seqs[0].page_ids[j / g]) * qv.quantized_page_bytes + offset;
  };
  auto full = [&](int kv, int32_t j) {
    const int slot = j - kivi.num_quantized_values[0] + kivi.residual_first_slot[0];
    return view.element<const float>(kivi.residual.page_ids[slot / ps], kv, slot % ps);
  };
  const size_t value_codes = static_cast<size_t>(dim) * key_words * 4;
  const size_t key_scale = value_codes + static_cast<size_t>(g) * value_words * 4;
  const size_t value_scale = key_scale + 4 * static_cast<size_t>(dim);
  const size_t value_min = value_scale + 2 * static_cast<size_t>(g) * value_groups;
  k.clear(), v.clear();
  for (int j = 0; j < view.seqs[0].num_tokens[0]; ++j) {
    const int t = j % g;
    for (int c = 0; c < dim; ++c) {
      if (j >= kivi.num_quantized_keys[0]) {
        k.push_back(full(0, j)[c]);
        continue;
      }
      const auto* words = reinterpret_cast<const uint32_t*>(part(j, 0)) + c * key_words;
      const uint32_t code = (words[t * b / 32] >> (t * b % 32)) & ((1u << b) - 1);
      k.push_back(kivi_dequantize(code, reinterpret_cast<const uint16_t*>(part(j, key_scale))[c],
                                  reinterpret_cast<const uint16_t*>(part(j, key_scale + 2 * dim))[c]));
    }
    for (int c = 0; c < dim; ++c) {
      if (j >= kivi.num_quantized_values[0]) {
        v.push_back(full(1, j)[c]);
        continue;
      }
      const auto* words = reinterpret_cast<const uint32_t*>(part(j, value_codes)) + t * value_words;
      const uint32_t code = (words[c * b / 32] >> (c * b % 32)) & ((1u << b) - 1);
      const int group = t * value_groups + c / qv.value_group_size;
      v.push_back(kivi_dequantize(code, reinterpret_cast<const uint16_t*>(part(j, value_scale))[group],
                                  reinterpret_cast<const uint16_t*>(part(j, value_min))[group]));
    }
  }
}

TEST(PayloadViewTest, QuantizedPagesWithResidualWindowReproduceAttention) {
  std::mt19937 rng(3);
  for (int n : {5, 16, 37}) {
    const std::vector<float> k = random_rows(n, kHeadDim, rng), v = random_rows(n, kHeadDim, rng);
    std::vector<float> q = random_rows(1, kHeadDim, rng);
    KiviStoreDouble store;
    const AttentionView view = store.build(k, v, n);
    std::vector<float> k_read, v_read;
    read_quantized(view, k_read, v_read);
    ASSERT_EQ(k_read.size(), k.size());
    for (size_t i = static_cast<size_t>(store.num_keys) * kHeadDim; i < k.size(); ++i)
      EXPECT_EQ(k_read[i], k[i]) << "the residual window is full precision";
    for (size_t i = static_cast<size_t>(store.num_values) * kHeadDim; i < v.size(); ++i)
      EXPECT_EQ(v_read[i], v[i]) << "the residual window is full precision";
    for (size_t i = 0; i < k.size(); ++i) EXPECT_NEAR(k_read[i], k[i], 0.03) << i;
    const std::vector<float> want = attend(q, k, v, n), got = attend(q, k_read, v_read, n);
    for (int d = 0; d < kHeadDim; ++d) EXPECT_NEAR(got[d], want[d], 0.03);
    // The op reads the same layout: its output is attention over what the documented reader decodes.
    std::vector<float> out(kHeadDim);
    AttentionParams params;
    params.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
    paged_attention(TensorView{out.data(), DType::kF32, Shape{1, 1, kHeadDim}},
                    TensorView{q.data(), DType::kF32, Shape{1, 1, kHeadDim}}, view, params);
    for (int d = 0; d < kHeadDim; ++d) EXPECT_NEAR(out[d], got[d], 1e-5) << "n " << n << " d " << d;
    // Tables that break the window's invariants are refused, naming what is wrong.
    store.num_values = store.num_keys + kHeadDim;
    EXPECT_DEATH(paged_attention(TensorView{out.data(), DType::kF32, Shape{1, 1, kHeadDim}},
                                 TensorView{q.data(), DType::kF32, Shape{1, 1, kHeadDim}}, view, params),
                 "quantized keys");
  }
}

TEST(PayloadViewTest, ExplicitOnlyOpsRejectOtherPayloads) {
  AttentionView view;
  Tensor q = Tensor::empty(DType::kF32, {1, 1, kHeadDim}), out = Tensor::empty(DType::kF32, {1, 1, kHeadDim});
  view.payload = KvPayload::kLowRankLatent;  // paged_low_rank_attention reads it
  EXPECT_DEATH(paged_attention(out.view(), q.view(), view, AttentionParams{}), "payloads are not implemented");
  // TurboQuant slots are written by no op yet; FP8 pages are (fp8_kv_store_test), and KIVI windows, whose view must
  // give the codes' geometry (kivi_kv_store_test).
  view.payload = KvPayload::kSharedLatent;  // paged_latent_attention reads it
  EXPECT_DEATH(paged_attention(out.view(), q.view(), view, AttentionParams{}), "payloads are not implemented");
  view.payload = KvPayload::kQuantized;
  view.quantized.scheme = KvQuantScheme::kTurboQuant;
  EXPECT_DEATH(write_kv(view, q.view(), q.view()), "only explicit and FP8 K/V pages are written");
  view.quantized.scheme = KvQuantScheme::kKivi;
  EXPECT_DEATH(write_kv(view, q.view(), q.view()), "KIVI bits 0");
}

}  // namespace
}  // namespace se
