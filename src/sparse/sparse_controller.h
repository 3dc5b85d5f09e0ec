// SparseController: the model's ForwardHooks, turned into the active method's lifecycle. At every layer it
// stores the new K/V through the method's CacheManager, lets the method narrow what each sequence's attention
// reads, runs attention over the resulting AttentionView and hands the method the outcome; around the forward
// it fires prepare_step and finish_step. Model code and the scheduler only ever talk to this class, never to a
// method by name. Engine thread only.
#pragma once

#include <span>

#include "model/forward_hooks.h"
#include "sparse/method_runtime.h"

namespace se {

class SparseController final : public ForwardHooks {
 public:
  SparseController(MethodRuntime& method, CacheManager& cache) : method_(method), cache_(cache) {}

  MethodRuntime& method() { return method_; }
  CacheManager& cache() { return cache_; }
  const CacheManager& cache() const { return cache_; }

  // Before and after one step's forward (after = after sampling).
  void prepare_step(const ForwardBatch& batch);
  void finish_step(const ForwardBatch& batch);

  void attend(int layer, const LayerConfig& layer_config, const ForwardBatch& batch, TensorView q, TensorView k,
              TensorView v, TensorView out, const AttentionParams& params) override;
  void on_layer_end(int layer, const ForwardBatch& batch, TensorView hidden) override;

  // Sequence lifecycle: the cache's open/close with the method told when a sequence ends.
  Result<int32_t> open(int32_t seq, std::span<const int32_t> prompt) { return cache_.open(seq, prompt); }
  void close(int32_t seq);

  // The MemoryOracle's questions that depend on the method.
  int64_t peak_pages(int32_t num_prompt_tokens, int32_t max_new_tokens) const {
    return method_.peak_pages(cache_.layout(), num_prompt_tokens, max_new_tokens);
  }

 private:
  MethodRuntime& method_;
  CacheManager& cache_;
  Selection selection_;  // reused by every layer
};

}  // namespace se
