// Parity of the CUDA twins of the KV-eviction methods' ops (attention_scores, subset_attention_max_scores,
// compact_kv) with the CPU reference, under the methods' contract: host tables, a device bf16 pool, q on the
// device, scores written to host memory. The CPU pool holds the GPU's bf16 values as f32, so the scores differ only
// in fp32 accumulation order. Pages are shuffled across the pool, every page (used or not) holds random data, and
// streams of one sequence have unequal lengths, as after per-head eviction. The scored sequence is not the view's
// first. Outputs are NaN-poisoned before each call.
//
// Score bound: per element |gpu - cpu| <= 1e-3 |cpu|, and exactly the same zeros. Both sides compute fp32 logits
// from the same bf16 keys and q; they differ in the order of the head_dim products (about 1e-6 of a logit) and of
// the softmax sums, so probabilities agree to ~1e-5 relative. 1e-3 keeps a wide margin over that while still
// failing on a visibility mistake: a key shown to one row too many or too few moves its sum over <= 64 rows by more
// than 1e-3, and a key no row may see must be exactly 0. compact_kv is bit-exact over the whole pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "cuda_test_util.h"

namespace se {
namespace {

using test::random_host;
using test::upload;

enum class Selection { kNone, kTokens, kPages };

// One paged cache in two copies: f32 pages on the host for the CPU reference and the same values as bf16 pages on
// the GPU, described by one set of host tables that both views share. lens[s][h] = tokens of sequence s, KV head h.
class EvictionCache {
 public:
  EvictionCache(int32_t page_size, int32_t num_kv_heads, int32_t head_dim, std::vector<std::vector<int32_t>> lens,
                uint64_t seed)
      : page_size_(page_size), num_kv_heads_(num_kv_heads), head_dim_(head_dim), lens_(std::move(lens)) {
    const auto num_seqs = static_cast<int32_t>(lens_.size());
    int64_t pages_needed = 0;
    for (const auto& seq : lens_) {
      const int32_t longest = *std::max_element(seq.begin(), seq.end());
      strides_.push_back((longest + page_size - 1) / page_size + 1);  // a spare page per stream
      pages_needed += int64_t{strides_.back()} * num_kv_heads;
    }
    num_pages_ = static_cast<int32_t>(pages_needed + 5);  // some pages belong to no stream
    std::vector<int32_t> free_pages(static_cast<size_t>(num_pages_));
    std::iota(free_pages.begin(), free_pages.end(), 0);
    std::shuffle(free_pages.begin(), free_pages.end(), std::mt19937_64(seed));
    size_t next_free = 0;
    for (int32_t s = 0; s < num_seqs; ++s) {
      std::vector<int32_t> pages;
      for (int32_t i = 0; i < strides_[s] * num_kv_heads; ++i) pages.push_back(free_pages[next_free++]);
      page_ids_.push_back(std::move(pages));
      selected_.emplace_back();
      num_selected_.emplace_back(static_cast<size_t>(num_kv_heads), 0);
    }
    for (int32_t s = 0; s <= num_seqs; ++s) q_indptr_.push_back(s);  // unused by these ops
    elems_per_page_ = int64_t{2} * page_size * head_dim;
    cpu_pool_ = random_host({num_pages_, elems_per_page_}, seed + 1, DType::kBF16);
    gpu_pool_ = upload(cpu_pool_, DType::kBF16);
    seqs_.resize(static_cast<size_t>(num_seqs));
    for (int32_t s = 0; s < num_seqs; ++s)
      seqs_[s] = SeqKvView{page_ids_[s].data(), strides_[s], lens_[s].data()};
  }

  int32_t length(int32_t seq, int32_t head) const { return lens_[seq][head]; }
  int32_t max_length(int32_t seq) const { return *std::max_element(lens_[seq].begin(), lens_[seq].end()); }
  void set_length(int32_t seq, int32_t head, int32_t len) { lens_[seq][head] = len; }

