// The KIVI stores (kivi2, kivi4) on the GPU against the CPU's: two KiviCacheManagers, one over a CPU pool (f32 window
// rows) and one over a GPU pool (bf16 window rows, its views mirrored to the device as the engine mirrors them), run
// the same steps on the same bf16-representable K/V rows. After every step the GPU's quantized groups (key codes,
// scales and minima of every flushed group, value codes, scales and minima of every flushed token) are the CPU's byte
// for byte and its window rows hold the same values, and the tiled attention's KIVI variant over the device pages
// matches the CPU's KIVI attention over its pages to bf16 tolerance: ragged batches mixing decode rows with chunked
// prefill (a chunk reads earlier chunks' groups and the window), GQA 1, 4 and 8, head_dim 64, 128 and 256, windows
// partly full, several flushed groups. Under a compress-after method's held prompt, attention_scores over the window
// (bf16 tolerance) and evict_streams' row moves match too, and the kept tokens flush into the same bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "backend/quant/quantized_kv_layout.h"
#include "cuda_test_util.h"
#include "sparse/attention_view_mirror.h"
#include "sparse/kivi_cache_manager.h"

namespace se {
namespace {

struct KiviCase {
  std::string name;
  KvStoreKind store;
  int32_t num_kv_heads, group, head_dim, residual;
  // Steps: each lists the new tokens of sequences 0, 1, ... (0: the sequence sits the step out).
  std::vector<std::vector<int32_t>> steps;
};

constexpr int32_t kKeyGroup = 32;
constexpr int32_t kMaxStep = 512;

// The same KIVI store on both devices, driven in lockstep.
class KiviPair {
 public:
  KiviPair(const KiviCase& c, int32_t num_pages, bool hold_prompts) : c_(c), mirror_(Device::kCuda) {
    auto layout = [&](Device device) {
      return make_kv_layout(1, c.num_kv_heads, c.head_dim, 16, device, c.store, kKeyGroup, c.residual, kMaxStep);
    };
    auto cpu = KiviCacheManager::create(layout(Device::kCpu), num_pages, cpu_allocator(), hold_prompts);
    auto gpu = KiviCacheManager::create(layout(Device::kCuda), num_pages, cuda::cuda_allocator(), hold_prompts);
    SE_CHECK(cpu.is_ok() && gpu.is_ok(), "kivi pair: {} / {}", cpu.status().to_string(), gpu.status().to_string());
    cpu_ = std::move(*cpu);
    gpu_ = std::move(*gpu);
  }

  KiviCacheManager& cpu() { return *cpu_; }
  KiviCacheManager& gpu() { return *gpu_; }

  void open(int32_t seq, int32_t prompt_tokens) {
    const std::vector<int32_t> prompt(static_cast<size_t>(prompt_tokens), 1);
    ASSERT_TRUE(cpu_->open(seq, prompt).is_ok());
    ASSERT_TRUE(gpu_->open(seq, prompt).is_ok());
  }

  // One forward: reserves the batch's new tokens, writes random K/V rows on both devices and attends; returns the
  // relative error of the GPU's attention output against the CPU's (q, out bf16 on the GPU).
  double forward(const ForwardBatch& batch, uint64_t seed) {
    for (const SequenceSlice& s : batch.sequences) {
      EXPECT_TRUE(cpu_->reserve(s.seq, s.num_tokens).is_ok());
      EXPECT_TRUE(gpu_->reserve(s.seq, s.num_tokens).is_ok());
    }
    const int64_t rows = batch.num_tokens(), heads = int64_t{c_.num_kv_heads} * c_.group;
    const Tensor k = test::random_host({rows, c_.num_kv_heads, c_.head_dim}, seed, DType::kBF16);
    const Tensor v = test::random_host({rows, c_.num_kv_heads, c_.head_dim}, seed + 1, DType::kBF16, 2.0f);
    const Tensor q = test::random_host({rows, heads, c_.head_dim}, seed + 2, DType::kBF16);
    AttentionParams params;
    params.scale = 1.0f / std::sqrt(static_cast<float>(c_.head_dim));

    const AttentionView cpu_view = cpu_->build_view(0, batch);
    write_kv(cpu_view, k.view(), v.view());
    Tensor want = Tensor::empty(DType::kF32, {rows, heads, c_.head_dim});
    paged_attention(want.view(), q.view(), cpu_view, params);

    mirror_.upload(*gpu_, batch);
    const AttentionView gpu_view = mirror_.device_view(0, gpu_->build_view(0, batch));
    write_kv(gpu_view, test::upload(k, DType::kBF16).view(), test::upload(v, DType::kBF16).view());
    Tensor got = test::poisoned(DType::kBF16, {rows, heads, c_.head_dim});
    paged_attention(got.view(), test::upload(q, DType::kBF16).view(), gpu_view, params);
    return test::relative_error(test::download_f32(got), want);
  }

