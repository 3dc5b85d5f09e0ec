#include "kv/chain_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>

#include "../support/page_pools.h"
#include "kv/page_table.h"
#include "kv/page_table_transfer.h"

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
  int64_t num_host_pages_short() const override { return 0; }  // no host tier
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

// The running total of reclaimable pages follows every way a chain enters or leaves the LRU: after each of
// thousands of random turns, cancels, takes, drops and reclaims it equals the pages the idle chains hold.
TEST_F(ChainCacheTest, ReclaimablePagesFollowEveryOperation) {
  std::mt19937 rng(7);
  std::map<std::string, std::unique_ptr<ChainState>> in_flight;  // states taken out, by chain
  constexpr int kNumIds = 12;
  for (int op = 0; op < 3000; ++op) {
    const std::string chain_id = std::to_string(rng() % kNumIds);
    const auto info = index_.find(chain_id);
    switch (rng() % 6) {
      case 0:  // a new chain's first turn
        if (!info && index_.create(chain_id, kFingerprint).is_ok()) in_flight[chain_id] = nullptr;
        break;
      case 1:  // a turn ends, or one begins
        if (auto it = in_flight.find(chain_id); it != in_flight.end()) {
          const auto n = static_cast<int32_t>(info->num_prefix_tokens + 1 + rng() % 9);
          if (pool_.num_free_pages() < small_layout().pages_for_tokens(n)) break;
          index_.end_turn(chain_id, iota_tokens(n), std::make_unique<TableState>(&pool_, n));
          in_flight.erase(it);
        } else if (info && !info->in_flight) {
          auto state = index_.begin_turn(chain_id, kFingerprint, iota_tokens(info->num_prefix_tokens + 1));
          ASSERT_TRUE(state.is_ok()) << state.status().to_string();
          state->reset();  // the turn's new state replaces it
          in_flight[chain_id] = nullptr;
        }
        break;
      case 2:  // taken out between turns, or given back
        if (auto it = in_flight.find(chain_id); it != in_flight.end() && it->second) {
          index_.cancel_turn(chain_id, std::move(it->second));
          in_flight.erase(it);
        } else if (info && !info->in_flight) {
          auto idle = index_.take_idle(chain_id);
          ASSERT_TRUE(idle.is_ok()) << idle.status().to_string();
          in_flight[chain_id] = std::move(idle->state);
        }
        break;
      case 3:
        if (info) {
          in_flight.erase(chain_id);
          index_.drop(chain_id);
        }
        break;
      default:
        index_.reclaim(static_cast<int64_t>(rng() % 16));
        break;
    }
    int64_t num_idle_pages = 0;
    for (int id = 0; id < kNumIds; ++id) {
      const auto chain = index_.find(std::to_string(id));
      if (chain && !chain->in_flight) num_idle_pages += chain->num_held_pages;
    }
    ASSERT_EQ(index_.num_reclaimable_pages(), num_idle_pages) << "after operation " << op;
    ASSERT_TRUE(index_.check_integrity().is_ok()) << index_.check_integrity().to_string();
  }
  in_flight.clear();
  index_.reclaim(pool_.num_total_pages());
  EXPECT_EQ(index_.num_reclaimable_pages(), 0);
  EXPECT_EQ(pool_.num_used_pages(), 0);
}

