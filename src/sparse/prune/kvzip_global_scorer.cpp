#include "sparse/prune/kvzip_global_scorer.h"

#include "sparse/methods/kvzip.h"

namespace se {

namespace {

class KvzipGlobalScorer final : public PruneScorer {
 public:
  explicit KvzipGlobalScorer(MethodEnvironment environment) : environment_(std::move(environment)) {}

  // The reconstruction passes need the whole prompt resident: always a scratch sequence.
  std::optional<int32_t> computed_suffix() const override { return std::nullopt; }

  Result<std::unique_ptr<MethodRuntime>> make_method(std::vector<int32_t> /*attached_positions*/) override {
    // Every position is context (no sinks); a ratio below 1 makes the passes run (the scratch eviction after
    // them is discarded with the sequence).
    SE_ASSIGN_OR_RETURN(std::unique_ptr<KvzipMethod> method,
                        KvzipMethod::make({{"ratio", 0.5}, {"n_sink", 0}}, environment_));
    method_ = method.get();
    return std::unique_ptr<MethodRuntime>(std::move(method));
  }

  Result<std::vector<float>> position_scores(int32_t seq, const ModelConfig& config,
                                             int32_t num_tokens) const override {
    if (method_ == nullptr) return failed_precondition("kvzip_global: no scoring pass ran");
    const std::span<const float> scores = method_->last_scores(seq);
    if (scores.size() != static_cast<size_t>(config.num_layers) * config.num_kv_heads * num_tokens)
      return failed_precondition("kvzip_global: the reconstruction passes did not run for {} tokens", num_tokens);
    return kvzip_position_scores(scores, config.num_layers, config.num_kv_heads, num_tokens);
  }

 private:
  MethodEnvironment environment_;
  const KvzipMethod* method_ = nullptr;  // owned by the pass's driver
};

}  // namespace

std::unique_ptr<PruneScorer> make_kvzip_global_prune_scorer(const PruneScorerOptions& options) {
  return std::make_unique<KvzipGlobalScorer>(options.environment);
}

std::vector<float> kvzip_position_scores(std::span<const float> scores, int num_layers, int num_kv_heads,
                                         int32_t num_tokens) {
  std::vector<float> out(static_cast<size_t>(num_tokens), 0.0f);
  const float inv_heads = 1.0f / static_cast<float>(num_kv_heads);
  for (int stream = 0; stream < num_layers * num_kv_heads; ++stream) {
    const float* row = scores.data() + static_cast<size_t>(stream) * static_cast<size_t>(num_tokens);
    for (int32_t j = 0; j < num_tokens; ++j) out[static_cast<size_t>(j)] += row[j] * inv_heads;
  }
  return out;
}

}  // namespace se
