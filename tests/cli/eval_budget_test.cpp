// eval's budget table: which config key of a method takes the budget and the value it gets, a per-window budget
// (Kara's, as its registry entry says) included, and --budget-key's syntax.
#include <gtest/gtest.h>

#include "cli/eval_budget.h"

namespace se::cli {
namespace {

const nlohmann::ordered_json kKaraDefaults = {{"window", 512}, {"buffer", 64}, {"budget", 160}, {"period", 128}};
const nlohmann::ordered_json kRkvDefaults = {{"budget", 1024}, {"buffer", 128}, {"window", 8}};
const nlohmann::ordered_json kH2oDefaults = {{"budget", 256}};

// find_budget_key's entry for a method whose defaults it accepts.
std::optional<BudgetKey> key_of(const std::string& method, const nlohmann::ordered_json& defaults,
                                const std::vector<BudgetKey>& table, bool budget_per_window = false) {
  auto key = find_budget_key(method, defaults, table, budget_per_window);
  EXPECT_TRUE(key.is_ok()) << key.status().to_string();
  return key.is_ok() ? *key : std::nullopt;
}

TEST(EvalBudget, KaraKeepsAShareOfItsWindowAndOthersAShareOfTheTokens) {
  const std::vector<BudgetKey> table = default_budget_keys();
  const auto kara = key_of("kara", kKaraDefaults, table, /*budget_per_window=*/true);
  ASSERT_TRUE(kara.has_value());
  EXPECT_EQ(kara->kind, BudgetKind::kWindowShare);
  EXPECT_EQ(budget_value(*kara, 0.3, 4096, kKaraDefaults), 154);               // 0.3 * 512, not of the 4,096 tokens
  EXPECT_EQ(key_of("kara", kKaraDefaults, table)->kind, BudgetKind::kTokens);  // unless it says so
  nlohmann::ordered_json small_window = kKaraDefaults;
  small_window["window"] = 64;
  EXPECT_EQ(budget_value(*kara, 0.2, 4096, small_window), 13);

  const auto rkv = key_of("rkv", kRkvDefaults, table);
  ASSERT_TRUE(rkv.has_value());
  EXPECT_EQ(rkv->kind, BudgetKind::kTokens);
  EXPECT_EQ(budget_value(*rkv, 0.3, 4096, kRkvDefaults), 1229);
  EXPECT_FALSE(key_of("vanilla", nlohmann::ordered_json::object(), table).has_value());
}

// A share of the window counts from the window the method runs with: its default when the user's config sets
// none, never a window of 0 that would leave every budget at 1 token.
TEST(EvalBudget, AWindowShareCountsFromTheMethodsWindowOrIsAnError) {
  const auto kara = key_of("kara", kKaraDefaults, default_budget_keys(), /*budget_per_window=*/true);
  ASSERT_TRUE(kara.has_value());
  ASSERT_TRUE(budget_window("kara", kKaraDefaults).is_ok());
  EXPECT_EQ(*budget_window("kara", kKaraDefaults), 512);
  EXPECT_EQ(budget_value(*kara, 0.5, 100, kKaraDefaults), 256);

  // A method whose defaults hold no window: asked by name, for every method, or by its registry entry.
  for (const char* spec : {"h2o:budget=window", "budget=window"}) {
    auto entry = parse_budget_key(spec);
    ASSERT_TRUE(entry.is_ok()) << spec;
    const auto key = find_budget_key("h2o", kH2oDefaults, merge_budget_keys(default_budget_keys(), {*entry}));
    ASSERT_FALSE(key.is_ok()) << spec;
    EXPECT_EQ(key.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(key.status().message().find("h2o"), std::string::npos) << key.status().message();
  }
  EXPECT_FALSE(find_budget_key("h2o", kH2oDefaults, default_budget_keys(), /*budget_per_window=*/true).is_ok());
  // Its tokens entry still applies.
  EXPECT_EQ(key_of("h2o", kH2oDefaults, default_budget_keys())->kind, BudgetKind::kTokens);

  // A window the user's config sets must be one too.
  for (const nlohmann::json& window : {nlohmann::json("64"), nlohmann::json(0), nlohmann::json(6.5)}) {
    nlohmann::ordered_json resolved = kKaraDefaults;
    resolved["window"] = window;
    EXPECT_EQ(budget_window("kara", resolved).status().code(), StatusCode::kInvalidArgument) << window.dump();
  }
}

TEST(EvalBudget, AMethodsOwnEntryOverridesOrDropsItsKeyAlone) {
  auto none = parse_budget_key("kara:budget=none");
  ASSERT_TRUE(none.is_ok()) << none.status().to_string();
  EXPECT_EQ(none->method, "kara");
  EXPECT_EQ(none->key, "budget");
  const std::vector<BudgetKey> table = merge_budget_keys(default_budget_keys(), {*none});
  // The general entry does not bring it back.
  EXPECT_FALSE(key_of("kara", kKaraDefaults, table, /*budget_per_window=*/true).has_value());
  EXPECT_TRUE(key_of("rkv", kRkvDefaults, table).has_value());

  auto tokens = parse_budget_key("kara:budget=tokens");
  ASSERT_TRUE(tokens.is_ok());
  const auto kara = key_of("kara", kKaraDefaults, merge_budget_keys(default_budget_keys(), {*tokens}),
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