  // Restricts what each KV head of `seq` exposes: roughly every other token or page, picked at random.
  void select(int32_t seq, Selection what, uint64_t seed) {
    if (what == Selection::kNone) return;
    selection_unit_ = what == Selection::kPages ? SelectionUnit::kPage : SelectionUnit::kToken;
    std::mt19937_64 rng(seed);
    std::vector<std::vector<int32_t>> lists;
    size_t stride = 1;
    for (int32_t h = 0; h < num_kv_heads_; ++h) {
      const int32_t units = what == Selection::kPages ? (lens_[seq][h] + page_size_ - 1) / page_size_ : lens_[seq][h];
      std::vector<int32_t> list;
      for (int32_t u = 0; u < units; ++u)
        if (rng() % 2 == 0) list.push_back(u);
      stride = std::max(stride, list.size());
      lists.push_back(std::move(list));
    }
    selected_[seq].assign(stride * num_kv_heads_, 0);
    for (int32_t h = 0; h < num_kv_heads_; ++h) {
      std::copy(lists[h].begin(), lists[h].end(), selected_[seq].begin() + static_cast<int64_t>(h) * stride);
      num_selected_[seq][h] = static_cast<int32_t>(lists[h].size());
    }
    seqs_[seq].selected = selected_[seq].data();
    seqs_[seq].selected_stride = static_cast<int32_t>(stride);
    seqs_[seq].num_selected = num_selected_[seq].data();
    has_selection_ = true;
  }

  AttentionView cpu_view() const {
    AttentionView v = common();
    v.kv_base = cpu_pool_.raw();
    v.kv_device = Device::kCpu;
    v.kv_dtype = DType::kF32;
    v.page_bytes = static_cast<size_t>(elems_per_page_) * sizeof(float);
    return v;
  }
  AttentionView gpu_view() const {
    AttentionView v = common();
    v.kv_base = gpu_pool_.raw();
    v.kv_device = Device::kCuda;
    v.kv_dtype = DType::kBF16;
    v.page_bytes = static_cast<size_t>(elems_per_page_) * 2;
    return v;
  }

  // The CPU pool's K (kv 0) or V row of token `token` of stream (seq, head).
  const float* cpu_row(const Tensor& pool, int32_t seq, int32_t head, int32_t token, int kv) const {
    const int32_t page = page_ids_[seq][static_cast<size_t>(head) * strides_[seq] + token / page_size_];
    return pool.data<float>() + page * elems_per_page_ + (int64_t{kv} * page_size_ + token % page_size_) * head_dim_;
  }
  const Tensor& cpu_pool() const { return cpu_pool_; }

  // Pool elements whose bits differ between the GPU's bf16 pages and the CPU's f32 pages (every page, not only the
  // streams' live slots).
  int64_t count_pool_mismatches() const {
    const Tensor gpu = cuda::to_host(gpu_pool_);
    const auto* bits = gpu.data<uint16_t>();
    int64_t mismatches = 0;
    for (int64_t i = 0; i < gpu.numel(); ++i) mismatches += bits[i] != f32_to_bf16(cpu_pool_.data<float>()[i]);
    return mismatches;
  }

 private:
  AttentionView common() const {
    AttentionView v;
    v.page_size = page_size_;
    v.head_dim = head_dim_;
    v.num_kv_heads = num_kv_heads_;
    v.num_seqs = static_cast<int32_t>(seqs_.size());
    v.q_indptr = q_indptr_.data();
    v.seqs = seqs_.data();
    v.selection_unit = selection_unit_;
    v.has_selection = has_selection_;
    return v;
  }

  int32_t page_size_, num_kv_heads_, head_dim_;
  int32_t num_pages_ = 0;
  int64_t elems_per_page_ = 0;
  std::vector<std::vector<int32_t>> lens_, page_ids_, selected_, num_selected_;
  std::vector<int32_t> strides_, q_indptr_;
  std::vector<SeqKvView> seqs_;
  SelectionUnit selection_unit_ = SelectionUnit::kToken;
  bool has_selection_ = false;
  Tensor cpu_pool_, gpu_pool_;
};

// A host F32 output full of NaN: every element the op leaves unwritten shows.
Tensor poisoned_host(Shape shape) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  std::fill(t.data<float>(), t.data<float>() + t.numel(), std::numeric_limits<float>::quiet_NaN());
  return t;
}

struct Agreement {
  double max_rel = 0.0;       // over elements nonzero on both sides
  int64_t zero_mismatches = 0;  // zero on one side only
  int64_t non_finite = 0;
};

Agreement compare_scores(const Tensor& got, const Tensor& ref) {
  Agreement a;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.data<float>()[i];
    const double r = ref.data<float>()[i];
    if (!std::isfinite(g)) {
      ++a.non_finite;
    } else if ((g == 0.0) != (r == 0.0)) {
      ++a.zero_mismatches;
    } else if (r != 0.0) {
      a.max_rel = std::max(a.max_rel, std::abs(g - r) / std::abs(r));
    }
  }
  return a;
}

