// SequenceGenerator: generates one sequence on the reference path (ContiguousKvCache, prompt prefilled in
// chunks), streaming text as it is decoded. It is the engine-free ground truth the serving engine's outputs are
// compared against, and the single-stream path of `generate` and `bench generate`. Not thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/request_output.h"
#include "engine/sampling_params.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace se {

struct GenerationResult {
  std::vector<int32_t> output_ids;
  std::string text;
  FinishReason finish_reason = FinishReason::kLength;
  int num_prompt_tokens = 0;
  double prefill_seconds = 0.0;  // prompt forward until the first token is sampled
  double decode_seconds = 0.0;   // the remaining tokens
};

class SequenceGenerator {
 public:
  static constexpr int kPrefillChunk = 512;

  // `tokenizer` may be null (dummy models): no text, stop strings unsupported, stops only at max_tokens.
  SequenceGenerator(const Model& model, const Tokenizer* tokenizer) : model_(model), tokenizer_(tokenizer) {}

  // Runs the prompt and samples until a stop condition. `on_text` receives each newly final piece of text.
  // Errors: invalid params, a prompt that is empty or longer than the model's context.
  Result<GenerationResult> generate(const std::vector<int32_t>& prompt_ids, const SamplingParams& params,
                                    const std::function<void(std::string_view)>& on_text = {}) const;

 private:
  const Model& model_;
  const Tokenizer* tokenizer_;
};

}  // namespace se