  void computed(int32_t seq) {
    cpu_->on_computed(seq, {}, cpu_->num_logical_tokens(seq));
    gpu_->on_computed(seq, {}, gpu_->num_logical_tokens(seq));
    EXPECT_TRUE(cpu_->check_integrity().is_ok());
    EXPECT_TRUE(gpu_->check_integrity().is_ok());
  }

  // Differences between the two stores of sequence `seq`: its counts, every flushed key group's and value's bytes and
  // every window row's values. The devices' windows hold different numbers of rows per page (f32 and bf16), so each
  // side is read through its own page lists. Prints the first few.
  int64_t count_mismatches(int32_t seq) {
    const AttentionView a = cpu_->build_sequence_view(seq, 0);
    const AttentionView b = gpu_->build_sequence_view(seq, 0);
    const KiviPageLayout layout =
        kivi_page_layout(a.quantized.group_size, a.quantized.value_group_size, a.head_dim, a.quantized.bits);
    const size_t pool_bytes = static_cast<size_t>(gpu_->num_total_pages()) * layout.page_bytes;
    std::vector<char> gpu_pool(pool_bytes);
    copy_bytes(Device::kCuda, gpu_pool.data(), b.kv_base, pool_bytes);
    const char* cpu_pool = static_cast<const char*>(a.kv_base);
    int64_t mismatches = 0;
    auto report = [&](bool equal, const std::string& what) {
      if (equal) return;
      if (mismatches++ < 5) std::printf("KIVI mismatch sequence %d: %s\n", seq, what.c_str());
    };
    // Bytes [offset, offset + n) of CPU page `page_a` and GPU page `page_b`.
    auto bytes_equal = [&](int32_t page_a, int32_t page_b, size_t offset, size_t n) {
      return std::memcmp(cpu_pool + static_cast<size_t>(page_a) * layout.page_bytes + offset,
                         gpu_pool.data() + static_cast<size_t>(page_b) * layout.page_bytes + offset, n) == 0;
    };
    const KiviSeqView& ka = a.quantized.kivi_seqs[0];
    const KiviSeqView& kb = b.quantized.kivi_seqs[0];
    const int32_t group = a.quantized.group_size;
    for (int32_t h = 0; h < a.num_kv_heads; ++h) {
      const int32_t len = a.seqs[0].num_tokens[h], keys = ka.num_quantized_keys[h], values = ka.num_quantized_values[h];
      report(len == b.seqs[0].num_tokens[h] && keys == kb.num_quantized_keys[h] && values == kb.num_quantized_values[h],
             "counts of head " + std::to_string(h));
      if (mismatches > 0) return mismatches;
      const int32_t* pages_a = a.seqs[0].page_ids + static_cast<int64_t>(h) * a.seqs[0].stride;
      const int32_t* pages_b = b.seqs[0].page_ids + static_cast<int64_t>(h) * b.seqs[0].stride;
      for (int32_t g = 0; g * group < keys; ++g) {
        const std::string where = " of head " + std::to_string(h) + " group " + std::to_string(g);
        report(bytes_equal(pages_a[g], pages_b[g], layout.key_codes, layout.value_codes - layout.key_codes),
               "key codes" + where);
        report(bytes_equal(pages_a[g], pages_b[g], layout.key_scale, layout.value_scale - layout.key_scale),
               "key scales and minima" + where);
      }
      const size_t code_bytes = static_cast<size_t>(layout.value_words) * sizeof(uint32_t);
      const size_t param_bytes = static_cast<size_t>(layout.value_groups) * sizeof(uint16_t);
      for (int32_t j = 0; j < values; ++j) {
        const int32_t page_a = pages_a[j / group], page_b = pages_b[j / group];
        const size_t t = static_cast<size_t>(j % group);
        const std::string where = " of head " + std::to_string(h) + " token " + std::to_string(j);
        report(bytes_equal(page_a, page_b, layout.value_codes + t * code_bytes, code_bytes), "value codes" + where);
        report(bytes_equal(page_a, page_b, layout.value_scale + t * param_bytes, param_bytes) &&
                   bytes_equal(page_a, page_b, layout.value_min + t * param_bytes, param_bytes),
               "value scale and minimum" + where);
      }
      // The window's rows: the CPU's f32 values are bf16 values, so the GPU's bf16 rows hold them exactly.
      const int32_t* window_a = ka.residual.page_ids + static_cast<int64_t>(h) * ka.residual.stride;
      const int32_t* window_b = kb.residual.page_ids + static_cast<int64_t>(h) * kb.residual.stride;
      for (int32_t j = values; j < len; ++j) {
        const int32_t slot_a = j - values + ka.residual_first_slot[h], slot_b = j - values + kb.residual_first_slot[h];
        const int32_t page_b = window_b[slot_b / b.page_size], offset_b = slot_b % b.page_size;
        for (int kv = 0; kv < 2; ++kv) {
          const float* want = a.element<const float>(window_a[slot_a / a.page_size], kv, slot_a % a.page_size);
          const auto* got = reinterpret_cast<const uint16_t*>(
              gpu_pool.data() + static_cast<size_t>(page_b) * layout.page_bytes +
              (static_cast<size_t>(kv) * b.page_size + static_cast<size_t>(offset_b)) * b.head_dim * sizeof(uint16_t));
          bool equal = true;
          for (int32_t d = 0; d < a.head_dim; ++d) equal = equal && bf16_to_f32(got[d]) == want[d];
          report(equal, (kv == 0 ? "window key" : "window value") + std::string(" of head ") + std::to_string(h) +
                            " token " + std::to_string(j));
        }
      }
    }
    return mismatches;
  }

