// HostTier over two real page pools (both host memory, as on the CPU backend): a randomized run of creates,
// touches, ticks, offloads, retrieves, make_room evictions, drops and resumes (a retrieved sequence taken back,
// grown and handed back), with check_integrity, the pools' page accounting and every token's contents checked after
// each operation, and both pools whole at the end; plus the victim order and the errors that must change nothing.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "kv/host_tier.h"
#include "kv/page_table_transfer.h"

namespace se {
namespace {

const KvLayout kLayout{.num_layers = 2, .num_kv_heads = 2, .head_dim = 2, .page_size = 4, .dtype = DType::kF32};

BlockPool make_pool(int32_t num_pages) {
  auto storage = ArenaPageStorage::create(cpu_allocator(), num_pages, kLayout.page_bytes());
  SE_CHECK(storage.is_ok(), "{}", storage.status().to_string());
  return BlockPool(std::move(storage).value());
}

// What token `i` of stream (layer, head) of sequence `seq` holds, element e of K (kv 0) or V (kv 1).
float pattern(int32_t seq, int32_t layer, int32_t head, int32_t i, int kv, int32_t e) {
  return static_cast<float>(((seq * 7 + layer) * 5 + head) * 1000 + i * 4 + kv * 2 + e);
}

float* element(const BlockPool& pool, const PageTable& t, int32_t layer, int32_t head, int32_t i, int kv) {
  const PageSlot slot = t.slot(layer, head, i);
  return static_cast<float*>(pool.storage()->page(slot.page_id)) + kLayout.element_offset(kv, slot.offset);
}

// Writes the pattern into the tokens of every stream past its first from[stream] (none given: all).
void write_tokens(const BlockPool& pool, const PageTable& t, int32_t seq, const std::vector<int32_t>& from = {}) {
  for (int32_t l = 0; l < kLayout.num_layers; ++l)
    for (int32_t h = 0; h < kLayout.num_kv_heads; ++h)
      for (int32_t i = from.empty() ? 0 : from[static_cast<size_t>(kLayout.stream(l, h))]; i < t.num_tokens(l, h); ++i)
        for (int kv = 0; kv < 2; ++kv)
          for (int32_t e = 0; e < kLayout.head_dim; ++e)
            element(pool, t, l, h, i, kv)[e] = pattern(seq, l, h, i, kv, e);
}

void expect_tokens(const BlockPool& pool, const PageTable& t, int32_t seq) {
  for (int32_t l = 0; l < kLayout.num_layers; ++l)
    for (int32_t h = 0; h < kLayout.num_kv_heads; ++h)
      for (int32_t i = 0; i < t.num_tokens(l, h); ++i)
        for (int kv = 0; kv < 2; ++kv)
          for (int32_t e = 0; e < kLayout.head_dim; ++e)
            ASSERT_EQ(element(pool, t, l, h, i, kv)[e], pattern(seq, l, h, i, kv, e))
                << "seq " << seq << " stream (" << l << ", " << h << ") token " << i;
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

struct Checker {
  const BlockPool& device;
  const BlockPool& host;
  const HostTier& tier;
  const std::map<int32_t, int32_t>& seqs;  // held sequence -> its id in the pattern
  bool& logical_above_streams;             // set once a held table's logical length exceeded its streams'

  void operator()(const std::string& where) const {
    const Status s = tier.check_integrity();
    ASSERT_TRUE(s.is_ok()) << where << ": " << s.to_string();
    int64_t on_device = 0, on_host = 0;
    for (const auto& [seq, id] : seqs) {
      ASSERT_TRUE(tier.contains(seq)) << where;
      logical_above_streams |= tier.table(seq).num_logical_tokens() > tier.table(seq).num_tokens(0, 1);
      const bool resident = tier.is_resident(seq);
      (resident ? on_device : on_host) += tier.table(seq).num_held_pages();
      expect_tokens(resident ? device : host, tier.table(seq), id);
    }
    // Nothing else holds pages: every used page is a held sequence's.
    ASSERT_EQ(device.num_used_pages(), on_device) << where;
    ASSERT_EQ(host.num_used_pages(), on_host) << where;
  }
};

TEST(HostTierTest, RandomOffloadRetrieveEvictResume) {
  BlockPool device = make_pool(48);
  BlockPool host = make_pool(160);
  HostTier tier(&device, &host);
  std::map<int32_t, int32_t> seqs;
  bool logical_above_streams = false;
  const Checker check{device, host, tier, seqs, logical_above_streams};
  std::mt19937 rng(35);
  int32_t next_seq = 0;
  int counts[7] = {};
  int64_t evicted = 0, refused_retrieves = 0;
  auto pick = [&](bool resident) -> int32_t {
    std::vector<int32_t> candidates;
    for (const auto& [seq, id] : seqs)
      if (tier.is_resident(seq) == resident) candidates.push_back(seq);
    return candidates.empty() ? -1 : candidates[rng() % candidates.size()];
  };
  for (int step = 0; step < 3000; ++step) {
    const std::string where = "step " + std::to_string(step);
    const int op = static_cast<int>(rng() % 7);
    if (op == 0 && seqs.size() < 24) {  // a new sequence, making room on the device first when needed
      const int32_t length = 1 + static_cast<int32_t>(rng() % 24);
      const int32_t seq = next_seq++;
      if (device.num_free_pages() < kLayout.pages_for_tokens(length)) {
        const auto made = tier.make_room(kLayout.pages_for_tokens(length));
        if (!made.is_ok()) {
          ASSERT_EQ(made.status().code(), StatusCode::kResourceExhausted) << where;
          check(where);
          continue;
        }
        evicted += static_cast<int64_t>(made->size());
      }
      auto t = new_sequence(&device, seq, length, rng);
      ASSERT_TRUE(t.is_ok()) << where << ": " << t.status().to_string();
      ASSERT_TRUE(tier.add(seq, std::move(*t)).is_ok()) << where;
      seqs[seq] = seq;
    } else if (op == 1) {
      if (const int32_t seq = pick(true); seq >= 0) ASSERT_TRUE(tier.touch(seq).is_ok());
      tier.advance();
    } else if (op == 2) {  // offload; a full host pool refuses and changes nothing
      if (const int32_t seq = pick(true); seq >= 0) {
        const Status s = tier.offload(seq);
        ASSERT_TRUE(s.is_ok() || s.code() == StatusCode::kResourceExhausted) << s.to_string();
        ASSERT_EQ(tier.is_resident(seq), !s.is_ok());
      }
    } else if (op == 3) {  // retrieve, evicting the least recently used sequences first when the device is full
      if (const int32_t seq = pick(false); seq >= 0) {
        Status s = tier.retrieve(seq);
        if (s.code() == StatusCode::kResourceExhausted) {
          ASSERT_FALSE(tier.is_resident(seq));
          check(where + " (refused retrieve)");
          ++refused_retrieves;
          const auto made = tier.make_room(pages_to_copy_page_table(tier.table(seq)));
          if (made.is_ok()) {
            evicted += static_cast<int64_t>(made->size());
            s = tier.retrieve(seq);
          }
        }
        ASSERT_TRUE(s.is_ok() || s.code() == StatusCode::kResourceExhausted) << s.to_string();
      }
    } else if (op == 4) {  // resume: the engine takes a resident sequence back, computes more tokens, returns it
      if (const int32_t seq = pick(true); seq >= 0) {
        auto t = tier.take(seq);
        ASSERT_TRUE(t.is_ok()) << t.status().to_string();
        std::vector<int32_t> lengths;  // each stream's new slots follow its own kept tokens
        for (int32_t l = 0; l < kLayout.num_layers; ++l)
          for (int32_t h = 0; h < kLayout.num_kv_heads; ++h) lengths.push_back(t->num_tokens(l, h));
        if (t->append(1 + static_cast<int32_t>(rng() % 6)).is_ok()) write_tokens(device, *t, seqs[seq], lengths);
        ASSERT_TRUE(tier.add(seq, std::move(*t)).is_ok());
      }
    } else if (op == 5) {
      const int32_t seq = rng() % 2 ? pick(true) : pick(false);
      if (seq >= 0) {
        ASSERT_TRUE(tier.drop(seq).is_ok());
        seqs.erase(seq);
      }
    } else {
      tier.advance();
    }
    ++counts[op];
    check(where);
  }
  for (int op = 0; op < 7; ++op) EXPECT_GT(counts[op], 100) << op;
  // The device pool was often full: sequences were evicted to make room, and retrieves had to wait for it.
  EXPECT_GT(evicted, 100);
  EXPECT_GT(refused_retrieves, 50);
  EXPECT_TRUE(logical_above_streams);
  for (const auto& [seq, id] : seqs) ASSERT_TRUE(tier.drop(seq).is_ok());
  EXPECT_EQ(device.num_free_pages(), device.num_total_pages());
  EXPECT_EQ(host.num_free_pages(), host.num_total_pages());
  EXPECT_TRUE(tier.check_integrity().is_ok());
}

TEST(HostTierTest, MakeRoomOffloadsTheLeastRecentlyUsedFirst) {
  BlockPool device = make_pool(24);
  BlockPool host = make_pool(16);
  HostTier tier(&device, &host);
  for (int32_t seq = 0; seq < 3; ++seq) {
    PageTable t(&device, kLayout);
    ASSERT_TRUE(t.append(8).is_ok());  // 8 pages each: the pool is full
    ASSERT_TRUE(tier.add(seq, std::move(t)).is_ok());
  }
  tier.advance();
  ASSERT_TRUE(tier.touch(0).is_ok());
  ASSERT_TRUE(tier.touch(2).is_ok());
  auto made = tier.make_room(8);
  ASSERT_TRUE(made.is_ok());
  EXPECT_EQ(*made, std::vector<int32_t>{1});
  made = tier.make_room(16);
  ASSERT_TRUE(made.is_ok());
  EXPECT_EQ(*made, std::vector<int32_t>{0});
  // The host pool holds two sequences: the third cannot go.
  made = tier.make_room(24);
  ASSERT_FALSE(made.is_ok());
  EXPECT_EQ(made.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(tier.is_resident(2));
  EXPECT_TRUE(tier.check_integrity().is_ok());
}

TEST(HostTierTest, ErrorsChangeNothing) {
  BlockPool device = make_pool(16);
  BlockPool host = make_pool(16);
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
  // No device room for sequence 0, and make_room cannot offload 1 (the host pool holds 0's 12 of 16 pages).
  s = tier.retrieve(0);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.to_string();
  EXPECT_FALSE(tier.make_room(12).is_ok());
  EXPECT_FALSE(tier.is_resident(0));
  EXPECT_TRUE(tier.is_resident(1));
  expect_tokens(host, tier.table(0), 0);
  expect_tokens(device, tier.table(1), 1);
  EXPECT_EQ(tier.take(0).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(tier.drop(7).code(), StatusCode::kNotFound);
  EXPECT_TRUE(tier.check_integrity().is_ok());
  ASSERT_TRUE(tier.drop(1).is_ok());
  ASSERT_TRUE(tier.retrieve(0).is_ok());
  expect_tokens(device, tier.table(0), 0);
  ASSERT_TRUE(tier.drop(0).is_ok());
  EXPECT_EQ(device.num_free_pages(), device.num_total_pages());
  EXPECT_EQ(host.num_free_pages(), host.num_total_pages());
}

}  // namespace
}  // namespace se
