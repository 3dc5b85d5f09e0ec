// How `sparse-engine eval` turns "keep this fraction of the context" into each method's own hyperparameter,
// without naming methods: a table of config key names (the keys a method's resolved defaults expose) and what
// each means. The first entry of the table that a method's defaults hold (and that names no other method) is its
// budget key; a method with none (vanilla) runs once, at its defaults. A method whose registry entry says its
// budget is per window (MethodInfo::budget_per_window) takes `budget` as a share of its `window`. --budget-key adds
// or overrides entries, for one method when it names one.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace se::cli {

enum class BudgetKind {
  kTokens,           // an integer token count: round(fraction * context)
  kKeptFraction,     // a retained fraction: fraction
  kEvictedFraction,  // a compression ratio (the evicted fraction, kvpress style): 1 - fraction
  kWindowShare,      // an integer token count out of the method's own `window` key: round(fraction * window)
  kNone,             // not a budget (lets --budget-key drop a default entry)
};

struct BudgetKey {
  std::string key;
  BudgetKind kind = BudgetKind::kTokens;
  std::string method;  // empty: any method whose defaults hold `key`
};

// The default table, in priority order.
std::vector<BudgetKey> default_budget_keys();

// "[METHOD:]KEY=tokens|kept|evicted|window|none"; kInvalidArgument names what is wrong.
Result<BudgetKey> parse_budget_key(const std::string& spec);

// `table` with `overrides` applied: an override replaces the entry of the same method and key, or goes first.
std::vector<BudgetKey> merge_budget_keys(std::vector<BudgetKey> table, const std::vector<BudgetKey>& overrides);

// The entry of `table` that method `method` with these resolved `defaults` takes its budget from; none when its
// defaults hold no key of the table. With `budget_per_window`, a general `budget` entry counting tokens becomes a
// share of the window (an entry naming the method stays as it is). A share of the window for a method whose defaults
// hold none is kInvalidArgument.
Result<std::optional<BudgetKey>> find_budget_key(const std::string& method, const nlohmann::ordered_json& defaults,
                                                 const std::vector<BudgetKey>& table, bool budget_per_window = false);

// The window a kWindowShare budget of method `method` is a share of: its resolved config's `window` (the default
// unless the user's config sets one); kInvalidArgument when that is not a positive integer.
Result<int64_t> budget_window(const std::string& method, const nlohmann::ordered_json& resolved);

// The value `key` gets for a budget of `fraction` of `num_context_tokens` tokens (at least 1 token), for a method
// whose resolved config is `resolved` (kWindowShare reads its window, which budget_window must accept).
nlohmann::json budget_value(const BudgetKey& key, double fraction, int32_t num_context_tokens,
                            const nlohmann::ordered_json& resolved);

}  // namespace se::cli
