#include "sparse/prune/snapkv_global_scorer.h"

#include <limits>

#include "base/check.h"
#include "sparse/methods/observation_window_scores.h"

namespace se {

SnapKvGlobalScorer::SnapKvGlobalScorer(int32_t window)
    : MethodRuntime("snapkv_global", {{"window", window}, {"kernel", kKernel}}), window_(window) {
  SE_CHECK(window >= 1, "snapkv_global: window {}", window);
}

void SnapKvGlobalScorer::on_attention_end(LayerContext& ctx) {
  SE_CHECK(ctx.batch.sequences.size() == 1, "snapkv_global scores one sequence per forward");
  const SequenceSlice& slice = ctx.batch.sequences.front();
  const int32_t num_slots = ctx.view.seqs[0].num_tokens[0];
  if (ctx.layer == 0) {
    // Scored only when this forward completes the sequence with the whole window among its rows, on top of the
    // attached prefix.
    const auto num_attached = static_cast<int32_t>(attached_positions_.size());
    const bool scorable = slice.completes_prefill(ctx.batch.positions) && slice.num_tokens >= window_ &&
                          num_slots == num_attached + slice.num_tokens;
    num_tokens_ = scorable ? slice.num_prefill_tokens : 0;
    num_scored_layers_ = 0;
    layer_sum_.assign(static_cast<size_t>(num_tokens_), 0.0f);
    slot_positions_ = attached_positions_;
    for (int32_t r = 0; r < slice.num_tokens; ++r)
      slot_positions_.push_back(ctx.batch.positions[static_cast<size_t>(slice.token_begin + r)]);
  }
  if (num_tokens_ <= window_ || static_cast<int32_t>(slot_positions_.size()) != num_slots) return;
  const int64_t num_heads = ctx.q.shape[1];
  const int64_t row_elements = num_heads * ctx.q.shape[2];
  const TensorView window_q{ctx.q.ptr<char>() + (slice.token_begin + slice.num_tokens - window_) * row_elements *
                                                     static_cast<int64_t>(dtype_size(ctx.q.dtype)),
                            ctx.q.dtype, Shape{window_, num_heads, ctx.q.shape[2]}, ctx.q.device};  // [w, H, D]
  probs_.resize(static_cast<size_t>(num_heads * num_slots));
  const TensorView probs{probs_.data(), DType::kF32, {num_heads, num_slots}, Device::kCpu};  // [H, slots]
  attention_scores(probs, window_q, ctx.view, 0, ctx.params, ScoreReduce::kSum);
  const float inv_heads = 1.0f / static_cast<float>(num_heads);
  for (int64_t h = 0; h < num_heads; ++h)
    for (int32_t j = 0; j < num_slots; ++j)
      layer_sum_[static_cast<size_t>(slot_positions_[static_cast<size_t>(j)])] +=
          probs_[static_cast<size_t>(h * num_slots + j)] * inv_heads;
  ++num_scored_layers_;
}

Result<std::vector<float>> SnapKvGlobalScorer::position_scores() const {
  if (num_tokens_ <= window_ || num_scored_layers_ == 0)
    return failed_precondition("snapkv_global needs more than its window of {} tokens, the window's rows in the "
                               "forward that completes the sequence",
                               window_);
  const int32_t num_prefix = num_tokens_ - window_;
  // Positions no slot holds (pruned away) take no part in the pooling.
  std::vector<float> sums(static_cast<size_t>(num_prefix), -std::numeric_limits<float>::infinity());
  for (int32_t position : slot_positions_)
    if (position < num_prefix) sums[static_cast<size_t>(position)] = layer_sum_[static_cast<size_t>(position)];
  std::vector<float> scores(static_cast<size_t>(num_tokens_), std::numeric_limits<float>::infinity());
  pool_scores(sums.data(), scores.data(), num_prefix, kKernel, WindowPooling::kMax);
  for (int32_t j = 0; j < num_prefix; ++j)
    if (sums[static_cast<size_t>(j)] == -std::numeric_limits<float>::infinity())
      scores[static_cast<size_t>(j)] = -std::numeric_limits<float>::infinity();
  return scores;
}

nlohmann::json SnapKvGlobalScorer::debug_state(int32_t /*seq*/) const {
  Result<std::vector<float>> scores = position_scores();
  if (!scores.is_ok()) return nullptr;
  scores->resize(static_cast<size_t>(num_tokens_ - window_));
  return {{"window", window_}, {"scores", *scores}};
}

}  // namespace se

namespace se {

namespace {

class SnapKvGlobalPruneScorer final : public PruneScorer {
 public:
  explicit SnapKvGlobalPruneScorer(int32_t window) : window_(window) {}

  // The window's queries must be computed; the prefix before it can be the engine's cached KV.
  std::optional<int32_t> computed_suffix() const override { return window_; }

  Result<std::unique_ptr<MethodRuntime>> make_method(std::vector<int32_t> attached_positions) override {
    auto method = std::make_unique<SnapKvGlobalScorer>(window_);
    method->set_attached_positions(std::move(attached_positions));
    method_ = method.get();
    return std::unique_ptr<MethodRuntime>(std::move(method));
  }

  Result<std::vector<float>> position_scores(int32_t /*seq*/, const ModelConfig& /*config*/,
                                             int32_t /*num_tokens*/) const override {
    if (method_ == nullptr) return failed_precondition("snapkv_global: no scoring pass ran");
    return method_->position_scores();
  }

 private:
  int32_t window_;
  const SnapKvGlobalScorer* method_ = nullptr;  // owned by the pass's driver
};

}  // namespace

std::unique_ptr<PruneScorer> make_snapkv_global_prune_scorer(const PruneScorerOptions& options) {
  return std::make_unique<SnapKvGlobalPruneScorer>(options.window);
}

}  // namespace se
