// eval's budget table: which config key of a method takes the budget and the value it gets, a per-window budget
// (Kara's, as its registry entry says) included, and --budget-key's syntax.
#include <gtest/gtest.h>

#include "cli/eval_budget.h"

namespace se::cli {
namespace {

const nlohmann::ordered_json kKaraDefaults = {{"window", 512}, {"buffer", 64}, {"budget", 160}, {"period", 128}};
const nlohmann::ordered_json kRkvDefaults = {{"budget", 1024}, {"buffer", 128}, {"window", 8}};

TEST(EvalBudget, KaraKeepsAShareOfItsWindowAndOthersAShareOfTheTokens) {
  const std::vector<BudgetKey> table = default_budget_keys();
  const auto kara = find_budget_key("kara", kKaraDefaults, table, /*budget_per_window=*/true);
  ASSERT_TRUE(kara.has_value());
  EXPECT_EQ(kara->kind, BudgetKind::kWindowShare);
  EXPECT_EQ(budget_value(*kara, 0.3, 4096, kKaraDefaults), 154);  // 0.3 * 512, not of the 4,096 tokens
  EXPECT_EQ(find_budget_key("kara", kKaraDefaults, table)->kind, BudgetKind::kTokens);  // unless it says so
  nlohmann::ordered_json small_window = kKaraDefaults;
  small_window["window"] = 64;
  EXPECT_EQ(budget_value(*kara, 0.2, 4096, small_window), 13);

  const auto rkv = find_budget_key("rkv", kRkvDefaults, table);
  ASSERT_TRUE(rkv.has_value());
  EXPECT_EQ(rkv->kind, BudgetKind::kTokens);
  EXPECT_EQ(budget_value(*rkv, 0.3, 4096, kRkvDefaults), 1229);
  EXPECT_FALSE(find_budget_key("vanilla", nlohmann::ordered_json::object(), table).has_value());
}

TEST(EvalBudget, AMethodsOwnEntryOverridesOrDropsItsKeyAlone) {
  auto none = parse_budget_key("kara:budget=none");
  ASSERT_TRUE(none.is_ok()) << none.status().to_string();
  EXPECT_EQ(none->method, "kara");
  EXPECT_EQ(none->key, "budget");
  const std::vector<BudgetKey> table = merge_budget_keys(default_budget_keys(), {*none});
  // The general entry does not bring it back.
  EXPECT_FALSE(find_budget_key("kara", kKaraDefaults, table, /*budget_per_window=*/true).has_value());
  EXPECT_TRUE(find_budget_key("rkv", kRkvDefaults, table).has_value());

  auto tokens = parse_budget_key("kara:budget=tokens");
  ASSERT_TRUE(tokens.is_ok());
  const auto kara = find_budget_key("kara", kKaraDefaults, merge_budget_keys(default_budget_keys(), {*tokens}),
                                    /*budget_per_window=*/true);
  ASSERT_TRUE(kara.has_value());
  EXPECT_EQ(kara->kind, BudgetKind::kTokens);
}

TEST(EvalBudget, BadSpecsAreErrors) {
  for (const char* spec : {"budget", "=tokens", "budget=lots", ":budget=tokens", "kara:=window"})
    EXPECT_EQ(parse_budget_key(spec).status().code(), StatusCode::kInvalidArgument) << spec;
  auto window = parse_budget_key("budget=window");
  ASSERT_TRUE(window.is_ok());
  EXPECT_EQ(window->kind, BudgetKind::kWindowShare);
  EXPECT_TRUE(window->method.empty());
}

}  // namespace
}  // namespace se::cli
