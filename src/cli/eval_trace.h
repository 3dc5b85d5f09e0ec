// Key-value tracking written as decode steps, for `sparse-engine eval --trace-lengths`: a task scored exactly whose
// evidence lies in the part of the sequence a decode-time method compresses. The prompt is a short instruction;
// the trace that follows is fed token by token as decode steps, as if the model had written it: lines
// "KEY = VALUE." that set a few distractor keys again and again, with the asked key set once at `depth` of the
// trace; then the question "what is the last value of KEY?" ending in "KEY =", and the model writes the value.
// Generated from a seed (no dataset), pieces encoded separately and joined so the asked line sits at a known token.
// Word recall (make_recall_sample) is the same shape over real prose, and copying is what even 135M models do.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "cli/eval_ruler.h"

namespace se::cli {

struct TraceSample {
  std::vector<int32_t> prompt;  // BOS (when the model adds one) and the instruction: prefilled
  std::vector<int32_t> trace;   // the assignments, then the question: fed as decode steps
  std::string answer;           // the asked key's value, which the output must hold as a whole word
  int64_t asked_token = 0;      // where the asked key's line starts in `trace`
};

// Greedy tokens the answer gets: the value (up to three digits, one token each on SmolLM2) and its period.
inline constexpr int kTraceAnswerTokens = 5;

// A sample whose assignments take `num_trace_tokens` tokens (within one line) before the question; `depth` in
// [0, 1] places the asked line among them. Errors: a trace too short for the asked line and one distractor line.
Result<TraceSample> make_trace_sample(const EncodeFn& encode, std::optional<int32_t> bos, int32_t num_trace_tokens,
                                      double depth, uint64_t seed);

// Recall of words the sequence wrote, for `--recall-lengths`: the prompt is a short instruction; the trace is
// `filler` (prose, fed as decode steps) with the line "The code words are: W1 ... W6." placed at `depth` of it, then
// the cue "The code words are: W1 W2", and the model must go on with "W3 W4 W5 W6" (the answer, as one phrase):
// an induction copy that needs the line still readable. Errors: a depth outside [0, 1], an empty filler.
Result<TraceSample> make_recall_sample(const EncodeFn& encode, std::optional<int32_t> bos,
                                       std::span<const int32_t> filler, double depth, uint64_t seed);

// Greedy tokens the recalled words get: four words of one or two tokens each, and their period.
inline constexpr int kRecallAnswerTokens = 10;

}  // namespace se::cli
