// HostTier over two real page pools (both host memory, as on the CPU backend): a randomized run of creates,
// touches, ticks, whole and single-page offloads and retrieves, make_room evictions of single pages, a sequence's own
// oldest pages offloaded, decode steps in place (appends), drops and resumes (a sequence brought back whole, taken
// back, grown and handed back), with check_integrity, the pools' page
// accounting and every token's contents (read from whichever pool holds its page) checked after each operation, and
// both pools whole at the end; plus the victim order and the errors that must change nothing.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "../support/page_pools.h"
#include "kv/host_tier.h"

namespace se {
namespace {

const KvLayout kLayout{.num_layers = 2, .num_kv_heads = 2, .head_dim = 2, .page_size = 4, .dtype = DType::kF32};

// What token `i` of stream (layer, head) of sequence `seq` holds, element e of K (kv 0) or V (kv 1).
float pattern(int32_t seq, int32_t layer, int32_t head, int32_t i, int kv, int32_t e) {
  return static_cast<float>(((seq * 7 + layer) * 5 + head) * 1000 + i * 4 + kv * 2 + e);
}

float* element(const BlockPool& pool, int32_t page_id, int32_t offset, int kv) {
  return static_cast<float*>(pool.storage()->page(page_id)) + kLayout.element_offset(kv, offset);
}

// Writes the pattern into the tokens of every stream past its first from[stream] (none given: all).
void write_tokens(const BlockPool& pool, const PageTable& t, int32_t seq, const std::vector<int32_t>& from = {}) {
  for (int32_t l = 0; l < kLayout.num_layers; ++l)
    for (int32_t h = 0; h < kLayout.num_kv_heads; ++h)
      for (int32_t i = from.empty() ? 0 : from[static_cast<size_t>(kLayout.stream(l, h))]; i < t.num_tokens(l, h); ++i)
        for (int kv = 0; kv < 2; ++kv)
          for (int32_t e = 0; e < kLayout.head_dim; ++e) {
            const PageSlot slot = t.slot(l, h, i);
            element(pool, slot.page_id, slot.offset, kv)[e] = pattern(seq, l, h, i, kv, e);
          }
}

// Every token of a held sequence, read from the pool its page is in.
void expect_tokens(const BlockPool& device, const BlockPool& host, const TieredPageTable& t, int32_t seq) {
  for (int32_t s = 0; s < kLayout.num_streams(); ++s) {
    const int32_t l = s / kLayout.num_kv_heads, h = s % kLayout.num_kv_heads;
    for (int32_t i = 0; i < t.num_tokens(s); ++i) {
      const StreamPage page{s, i / kLayout.page_size};
      const bool resident = t.device_page(page) >= 0;
      for (int kv = 0; kv < 2; ++kv)
        for (int32_t e = 0; e < kLayout.head_dim; ++e)
          ASSERT_EQ(element(resident ? device : host, resident ? t.device_page(page) : t.host_page(page),
                            i % kLayout.page_size, kv)[e],
                    pattern(seq, l, h, i, kv, e))
              << "seq " << seq << " stream " << s << " token " << i << (resident ? " (device)" : " (host)");
    }
  }
}

// Writes the pattern into the slots of a held sequence's streams past their first from[stream], in whichever pool
// holds each slot's page.
void write_tokens(const BlockPool& device, const BlockPool& host, const TieredPageTable& t, int32_t seq,
                  const std::vector<int32_t>& from) {
  for (int32_t s = 0; s < kLayout.num_streams(); ++s)
    for (int32_t i = from[static_cast<size_t>(s)]; i < t.num_tokens(s); ++i) {
      const StreamPage page{s, i / kLayout.page_size};
      const bool resident = t.device_page(page) >= 0;
      for (int kv = 0; kv < 2; ++kv)
        for (int32_t e = 0; e < kLayout.head_dim; ++e)
          element(resident ? device : host, resident ? t.device_page(page) : t.host_page(page), i % kLayout.page_size,
                  kv)[e] = pattern(seq, s / kLayout.num_kv_heads, s % kLayout.num_kv_heads, i, kv, e);
    }
}

// A sequence of `length` tokens whose streams were then cut, at times all of them (so its logical length exceeds
// every stream's), at times unevenly (head-wise eviction), and one of which at times keeps a spare page.
Result<PageTable> new_sequence(BlockPool* pool, int32_t seq, int32_t length, std::mt19937& rng) {
  PageTable t(pool, kLayout);
  SE_RETURN_IF_ERROR(t.append(length));
  if (length > 3 && rng() % 4 == 0)
    for (int32_t l = 0; l < kLayout.num_layers; ++l)
      for (int32_t h = 0; h < kLayout.num_kv_heads; ++h) SE_RETURN_IF_ERROR(t.shrink_stream(l, h, length - 1));
  if (length > 3 && rng() % 2 == 0)
    SE_RETURN_IF_ERROR(t.shrink_stream(1, 1, length - 2 - static_cast<int32_t>(rng() % 2)));
  if (length > 1 && rng() % 3 == 0) SE_RETURN_IF_ERROR(t.drop_last_slot(0, 0));
  write_tokens(*pool, t, seq);
  return t;
}

// Up to `max_pages` distinct random pages of `t`, resident ones (on_device) or offloaded ones.
std::vector<StreamPage> some_pages(const TieredPageTable& t, bool on_device, size_t max_pages, std::mt19937& rng) {
  std::vector<StreamPage> pages;
  for (int32_t s = 0; s < kLayout.num_streams(); ++s)
    for (int32_t p = 0; p < t.num_pages(s); ++p)
      if ((t.device_page({s, p}) >= 0) == on_device) pages.push_back({s, p});
  std::shuffle(pages.begin(), pages.end(), rng);
  if (pages.size() > max_pages) pages.resize(max_pages);
  return pages;
}

struct Checker {
  const BlockPool& device;
  const BlockPool& host;
  const HostTier& tier;
  const std::map<int32_t, int32_t>& seqs;  // held sequence -> its id in the pattern
  bool& logical_above_streams;             // set once a held table's logical length exceeded its streams'
  bool& partly_resident;                   // set once a held sequence had pages in both pools

