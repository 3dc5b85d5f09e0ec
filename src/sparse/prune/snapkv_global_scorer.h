// SnapKvGlobalScorer: the `snapkv_global` prefix-pruning policy's scoring pass, as a method a scratch sequence
// runs (the engine's prune job prefills the tokens through it, METHODS.md "SnapKV" adapted to one score per
// position shared by every stream). Dense attention, no eviction; it only records scores. Engine thread only.
//
// For a token sequence of T tokens and window w (the last w tokens), whose last forward computes at least the
// window's rows on top of an attached prefix whose stream slots hold the positions set_attached_positions names
// (a cached prefix, pruned segments included; none by default). Positions held nowhere score -inf. Then:
//   1. per layer l and query head h: p[l, h, j] = sum over the window rows r of softmax_r(q_r . k_j * scale)[j]
//      (backend attention_scores, ScoreReduce::kSum: fp32 softmax over all keys, causal inside the window);
//   2. s[j] = sum over layers of the mean over query heads of p[l, h, j];
//   3. the prefix j < T - w is max-pooled along j with kernel 7 (stride 1, -inf padding), as SnapKV pools;
//   4. the window positions j >= T - w score +inf (SnapKV always keeps its window).
// Keep masks then take the top positions of s inside a range (ties: the lower index).
#pragma once

#include <memory>
#include <vector>

#include "sparse/method_runtime.h"
#include "sparse/prune/prune_scorer.h"

namespace se {

class SnapKvGlobalScorer final : public MethodRuntime {
 public:
  static constexpr int32_t kDefaultWindow = 32;
  static constexpr int32_t kKernel = 7;

  // Precondition: window >= 1.
  explicit SnapKvGlobalScorer(int32_t window);

  // The positions the slots of the prefix the sequence attached hold, ascending (slot i holds [i]).
  void set_attached_positions(std::vector<int32_t> positions) { attached_positions_ = std::move(positions); }
  void on_attention_end(LayerContext& ctx) override;
  // {"window": w, "scores": the pooled prefix scores [T - w]} (the window's are +inf), or null.
  nlohmann::json debug_state(int32_t seq) const override;

  // [T] the scores of the sequence completed last (steps 2-4), or kFailedPrecondition when its last forward
  // did not hold the whole window or it holds no more than `window` tokens.
  Result<std::vector<float>> position_scores() const;

 private:
  int32_t window_;
  std::vector<int32_t> attached_positions_;
  std::vector<int32_t> slot_positions_;  // [stream length] the position each slot holds, this forward
  int32_t num_tokens_ = 0;           // T of the prefill scored so far
  int num_scored_layers_ = 0;
  std::vector<float> layer_sum_;     // [T] step 2 so far
  std::vector<float> probs_;         // scratch: [H, T]
};

// The policy's PruneScorer: runs a SnapKvGlobalScorer of options.window on top of the cached prefix when it can.
std::unique_ptr<PruneScorer> make_snapkv_global_prune_scorer(const PruneScorerOptions& options);

}  // namespace se
