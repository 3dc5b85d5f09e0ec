// pyramidkv: PyramidKV (kvpress `PyramidKVPress`; Zefan-Cai/KVCache-Factory `PyramidKVCluster`). SnapKV's
// scores and selection, with a per-layer budget that shrinks linearly from the first layer to the last, so
// that the layers together keep about as much as SnapKV with the same budget. Engine thread only (the
// lifecycle is ObservationWindowMethod's). Prompts of T <= budget are never compressed.
//
// `schedule` picks the per-layer rule (C = budget, w = window, L layers, T prompt tokens, T > C):
//
//   kvpress (default; PyramidKVPress.get_layer_budget, float arithmetic, counts include the window):
//     min = C / beta, max = 2C - min; if max >= T - w: max = T - w, min = 2C - max.
//     Unless T >= max >= min >= w, every layer keeps round(C) tokens (the uniform fallback, SnapKV's);
//     otherwise layer l keeps n_kept(l) = round(max - l (max - min) / (L - 1)) tokens (one layer: round(max)).
//     round() is half to even (Python's). Each layer keeps the window and its top n_kept(l) - w prefix tokens.
//     Budget mapping: kvpress's per-layer average T (1 - r) (compression_ratio r) is our `budget`, a real
//     number of tokens here: kvpress at ratio r on a T-token prompt == ours with budget = T * (1 - r), the
//     same double (kvpress computes window + T (1 - r) - window; so do we). The usual integer budget
//     int(T (1 - r)) = kvpress's compute_n_kept gives the same schedule only when T (1 - r) is whole.
//     (kvpress compresses every prompt when r > 0; T <= C here means r <= 0, so nothing is lost.)
//
//   kvcache_factory (PyramidKVCluster, integer arithmetic, prefix counts around C - w; budget an integer):
//     T < 2(C - w): every layer keeps C - w prefix tokens (SnapKV);
//     otherwise min = (C - w) / beta, max = 2(C - w) - min; if max >= T - w: max = T - w, min = 2(C - w) - max;
//     step = (max - min) / (L - 1); layer l keeps max - l * step prefix tokens, plus the window.
//     With one layer (L - 1 = 0, undefined in the reference) the layer keeps C - w.
//
// Config and the reference each default follows:
//   schedule kvpress   METHODS.md: the default follows kvpress where kvpress implements the method.
//   budget 2048        tokens per (layer, KV head) on average, the window included (the benchmark);
//                      fractional values only with schedule kvpress (see the mapping above).
//   beta 20            kvpress and KVCache-Factory.
//   window 64, kernel 5, pooling avgpool: kvpress PyramidKVPress (KVCache-Factory's LongBench runner uses 8/7/max).
//   gqa_agg mean, gqa_order pool_then_reduce: kvpress.
#pragma once

#include "sparse/methods/observation_window_method.h"

namespace se {

enum class PyramidSchedule : uint8_t { kKvpress, kKvCacheFactory };

class PyramidKvMethod final : public ObservationWindowMethod {
 public:
  static Result<std::unique_ptr<MethodRuntime>> create(const nlohmann::json& config);

  // kvpress: tokens (the window included) layer `layer` of `num_layers` keeps from a prompt of
  // num_prompt_tokens > budget tokens.
  static int32_t kvpress_layer_tokens(int32_t num_prompt_tokens, double budget, int32_t window, int32_t beta,
                                      int num_layers, int layer);
  // kvcache_factory: prefix tokens (the window excluded) layer `layer` of `num_layers` keeps from a prompt of
  // num_prompt_tokens > budget tokens.
  static int32_t layer_prefix_budget(int32_t num_prompt_tokens, int32_t budget, int32_t window, int32_t beta,
                                     int num_layers, int layer);

 private:
  PyramidKvMethod(nlohmann::ordered_json config, const ObservationWindowConfig& window_config, PyramidSchedule schedule,
                  int32_t beta)
      : ObservationWindowMethod("pyramidkv", std::move(config), window_config), schedule_(schedule), beta_(beta) {}
  // Prefix tokens layer `layer` keeps under the configured schedule, in [0, T - w].
  int32_t num_prefix_kept(int32_t num_prompt_tokens, int num_layers, int layer) const;
  std::vector<std::vector<int32_t>> select_prefix(const WindowScores& scores, int layer,
                                                  int num_layers) const override;
  // Exact: every KV head of a layer holds the layer's count plus the window and the decode tokens.
  int64_t compressed_pages(const KvLayout& layout, int32_t num_prompt_tokens,
                           int32_t num_decode_tokens) const override;

  PyramidSchedule schedule_ = PyramidSchedule::kKvpress;
  int32_t beta_ = 20;
};

}  // namespace se