 private:
  const KiviCase& c_;
  std::unique_ptr<KiviCacheManager> cpu_, gpu_;
  AttentionViewMirror mirror_;
};

// A batch of the step's sequences with their new token counts (positions follow each sequence's length).
ForwardBatch make_batch(KiviPair& pair, const std::vector<int32_t>& new_tokens) {
  ForwardBatch batch;
  for (size_t s = 0; s < new_tokens.size(); ++s) {
    const int32_t n = new_tokens[s];
    if (n == 0) continue;
    const auto seq = static_cast<int32_t>(s);
    const int32_t before = pair.cpu().num_logical_tokens(seq);
    batch.sequences.push_back({seq, batch.num_tokens(), n});
    for (int32_t i = 0; i < n; ++i) {
      batch.token_ids.push_back(1);
      batch.positions.push_back(before + i);
    }
  }
  return batch;
}

std::vector<KiviCase> kivi_cases() {
  const KvStoreKind k2 = KvStoreKind::kKivi2, k4 = KvStoreKind::kKivi4;
  std::vector<KiviCase> cases;
  // Decode over a window partly full, then past several flushes (R = 32: a key group every 32 tokens).
  cases.push_back({"kivi4 decode g4 d128 R32",
                   k4,
                   2,
                   4,
                   128,
                   32,
                   {{40, 7, 1}, {1, 1, 1}, {1, 1, 1}, {30, 1, 1}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}}});
  cases.push_back({"kivi2 decode g8 d128 R64", k2, 2, 8, 128, 64, {{130, 3}, {1, 1}, {1, 1}, {70, 1}, {1, 1}}});
  cases.push_back({"kivi2 decode g1 d64 R32", k2, 4, 1, 64, 32, {{100, 33, 1}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}}});
  // Chunked prefill: each chunk reads the earlier chunks' groups and the window, beside decode rows.
  cases.push_back({"kivi4 chunks g4 d128 R32", k4, 2, 4, 128, 32, {{64, 5}, {64, 1}, {100, 1}, {7, 1}, {1, 1}}});
  cases.push_back({"kivi2 chunks g8 d64 R64", k2, 1, 8, 64, 64, {{200}, {150}, {1}, {129}, {1}}});
  cases.push_back({"kivi4 ragged g1 d256 R32", k4, 2, 1, 256, 32, {{90, 1, 33}, {1, 70, 1}, {1, 1, 64}, {1, 1, 1}}});
  cases.push_back({"kivi2 long decode g4 d128 R128", k2, 8, 4, 128, 128, {{512, 512}, {512, 300}, {1, 1}, {1, 1}}});
  return cases;
}

