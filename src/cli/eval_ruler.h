// RULER-style long-context tasks for `sparse-engine eval`, generated from a seed (no dataset is downloaded):
// single needle, multi-key needle (distractor keys), multi-value needle (every value asked for), variable
// tracking (a chain of assignments), frequent-word extraction (top 3 of a generated word list) and QA over
// synthetic documents (the answer is a span of the context). Each sample is a plain prompt of exactly the
// requested token count (frequent words: at most a few tokens short), built by encoding its pieces separately
// and joining their ids, so the needles sit at a known token position. Scoring is exact: every expected answer
// must appear in the greedy output as a whole word. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace se::cli {

enum class RulerTask {
  kSingleNeedle,
  kMultiKeyNeedle,
  kMultiValueNeedle,
  kVariableTracking,
  kFrequentWords,
  kQa,
};

// Names as on the command line and in the results file: niah_single, niah_multikey, niah_multivalue, vt, fwe, qa.
std::string_view ruler_task_name(RulerTask task);
Result<RulerTask> parse_ruler_task(std::string_view name);
std::vector<RulerTask> all_ruler_tasks();
// Greedy tokens each task's answer gets (room for every expected answer and some preamble).
int ruler_answer_tokens(RulerTask task);

// The haystack of the needle tasks and of the passkey prompt (RULER's "noise" haystack), repeated.
inline constexpr char kNoiseFiller[] =
    " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

// Text -> token ids, without special tokens (the tokenizer of the model under test).
using EncodeFn = std::function<std::vector<int32_t>(std::string_view)>;

struct RulerSample {
  RulerTask task = RulerTask::kSingleNeedle;
  std::vector<int32_t> ids;          // the whole prompt
  std::vector<std::string> answers;  // every one must appear in the output
  // Where the needle (the first of a chain) starts: its token index, and the share of the filler before it; the
  // frequent-word task has no needle (index 0, depth 0).
  int64_t needle_token = 0;
  double depth = 0.0;
  std::vector<int32_t> needle_ids;  // the needle's own tokens (empty for frequent words)
};

// One sample of `num_tokens` tokens with its needle at `depth` in [0, 1] of the haystack. `bos`, when set, opens
// the prompt. Errors: a length too short for the task's fixed parts, a depth outside [0, 1].
Result<RulerSample> make_ruler_sample(RulerTask task, const EncodeFn& encode, std::optional<int32_t> bos,
                                      int32_t num_tokens, double depth, uint64_t seed);

// Whether `output` holds every expected answer, each as a whole word (not inside a longer run of letters or
// digits, so "22048" does not count for "2204" and "ab" does not count inside "abc").
bool ruler_correct(const RulerSample& sample, std::string_view output);
bool contains_word(std::string_view text, std::string_view word);

}  // namespace se::cli