  void operator()(const std::string& where) const {
    const Status s = tier.check_integrity();
    ASSERT_TRUE(s.is_ok()) << where << ": " << s.to_string();
    int64_t on_device = 0, on_host = 0;
    for (const auto& [seq, id] : seqs) {
      ASSERT_TRUE(tier.contains(seq)) << where;
      const TieredPageTable& t = tier.table(seq);
      logical_above_streams |= t.num_logical_tokens() > t.num_tokens(kLayout.stream(1, 1));
      partly_resident |= t.num_device_pages() > 0 && t.num_host_pages() > 0;
      on_device += t.num_device_pages();
      on_host += t.num_host_pages();
      expect_tokens(device, host, t, id);
    }
    // Nothing else holds pages: every used page is a held sequence's, and every resident one is in the LRU.
    ASSERT_EQ(device.num_used_pages(), on_device) << where;
    ASSERT_EQ(host.num_used_pages(), on_host) << where;
    ASSERT_EQ(tier.lru().size(), on_device) << where;
  }
};

TEST(HostTierTest, RandomPageOffloadRetrieveEvictResume) {
  BlockPool device = test::pool_with_storage(kLayout, 48);
  BlockPool host = test::pool_with_storage(kLayout, 160);
  HostTier tier(&device, &host);
  std::map<int32_t, int32_t> seqs;
  bool logical_above_streams = false, partly_resident = false;
  const Checker check{device, host, tier, seqs, logical_above_streams, partly_resident};
  std::mt19937 rng(35);
  int32_t next_seq = 0;
  constexpr int kNumOps = 11;
  int counts[kNumOps] = {};
  int64_t evicted_pages = 0, refused_retrieves = 0, resumed_after_retrieve = 0, decoded_in_place = 0;
  auto pick = [&](bool (*want)(const TieredPageTable&)) -> int32_t {
    std::vector<int32_t> candidates;
    for (const auto& [seq, id] : seqs)
      if (want(tier.table(seq))) candidates.push_back(seq);
    return candidates.empty() ? -1 : candidates[rng() % candidates.size()];
  };
  auto with_device_pages = [](const TieredPageTable& t) { return t.num_device_pages() > 0; };
  auto with_host_pages = [](const TieredPageTable& t) { return t.num_host_pages() > 0; };
  auto any = [](const TieredPageTable&) { return true; };
  // Retrieves the listed pages, evicting the least recently used pages first when the device is full.
  auto retrieve = [&](int32_t seq, const std::vector<StreamPage>& pages, const std::string& where) -> Status {
    Status s = tier.retrieve(seq, pages);
    if (s.code() != StatusCode::kResourceExhausted) return s;
    check(where + " (refused retrieve)");
    ++refused_retrieves;
    const auto made = tier.make_room(static_cast<int64_t>(pages.size()));
    if (!made.is_ok()) return made.status();
    evicted_pages += *made;
    // make_room may have evicted pages of this very sequence: ask again for what is on the host now.
    std::vector<StreamPage> still;
    for (const StreamPage& page : pages)
      if (tier.table(seq).device_page(page) < 0) still.push_back(page);
    return tier.retrieve(seq, still);
  };
  for (int step = 0; step < 4000; ++step) {
    const std::string where = "step " + std::to_string(step);
    const int op = static_cast<int>(rng() % kNumOps);
    if (op == 0 && seqs.size() < 24) {  // a new sequence, making room on the device first when needed
      const int32_t length = 1 + static_cast<int32_t>(rng() % 24);
      const int32_t seq = next_seq++;
      const auto made = tier.make_room(kLayout.pages_for_tokens(length));
      if (!made.is_ok()) {
        ASSERT_EQ(made.status().code(), StatusCode::kResourceExhausted) << where;
        check(where);
        continue;
      }
      evicted_pages += *made;
      auto t = new_sequence(&device, seq, length, rng);
      ASSERT_TRUE(t.is_ok()) << where << ": " << t.status().to_string();
      ASSERT_TRUE(tier.add(seq, std::move(*t)).is_ok()) << where;
      seqs[seq] = seq;
    } else if (op == 1) {  // a step reads some resident pages of a sequence
      if (const int32_t seq = pick(with_device_pages); seq >= 0) {
        const auto pages = some_pages(tier.table(seq), true, 1 + rng() % 4, rng);
        ASSERT_TRUE(tier.touch(seq, pages).is_ok()) << where;
      }
      tier.advance();
    } else if (op == 2) {  // offload a few pages; a full host pool refuses and changes nothing
      if (const int32_t seq = pick(with_device_pages); seq >= 0) {
        const auto pages = some_pages(tier.table(seq), true, 1 + rng() % 3, rng);
        const int64_t before = tier.table(seq).num_device_pages();
        const Status s = tier.offload(seq, pages);
        ASSERT_TRUE(s.is_ok() || s.code() == StatusCode::kResourceExhausted) << where << ": " << s.to_string();
        ASSERT_EQ(tier.table(seq).num_device_pages(), before - (s.is_ok() ? static_cast<int64_t>(pages.size()) : 0));
      }
    } else if (op == 3) {  // retrieve a few pages (a selection's missing ones)
      if (const int32_t seq = pick(with_host_pages); seq >= 0) {
        const auto pages = some_pages(tier.table(seq), false, 1 + rng() % 3, rng);
        const Status s = retrieve(seq, pages, where);
        ASSERT_TRUE(s.is_ok() || s.code() == StatusCode::kResourceExhausted) << where << ": " << s.to_string();
      }
    } else if (op == 4) {  // a whole sequence out
      if (const int32_t seq = pick(with_device_pages); seq >= 0) {
        const Status s = tier.offload(seq);
        ASSERT_TRUE(s.is_ok() || s.code() == StatusCode::kResourceExhausted) << where << ": " << s.to_string();
        ASSERT_EQ(tier.table(seq).num_device_pages() == 0, s.is_ok());
      }
    } else if (op == 5) {  // resume: brought back whole, taken, grown by some tokens, handed back
      if (const int32_t seq = pick(any); seq >= 0) {
        if (!tier.is_resident(seq)) {
          // Its resident pages are read first, so making room evicts others' pages before its own.
          ASSERT_TRUE(tier.touch(seq).is_ok());
          const auto pages = some_pages(tier.table(seq), false, 1 << 20, rng);
          const Status s = retrieve(seq, pages, where);
          ASSERT_TRUE(s.is_ok() || s.code() == StatusCode::kResourceExhausted) << where << ": " << s.to_string();
          if (!tier.is_resident(seq)) {
            check(where);
            continue;
          }
          ++resumed_after_retrieve;
        }
        auto t = tier.take(seq);
        ASSERT_TRUE(t.is_ok()) << where << ": " << t.status().to_string();
        std::vector<int32_t> lengths;  // each stream's new slots follow its own kept tokens
        for (int32_t l = 0; l < kLayout.num_layers; ++l)
          for (int32_t h = 0; h < kLayout.num_kv_heads; ++h) lengths.push_back(t->num_tokens(l, h));
        if (t->append(1 + static_cast<int32_t>(rng() % 6)).is_ok()) write_tokens(device, *t, seqs[seq], lengths);
        ASSERT_TRUE(tier.add(seq, std::move(*t)).is_ok()) << where;
      }
    } else if (op == 6) {
      if (const int32_t seq = pick(any); seq >= 0) {
        ASSERT_TRUE(tier.drop(seq).is_ok());
        seqs.erase(seq);
      }
    } else if (op == 9) {  // a decode step in place: new slots appended, some landing in partly filled host pages
      if (const int32_t seq = pick(any); seq >= 0) {
        std::vector<int32_t> lengths(static_cast<size_t>(kLayout.num_streams()));
        for (int32_t st = 0; st < kLayout.num_streams(); ++st)
          lengths[static_cast<size_t>(st)] = tier.table(seq).num_tokens(st);
        const int32_t n = 1 + static_cast<int32_t>(rng() % 3);
        Status s = tier.append(seq, n);
        if (s.code() == StatusCode::kResourceExhausted && tier.make_room(kLayout.pages_for_tokens(n)).is_ok())
          s = tier.append(seq, n);
        ASSERT_TRUE(s.is_ok() || s.code() == StatusCode::kResourceExhausted) << where << ": " << s.to_string();
        if (s.is_ok()) {
          write_tokens(device, host, tier.table(seq), seqs[seq], lengths);
          ++decoded_in_place;
        }
      }
    } else if (op == 10) {  // a sequence's buffer shrinks: its own oldest pages go
      if (const int32_t seq = pick(with_device_pages); seq >= 0) {
        const int64_t before = tier.table(seq).num_device_pages();
        const auto moved = tier.offload_oldest(seq, 1 + static_cast<int64_t>(rng() % 4));
        ASSERT_TRUE(moved.is_ok() || moved.status().code() == StatusCode::kResourceExhausted) << where;
        if (moved.is_ok()) ASSERT_EQ(tier.table(seq).num_device_pages(), before - *moved) << where;
      }
    } else if (op == 7) {  // the device pool asked for room by someone else: single pages go, oldest first
      const auto made = tier.make_room(1 + static_cast<int64_t>(rng() % 40));
      ASSERT_TRUE(made.is_ok() || made.status().code() == StatusCode::kResourceExhausted) << where;
      if (made.is_ok()) evicted_pages += *made;
    } else {
      tier.advance();
    }
    ++counts[op];
    check(where);
  }
  for (int op = 0; op < kNumOps; ++op) EXPECT_GT(counts[op], 100) << op;
  // The device pool was often full: pages were evicted to make room, and retrieves had to wait for it.
  EXPECT_GT(evicted_pages, 300);
  EXPECT_GT(refused_retrieves, 50);
  EXPECT_GT(resumed_after_retrieve, 50);
  EXPECT_GT(decoded_in_place, 100);
  EXPECT_TRUE(logical_above_streams);
  EXPECT_TRUE(partly_resident);
  for (const auto& [seq, id] : seqs) ASSERT_TRUE(tier.drop(seq).is_ok());
  EXPECT_EQ(device.num_free_pages(), device.num_total_pages());
  EXPECT_EQ(host.num_free_pages(), host.num_total_pages());
  EXPECT_EQ(tier.lru().size(), 0);
  EXPECT_TRUE(tier.check_integrity().is_ok());
}

TEST(HostTierTest, MakeRoomOffloadsTheLeastRecentlyUsedPagesFirst) {
  BlockPool device = test::pool_with_storage(kLayout, 24);
  BlockPool host = test::pool_with_storage(kLayout, 16);
  HostTier tier(&device, &host);
  for (int32_t seq = 0; seq < 3; ++seq) {
    PageTable t(&device, kLayout);
    ASSERT_TRUE(t.append(8).is_ok());  // 8 pages each (2 per stream): the pool is full
    ASSERT_TRUE(tier.add(seq, std::move(t)).is_ok());
  }
  tier.advance();
  ASSERT_TRUE(tier.touch(0).is_ok());
  ASSERT_TRUE(tier.touch(2).is_ok());
  // Of sequence 1, only stream 3's second page was read since.
  ASSERT_TRUE(tier.touch(1, std::vector<StreamPage>{{3, 1}}).is_ok());
  auto made = tier.make_room(7);
  ASSERT_TRUE(made.is_ok());
  EXPECT_EQ(*made, 7);
  // Sequence 1's seven older pages went; the page read after the others stays, and so do 0 and 2.
  EXPECT_EQ(tier.table(1).num_device_pages(), 1);
  EXPECT_GE(tier.table(1).device_page({3, 1}), 0);
  EXPECT_TRUE(tier.is_resident(0));
  EXPECT_TRUE(tier.is_resident(2));
  made = tier.make_room(9);  // then the page of 1 touched before 2's, and 0's, the least recent of the rest
  ASSERT_TRUE(made.is_ok());
  EXPECT_EQ(*made, 2);
  EXPECT_EQ(tier.table(1).num_device_pages(), 1);
  EXPECT_EQ(tier.table(0).num_device_pages(), 6);
  EXPECT_TRUE(tier.is_resident(2));
  // The host pool holds 16 pages: 8 more cannot go, and nothing moves.
  made = tier.make_room(17);
  ASSERT_FALSE(made.is_ok());
  EXPECT_EQ(made.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(host.num_free_pages(), 7);
  EXPECT_TRUE(tier.check_integrity().is_ok());
}

TEST(HostTierTest, ErrorsChangeNothing) {
  BlockPool device = test::pool_with_storage(kLayout, 16);
  BlockPool host = test::pool_with_storage(kLayout, 16);
  HostTier tier(&device, &host);
  std::mt19937 rng(2);
  auto a = new_sequence(&device, 0, 12, rng);  // 12 pages
  ASSERT_TRUE(a.is_ok());
  ASSERT_TRUE(tier.add(0, std::move(*a)).is_ok());
  ASSERT_TRUE(tier.offload(0).is_ok());
  auto b = new_sequence(&device, 1, 13, rng);  // 16 pages at most: the device is full
  ASSERT_TRUE(b.is_ok());
  // A second sequence under a held id, or one whose pages another table shares, stays with the caller.
  PageTable shared = b->clone();
  Status s = tier.add(1, std::move(shared));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
  EXPECT_GT(shared.num_held_pages(), 0);  // NOLINT(bugprone-use-after-move): a refused add leaves it here
  shared.free_all();
  s = tier.add(0, std::move(*b));
  EXPECT_EQ(s.code(), StatusCode::kConflict) << s.to_string();
  EXPECT_GT(b->num_held_pages(), 0);
  ASSERT_TRUE(tier.add(1, std::move(*b)).is_ok());
  // No device room for sequence 0 while 1 fills the device, and make_room cannot move 12 of 1's pages (the host
  // pool holds 0's 12 of 16).
  const int64_t device_used = device.num_used_pages();
  s = tier.retrieve(0);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.to_string();
  EXPECT_FALSE(tier.make_room(device.num_free_pages() + 5).is_ok());
  EXPECT_EQ(device.num_used_pages(), device_used);
  // Pages outside the table, listed twice, or in the other pool are refused whole.
  EXPECT_EQ(tier.retrieve(0, std::vector<StreamPage>{{0, 0}, {4, 0}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tier.retrieve(0, std::vector<StreamPage>{{0, 0}, {0, 0}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tier.offload(1, std::vector<StreamPage>{{0, 0}, {0, 9}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tier.offload(0, std::vector<StreamPage>{{0, 0}}).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(tier.touch(0, std::vector<StreamPage>{{0, 0}}).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(tier.is_resident(0));
  EXPECT_TRUE(tier.is_resident(1));
  EXPECT_EQ(tier.table(0).num_host_pages(), 12);
  expect_tokens(device, host, tier.table(0), 0);
  expect_tokens(device, host, tier.table(1), 1);
  EXPECT_EQ(tier.take(0).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(tier.drop(7).code(), StatusCode::kNotFound);
  EXPECT_TRUE(tier.check_integrity().is_ok());
  // One page of 0 comes back once one of 1's goes out: the sequences are then both partly resident.
  ASSERT_TRUE(tier.make_room(device.num_free_pages() + 1).is_ok());
  ASSERT_TRUE(tier.retrieve(0, std::vector<StreamPage>{{2, 1}}).is_ok());
  EXPECT_EQ(tier.table(0).num_device_pages(), 1);
  EXPECT_EQ(tier.table(1).num_host_pages(), 1);
  expect_tokens(device, host, tier.table(0), 0);
  expect_tokens(device, host, tier.table(1), 1);
  EXPECT_TRUE(tier.check_integrity().is_ok());
  ASSERT_TRUE(tier.drop(1).is_ok());
  ASSERT_TRUE(tier.retrieve(0).is_ok());
  expect_tokens(device, host, tier.table(0), 0);
  ASSERT_TRUE(tier.drop(0).is_ok());
  EXPECT_EQ(device.num_free_pages(), device.num_total_pages());
  EXPECT_EQ(host.num_free_pages(), host.num_total_pages());
}

}  // namespace
}  // namespace se
