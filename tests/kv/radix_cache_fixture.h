// A radix cache over a small block pool, shared by the radix cache and prefix pruning tests.
#pragma once

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "kv/radix_cache.h"

namespace se::test {

// 2 layers x 2 KV heads = 4 streams, 4-token blocks.
inline KvLayout small_layout() {
  return KvLayout{.num_layers = 2, .num_kv_heads = 2, .head_dim = 2, .page_size = 4, .dtype = DType::kF32};
}

inline std::vector<int32_t> iota_tokens(int32_t n, int32_t first = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

class RadixCacheFixture : public ::testing::Test {
 protected:
  void expect_intact() {
    Status s = pool_.check_integrity();
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    s = cache_.check_integrity();
    EXPECT_TRUE(s.is_ok()) << s.to_string();
  }
  // A table holding `num_tokens` tokens' KV (the pages are what matters here, not their bytes).
  PageTable filled_table(int32_t num_tokens) {
    PageTable table(&pool_, small_layout());
    EXPECT_TRUE(table.append(num_tokens).is_ok());
    return table;
  }
  // Inserts `tokens` through a fresh table which is then freed: the cache keeps the only references.
  RadixCache::InsertResult insert_and_free(const std::vector<int32_t>& tokens) {
    PageTable table = filled_table(static_cast<int32_t>(tokens.size()));
    auto result = cache_.insert(tokens, table.view());
    EXPECT_TRUE(result.is_ok()) << result.status().to_string();
    return result.is_ok() ? *result : RadixCache::InsertResult{};
  }

  BlockPool pool_{256};
  RadixCache cache_{&pool_, small_layout()};
};

}  // namespace se::test
