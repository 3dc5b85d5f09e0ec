#include "cli/eval_trace.h"

#include <algorithm>
#include <cmath>
#include <random>

#include <fmt/format.h>

namespace se::cli {

namespace {

constexpr char kInstruction[] = "Keep track of the variables. Each line sets one variable to a new value.\n";
// Common words, one or two tokens each on SmolLM2's tokenizer.
constexpr const char* kKeys[] = {"apple", "river", "stone", "cloud", "tiger", "lemon",
                                 "piano", "robot", "maple", "comet", "otter", "pearl"};
constexpr int kDistractorKeys = 5;

std::string assignment(std::string_view key, int value) { return fmt::format("\n{} = {}.", key, value); }

constexpr char kRecallInstruction[] = "Remember the code words.\n";
// Common nouns, one or two tokens each on SmolLM2's and Gemma 3's tokenizers.
constexpr const char* kCodeWords[] = {"apple",  "river",  "stone",  "cloud",  "tiger",  "lemon",
                                      "piano",  "robot",  "maple",  "comet",  "otter",  "pearl",
                                      "candle", "forest", "silver", "window", "garden", "rocket"};
constexpr int kRecalledWords = 6;  // the line's words; the cue repeats the first two

}  // namespace

Result<TraceSample> make_trace_sample(const EncodeFn& encode, std::optional<int32_t> bos, int32_t num_trace_tokens,
                                      double depth, uint64_t seed) {
  if (!(depth >= 0.0 && depth <= 1.0)) return invalid_argument("trace depth {} is not in [0, 1]", depth);
  std::mt19937_64 rng(seed);
  std::vector<std::string_view> keys(std::begin(kKeys), std::end(kKeys));
  std::shuffle(keys.begin(), keys.end(), rng);
  const std::string_view asked = keys[0];
  std::uniform_int_distribution<int> value(10, 999);
  std::uniform_int_distribution<size_t> distractor(1, kDistractorKeys);

  const int answer = value(rng);
  const std::vector<int32_t> asked_line = encode(assignment(asked, answer));
  // Distractor lines until the trace, the asked line included, holds the requested tokens.
  std::vector<std::vector<int32_t>> lines;
  int64_t num_tokens = static_cast<int64_t>(asked_line.size());
  while (num_tokens < num_trace_tokens) {
    lines.push_back(encode(assignment(keys[distractor(rng)], value(rng))));
    num_tokens += static_cast<int64_t>(lines.back().size());
  }
  if (lines.empty())
    return invalid_argument("a trace of {} tokens has no room for a distractor line besides the asked one",
                            num_trace_tokens);
  const auto at = static_cast<size_t>(std::llround(depth * static_cast<double>(lines.size())));
  lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(at), asked_line);

  TraceSample sample;
  if (bos) sample.prompt.push_back(*bos);
  const std::vector<int32_t> instruction = encode(kInstruction);
  sample.prompt.insert(sample.prompt.end(), instruction.begin(), instruction.end());
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i == at) sample.asked_token = static_cast<int64_t>(sample.trace.size());
    sample.trace.insert(sample.trace.end(), lines[i].begin(), lines[i].end());
  }
  const std::vector<int32_t> question =
      encode(fmt::format("\n\nQuestion: what is the last value of {}?\nAnswer: {} =", asked, asked));
  sample.trace.insert(sample.trace.end(), question.begin(), question.end());
  sample.answer = std::to_string(answer);
  return sample;
}

Result<TraceSample> make_recall_sample(const EncodeFn& encode, std::optional<int32_t> bos,
                                       std::span<const int32_t> filler, double depth, uint64_t seed) {
  if (!(depth >= 0.0 && depth <= 1.0)) return invalid_argument("recall depth {} is not in [0, 1]", depth);
  if (filler.empty()) return invalid_argument("a recall sample needs filler text");
  std::mt19937_64 rng(seed);
  std::vector<std::string_view> words(std::begin(kCodeWords), std::end(kCodeWords));
  std::shuffle(words.begin(), words.end(), rng);
  words.resize(kRecalledWords);
  const auto joined = [&](size_t first, size_t last) {
    std::string text;
    for (size_t i = first; i < last; ++i) text += (i == first ? "" : " ") + std::string(words[i]);
    return text;
  };

  TraceSample sample;
  if (bos) sample.prompt.push_back(*bos);
  const std::vector<int32_t> instruction = encode(kRecallInstruction);
  sample.prompt.insert(sample.prompt.end(), instruction.begin(), instruction.end());
  const auto at = static_cast<size_t>(std::llround(depth * static_cast<double>(filler.size())));
  const std::vector<int32_t> line = encode(fmt::format("\nThe code words are: {}.\n", joined(0, words.size())));
  sample.trace.assign(filler.begin(), filler.begin() + static_cast<std::ptrdiff_t>(at));
  sample.asked_token = static_cast<int64_t>(sample.trace.size());
  sample.trace.insert(sample.trace.end(), line.begin(), line.end());
  sample.trace.insert(sample.trace.end(), filler.begin() + static_cast<std::ptrdiff_t>(at), filler.end());
  const std::vector<int32_t> cue = encode(fmt::format("\nThe code words are: {}", joined(0, 2)));
  sample.trace.insert(sample.trace.end(), cue.begin(), cue.end());
  sample.answer = joined(2, words.size());
  return sample;
}

}  // namespace se::cli
