// rkv: R-KV, redundancy-aware decode-time compression (Zefan-Cai/R-KV `R1KV`; scores and trigger in
// rkv_scores.h, checked against the reference's code). The prompt stays as prefilled; once a sequence's
// generated tokens resident reach budget + buffer, the step whose decoded count crosses a multiple of `buffer`
// rescores all of them with the newest `window` decode queries (attention importance minus key-similarity
// redundancy, per (layer, KV head)) and keeps `budget` (the window's own tokens among them), so the generated part
// cycles between budget and budget + buffer tokens per stream. Lifecycle, memory and Chain Cache behaviour:
// decode_compression_method.h. Engine thread only.
//
// Config: budget (default 1024, the SGLang port's), buffer (128, the reference's divide_length), window (8),
// kernel (7), mix_lambda (0.07, the reference code's default; its paper says 0.1); budget > window, buffer >=
// window (the reference requires it: the window's queries are decode queries).
// Plus "prompt_method" / "prompt_config": a prompt-time method that compresses the prompt at the end of prefill
// (the registry lists the valid ones); without it the prompt stays whole. The reference instead compresses a
// prompt longer than the budget at prefill with its own scores.
#pragma once

#include "sparse/method_config.h"
#include "sparse/methods/decode_compression_method.h"
#include "sparse/methods/rkv_scores.h"

namespace se {

class RkvMethod final : public DecodeCompressionMethod {
 public:
  // `prompt_method` (or null): the prompt-time method that compresses the prompt (decode_compression_method.h).
  static Result<std::unique_ptr<MethodRuntime>> create(const nlohmann::json& config,
                                                       std::unique_ptr<MethodRuntime> prompt_method);

 protected:
  std::optional<Region> plan_compression(const Clock& clock) const override;
  // The window's own tokens are always kept and not scored.
  int32_t num_scores(int32_t n) const override { return n - params_.window; }
  void score(TensorView out, TensorView queries, TensorView keys) override;
  std::vector<int32_t> select(const float* scores, int32_t n) const override;
  int32_t num_kept(int32_t n) const override { return std::min(n, params_.budget); }
  int32_t peak_generated_tokens(int32_t num_decoded) const override;

 private:
  RkvMethod(nlohmann::ordered_json config, const RkvParams& params, std::unique_ptr<MethodRuntime> prompt_method);
  RkvParams params_;
  RkvScratch scratch_;  // of score()
};

}  // namespace se