void expect_agreement(const Tensor& got, const Tensor& ref, const char* op, const std::string& name, double ms) {
  const Agreement a = compare_scores(got, ref);
  std::printf("PARITY %-27s %-44s max_rel %.3e  zero_mismatch %lld  gpu %.2f ms\n", op, name.c_str(), a.max_rel,
              static_cast<long long>(a.zero_mismatches), ms);
  EXPECT_EQ(a.non_finite, 0) << name;
  EXPECT_EQ(a.zero_mismatches, 0) << name;
  EXPECT_LT(a.max_rel, 1e-3) << name;
}

double elapsed_ms(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// --- attention_scores ---

struct ScoresCase {
  std::string name;
  int32_t page_size, num_kv_heads, group, head_dim;
  std::vector<int32_t> lens;  // per KV head of the scored sequence
  int32_t num_rows;
  int32_t window = 0;
  float softcap = 0.0f;
  float logit_scale = 1.0f;  // times 1/sqrt(D); larger = peakier softmax
  ScoreReduce reduce = ScoreReduce::kSum;
  DType q_dtype = DType::kBF16;
  Selection selection = Selection::kNone;
};

AttentionParams params_for(int32_t head_dim, float logit_scale, int32_t window, float softcap) {
  AttentionParams p;
  p.scale = logit_scale / std::sqrt(static_cast<float>(head_dim));
  p.sliding_window = window;
  p.logit_softcap = softcap;
  return p;
}

// Sequence 0 is a decoy with other lengths; sequence 1 is scored.
std::vector<std::vector<int32_t>> with_decoy(const std::vector<int32_t>& lens) {
  std::vector<int32_t> decoy;
  for (size_t h = 0; h < lens.size(); ++h) decoy.push_back(static_cast<int32_t>(17 + 3 * h));
  return {decoy, lens};
}

// Scores sequence `seq` of `cache` on both backends and checks them.
void check_scores(const EvictionCache& cache, int32_t seq, const ScoresCase& c, uint64_t seed) {
  const int64_t heads = int64_t{c.num_kv_heads} * c.group;
  const Tensor q = random_host({c.num_rows, heads, c.head_dim}, seed, c.q_dtype);
  const AttentionParams params = params_for(c.head_dim, c.logit_scale, c.window, c.softcap);
  const int32_t max_len = cache.max_length(seq);
  Tensor ref = poisoned_host({heads, max_len});
  attention_scores(ref.view(), q.view(), cache.cpu_view(), seq, params, c.reduce);
  const Tensor q_dev = upload(q, c.q_dtype);
  Tensor got = poisoned_host({heads, max_len});
  attention_scores(got.view(), q_dev.view(), cache.gpu_view(), seq, params, c.reduce);  // warm-up (first launch)
  got = poisoned_host({heads, max_len});
  const auto start = std::chrono::steady_clock::now();
  attention_scores(got.view(), q_dev.view(), cache.gpu_view(), seq, params, c.reduce);
  expect_agreement(got, ref, "attention_scores", c.name, elapsed_ms(start));
}

std::vector<ScoresCase> scores_cases() {
  using R = ScoreReduce;
  std::vector<ScoresCase> cases;
  cases.push_back({"decode len 1 ps16 g1 d64", 16, 1, 1, 64, {1}, 1});
  cases.push_back({"decode ragged ps16 g4 d128", 16, 2, 4, 128, {3000, 2501}, 1});
  cases.push_back({"h2o decode 32K ps64 g8 d128 f32", 64, 2, 8, 128, {32768, 30001}, 1, 0, 0.0f, 1.0f, R::kSum,
                   DType::kF32});
  cases.push_back({"snapkv 64 rows 8K ps16 g4 d128", 16, 2, 4, 128, {8192, 8192}, 64});
  cases.push_back({"snapkv 64 rows 32K ragged ps64 g4 d128", 64, 2, 4, 128, {32768, 20000}, 64});
  cases.push_back({"8 rows softcap ps64 g8 d256", 64, 1, 8, 256, {5000}, 8, 0, 2.0f, 3.0f});
  cases.push_back({"max 32 rows ragged ps16 g1 d64", 16, 4, 1, 64, {700, 650, 123, 64}, 32, 0, 0.0f, 1.0f, R::kMax});
  cases.push_back({"window 100 x 64 rows ps16 g4 d128", 16, 2, 4, 128, {2000, 1800}, 64, 100});
  cases.push_back({"window 4K decode 32K softcap ps16 g4 d256", 16, 1, 4, 256, {32768}, 1, 4096, 50.0f});
  cases.push_back({"h2o prefill 200 rows ps16 g4 d128", 16, 2, 4, 128, {600, 600}, 200});
  cases.push_back({"h2o prefill 150 rows max window ps64 g8 d64", 64, 1, 8, 64, {150}, 150, 50, 0.0f, 1.0f, R::kMax,
                   DType::kF32});
  cases.push_back({"group 6 x 10 rows max ps64 d128", 64, 2, 6, 128, {1000, 999}, 10, 0, 0.0f, 1.0f, R::kMax});
  cases.push_back({"heads shorter than rows ps16 g4 d64", 16, 4, 4, 64, {300, 5, 1, 64}, 8});
  cases.push_back({"token selection ps16 g4 d128", 16, 2, 4, 128, {3000, 2000}, 8, 0, 0.0f, 1.0f, R::kSum,
                   DType::kBF16, Selection::kTokens});
  cases.push_back({"page selection window max ps64 g8 d128", 64, 2, 8, 128, {5000, 4000}, 4, 1000, 0.0f, 1.0f,
                   R::kMax, DType::kF32, Selection::kPages});
  cases.push_back({"peaky 64 rows 16K ps64 g8 d64 f32", 64, 1, 8, 64, {16384}, 64, 0, 0.0f, 4.0f, R::kSum,
                   DType::kF32});
  return cases;
}

TEST(CudaEvictionOpsTest, AttentionScoresMatchCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 5000;
  for (const ScoresCase& c : scores_cases()) {
    SCOPED_TRACE(c.name);
    EvictionCache cache(c.page_size, c.num_kv_heads, c.head_dim, with_decoy(c.lens), seed += 10);
    cache.select(1, c.selection, seed + 1);
    check_scores(cache, 1, c, seed + 2);
  }
}

// --- subset_attention_max_scores ---

struct SubsetCase {
  std::string name;
  int32_t page_size, num_kv_heads, group, head_dim;
  std::vector<int32_t> lens;  // per KV head, each >= begin + num_range + num_rows
  int32_t num_rows, num_sink, begin, num_range;
  float softcap = 0.0f;
  float logit_scale = 1.0f;
  DType q_dtype = DType::kBF16;
};

std::vector<SubsetCase> subset_cases() {
  std::vector<SubsetCase> cases;
  cases.push_back({"kvzip chunk 2048 x 300 rows ps16 g4 d128", 16, 2, 4, 128, {4000, 3900}, 300, 4, 1000, 2048});
  cases.push_back({"first chunk 64 rows ps64 g8 d64", 64, 2, 8, 64, {2600, 2600}, 64, 4, 4, 2048});
  cases.push_back({"one row softcap ps16 g1 d256 f32", 16, 1, 1, 256, {500}, 1, 0, 0, 100, 2.0f, 3.0f, DType::kF32});
  cases.push_back({"70 rows g6 range 37 ps16 d128", 16, 2, 6, 128, {1200, 1500}, 70, 2, 300, 37});
  cases.push_back({"1000 rows ps64 g4 d128 softcap", 64, 1, 4, 128, {5000}, 1000, 4, 2000, 2000, 50.0f});
  return cases;
}

TEST(CudaEvictionOpsTest, SubsetAttentionMaxScoresMatchCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 6000;
  for (const SubsetCase& c : subset_cases()) {
    SCOPED_TRACE(c.name);
    EvictionCache cache(c.page_size, c.num_kv_heads, c.head_dim, with_decoy(c.lens), seed += 10);
    const int64_t heads = int64_t{c.num_kv_heads} * c.group;
    const Tensor q = random_host({c.num_rows, heads, c.head_dim}, seed + 1, c.q_dtype);
    const AttentionParams params = params_for(c.head_dim, c.logit_scale, 0, c.softcap);
    Tensor ref = poisoned_host({c.num_kv_heads, c.num_range});
    subset_attention_max_scores(ref.view(), q.view(), cache.cpu_view(), 1, c.num_sink, c.begin, params);
    const Tensor q_dev = upload(q, c.q_dtype);
    Tensor got = poisoned_host({c.num_kv_heads, c.num_range});
    subset_attention_max_scores(got.view(), q_dev.view(), cache.gpu_view(), 1, c.num_sink, c.begin, params);
    got = poisoned_host({c.num_kv_heads, c.num_range});
    const auto start = std::chrono::steady_clock::now();
    subset_attention_max_scores(got.view(), q_dev.view(), cache.gpu_view(), 1, c.num_sink, c.begin, params);
    expect_agreement(got, ref, "subset_attention_max_scores", c.name, elapsed_ms(start));
  }
}

// --- compact_kv ---

// A kept list for a stream of `len` tokens, in one of the shapes the methods produce.
std::vector<int32_t> kept_for(int32_t len, int shape, std::mt19937_64& rng) {
  std::vector<int32_t> kept;
  switch (shape % 5) {
    case 0:  // SnapKV-like: a scattered prefix selection plus the whole observation window
      for (int32_t j = 0; j < len; ++j)
        if (j >= len - 32 || rng() % 4 == 0) kept.push_back(j);
      break;
    case 1:  // an in-place prefix (sinks), then a sparse tail
      for (int32_t j = 0; j < len; ++j)
        if (j < std::min(len, 100) || rng() % 3 == 0) kept.push_back(j);
      break;
    case 2:  // everything: nothing moves
      for (int32_t j = 0; j < len; ++j) kept.push_back(j);
      break;
    case 3:  // nothing kept
      break;
    default:  // H2O-like: drop one token
      for (int32_t j = 0; j < len; ++j)
        if (j != len / 2) kept.push_back(j);
      break;
  }
  return kept;
}

// The first kept.size() heads of sequence `seq` of `view`, head h keeping kept[h].
std::vector<StreamCompaction> streams_of(const AttentionView& view, int32_t seq,
                                         const std::vector<std::vector<int32_t>>& kept) {
  std::vector<StreamCompaction> streams;
  const SeqKvView& sv = view.seqs[seq];
  for (size_t h = 0; h < kept.size(); ++h)
    streams.push_back(StreamCompaction{sv.page_ids + static_cast<int64_t>(h) * sv.stride, kept[h]});
  return streams;
}

struct CompactCase {
  std::string name;
  int32_t page_size, num_kv_heads, head_dim;
  std::vector<int32_t> lens;
};

TEST(CudaEvictionOpsTest, CompactKvIsBitExactAndTouchesNothingElse) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  const std::vector<CompactCase> cases = {
      {"ps16 d128 ragged", 16, 4, 128, {1000, 777, 1, 33}},
      {"ps64 d64 32K", 64, 2, 64, {32768, 30000}},
      {"ps16 d256", 16, 2, 256, {5000, 4097}},
      {"ps64 d128 short streams", 64, 5, 128, {64, 65, 2, 130, 200}},
      {"ps16 d64 rows past one scratch piece", 16, 6, 64, {50000, 50000}},
  };
  uint64_t seed = 7000;
  int shape = 0;
  for (const CompactCase& c : cases) {
    SCOPED_TRACE(c.name);
    EvictionCache cache(c.page_size, c.num_kv_heads, c.head_dim, with_decoy(c.lens), seed += 10);
    std::mt19937_64 rng(seed);
    const Tensor before = cache.cpu_pool().to_f32();  // a copy of every page
    // Every head of sequence 1 in one call, as the methods evict.
    std::vector<std::vector<int32_t>> kept;
    for (int32_t h = 0; h < c.num_kv_heads; ++h) kept.push_back(kept_for(cache.length(1, h), shape++, rng));
    compact_kv(cache.cpu_view(), streams_of(cache.cpu_view(), 1, kept));
    compact_kv(cache.gpu_view(), streams_of(cache.gpu_view(), 1, kept));
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {
      // The reference did what the contract says: slot i holds what token kept[i] held.
      const std::vector<int32_t>& head = kept[static_cast<size_t>(h)];
      for (size_t i = 0; i < head.size(); ++i)
        for (int kv = 0; kv < 2; ++kv)
          ASSERT_EQ(std::memcmp(cache.cpu_row(cache.cpu_pool(), 1, h, static_cast<int32_t>(i), kv),
                                cache.cpu_row(before, 1, h, head[i], kv), sizeof(float) * c.head_dim),
                    0)
              << "head " << h << " slot " << i;
      cache.set_length(1, h, static_cast<int32_t>(head.size()));
    }
    // One stream of the other sequence too (its first head, every third token).
    std::vector<int32_t> decoy_kept;
    for (int32_t j = 0; j < cache.length(0, 0); j += 3) decoy_kept.push_back(j);
    const std::vector<std::vector<int32_t>> decoy = {decoy_kept};
    compact_kv(cache.cpu_view(), streams_of(cache.cpu_view(), 0, decoy));
    compact_kv(cache.gpu_view(), streams_of(cache.gpu_view(), 0, decoy));
    cache.set_length(0, 0, static_cast<int32_t>(decoy_kept.size()));

    // Bit-exact on every page: the moved slots, the slots past each new end, the other streams and free pages.
    const int64_t mismatches = cache.count_pool_mismatches();
    std::printf("PARITY compact_kv                  %-44s pool mismatches %lld\n", c.name.c_str(),
                static_cast<long long>(mismatches));
    EXPECT_EQ(mismatches, 0);

    // Scoring the compacted (now ragged) streams still agrees.
    if (cache.max_length(1) >= 8) {
      const ScoresCase after{c.name + " compacted", c.page_size, c.num_kv_heads, 4, c.head_dim, c.lens, 8};
      check_scores(cache, 1, after, seed + 3);
    }
  }
}

