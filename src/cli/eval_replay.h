// The model-driven halves of `sparse-engine eval`'s long text: a continuation the model writes itself (its
// decode steps' log-probabilities kept as the reference), the log-probabilities of a given continuation fed as
// decode steps, and the teacher-forced replay of a continuation through a method against such a reference (top-1
// agreement and KL per step). Each drives one fresh TeacherForcedSequence: prefill the prompt, then one decode
// step per continuation token. Single thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "engine/sampling_params.h"
#include "engine/teacher_forcing.h"

namespace se::cli {

// Log-probabilities of the decode step that fed each continuation token: [continuation][vocab].
using StepLogProbs = std::vector<std::vector<float>>;

struct WrittenContinuation {
  std::vector<int32_t> tokens;
  StepLogProbs log_probs;
};

// Prefills `prompt` on the fresh `run`, then writes `num_tokens` tokens: each is drawn from the latest logits
// under `sampling` (temperature 0: greedy; its seed makes a sampled one repeatable; end of generation is not a
// stop) and fed as a decode step, whose log-probabilities are kept. Replaying the tokens through the same method
// reproduces them exactly.
Result<WrittenContinuation> write_continuation(TeacherForcedSequence& run, std::span<const int32_t> prompt,
                                               int num_tokens, const SamplingParams& sampling);

// Prefills `prompt` on the fresh `run` and feeds every `continuation` token as a decode step.
Result<StepLogProbs> forced_log_probs(TeacherForcedSequence& run, std::span<const int32_t> prompt,
                                      std::span<const int32_t> continuation);

struct ReplayScore {
  int64_t steps = 0;
  int64_t agree = 0;     // steps whose argmax is the reference's
  double mean_kl = 0.0;  // KL(reference || run), nats, averaged over steps
};

// Prefills `prompt` on the fresh `run`, feeds every `continuation` token as a decode step and compares each step's
// logits with `reference` (one row per continuation token).
Result<ReplayScore> replay_against(TeacherForcedSequence& run, std::span<const int32_t> prompt,
                                   std::span<const int32_t> continuation, const StepLogProbs& reference);

}  // namespace se::cli