// A state whose pages changed while it sat idle breaks the running total: check_integrity says so.
TEST_F(ChainCacheTest, IntegrityCatchesAStateThatGrewWhileIdle) {
  ASSERT_TRUE(index_.create("a", kFingerprint).is_ok());
  auto state = std::make_unique<TableState>(&pool_, 8);
  TableState* grown = state.get();
  index_.end_turn("a", iota_tokens(8), std::move(state));
  expect_intact();
  ASSERT_TRUE(grown->table.append(8).is_ok());
  EXPECT_EQ(index_.check_integrity().code(), StatusCode::kInternal);
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

// A retained turn that can move to a host pool, as the paged cache's snapshots do: its table is copied there
// (kv/page_table_transfer.h) and back.
class TieredState final : public ChainState {
 public:
  TieredState(BlockPool* device, BlockPool* host, int32_t num_tokens)
      : table(device, small_layout()), device_(device), host_(host) {
    EXPECT_TRUE(table.append(num_tokens).is_ok());
  }
  int64_t num_held_pages() const override { return on_host_ ? 0 : table.num_held_pages(); }
  int32_t num_logical_tokens() const override { return table.num_logical_tokens(); }
  Status offload() override {
    if (on_host_) return Status::ok();
    if (pages_to_copy_page_table(table) > host_->num_total_pages()) return out_of_range("larger than the tier");
    SE_ASSIGN_OR_RETURN(PageTable copy, copy_page_table(table, *device_, host_));
    table = std::move(copy);
    on_host_ = true;
    return Status::ok();
  }
  bool is_offloaded() const override { return on_host_; }
  int64_t num_host_pages() const override { return on_host_ ? table.num_held_pages() : 0; }
  int64_t num_host_pages_short() const override {
    return on_host_ ? 0 : std::max<int64_t>(0, pages_to_copy_page_table(table) - host_->num_free_pages());
  }
  int64_t num_pages_to_restore() const override { return on_host_ ? pages_to_copy_page_table(table) : 0; }
  PageTable table;

 private:
  BlockPool* device_;
  BlockPool* host_;
  bool on_host_ = false;
};

class ChainHostTierIndexTest : public ::testing::Test {
 protected:
  // `num_taken_host_pages`: host pages of states a turn took out of the index.
  void expect_intact(int64_t num_taken_host_pages = 0) {
    for (const Status& s : {device_.check_integrity(), host_.check_integrity(), index_.check_integrity()})
      EXPECT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ(index_.num_host_pages() + num_taken_host_pages, host_.num_used_pages());
  }
  // A chain idle on the device whose state holds `num_tokens` tokens (4 streams x ceil(n / 4) pages).
  void add_idle_chain(const std::string& chain_id, int32_t num_tokens) {
    ASSERT_TRUE(index_.create(chain_id, kFingerprint).is_ok());
    index_.end_turn(chain_id, iota_tokens(num_tokens), std::make_unique<TieredState>(&device_, &host_, num_tokens));
  }

  // Host pages held by others than the index's chains (running sequences, where they live in the tier too).
  std::vector<int32_t> occupy_host(int32_t num_pages) { return host_.allocate(num_pages).value(); }

  static constexpr const char* kFingerprint = "model|f32|snapkv|{}";
  BlockPool device_ = test::pool_with_storage(small_layout(), 256);
  BlockPool host_ = test::pool_with_storage(small_layout(), 24);  // two chains of 10 tokens (12 pages each)
  ChainCacheIndex index_{/*max_tombstones=*/8};
};

TEST_F(ChainHostTierIndexTest, ReclaimedChainsMoveToTheHostAndAFullTierDropsItsOldest) {
  add_idle_chain("a", 10);
  add_idle_chain("b", 10);
  add_idle_chain("c", 10);
  expect_intact();
  EXPECT_EQ(index_.reclaim(1), 12);  // "a" moves: its device pages are freed, the chain stays
  EXPECT_TRUE(index_.find("a")->on_host);
  EXPECT_EQ(index_.find("a")->num_host_pages, 12);
  EXPECT_EQ(index_.find("a")->num_held_pages, 0);
  EXPECT_EQ(index_.num_reclaimable_pages(), 24);
  EXPECT_EQ(index_.num_chains_on_host(), 1);
  EXPECT_EQ(device_.num_used_pages(), 24);
  expect_intact();

  // A turn on a host chain takes the offloaded state; cancelled, it goes back to the host.
  auto state = index_.begin_turn("a", kFingerprint, iota_tokens(11));
  ASSERT_TRUE(state.is_ok()) << state.status().to_string();
  EXPECT_TRUE((*state)->is_offloaded());
  EXPECT_EQ((*state)->num_pages_to_restore(), 12);
  EXPECT_EQ(index_.num_chains_on_host(), 0);
  expect_intact(/*num_taken_host_pages=*/12);
  index_.cancel_turn("a", std::move(*state));
  EXPECT_TRUE(index_.find("a")->on_host);
  expect_intact();

  // Host chains are not reclaimed again; "b" fills the tier, and "c" makes room by dropping its oldest ("a").
  EXPECT_EQ(index_.reclaim(1000), 24);
  EXPECT_EQ(index_.begin_turn("a", kFingerprint, iota_tokens(11)).status().code(), StatusCode::kGone);
  EXPECT_TRUE(index_.find("b")->on_host);
  EXPECT_TRUE(index_.find("c")->on_host);
  EXPECT_EQ(index_.num_idle_chains(), 2);
  EXPECT_EQ(device_.num_used_pages(), 0);
  EXPECT_EQ(host_.num_used_pages(), 24);
  expect_intact();
  index_.drop("b");
  EXPECT_EQ(host_.num_used_pages(), 12);
  expect_intact();
}

TEST_F(ChainHostTierIndexTest, AStateTheTierCanNeverHoldIsDroppedAndTheHostChainsStay) {
  add_idle_chain("a", 10);
  EXPECT_EQ(index_.reclaim(1), 12);
  add_idle_chain("big", 30);  // 4 x 8 pages: more than the whole tier
  EXPECT_EQ(index_.reclaim(1), 32);
  EXPECT_FALSE(index_.find("big").has_value());
  EXPECT_EQ(index_.begin_turn("big", kFingerprint, iota_tokens(31)).status().code(), StatusCode::kGone);
  EXPECT_TRUE(index_.find("a")->on_host);
  EXPECT_EQ(device_.num_used_pages(), 0);
  expect_intact();
}

TEST_F(ChainHostTierIndexTest, ParkMovesOneChainAndDroppingHostChainsGivesTheTierBack) {
  add_idle_chain("a", 10);
  add_idle_chain("b", 10);
  index_.park("b");  // only the chain named: "a" stays on the device
  EXPECT_TRUE(index_.find("b")->on_host);
  EXPECT_FALSE(index_.find("a")->on_host);
  index_.park("b");  // already there: nothing changes
  index_.park("unknown");
  expect_intact();
  index_.park("a");
  EXPECT_EQ(host_.num_used_pages(), 24);
  add_idle_chain("big", 30);  // more than the whole tier: dropped, the others stay
  index_.park("big");
  EXPECT_FALSE(index_.find("big").has_value());
  EXPECT_EQ(index_.num_chains_on_host(), 2);
  expect_intact();
  // The oldest on the host ("b", parked first) goes first; a drop that leaves what is missing as it was ends it.
  const auto never_shortened = [] { return int64_t{1}; };
  index_.drop_host_chains_while_short(never_shortened);
  EXPECT_EQ(index_.begin_turn("b", kFingerprint, iota_tokens(11)).status().code(), StatusCode::kGone);
  EXPECT_TRUE(index_.find("a")->on_host);
  EXPECT_EQ(host_.num_used_pages(), 12);
  // Nothing is dropped while nothing is missing; then drops go on while each shortens it.
  index_.drop_host_chains_while_short([] { return int64_t{0}; });
  EXPECT_TRUE(index_.find("a")->on_host);
  index_.drop_host_chains_while_short([&] { return 24 - host_.num_free_pages(); });
  EXPECT_EQ(index_.num_chains_on_host(), 0);
  index_.drop_host_chains_while_short(never_shortened);  // none left
  EXPECT_EQ(host_.num_used_pages(), 0);
  EXPECT_EQ(device_.num_used_pages(), 0);
  expect_intact();
}

TEST_F(ChainHostTierIndexTest, HostChainsAreDroppedOnlyWhenThatMakesRoom) {
  add_idle_chain("a", 4);  // 4 pages
  add_idle_chain("b", 4);
  index_.park("a");
  index_.park("b");
  std::vector<int32_t> running = occupy_host(13);  // 3 host pages left free
  // "c" takes 12: the host chains' 8 pages and the 3 free ones are not enough, so they stay and "c" goes.
  add_idle_chain("c", 10);
  index_.park("c");
  EXPECT_FALSE(index_.find("c").has_value());
  EXPECT_EQ(index_.num_chains_on_host(), 2);
  expect_intact(/*num_taken_host_pages=*/13);
  // With 8 free host pages, dropping the oldest ("a") is enough: "b" stays.
  host_.release(std::span<const int32_t>(running).first(5));
  running.erase(running.begin(), running.begin() + 5);
  add_idle_chain("d", 10);
  EXPECT_EQ(index_.reclaim(1), 12);
  EXPECT_TRUE(index_.find("d").value_or(ChainInfo{}).on_host);
  EXPECT_FALSE(index_.find("a").has_value());
  EXPECT_TRUE(index_.find("b").value_or(ChainInfo{}).on_host);
  expect_intact(/*num_taken_host_pages=*/8);
  host_.release(running);
  expect_intact();
}

TEST_F(ChainHostTierIndexTest, AStateOutsideTheIndexTakesHostRoomFromIdleChainsOnlyWhenThatHelps) {
  add_idle_chain("a", 4);
  index_.park("a");
  std::vector<int32_t> running = occupy_host(12);  // 8 host pages left free
  {
    // 12 pages: 4 short, which dropping "a" covers.
    TieredState fits(&device_, &host_, 10);
    ASSERT_TRUE(index_.offload_state(fits).is_ok());
    EXPECT_TRUE(fits.is_offloaded());
    EXPECT_FALSE(index_.find("a").has_value());
    expect_intact(/*num_taken_host_pages=*/12 + 12);
  }
  add_idle_chain("b", 4);
  index_.park("b");  // 8 host pages left free
  // 16 pages: 8 short, more than "b" holds, so it stays and the state stays on the device.
  TieredState too_big(&device_, &host_, 16);
  EXPECT_EQ(index_.offload_state(too_big).code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(too_big.is_offloaded());
  EXPECT_TRUE(index_.find("b").value_or(ChainInfo{}).on_host);
  expect_intact(/*num_taken_host_pages=*/12);
  // A state larger than the whole tier leaves the host chains be too.
  host_.release(running);
  TieredState never(&device_, &host_, 30);
  EXPECT_EQ(index_.offload_state(never).code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(index_.find("b").value_or(ChainInfo{}).on_host);
  expect_intact();
}

}  // namespace
}  // namespace se