// --- move_kv_rows ---

// StreamingLLM's ring step on every stream of a sequence at once: each stream's last token overwrites one earlier
// slot (a random one per stream), as CacheManager::evict_slots sends it.
TEST(CudaEvictionOpsTest, MoveKvRowsIsBitExactAndTouchesNothingElse) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  const std::vector<CompactCase> cases = {
      {"ps16 d128 8 heads", 16, 8, 128, {2049, 2049, 2049, 2049, 2049, 2049, 2049, 2049}},
      {"ps64 d64 ragged", 64, 3, 64, {65, 2, 700}},
      {"ps16 d256", 16, 2, 256, {33, 17}},
  };
  uint64_t seed = 9000;
  for (const CompactCase& c : cases) {
    SCOPED_TRACE(c.name);
    EvictionCache cache(c.page_size, c.num_kv_heads, c.head_dim, with_decoy(c.lens), seed += 10);
    std::mt19937_64 rng(seed);
    const Tensor before = cache.cpu_pool().to_f32();
    const SeqKvView& sv = cache.cpu_view().seqs[1];
    std::vector<KvRowMove> moves;
    std::vector<int32_t> holes;
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {
      const int32_t last = cache.length(1, h) - 1;
      const int32_t hole = static_cast<int32_t>(rng() % static_cast<uint64_t>(last));  // below the last slot
      const int32_t* pages = sv.page_ids + static_cast<int64_t>(h) * sv.stride;
      moves.push_back(KvRowMove{pages[last / c.page_size], last % c.page_size, pages[hole / c.page_size],
                                hole % c.page_size});
      holes.push_back(hole);
    }
    move_kv_rows(cache.cpu_view(), moves);
    move_kv_rows(cache.gpu_view(), moves);
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {
      const int32_t last = cache.length(1, h) - 1;
      for (int kv = 0; kv < 2; ++kv)
        ASSERT_EQ(std::memcmp(cache.cpu_row(cache.cpu_pool(), 1, h, holes[static_cast<size_t>(h)], kv),
                              cache.cpu_row(before, 1, h, last, kv), sizeof(float) * c.head_dim),
                  0)
            << "head " << h;
      cache.set_length(1, h, last);
    }
    const int64_t mismatches = cache.count_pool_mismatches();
    std::printf("PARITY move_kv_rows                %-44s pool mismatches %lld\n", c.name.c_str(),
                static_cast<long long>(mismatches));
    EXPECT_EQ(mismatches, 0);
  }
}

// The dispatch names what is wrong when a CUDA pool gets a host q or device scores.
TEST(CudaEvictionOpsDeathTest, ScoresWithACudaPoolWantDeviceQAndHostOut) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EvictionCache cache(16, 1, 64, with_decoy({40}), 1);
  const Tensor q = random_host({1, 2, 64}, 2, DType::kBF16);
  const Tensor q_dev = upload(q, DType::kBF16);
  Tensor out = poisoned_host({2, 40});
  EXPECT_DEATH(attention_scores(out.view(), q.view(), cache.gpu_view(), 1, AttentionParams{}, ScoreReduce::kSum),
               "attention_scores.q: expected a CUDA tensor");
  Tensor out_dev = Tensor::empty(DType::kF32, {2, 40}, cuda::cuda_allocator());
  EXPECT_DEATH(
      attention_scores(out_dev.view(), q_dev.view(), cache.gpu_view(), 1, AttentionParams{}, ScoreReduce::kSum),
      "attention_scores.out: expected host f32 memory");
}

}  // namespace
}  // namespace se
