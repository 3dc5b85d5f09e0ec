#include "cli/eval_budget.h"

#include <algorithm>
#include <cmath>

namespace se::cli {

std::vector<BudgetKey> default_budget_keys() {
  return {
      {"budget", BudgetKind::kTokens},
      {"token_budget", BudgetKind::kTokens},
      {"num_selected_tokens", BudgetKind::kTokens},
      {"capacity", BudgetKind::kTokens},
      {"max_capacity_prompt", BudgetKind::kTokens},
      {"num_kept_tokens", BudgetKind::kTokens},
      {"kept_ratio", BudgetKind::kKeptFraction},
      {"retained_ratio", BudgetKind::kKeptFraction},
      {"ratio", BudgetKind::kKeptFraction},
      {"compression_ratio", BudgetKind::kEvictedFraction},
  };
}

Result<BudgetKey> parse_budget_key(const std::string& spec) {
  const size_t eq = spec.find('=');
  const size_t colon = spec.substr(0, eq).find(':');
  if (eq == std::string::npos || eq == 0 || colon == 0 || colon + 1 == eq)
    return invalid_argument("--budget-key '{}' must read [METHOD:]KEY=tokens|kept|evicted|window|none", spec);
  const std::string kind = spec.substr(eq + 1);
  BudgetKey key{spec.substr(0, eq), BudgetKind::kTokens};
  if (colon != std::string::npos) {
    key.method = spec.substr(0, colon);
    key.key = spec.substr(colon + 1, eq - colon - 1);
  }
  if (kind == "tokens") {
    key.kind = BudgetKind::kTokens;
  } else if (kind == "kept") {
    key.kind = BudgetKind::kKeptFraction;
  } else if (kind == "evicted") {
    key.kind = BudgetKind::kEvictedFraction;
  } else if (kind == "window") {
    key.kind = BudgetKind::kWindowShare;
  } else if (kind == "none") {
    key.kind = BudgetKind::kNone;
  } else {
    return invalid_argument("--budget-key '{}': the kind must be tokens, kept, evicted, window or none", spec);
  }
  return key;
}

std::vector<BudgetKey> merge_budget_keys(std::vector<BudgetKey> table, const std::vector<BudgetKey>& overrides) {
  for (auto it = overrides.rbegin(); it != overrides.rend(); ++it) {
    std::erase_if(table, [&](const BudgetKey& k) { return k.key == it->key && k.method == it->method; });
    table.insert(table.begin(), *it);
  }
  return table;
}

Result<std::optional<BudgetKey>> find_budget_key(const std::string& method, const nlohmann::ordered_json& defaults,
                                                 const std::vector<BudgetKey>& table, bool budget_per_window) {
  std::vector<std::string> dropped;  // keys a "none" entry took out (a later entry of the key must not bring it back)
  for (const BudgetKey& entry : table) {
    if (!entry.method.empty() && entry.method != method) continue;
    if (!defaults.contains(entry.key) || std::ranges::count(dropped, entry.key) > 0) continue;
    if (entry.kind == BudgetKind::kNone) {
      dropped.push_back(entry.key);
      continue;
    }
    BudgetKey key = entry;
    if (budget_per_window && entry.method.empty() && entry.key == "budget" && entry.kind == BudgetKind::kTokens)
      key = BudgetKey{entry.key, BudgetKind::kWindowShare, method};
    if (key.kind == BudgetKind::kWindowShare) SE_RETURN_IF_ERROR(budget_window(method, defaults).status());
    return std::optional<BudgetKey>(std::move(key));
  }
  return std::optional<BudgetKey>();
}

Result<int64_t> budget_window(const std::string& method, const nlohmann::ordered_json& resolved) {
  const auto it = resolved.find("window");
  if (it == resolved.end() || !it->is_number_integer() || it->get<int64_t>() < 1)
    return invalid_argument(
        "{}: a budget as a share of its window needs a positive integer 'window' in its config, "
        "got {}",
        method, it == resolved.end() ? std::string("none") : it->dump());
  return it->get<int64_t>();
}

nlohmann::json budget_value(const BudgetKey& key, double fraction, int32_t num_context_tokens,
                            const nlohmann::ordered_json& resolved) {
  switch (key.kind) {
    case BudgetKind::kTokens:
      return std::max<int64_t>(1, std::llround(fraction * num_context_tokens));
    case BudgetKind::kKeptFraction:
      return fraction;
    case BudgetKind::kEvictedFraction:
      return 1.0 - fraction;
    case BudgetKind::kWindowShare:
      return std::max<int64_t>(1, std::llround(fraction * static_cast<double>(resolved.at("window").get<int64_t>())));
    case BudgetKind::kNone:
      break;
  }
  return nullptr;
}

}  // namespace se::cli
