// TeacherForcedSequence: one sequence driven through a sparse method the way the engine drives it (the
// method's own CacheManager under a SparseController; the prompt prefilled in chunks of at most
// `prefill_chunk` tokens, then one decode step per token), except that the caller picks every token. Each step
// returns its logits, so the same token stream can be compared across methods step by step (`sparse-engine
// eval`). Methods' transient passes run as under the engine. Owns the method, its cache and the controller; the
// prefix cache is off. Single thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kv/kv_layout.h"
#include "model/model.h"
#include "sparse/method_environment.h"
#include "sparse/sparse_controller.h"

namespace se {

struct TeacherForcingOptions {
  std::string method = "vanilla";
  nlohmann::json config;          // the method's hyperparameters (object or null)
  int page_size = 16;             // tokens per KV page
  int prefill_chunk = 2048;       // prompt tokens per forward at most (the engine's --max-num-batched-tokens)
  int32_t max_tokens = 0;         // prompt + decoded tokens the sequence will reach at most (sizes the KV pool)
  MethodEnvironment environment;  // what the engine would give the method (engine.h: method_environment)
  // The KV store (--kv-cache-dtype), checked against the method as the engine checks it; KIVI's geometry.
  KvStoreKind store = KvStoreKind::kExplicit;
  int32_t kivi_group_size = 32;
  int32_t kivi_residual = 128;
};

class TeacherForcedSequence {
 public:
  static constexpr int32_t kSeq = 0;  // the one sequence id (what the method sees)

  // Builds the method and a KV pool that holds `options.max_tokens` tokens densely, with room to spare for
  // methods that work on top of the full cache. Errors: the method's (unknown name, bad config).
  static Result<std::unique_ptr<TeacherForcedSequence>> create(const Model& model,
                                                               const TeacherForcingOptions& options);
  // The same around a method the caller built (options.method and options.config are not read).
  static Result<std::unique_ptr<TeacherForcedSequence>> create(const Model& model,
                                                               std::unique_ptr<MethodRuntime> method,
                                                               const TeacherForcingOptions& options);
  ~TeacherForcedSequence();  // ends the sequence (the method drops its state)
  TeacherForcedSequence(const TeacherForcedSequence&) = delete;
  TeacherForcedSequence& operator=(const TeacherForcedSequence&) = delete;

  // Prefills the whole prompt (once, first). Returns the logits of its last token, [1, vocab].
  Result<Tensor> prefill(std::span<const int32_t> prompt);
  // The same one chunk at a time, so two runs can be compared between the chunks: start_prefill, then
  // prefill_chunk until prefill_done(). Each chunk returns the logits of its last row, [1, vocab].
  Status start_prefill(std::span<const int32_t> prompt);
  Result<Tensor> prefill_chunk();
  bool prefill_done() const { return num_prefill_tokens_ > 0 && num_prefilled_ == num_prefill_tokens_; }
  // One decode step that feeds `token` after everything so far. Returns its logits, [1, vocab].
  Result<Tensor> decode(int32_t token);

  // Pages the sequence holds now, and what a dense (vanilla) sequence of the same length would hold.
  int64_t num_held_pages() const;
  int64_t num_dense_pages() const;
  // The KV bytes it holds over a dense sequence's: the page ratio, scaled by the page sizes where the method keeps
  // another store than explicit K/V (low-rank latents).
  double held_bytes_fraction() const;
  int32_t num_tokens() const { return static_cast<int32_t>(tokens_.size()); }
  const MethodRuntime& method() const { return *method_; }
  // The method's cache (what each stream keeps), for inspection between steps.
  const CacheManager& cache() const { return *cache_; }
  // What each layer of the following forwards attends to (SparseController::set_attention_observer).
  void set_attention_observer(SparseController::AttentionObserver observer) {
    controller_.set_attention_observer(std::move(observer));
  }

 private:
  TeacherForcedSequence(const Model& model, std::unique_ptr<MethodRuntime> method, std::unique_ptr<CacheManager> cache);
  // Runs tokens_[begin, begin + n) as one forward; returns the logits of its last row.
  Result<Tensor> step(int32_t begin, int32_t n);


  const Model& model_;
  KvLayout dense_layout_;  // explicit K/V pages: what vanilla would keep
  std::unique_ptr<MethodRuntime> method_;
  std::unique_ptr<CacheManager> cache_;
  SparseController controller_;
  ForwardWorkspace workspace_;
  ForwardBatch batch_;
  std::vector<int32_t> tokens_;  // every token fed so far
  int32_t num_prefill_tokens_ = 0;
  int32_t num_prefilled_ = 0;  // prompt tokens computed so far
  int prefill_chunk_ = 0;
};

}  // namespace se
