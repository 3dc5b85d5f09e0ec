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

}  // namespace se::cli
