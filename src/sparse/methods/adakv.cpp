#include "sparse/methods/adakv.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/top_k.h"

namespace se {

namespace {

// The most pages `num_streams` streams can hold together when each holds between `lo` and `hi` tokens and all
// of them at most `total` tokens: start every stream at lo, then open new pages cheapest first (the first
// extra page of a stream costs what is left of its last page plus one token, every later one a whole page).
int64_t max_split_pages(int64_t num_streams, int64_t lo, int64_t hi, int64_t total, int64_t page_size) {
  const int64_t first_pages = (lo + page_size - 1) / page_size;
  const int64_t most_pages = (hi + page_size - 1) / page_size;
  int64_t pages = num_streams * first_pages;
  int64_t left = total - num_streams * lo;
  if (most_pages == first_pages || left <= 0) return pages;
  const int64_t first_cost = first_pages * page_size + 1 - lo;
  const int64_t num_opened = std::min(num_streams, left / first_cost);
  pages += num_opened;
  left -= num_opened * first_cost;
  return pages + std::min(left / page_size, num_opened * (most_pages - first_pages - 1));
}

}  // namespace

Result<std::unique_ptr<MethodRuntime>> AdaKvMethod::create(const nlohmann::json& config) {
  SE_ASSIGN_OR_RETURN(MethodConfig reader, MethodConfig::parse("adakv", config));
  SE_ASSIGN_OR_RETURN(const std::string variant_name,
                      reader.get_choice("variant", "kvpress", {"kvpress", "adakv_reference"}));
  const AdaKvVariant variant = variant_name == "kvpress" ? AdaKvVariant::kKvpress : AdaKvVariant::kAdaKvReference;
  ObservationWindowDefaults defaults;  // kvpress: SnapKVPress's scorer
  if (variant == AdaKvVariant::kAdaKvReference) {
    defaults.window = 32;
    defaults.kernel = 7;
    defaults.pooling = "maxpool";
    defaults.gqa_order = "reduce_then_pool";
  }
  SE_ASSIGN_OR_RETURN(const ObservationWindowConfig window_config,
                      read_observation_window_config(reader, "adakv", defaults));
  SE_ASSIGN_OR_RETURN(const double floor_alpha, reader.get_double("floor_alpha", 0.2, 0.0, 1.0));
  SE_RETURN_IF_ERROR(reader.finish());
  return std::unique_ptr<MethodRuntime>(new AdaKvMethod(reader.resolved(), window_config, variant, floor_alpha));
}

std::vector<int32_t> AdaKvMethod::head_capacities(const WindowScores& scores, int32_t num_prefix_budget,
                                                  double floor_alpha) {
  const int64_t n = scores.num_prefix;
  const int64_t num_entries = scores.num_kv_heads * n;
  const int64_t num_global = std::min<int64_t>(int64_t{scores.num_kv_heads} * num_prefix_budget, num_entries);
  // Global top over every (head, token): value descending, then head, then token (= flat index) ascending.
  std::vector<int64_t> order(static_cast<size_t>(num_entries));
  std::iota(order.begin(), order.end(), int64_t{0});
  const float* v = scores.values.data();
  std::nth_element(order.begin(), order.begin() + num_global, order.end(),
                   [v](int64_t a, int64_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  std::vector<int64_t> num_top(static_cast<size_t>(scores.num_kv_heads), 0);  // n_h
  for (int64_t i = 0; i < num_global; ++i) ++num_top[static_cast<size_t>(order[static_cast<size_t>(i)] / n)];
  const auto floor_capacity = static_cast<int64_t>(num_prefix_budget * floor_alpha);  // int(B * alpha)
  std::vector<int32_t> caps;
  for (int64_t n_h : num_top) {
    const double cap = std::nearbyint(static_cast<double>(n_h) * (1.0 - floor_alpha) +
                                      static_cast<double>(floor_capacity));  // half to even
    caps.push_back(static_cast<int32_t>(std::clamp<double>(cap, 0.0, static_cast<double>(n))));
  }
  return caps;
}

int32_t AdaKvMethod::kvpress_num_forced(int32_t budget, int32_t window, double floor_alpha) {
  auto num_safe = static_cast<int32_t>(static_cast<double>(budget) * floor_alpha);  // int(n_kept * alpha)
  if (floor_alpha > 0) num_safe = std::max(1, num_safe);
  return std::max(0, num_safe - window);  // the window's max + 1 scores take the first w of them
}

std::vector<std::vector<int32_t>> AdaKvMethod::kvpress_prefix_kept(const WindowScores& scores, int32_t budget,
                                                                   int32_t window, double floor_alpha) {
  const int32_t n = scores.num_prefix;
  const int32_t num_forced = std::min(kvpress_num_forced(budget, window, floor_alpha), n);
  std::vector<char> taken(static_cast<size_t>(scores.num_kv_heads) * n, 0);  // [Hkv, n]
  std::vector<std::vector<int32_t>> kept(static_cast<size_t>(scores.num_kv_heads));
  for (int32_t h = 0; h < scores.num_kv_heads; ++h) {
    kept[static_cast<size_t>(h)] = top_k_ascending(scores.head(h), n, num_forced);
    for (int32_t j : kept[static_cast<size_t>(h)]) taken[static_cast<size_t>(h) * n + j] = 1;
  }
  // The rest of the layer's Hkv * (C - w) prefix slots: the global top of the scores not forced, by value
  // descending, then flat index (head, then token) ascending.
  std::vector<int64_t> rest;
  rest.reserve(taken.size());
  for (int64_t i = 0; i < static_cast<int64_t>(taken.size()); ++i)
    if (!taken[static_cast<size_t>(i)]) rest.push_back(i);
  const int64_t num_slots = int64_t{scores.num_kv_heads} * (int64_t{budget} - window);
  const int64_t num_global =
      std::clamp<int64_t>(num_slots - int64_t{scores.num_kv_heads} * num_forced, 0, static_cast<int64_t>(rest.size()));
  const float* v = scores.values.data();
  std::nth_element(rest.begin(), rest.begin() + num_global, rest.end(),
                   [v](int64_t a, int64_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  for (int64_t i = 0; i < num_global; ++i) {
    const int64_t flat = rest[static_cast<size_t>(i)];
    kept[static_cast<size_t>(flat / n)].push_back(static_cast<int32_t>(flat % n));
  }
  for (std::vector<int32_t>& head : kept) std::sort(head.begin(), head.end());
  return kept;
}

std::vector<std::vector<int32_t>> AdaKvMethod::select_prefix(const WindowScores& scores, int /*layer*/,
                                                             int /*num_layers*/) const {
  return select_over_every_rank(scores, [this](const WindowScores& all) { return select_over_all_heads(all); });
}

std::vector<std::vector<int32_t>> AdaKvMethod::select_over_all_heads(const WindowScores& scores) const {
  const ObservationWindowConfig& c = window_config();
  if (variant_ == AdaKvVariant::kKvpress) return kvpress_prefix_kept(scores, c.budget, c.window, floor_alpha_);
  const std::vector<int32_t> caps = head_capacities(scores, c.budget - c.window, floor_alpha_);
  std::vector<std::vector<int32_t>> kept;
  kept.reserve(static_cast<size_t>(scores.num_kv_heads));
  for (int32_t h = 0; h < scores.num_kv_heads; ++h)
    kept.push_back(top_k_ascending(scores.head(h), scores.num_prefix, caps[static_cast<size_t>(h)]));
  return kept;
}

int64_t AdaKvMethod::compressed_pages(const KvLayout& layout, int32_t num_prompt_tokens,
                                      int32_t num_decode_tokens) const {
  const int64_t w = window_config().window, d = num_decode_tokens, num_tokens = num_prompt_tokens;
  const int64_t budget = window_config().budget;
  // This rank's heads of the layer's `heads` (all of them on one rank): they hold at most what the layer's total
  // leaves once every other head holds its least.
  const int64_t own = layout.num_kv_heads;
  const int64_t heads = own * communicator().size();
  const auto own_split_pages = [&](int64_t lo, int64_t hi, int64_t layer_total) {
    return max_split_pages(own, lo, hi, layer_total - (heads - own) * lo, layout.page_size);
  };
  if (variant_ == AdaKvVariant::kKvpress) {
    // Per layer the heads hold exactly Hkv * C prompt tokens together; each holds the window and its f forced
    // tokens, and at most what is left after the other heads' forced ones (and at most the prompt).
    const int64_t forced = kvpress_num_forced(window_config().budget, window_config().window, floor_alpha_);
    const int64_t most = std::min(num_tokens, w + heads * (budget - w) - (heads - 1) * forced);
    return layout.num_layers * own_split_pages(forced + w + d, most + d, heads * (budget + d));
  }
  // adakv_reference, per layer: cap_h >= int(B * alpha) (n_h >= 0), cap_h <= T - w, and since sum n_h = Hkv * B
  // and each cap_h rounds n_h * (1 - alpha) + int(B * alpha) up by at most 1/2, sum cap_h <= Hkv * (B (1 - alpha)
  // + int(B * alpha) + 1/2).
  const int64_t prefix_budget = budget - w;
  const auto floor_capacity = static_cast<int64_t>(static_cast<double>(prefix_budget) * floor_alpha_);
  const double most_caps = static_cast<double>(heads) * (static_cast<double>(prefix_budget) * (1.0 - floor_alpha_) +
                                                         static_cast<double>(floor_capacity) + 0.5);
  const int64_t total_caps =
      std::min(static_cast<int64_t>(std::floor(most_caps + 1e-6)), heads * (num_tokens - w));
  return layout.num_layers * own_split_pages(floor_capacity + w + d, num_tokens + d, total_caps + heads * (w + d));
}

}  // namespace se
