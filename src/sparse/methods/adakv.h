// adakv: Ada-KV (kvpress `AdaKVPress`; FFY0/AdaKV `AdaptiveSnapKVCluster.update_kv_gqa`). SnapKV-style scores,
// but the heads of a layer share the layer's budget adaptively: heads whose attention is concentrated give
// their share to heads whose attention is spread out, so the KV heads of one layer end with different lengths
// (the page table keeps per-stream lengths). Engine thread only (the lifecycle is ObservationWindowMethod's).
// Prompts of T <= budget are not compressed. C = budget, w = window, alpha = floor_alpha, Hkv KV heads.
//
// `variant` picks the allocation per layer (T > C):
//
//   kvpress (default; AdaKVPress over SnapKVPress scores, our `budget` = kvpress's n_kept = compute_n_kept(T, r)):
//     kvpress scores the window max + 1 (above every prefix score), forces each head's top
//     n_safe = int(C * alpha) scores (at least 1 when alpha > 0) to the largest float, and keeps the global top
//     Hkv * C of the layer (masking the rest with fake keys; we evict them). In prefix terms, which is what
//     this computes: every head keeps the whole window and its own top max(0, n_safe - w) prefix tokens (the
//     window takes the first w of the n_safe), and the rest of the Hkv * (C - w) prefix slots go to the global
//     top of the remaining prefix scores across heads (ties: lower head, then lower token).
//
//   adakv_reference (FFY0/AdaKV LongBench `pred.py`, gqa_support; B = C - w):
//     1. Each KV head's prefix scores, sorted descending (ties: lower token index first).
//     2. The global top Hkv * B of all heads' scores (ties: lower head first); n_h = how many of them
//        belong to head h.
//     3. Head h keeps its own top cap_h = round(n_h * (1 - alpha) + int(B * alpha)) tokens (round half to even,
//        as torch.round), plus the window. The reference's `normalize` (off by default), `skip` (0) and
//        pyramid mode are not offered. FFY0 compresses at T == budget too, where rounding may drop a token.
//
// Tensor parallelism: a rank holds some of the layer's KV heads, so the allocation gathers every rank's scores over
// its communicator, decides over all Hkv heads as one rank would, and keeps its own heads' part; every rank decides
// the same allocation.
//
// Config and the reference each default follows:
//   variant kvpress    METHODS.md: the default follows kvpress where kvpress implements the method.
//   budget 2048        tokens per (layer, KV head) on average, the window included (the benchmark
//                      budget; FFY0 uses 1024).
//   floor_alpha 0.2    kvpress alpha_safeguard and FFY0 floor_alpha.
//   the scorer, per variant (kvpress delegates scoring to the press it wraps; we follow SnapKVPress's defaults):
//     kvpress:          window 64, kernel 5, pooling avgpool, gqa_agg mean, gqa_order pool_then_reduce.
//     adakv_reference:  window 32, kernel 7, pooling maxpool, gqa_agg mean, gqa_order reduce_then_pool (FFY0:
//                       the window queries' mean, the group reduced before pooling).
#pragma once

#include "sparse/methods/observation_window_method.h"

namespace se {

enum class AdaKvVariant : uint8_t { kKvpress, kAdaKvReference };

class AdaKvMethod final : public ObservationWindowMethod {
 public:
  static Result<std::unique_ptr<MethodRuntime>> create(const nlohmann::json& config);

  // adakv_reference: per KV head, the prefix tokens it keeps (step 3's cap_h) from a layer's scores.
  static std::vector<int32_t> head_capacities(const WindowScores& scores, int32_t num_prefix_budget,
                                              double floor_alpha);
  // kvpress: the prefix tokens every head is forced to keep, max(0, n_safe - window).
  static int32_t kvpress_num_forced(int32_t budget, int32_t window, double floor_alpha);
  // kvpress: per KV head, the ascending prefix indices it keeps from a layer's scores (the window excluded).
  static std::vector<std::vector<int32_t>> kvpress_prefix_kept(const WindowScores& scores, int32_t budget,
                                                               int32_t window, double floor_alpha);

 private:
  AdaKvMethod(nlohmann::ordered_json config, const ObservationWindowConfig& window_config, AdaKvVariant variant,
              double floor_alpha)
      : ObservationWindowMethod("adakv", std::move(config), window_config),
        variant_(variant),
        floor_alpha_(floor_alpha) {}
  std::vector<std::vector<int32_t>> select_prefix(const WindowScores& scores, int layer,
                                                  int num_layers) const override;
  // The kept prefix of every head of the layer from all of its heads' scores.
  std::vector<std::vector<int32_t>> select_over_all_heads(const WindowScores& scores) const;
  // An upper bound: the split of a layer's tokens over its heads depends on the scores, so this is the most
  // pages any split the variant allows can take of this rank's heads (see adakv.cpp).
  int64_t compressed_pages(const KvLayout& layout, int32_t num_prompt_tokens,
                           int32_t num_decode_tokens) const override;

  AdaKvVariant variant_ = AdaKvVariant::kKvpress;
  double floor_alpha_ = 0.2;
};

}  // namespace se
