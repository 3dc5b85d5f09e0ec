// The device mirror of a forward's views, run with the CPU as its device (its copies are plain memcpys there):
// after every upload each layer's mirrored view holds the cache's token counts and page lists, while a batch
// decodes across page boundaries and past its regions' room, a table is rewritten by eviction and by
// truncation, sequences trade places, the batch size changes, and a slot starts a new sequence. A steady decode
// keeps the buffer in place, and a batch that changes around a sequence does not send its lists again. The same
// over a KIVI cache, whose group lists take the regions and whose windows and counts travel each forward.
#include "sparse/attention_view_mirror.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <utility>
#include <vector>

#include "backend/step_graph.h"
#include "sparse/kivi_cache_manager.h"
#include "sparse/paged_cache_manager.h"

namespace se {
namespace {

// Entries [0, n) of row h of two page lists.
void expect_same_list(const SeqKvView& got, const SeqKvView& want, int32_t h, int64_t n, const char* what) {
  for (int64_t p = 0; p < n; ++p)
    ASSERT_EQ(got.page_ids[h * got.stride + p], want.page_ids[h * want.stride + p])
        << what << " head " << h << " entry " << p;
}

// One forward of `slices` (sequence, new tokens) on `cache`: reserve, upload, then compare every layer's views.
ForwardBatch mirrored_step(CacheManager& cache, AttentionViewMirror& mirror,
                           const std::vector<std::pair<int32_t, int32_t>>& slices) {
  const KvLayout& l = cache.layout();
  ForwardBatch batch;
  for (const auto& [seq, n] : slices) {
    EXPECT_TRUE(cache.reserve(seq, n).is_ok());
    const int32_t begin = cache.num_logical_tokens(seq) - n;
    batch.sequences.push_back({seq, batch.num_tokens(), n, 0});
    for (int32_t i = 0; i < n; ++i) {
      batch.token_ids.push_back(0);
      batch.positions.push_back(begin + i);
    }
  }
  mirror.upload(cache, batch);
  for (int layer = 0; layer < l.num_layers; ++layer) {
    const AttentionView host = cache.build_view(layer, batch);
    const AttentionView mirrored = mirror.device_view(layer, host);
    for (int32_t s = 0; s < host.num_seqs; ++s) {
      SCOPED_TRACE(::testing::Message() << "layer " << layer << " seq " << s);
      EXPECT_EQ(mirrored.q_indptr[s + 1], host.q_indptr[s + 1]);
      for (int32_t h = 0; h < l.num_kv_heads; ++h) {
        const SeqKvView& want = host.seqs[s];
        const SeqKvView& got = mirrored.seqs[s];
        EXPECT_EQ(got.num_tokens[h], want.num_tokens[h]) << "head " << h;
        if (!l.kivi()) {
          expect_same_list(got, want, h, l.pages_per_stream(want.num_tokens[h]), "pages");
          continue;
        }
        const KiviSeqView& want_kivi = host.quantized.kivi_seqs[s];
        const KiviSeqView& got_kivi = mirrored.quantized.kivi_seqs[s];
        const int32_t keys = want_kivi.num_quantized_keys[h], values = want_kivi.num_quantized_values[h];
        EXPECT_EQ(got_kivi.num_quantized_keys[h], keys) << "head " << h;
        EXPECT_EQ(got_kivi.num_quantized_values[h], values) << "head " << h;
        EXPECT_EQ(got_kivi.residual.num_tokens[h], want_kivi.residual.num_tokens[h]) << "head " << h;
        EXPECT_EQ(got_kivi.residual_first_slot[h], want_kivi.residual_first_slot[h]) << "head " << h;
        const int32_t group = host.quantized.group_size;
        expect_same_list(got, want, h, (std::max(keys, values) + group - 1) / group, "groups");
        const int32_t window_rows = want_kivi.residual_first_slot[h] + want_kivi.residual.num_tokens[h];
        expect_same_list(got_kivi.residual, want_kivi.residual, h,
                         (window_rows + l.residual_page_tokens() - 1) / l.residual_page_tokens(), "window pages");
      }
    }
  }
  return batch;
}

class MirrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layout_.num_layers = 3;
    layout_.num_kv_heads = 2;
    layout_.head_dim = 4;
    layout_.page_size = 4;
    layout_.dtype = DType::kF32;
    auto cache = PagedCacheManager::create(layout_, 32768, cpu_allocator(), /*enable_prefix_caching=*/false);
    ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
    cache_ = std::move(*cache);
    for (int32_t seq = 0; seq < 3; ++seq) ASSERT_TRUE(cache_->open(seq, {}).is_ok());
  }

  void step(const std::vector<std::pair<int32_t, int32_t>>& slices) { mirrored_step(*cache_, mirror_, slices); }

