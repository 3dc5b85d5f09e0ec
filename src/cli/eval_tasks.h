// The inputs and scores of `sparse-engine eval`: passkey-retrieval
// prompts (a passkey sentence hidden at a chosen depth of filler text), and the per-step comparison of a
// method's logits with vanilla's (top-1 agreement and KL). Plain functions over token ids; thread-compatible.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "cli/eval_texts.h"
#include "engine/model_bundle.h"

namespace se::cli {

struct PasskeyPrompt {
  std::vector<int32_t> ids;  // the whole prompt, exactly `num_tokens` long in plain mode
  std::string passkey;       // the digits the answer must contain
  double depth = 0.0;        // where the passkey sentence sits, as a fraction of the filler
};

// A passkey prompt of `num_tokens` tokens: an instruction, filler sentences with the passkey sentence at
// `depth` (snapped to a filler-sentence boundary), then the question. Plain mode ends with "The pass key is"
// for the model to complete; `chat` wraps the same text as a user turn of the model's chat template (the
// template's tokens come on top of `num_tokens`). The 5-digit passkey comes from `seed`.
Result<PasskeyPrompt> make_passkey_prompt(const ModelBundle& bundle, int32_t num_tokens, double depth, uint64_t seed,
                                          bool chat);

// log_softmax of `logits` [vocab], in place.
void log_softmax_in_place(std::span<float> logits);

struct StepComparison {
  bool top1_agrees = false;
  double kl = 0.0;  // KL(reference || method), nats
};

// `reference_log_probs` [vocab] (vanilla's, log_softmax'ed) against a method's raw `logits` [vocab].
StepComparison compare_step(std::span<const float> reference_log_probs, std::span<const float> logits);

}  // namespace se::cli
