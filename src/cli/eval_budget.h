// How `sparse-engine eval` turns "keep this fraction of the context" into each method's own hyperparameter,
// without naming methods: a table of config key names (the keys a method's resolved defaults expose) and what
// each means. The first key of the table that a method's defaults hold is its budget key; a method with none
// (vanilla) runs once, at its defaults. --budget-key adds or overrides entries.
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
  kNone,             // not a budget (lets --budget-key drop a default entry)
};

struct BudgetKey {
  std::string key;
  BudgetKind kind = BudgetKind::kTokens;
};

// The default table, in priority order.
std::vector<BudgetKey> default_budget_keys();

// "KEY=tokens|kept|evicted|none"; kInvalidArgument names what is wrong.
Result<BudgetKey> parse_budget_key(const std::string& spec);

// `table` with `overrides` applied: an override replaces the entry of the same key, or goes first.
std::vector<BudgetKey> merge_budget_keys(std::vector<BudgetKey> table, const std::vector<BudgetKey>& overrides);

// The entry of `table` that a method with these resolved `defaults` takes its budget from; none when its
// defaults hold no key of the table.
std::optional<BudgetKey> find_budget_key(const nlohmann::ordered_json& defaults, const std::vector<BudgetKey>& table);

// The value `key` gets for a budget of `fraction` of `num_context_tokens` tokens (at least 1 token).
nlohmann::json budget_value(const BudgetKey& key, double fraction, int32_t num_context_tokens);

}  // namespace se::cli