  KvLayout layout_;
  std::unique_ptr<PagedCacheManager> cache_;
  AttentionViewMirror mirror_{Device::kCpu};
};

TEST_F(MirrorTest, FollowsTheCacheThroughGrowthRewritesAndReordering) {
  step({{0, 10}, {1, 3}});
  const uint64_t laid_out = StepGraph::buffers_generation();
  for (int i = 0; i < 20; ++i) step({{0, 1}, {1, 1}});  // page boundaries inside the first regions' room
  EXPECT_EQ(StepGraph::buffers_generation(), laid_out) << "a steady decode moved the buffer";
  for (int i = 0; i < 60; ++i) step({{0, 1}, {1, 1}});  // past it: the regions are laid out anew

  // Eviction rewrites sequence 1's lists (every other token of every stream).
  std::vector<std::vector<int32_t>> kept;
  std::vector<CacheManager::StreamEviction> evictions;
  for (int layer = 0; layer < layout_.num_layers; ++layer) {
    for (int h = 0; h < layout_.num_kv_heads; ++h) {
      kept.emplace_back();
      for (int32_t t = 0; t < cache_->stream_length(1, layer, h); t += 2) kept.back().push_back(t);
    }
  }
  for (int layer = 0, i = 0; layer < layout_.num_layers; ++layer)
    for (int h = 0; h < layout_.num_kv_heads; ++h, ++i) evictions.push_back({layer, h, kept[static_cast<size_t>(i)]});
  ASSERT_TRUE(cache_->evict_streams(1, evictions).is_ok());
  for (int i = 0; i < 6; ++i) step({{0, 1}, {1, 1}});

  step({{1, 1}, {0, 1}});          // the sequences trade places
  step({{0, 1}, {1, 1}, {2, 9}});  // a third joins
  ASSERT_TRUE(cache_->truncate(0, cache_->num_logical_tokens(0) - 7).is_ok());
  for (int i = 0; i < 5; ++i) step({{0, 1}, {1, 1}, {2, 1}});
  step({{2, 1}});  // the batch shrinks
  step({{2, 1}, {0, 1}});
  // Sequence 0 ends and its slot starts over: shorter lists over other pages, at the same batch position.
  cache_->close(0);
  ASSERT_TRUE(cache_->open(0, {}).is_ok());
  step({{2, 1}, {0, 20}});
  for (int i = 0; i < 5; ++i) step({{2, 1}, {0, 1}});
}

// Sequences keep their lists on the device while the batch around them changes: reordering, a prefill chunk
// joining, the batch shrinking send views and counts, but no sequence's whole lists again.
TEST_F(MirrorTest, AChangingBatchSendsNoListTwice) {
  step({{0, 400}, {1, 400}});
  // One sequence's lists: 100 pages of each of its 6 streams.
  const uint64_t one_sequence = uint64_t{100} * layout_.num_layers * layout_.num_kv_heads * sizeof(int32_t);
  uint64_t before = mirror_.bytes_sent();
  step({{1, 1}, {0, 1}});
  EXPECT_LT(mirror_.bytes_sent() - before, one_sequence) << "reordered";
  before = mirror_.bytes_sent();
  step({{1, 1}, {2, 40}, {0, 1}});
  EXPECT_LT(mirror_.bytes_sent() - before, one_sequence) << "a prefill chunk joined";
  before = mirror_.bytes_sent();
  step({{0, 1}});
  EXPECT_LT(mirror_.bytes_sent() - before, one_sequence) << "shrunk";
  before = mirror_.bytes_sent();
  step({{0, 1}, {1, 1}, {2, 1}});
  EXPECT_LT(mirror_.bytes_sent() - before, one_sequence) << "back";
}

