// Randomized invariant tests: thousands of random operations on the pool, page tables and radix
// cache, with check_integrity() after every mutation and an independent reference count oracle
// (and, for the radix cache, page contents written through the storage) checked against the pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <random>

#include "../support/page_pools.h"
#include "kv/radix_cache.h"

namespace se {
namespace {

KvLayout small_layout() {
  return KvLayout{
      .num_layers = 2, .num_kv_heads = 2, .head_dim = 2, .page_size = 4, .dtype = DType::kF32};
}

// References the pool must show for every page: one per listing in a table (spares included), plus `extra` held
// elsewhere.
void expect_ref_counts(const BlockPool& pool, const std::vector<PageTable>& tables,
                       const std::vector<int32_t>& extra, int64_t num_cache_pages = -1) {
  std::vector<int32_t> expected(static_cast<size_t>(pool.num_total_pages()), 0);
  for (const PageTable& t : tables) {
    for (int32_t layer = 0; layer < t.layout().num_layers; ++layer) {
      for (int32_t head = 0; head < t.layout().num_kv_heads; ++head) {
        for (int32_t id : t.pages(layer, head)) ++expected[static_cast<size_t>(id)];
        if (const int32_t spare = t.spare_page(layer, head); spare >= 0) ++expected[static_cast<size_t>(spare)];
      }
    }
  }
  for (int32_t id : extra) ++expected[static_cast<size_t>(id)];
  int64_t num_unexplained = 0;
  for (int32_t id = 0; id < pool.num_total_pages(); ++id) {
    const int32_t diff = pool.ref_count(id) - expected[static_cast<size_t>(id)];
    if (num_cache_pages < 0) {
      ASSERT_EQ(diff, 0) << "page " << id;
    } else {
      // The radix cache holds at most one reference per page.
      ASSERT_TRUE(diff == 0 || diff == 1) << "page " << id << " diff " << diff;
      num_unexplained += diff;
    }
  }
  if (num_cache_pages >= 0) ASSERT_EQ(num_unexplained, num_cache_pages);
}

void expect_intact(const BlockPool& pool, const std::vector<PageTable>& tables) {
  Status s = pool.check_integrity();
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  for (const PageTable& t : tables) {
    s = t.check_integrity();
    ASSERT_TRUE(s.is_ok()) << s.to_string();
  }
}

// Stream-major pages of the first `num_blocks` blocks of every stream of `t`.
std::vector<int32_t> prefix_pages(const PageTable& t, int32_t num_blocks) {
  std::vector<int32_t> pages;
  for (int32_t layer = 0; layer < t.layout().num_layers; ++layer) {
    for (int32_t head = 0; head < t.layout().num_kv_heads; ++head) {
      auto p = t.pages(layer, head);
      pages.insert(pages.end(), p.begin(), p.begin() + num_blocks);
    }
  }
  return pages;
}

TEST(KvRandomTest, PoolAndPageTables) {
  const KvLayout layout = small_layout();
  constexpr int kNumTables = 6;
  BlockPool pool(160);
  std::vector<PageTable> tables;
  tables.reserve(kNumTables);
  for (int i = 0; i < kNumTables; ++i) tables.emplace_back(&pool, layout);
  std::vector<int32_t> held;  // pages allocated straight from the pool
  std::mt19937 rng(1234);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  int num_ok = 0;
  int num_refused = 0;

  for (int step = 0; step < 20000; ++step) {
    PageTable& t = tables[static_cast<size_t>(pick(kNumTables))];
    const int32_t len = t.num_logical_tokens();
    Status s;
    switch (pick(9)) {
      case 0:
      case 1: {  // append; may run out of pages (all or nothing)
        const int32_t n = pick(12);
        const int64_t held_before = t.num_held_pages();
        const int32_t free_before = pool.num_free_pages();
        const int64_t need = t.num_pages_for_append(n);
        s = t.append(n);
        ASSERT_EQ(t.num_held_pages(), held_before + (s.is_ok() ? need : 0)) << s.to_string();
        ASSERT_EQ(pool.num_free_pages(), free_before - (s.is_ok() ? need : 0));
        ASSERT_EQ(t.num_logical_tokens(), len + (s.is_ok() ? n : 0));
        break;
      }
      case 2:
        s = t.truncate(len == 0 ? 0 : pick(len + 1));
        break;
      case 3:
        if (pick(3) == 0) t.free_all();
        break;
      case 4: {  // share whole blocks of another table with an empty one
        const PageTable& src = tables[static_cast<size_t>(pick(kNumTables))];
        if (&src == &t || t.num_logical_tokens() != 0) break;
        int32_t full = INT32_MAX;
        for (int32_t l = 0; l < layout.num_layers; ++l) {
          for (int32_t h = 0; h < layout.num_kv_heads; ++h) {
            full = std::min(full, src.num_tokens(l, h) / layout.page_size);
          }
        }
        const int32_t n = full == 0 ? 0 : pick(full + 1);
        s = t.attach_prefix(prefix_pages(src, n), n);
        break;
      }
      case 5: {  // compaction of one head: its leading slots stay
        const int32_t layer = pick(layout.num_layers);
        const int32_t head = pick(layout.num_kv_heads);
        const int32_t n = t.num_tokens(layer, head);
        s = t.shrink_stream(layer, head, n == 0 ? 0 : pick(n + 1));
        break;
      }
      case 6: {  // raw pool use next to the tables
        auto pages = pool.allocate(pick(4));
        if (pages.is_ok()) held.insert(held.end(), pages->begin(), pages->end());
        break;
      }
      case 7:
        if (!held.empty()) {
          const size_t i = static_cast<size_t>(pick(static_cast<int>(held.size())));
          pool.release(held[i]);
          held.erase(held.begin() + static_cast<ptrdiff_t>(i));
        }
        break;
      case 8: {  // a ring eviction's last slot; the page it empties may stay as the spare
        const int32_t layer = pick(layout.num_layers);
        const int32_t head = pick(layout.num_kv_heads);
        if (t.num_tokens(layer, head) > 0) s = t.drop_last_slot(layer, head);
        break;
      }
    }
    if (s.is_ok()) {
      ++num_ok;
    } else {
      ASSERT_TRUE(s.code() == StatusCode::kResourceExhausted ||
                  s.code() == StatusCode::kFailedPrecondition)
          << s.to_string();
      ++num_refused;
    }
    expect_intact(pool, tables);
    expect_ref_counts(pool, tables, held);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(num_refused, 0);
  EXPECT_GT(num_ok, 1000);
  for (PageTable& t : tables) t.free_all();
  pool.release(held);
  held.clear();
  expect_intact(pool, tables);
  EXPECT_EQ(pool.num_free_pages(), pool.num_total_pages());
}

// One running sequence of the radix scenario: its tokens, pages and the radix nodes it keeps
// locked.
struct Sequence {
  bool active = false;
  std::vector<int32_t> tokens;
  std::vector<RadixCache::NodeId> locks;
};

// The value stored for token `token` at position `pos` of stream `stream`: K = (token, pos), V =
// (stream, mix).
void write_kv(const BlockPool& pool, const PageTable& t, const std::vector<int32_t>& tokens,
              int32_t from) {
  const KvLayout& layout = t.layout();
  for (int32_t s = 0; s < layout.num_streams(); ++s) {
    for (int32_t pos = from; pos < static_cast<int32_t>(tokens.size()); ++pos) {
      const PageSlot slot = t.slot(s / layout.num_kv_heads, s % layout.num_kv_heads, pos);
      auto* page = static_cast<float*>(pool.storage()->page(slot.page_id));
      float* k = page + layout.element_offset(0, slot.offset);
      float* v = page + layout.element_offset(1, slot.offset);
      const int32_t token = tokens[static_cast<size_t>(pos)];
      k[0] = static_cast<float>(token);
      k[1] = static_cast<float>(pos);
      v[0] = static_cast<float>(s);
      v[1] = static_cast<float>(token * 7 + pos);
    }
  }
}

void expect_kv(const BlockPool& pool, const PageTable& t, const std::vector<int32_t>& tokens) {
  const KvLayout& layout = t.layout();
  for (int32_t s = 0; s < layout.num_streams(); ++s) {
    for (int32_t pos = 0; pos < static_cast<int32_t>(tokens.size()); ++pos) {
      const PageSlot slot = t.slot(s / layout.num_kv_heads, s % layout.num_kv_heads, pos);
      const auto* page = static_cast<const float*>(pool.storage()->page(slot.page_id));
      const float* k = page + layout.element_offset(0, slot.offset);
      const float* v = page + layout.element_offset(1, slot.offset);
      const int32_t token = tokens[static_cast<size_t>(pos)];
      ASSERT_EQ(k[0], static_cast<float>(token))
          << "stream " << s << " pos " << pos << " page " << slot.page_id;
      ASSERT_EQ(k[1], static_cast<float>(pos));
      ASSERT_EQ(v[0], static_cast<float>(s));
      ASSERT_EQ(v[1], static_cast<float>(token * 7 + pos));
    }
  }
}

TEST(KvRandomTest, RadixCacheSharedByRunningSequences) {
  const KvLayout layout = small_layout();
  constexpr int kNumSeqs = 5;
  BlockPool pool = test::pool_with_storage(layout, 120);
  std::vector<PageTable> tables;
  tables.reserve(kNumSeqs);
  for (int i = 0; i < kNumSeqs; ++i) tables.emplace_back(&pool, layout);
  std::vector<Sequence> seqs(kNumSeqs);
  RadixCache cache(&pool, layout);
  std::mt19937 rng(99);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  // Prompts start with a piece of one of a few stems over a tiny vocabulary, so prefixes are often
  // shared.
  std::vector<std::vector<int32_t>> stems(3);
  for (auto& stem : stems) {
    for (int i = 0; i < 24; ++i) stem.push_back(pick(5));
  }
  // Appends with eviction as the fallback, as the scheduler would; false when memory stays short.
  auto grow = [&](PageTable& t, int32_t n) {
    const int64_t need = t.num_pages_for_append(n);
    if (need > pool.num_free_pages()) {
      cache.evict(static_cast<int32_t>(need - pool.num_free_pages()));
    }
    const Status s = t.append(n);
    EXPECT_TRUE(s.is_ok() || s.code() == StatusCode::kResourceExhausted) << s.to_string();
    return s.is_ok();
  };
  auto finish = [&](int i) {
    for (RadixCache::NodeId node : seqs[static_cast<size_t>(i)].locks) cache.unlock(node);
    tables[static_cast<size_t>(i)].free_all();
    seqs[static_cast<size_t>(i)] = Sequence{};
  };
  int num_started = 0;
  int num_inserted = 0;

  for (int step = 0; step < 20000; ++step) {
    const int i = pick(kNumSeqs);
    Sequence& seq = seqs[static_cast<size_t>(i)];
    PageTable& t = tables[static_cast<size_t>(i)];
    switch (pick(7)) {
      case 0: {  // admit a new sequence on its cached prefix
        if (seq.active) break;
        const auto& stem = stems[static_cast<size_t>(pick(3))];
        std::vector<int32_t> prompt(stem.begin(), stem.begin() + pick(25));
        for (int k = pick(9); k >= 0; --k) prompt.push_back(pick(5));
        const auto match = cache.match_prefix(prompt);
        ASSERT_LT(match.num_cached_tokens, static_cast<int32_t>(prompt.size()));
        ASSERT_EQ(match.num_cached_tokens % layout.page_size, 0);
        cache.lock(match.last_node());
        seq.locks.push_back(match.last_node());
        seq.active = true;
        ASSERT_TRUE(t.attach_prefix(match.pages, match.num_blocks()).is_ok());
        seq.tokens.assign(prompt.begin(), prompt.begin() + match.num_cached_tokens);
        expect_kv(pool, t, seq.tokens);  // the cached pages hold exactly this prefix
        if (!grow(t, static_cast<int32_t>(prompt.size()) - match.num_cached_tokens)) {
          finish(i);
          break;
        }
        seq.tokens = prompt;
        write_kv(pool, t, seq.tokens, match.num_cached_tokens);
        ++num_started;
        break;
      }
      case 1:
      case 2:  // decode one token
        if (!seq.active || !grow(t, 1)) break;
        seq.tokens.push_back(pick(5));
        write_kv(pool, t, seq.tokens, static_cast<int32_t>(seq.tokens.size()) - 1);
        break;
      case 3: {  // insert the filled blocks; finish, or keep running with the new path locked
        if (!seq.active) break;
        auto inserted = cache.insert(seq.tokens, t.view());
        ASSERT_TRUE(inserted.is_ok()) << inserted.status().to_string();
        ++num_inserted;
        const auto num_full = static_cast<int32_t>(seq.tokens.size()) / layout.page_size;
        ASSERT_EQ(inserted->num_new_blocks + inserted->num_cached_blocks, num_full);
        auto probe = seq.tokens;
        probe.push_back(0);
        ASSERT_EQ(cache.match_prefix(probe).num_cached_tokens, num_full * layout.page_size);
        if (pick(2) == 0) {
          finish(i);
        } else {
          cache.lock(inserted->last_node);
          seq.locks.push_back(inserted->last_node);
        }
        break;
      }
      case 4:  // abort without caching
        if (seq.active && pick(4) == 0) finish(i);
        break;
      case 5: {  // roll back some tokens (refused inside a shared page)
        if (!seq.active || seq.tokens.empty()) break;
        const auto n = static_cast<int32_t>(seq.tokens.size()) - pick(6);
        const Status s = t.truncate(std::max(n, 0));
        ASSERT_TRUE(s.is_ok() || s.code() == StatusCode::kFailedPrecondition) << s.to_string();
        if (s.is_ok()) seq.tokens.resize(static_cast<size_t>(std::max(n, 0)));
        break;
      }
      case 6:
        cache.evict(pick(12));
        break;
    }
    expect_intact(pool, tables);
    Status s = cache.check_integrity();
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    expect_ref_counts(pool, tables, {}, cache.num_cached_pages());
    for (int k = 0; k < kNumSeqs; ++k) {
      if (seqs[static_cast<size_t>(k)].active) {
        expect_kv(pool, tables[static_cast<size_t>(k)], seqs[static_cast<size_t>(k)].tokens);
      }
    }
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(num_started, 200);
  EXPECT_GT(num_inserted, 200);
  EXPECT_GT(cache.num_hit_tokens(), 0);
  for (int i = 0; i < kNumSeqs; ++i) finish(i);
  EXPECT_EQ(cache.num_evictable_pages(), cache.num_cached_pages());
  cache.evict(INT_MAX);
  EXPECT_EQ(cache.num_nodes(), 0);
  ASSERT_TRUE(cache.check_integrity().is_ok());
  expect_intact(pool, tables);
  EXPECT_EQ(pool.num_free_pages(), pool.num_total_pages());
}

}  // namespace
}  // namespace se
