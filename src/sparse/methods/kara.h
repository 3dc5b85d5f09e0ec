// kara: Kara, periodic sliding-window compression of the generated tokens with Token2Chunk (the seed's
// description, METHODS-2.md §1; our interpretation, docs/fidelity.md "Kara: our interpretation"; selection in
// kara_selection.h). Every `period` decode steps of a sequence, if it holds at least window + buffer
// uncompressed generated tokens, its newest window + buffer of them form the window: every window query scores
// the first `window` (the compressible region) bidirectionally, Token2Chunk picks `budget` of them per (layer, KV
// head) as candidates plus whole chunks between them, and the region is compacted to those; the last `buffer`
// tokens stay uncompressed and open the next window. Uncompressed tokens older than the window (only before the
// first compression, when the period does not divide window + buffer) stay whole. Lifecycle, memory and Chain
// Cache behaviour: decode_compression_method.h. Engine thread only.
//
// Config: window (W, default 512), buffer (P, 64), candidates (K, 64), budget (R, 160), period (128),
// length_exponent (gamma, 1.0); budget <= window, candidates >= 1; plus "prompt_method" / "prompt_config": a
// prompt-time method that compresses the prompt at the end of prefill (the registry lists the valid ones).
// The sequence keeps the queries of its newest W + P decode tokens per layer in bf16, where the queries live
// (device memory on a GPU).
#pragma once

#include "sparse/method_config.h"
#include "sparse/methods/decode_compression_method.h"
#include "sparse/methods/kara_selection.h"

namespace se {

class KaraMethod final : public DecodeCompressionMethod {
 public:
  // `prompt_method` (or null): the prompt-time method that compresses the prompt (decode_compression_method.h).
  static Result<std::unique_ptr<MethodRuntime>> create(const nlohmann::json& config,
                                                       std::unique_ptr<MethodRuntime> prompt_method);

 protected:
  std::optional<Region> plan_compression(const Clock& clock) const override;
  int32_t num_scores(int32_t n) const override { return n; }
  void score(TensorView out, TensorView queries, TensorView keys) override;
  std::vector<int32_t> select(const float* scores, int32_t n) const override;
  int32_t num_kept(int32_t n) const override { return std::min(n, params_.budget); }
  int32_t peak_generated_tokens(int32_t num_decoded) const override;

 private:
  KaraMethod(nlohmann::ordered_json config, const KaraParams& params, std::unique_ptr<MethodRuntime> prompt_method);
  KaraParams params_;
};

}  // namespace se