// Random batches over five sequences (joins, leaves, reorders, prefill chunks beside decodes) with random table
// rewrites in between (truncation, eviction, a slot starting over): the mirror matches the cache after every upload.
TEST_F(MirrorTest, RandomBatchesAndRewrites) {
  for (int32_t seq = 3; seq < 5; ++seq) ASSERT_TRUE(cache_->open(seq, {}).is_ok());
  std::mt19937 rng(5);
  std::vector<int32_t> order = {0, 1, 2, 3, 4};
  for (int round = 0; round < 300; ++round) {
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<std::pair<int32_t, int32_t>> slices;
    for (int32_t seq : order) {
      if (rng() % 3 == 0) continue;  // not in this batch
      slices.push_back({seq, rng() % 4 == 0 ? 1 + static_cast<int32_t>(rng() % 40) : 1});
    }
    step(slices);
    const auto seq = static_cast<int32_t>(rng() % 5);
    const int32_t len = cache_->num_logical_tokens(seq);
    switch (rng() % 12) {
      case 0:  // refused (nothing changes) once the sequence was compacted
        if (len > 0) (void)cache_->truncate(seq, static_cast<int32_t>(rng() % len));
        break;
      case 1: {
        std::vector<std::vector<int32_t>> kept;
        std::vector<CacheManager::StreamEviction> evictions;
        for (int layer = 0; layer < layout_.num_layers; ++layer)
          for (int h = 0; h < layout_.num_kv_heads; ++h) {
            kept.emplace_back();
            for (int32_t t = 0; t < cache_->stream_length(seq, layer, h); t += 2) kept.back().push_back(t);
          }
        for (int layer = 0, i = 0; layer < layout_.num_layers; ++layer)
          for (int h = 0; h < layout_.num_kv_heads; ++h, ++i)
            evictions.push_back({layer, h, kept[static_cast<size_t>(i)]});
        ASSERT_TRUE(cache_->evict_streams(seq, evictions).is_ok());
        break;
      }
      case 2:
        cache_->close(seq);
        ASSERT_TRUE(cache_->open(seq, {}).is_ok());
        break;
      default:
        break;
    }
  }
}

// A KIVI cache (group 16, residual window 32): every step flushes what its window says,
// so the window slides and group lists grow while the mirror follows; an eviction of sealed groups rewrites one
// sequence's lists; a slot starts over. A steady decode sends the windows and counts but no group list again.
class KiviMirrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layout_ = make_kv_layout(3, 2, 16, 4, Device::kCpu, KvStoreKind::kKivi2, /*kivi_group_size=*/16,
                             /*kivi_residual=*/32, /*max_step_tokens=*/512);
    auto cache = KiviCacheManager::create(layout_, 16384, cpu_allocator());
    ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
    cache_ = std::move(*cache);
    for (int32_t seq = 0; seq < 3; ++seq) ASSERT_TRUE(cache_->open(seq, {}).is_ok());
  }

  void step(const std::vector<std::pair<int32_t, int32_t>>& slices) {
    const ForwardBatch batch = mirrored_step(*cache_, mirror_, slices);
    for (const SequenceSlice& slice : batch.sequences)
      cache_->on_computed(slice.seq, {}, cache_->num_logical_tokens(slice.seq));
  }

  KvLayout layout_;
  std::unique_ptr<KiviCacheManager> cache_;
  AttentionViewMirror mirror_{Device::kCpu};
};

TEST_F(KiviMirrorTest, FollowsFlushesEvictionsAndNewSequences) {
  step({{0, 100}, {1, 37}});
  for (int i = 0; i < 40; ++i) step({{0, 1}, {1, 1}});  // windows slide, groups fill
  step({{1, 1}, {0, 1}, {2, 50}});
  // Sequence 0 drops its first two sealed groups in every stream.
  std::vector<std::vector<int32_t>> kept;
  std::vector<CacheManager::StreamEviction> evictions;
  for (int layer = 0; layer < layout_.num_layers; ++layer)
    for (int h = 0; h < layout_.num_kv_heads; ++h) {
      ASSERT_GE(cache_->sealed_groups(0, layer, h).count, 2);
      kept.emplace_back();
      for (int32_t t = 32; t < cache_->stream_length(0, layer, h); ++t) kept.back().push_back(t);
    }
  for (int layer = 0, i = 0; layer < layout_.num_layers; ++layer)
    for (int h = 0; h < layout_.num_kv_heads; ++h, ++i) evictions.push_back({layer, h, kept[static_cast<size_t>(i)]});
  ASSERT_TRUE(cache_->evict_streams(0, evictions).is_ok());
  for (int i = 0; i < 20; ++i) step({{0, 1}, {1, 1}, {2, 1}});
  cache_->close(1);
  ASSERT_TRUE(cache_->open(1, {}).is_ok());
  step({{2, 1}, {1, 30}, {0, 1}});
  for (int i = 0; i < 20; ++i) step({{2, 1}, {1, 1}, {0, 1}});
}

TEST_F(KiviMirrorTest, ASteadyDecodeSendsNoGroupListAgain) {
  for (int chunk = 0; chunk < 16; ++chunk) step({{0, 400}, {1, 400}});
  step({{0, 1}, {1, 1}});  // the prompt's groups, quantized after the prefill, travel once
  // One sequence's group lists: 400 groups of each of its 6 streams.
  const uint64_t one_sequence = uint64_t{400} * layout_.num_layers * layout_.num_kv_heads * sizeof(int32_t);
  for (int i = 0; i < 24; ++i) {
    const uint64_t before = mirror_.bytes_sent();
    step({{0, 1}, {1, 1}});
    EXPECT_LT(mirror_.bytes_sent() - before, one_sequence / 4) << "decode step " << i;
  }
}

}  // namespace
}  // namespace se
