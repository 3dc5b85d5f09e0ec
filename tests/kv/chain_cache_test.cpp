#include "kv/chain_cache.h"

#include <gtest/gtest.h>

#include <numeric>

#include "kv/page_table.h"

namespace se {
namespace {

KvLayout small_layout() {
  return KvLayout{.num_layers = 2, .num_kv_heads = 2, .head_dim = 2, .page_size = 4, .dtype = DType::kF32};
}

std::vector<int32_t> iota_tokens(int32_t n, int32_t first = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

// A retained turn that holds real pool pages, so reclaiming it must give them back.
class TableState final : public ChainState {
 public:
  TableState(BlockPool* pool, int32_t num_tokens) : table(pool, small_layout()) {
    EXPECT_TRUE(table.append(num_tokens).is_ok());
  }
  int64_t num_held_pages() const override { return table.num_held_pages(); }
  int32_t num_logical_tokens() const override { return table.num_logical_tokens(); }
  PageTable table;
};

class ChainCacheTest : public ::testing::Test {
 protected:
  void expect_intact() {
    Status s = pool_.check_integrity();
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    s = index_.check_integrity();
    EXPECT_TRUE(s.is_ok()) << s.to_string();
  }
  // Creates `chain_id` and finishes its first turn on `tokens`, holding their pages.
  void add_idle_chain(const std::string& chain_id, const std::vector<int32_t>& tokens) {
    ASSERT_TRUE(index_.create(chain_id, kFingerprint).is_ok());
    index_.end_turn(chain_id, tokens, std::make_unique<TableState>(&pool_, static_cast<int32_t>(tokens.size())));
  }

  static constexpr const char* kFingerprint = "model|f32|snapkv|{}";
  BlockPool pool_{256};
  ChainCacheIndex index_{/*max_tombstones=*/3};
};

TEST(TokenDigestTest, DependsOnEveryToken) {
  EXPECT_EQ(token_digest(iota_tokens(8)), token_digest(iota_tokens(8)));
  EXPECT_NE(token_digest(iota_tokens(8)), token_digest(iota_tokens(8, 1)));
  EXPECT_NE(token_digest(iota_tokens(8)), token_digest(iota_tokens(7)));
}

TEST_F(ChainCacheTest, CreateResumeMismatchBusyReclaimGone) {
  add_idle_chain("a", iota_tokens(10));
  expect_intact();
  const int32_t num_used = pool_.num_used_pages();
  EXPECT_EQ(num_used, 4 * 3);  // 4 streams x ceil(10 / 4) pages

  // Resume: the new context extends the stored prefix.
  auto state = index_.begin_turn("a", kFingerprint, iota_tokens(14));
  ASSERT_TRUE(state.is_ok()) << state.status().to_string();
  EXPECT_TRUE(index_.find("a")->in_flight);
  // Busy while the turn runs.
  EXPECT_EQ(index_.begin_turn("a", kFingerprint, iota_tokens(14)).status().code(), StatusCode::kConflict);
  EXPECT_EQ(index_.reclaim(1000), 0);  // in flight = pinned
  expect_intact();
  index_.end_turn("a", iota_tokens(14), std::move(*state));
  EXPECT_EQ(index_.find("a")->num_prefix_tokens, 14);

  // Mismatch: a changed token inside the prefix, or no new token; nothing changes.
  std::vector<int32_t> changed = iota_tokens(20);
  changed[3] = 99;
  EXPECT_EQ(index_.begin_turn("a", kFingerprint, changed).status().code(), StatusCode::kConflict);
  EXPECT_EQ(index_.begin_turn("a", kFingerprint, iota_tokens(14)).status().code(), StatusCode::kConflict);
  EXPECT_EQ(index_.begin_turn("a", "other|f32|h2o|{}", iota_tokens(20)).status().code(), StatusCode::kConflict);
  EXPECT_FALSE(index_.find("a")->in_flight);
  EXPECT_EQ(pool_.num_used_pages(), num_used);
  expect_intact();

  // Reclaim under pressure frees the chain's pages; afterwards it answers gone, and an unknown id not found.
  EXPECT_EQ(index_.reclaim(1), num_used);
  EXPECT_EQ(pool_.num_used_pages(), 0);
  EXPECT_EQ(index_.begin_turn("a", kFingerprint, iota_tokens(20)).status().code(), StatusCode::kGone);
  EXPECT_EQ(index_.begin_turn("b", kFingerprint, iota_tokens(20)).status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(index_.create("a", kFingerprint).is_ok());  // a tombstoned id is not reused
  expect_intact();
}

TEST_F(ChainCacheTest, ReclaimsIdleChainsInLruOrder) {
  add_idle_chain("old", iota_tokens(4));
  add_idle_chain("mid", iota_tokens(4));
  add_idle_chain("new", iota_tokens(4));
  // Resuming "old" and finishing its turn makes it the most recently used.
  auto state = index_.begin_turn("old", kFingerprint, iota_tokens(5));
  ASSERT_TRUE(state.is_ok());
  state->reset();  // the turn's new state replaces the resumed one
  index_.end_turn("old", iota_tokens(5), std::make_unique<TableState>(&pool_, 5));
  EXPECT_EQ(index_.num_reclaimable_pages(), 4 + 4 + 8);

  EXPECT_EQ(index_.reclaim(1), 4);  // one chain's pages suffice: the least recently used goes
  EXPECT_FALSE(index_.find("mid").has_value());
  EXPECT_TRUE(index_.find("new").has_value());
  EXPECT_EQ(index_.reclaim(5), 4 + 8);  // then "new", then "old"
  EXPECT_EQ(index_.num_chains(), 0);
  EXPECT_EQ(pool_.num_used_pages(), 0);
  expect_intact();
}

TEST_F(ChainCacheTest, CancelledTurnKeepsTheStateAndDropTombstones) {
  add_idle_chain("a", iota_tokens(8));
  auto state = index_.begin_turn("a", kFingerprint, iota_tokens(9));
  ASSERT_TRUE(state.is_ok());
  index_.cancel_turn("a", std::move(*state));
  EXPECT_EQ(index_.find("a")->num_prefix_tokens, 8);
  EXPECT_TRUE(index_.begin_turn("a", kFingerprint, iota_tokens(9)).is_ok());
  index_.drop("a");  // the turn failed: the chain and its state are gone
  EXPECT_EQ(pool_.num_used_pages(), 0);
  EXPECT_EQ(index_.begin_turn("a", kFingerprint, iota_tokens(9)).status().code(), StatusCode::kGone);
  expect_intact();
}

TEST_F(ChainCacheTest, TakeIdlePinsTheChainUntilGivenBack) {
  add_idle_chain("a", iota_tokens(8));
  auto idle = index_.take_idle("a");
  ASSERT_TRUE(idle.is_ok()) << idle.status().to_string();
  EXPECT_EQ(idle->tokens, iota_tokens(8));
  EXPECT_EQ(idle->state->num_logical_tokens(), 8);
  // Pinned: busy to turns and to a second take, and not reclaimable.
  EXPECT_EQ(index_.begin_turn("a", kFingerprint, iota_tokens(9)).status().code(), StatusCode::kConflict);
  EXPECT_EQ(index_.take_idle("a").status().code(), StatusCode::kConflict);
  EXPECT_EQ(index_.num_reclaimable_pages(), 0);
  EXPECT_EQ(index_.reclaim(1), 0);
  expect_intact();
  index_.cancel_turn("a", std::move(idle->state));
  EXPECT_EQ(index_.find("a")->num_prefix_tokens, 8);
  EXPECT_TRUE(index_.begin_turn("a", kFingerprint, iota_tokens(9)).is_ok());
  EXPECT_EQ(index_.take_idle("b").status().code(), StatusCode::kNotFound);
  index_.drop("a");
  EXPECT_EQ(index_.take_idle("a").status().code(), StatusCode::kGone);
  expect_intact();
}

TEST_F(ChainCacheTest, TombstonesAreBounded) {
  for (const char* id : {"a", "b", "c", "d"}) {
    add_idle_chain(id, iota_tokens(4));
    index_.drop(id);
  }
  EXPECT_EQ(index_.begin_turn("a", kFingerprint, iota_tokens(5)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(index_.begin_turn("d", kFingerprint, iota_tokens(5)).status().code(), StatusCode::kGone);
  expect_intact();
}

}  // namespace
}  // namespace se