TEST(CudaKiviKvStoreTest, WritesTheCpuBytesAndAttendsLikeTheCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 9000;
  for (const KiviCase& c : kivi_cases()) {
    KiviPair pair(c, 8192, /*hold_prompts=*/false);
    const size_t num_seqs = c.steps.front().size();
    for (size_t s = 0; s < num_seqs; ++s) pair.open(static_cast<int32_t>(s), 0);
    double worst = 0.0;
    for (size_t i = 0; i < c.steps.size(); ++i) {
      const ForwardBatch batch = make_batch(pair, c.steps[i]);
      const double err = pair.forward(batch, seed += 10);
      worst = std::max(worst, err);
      EXPECT_LT(err, test::tolerance(DType::kBF16)) << c.name << " step " << i;
      for (const SequenceSlice& s : batch.sequences) pair.computed(s.seq);
      for (size_t s = 0; s < num_seqs; ++s)
        EXPECT_EQ(pair.count_mismatches(static_cast<int32_t>(s)), 0) << c.name << " step " << i << " sequence " << s;
    }
    std::printf("PARITY kivi %-32s rel_err %.3e\n", c.name.c_str(), worst);
  }
}

// A compress-after method's prompt, held at full precision: scored over the window on the GPU, evicted by moving the
// kept rows on the device, then flushed from the kept tokens only; decode continues as KIVI.
TEST(CudaKiviKvStoreTest, HeldPromptScoresAndEvictsLikeTheCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  const KiviCase c{"kivi4 held prompt g4 d128 R32", KvStoreKind::kKivi4, 2, 4, 128, 32, {}};
  KiviPair pair(c, 4096, /*hold_prompts=*/true);
  const int32_t prompt = 150, chunk = 64;
  pair.open(0, prompt);
  uint64_t seed = 9500;
  for (int32_t done = 0; done < prompt; done += chunk) {
    const int32_t n = std::min(chunk, prompt - done);
    EXPECT_LT(pair.forward(make_batch(pair, {n}), seed += 10), test::tolerance(DType::kBF16)) << "chunk at " << done;
    if (done + n < prompt) pair.computed(0);  // the last chunk is scored and evicted before it is reported
  }
  // Scores of the prompt's last 8 rows over its window, as SnapKV reads them.
  const int32_t heads = c.num_kv_heads * c.group, rows = 8;
  const Tensor q = test::random_host({rows, heads, c.head_dim}, 9600, DType::kBF16);
  AttentionParams params;
  params.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  Tensor want = Tensor::empty(DType::kF32, {heads, prompt});
  Tensor got = Tensor::empty(DType::kF32, {heads, prompt});
  attention_scores(want.view(), q.view(), pair.cpu().build_sequence_view(0, 0), 0, params, ScoreReduce::kSum);
  attention_scores(got.view(), test::upload(q, DType::kBF16).view(), pair.gpu().build_sequence_view(0, 0), 0, params,
                   ScoreReduce::kSum);
  const double err = test::relative_error(got, want);
  std::printf("PARITY kivi attention_scores over a held window rel_err %.3e\n", err);
  EXPECT_LT(err, test::tolerance(DType::kBF16));
  // Each KV head keeps its own tokens (streams of unequal lengths), then the prompt is reported and flushes.
  std::vector<std::vector<int32_t>> kept(static_cast<size_t>(c.num_kv_heads));
  std::vector<KvStreams::StreamEviction> evictions;
  for (int32_t h = 0; h < c.num_kv_heads; ++h) {
    for (int32_t j = h; j < prompt; j += 2 + h) kept[static_cast<size_t>(h)].push_back(j);
    evictions.push_back(KvStreams::StreamEviction{0, h, kept[static_cast<size_t>(h)]});
  }
  ASSERT_TRUE(pair.cpu().evict_streams(0, evictions).is_ok());
  ASSERT_TRUE(pair.gpu().evict_streams(0, evictions).is_ok());
  pair.computed(0);
  EXPECT_EQ(pair.count_mismatches(0), 0) << "after the eviction's flush";
  for (int i = 0; i < 40; ++i) {
    EXPECT_LT(pair.forward(make_batch(pair, {1}), seed += 10), test::tolerance(DType::kBF16)) << "decode " << i;
    pair.computed(0);
  }
  EXPECT_EQ(pair.count_mismatches(0), 0) << "after decoding";
}

}  // namespace
}  // namespace se
