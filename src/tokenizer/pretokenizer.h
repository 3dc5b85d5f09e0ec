// PreTokenizer: cuts normalized text into the pieces BPE runs on, as HF tokenizers' pre-tokenizers
// do: regex or literal splits with HF's delimiter behaviours, digit splitting, and the byte-level
// step (GPT-2 regex split plus the byte -> printable-character mapping of the result).
// Immutable after construction; split() is safe from many threads.
#pragma once

#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/status.h"
#include "tokenizer/regex.h"

namespace se {

// GPT-2's split pattern, as HF's ByteLevel pre-tokenizer uses it.
inline constexpr std::string_view kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class PreTokenizer {
 public:
  // What happens to a delimiter (a pattern match): HF's SplitDelimiterBehavior.
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

  struct Split {
    std::string literal;       // used when regex is empty
    std::vector<Regex> regex;  // empty, or one compiled pattern
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
  };
  // Must be the last step: everything after it would see mapped characters.
  struct ByteLevel {
    bool add_prefix_space = false;
    bool use_regex = true;
  };
  using Step = std::variant<Split, ByteLevel>;

  static Result<Split> regex_split(std::string_view pattern, Behavior behavior,
                                   bool invert = false);
  // HF's Digits pre-tokenizer: every digit alone, or runs of digits.
  static Split digits(bool individual_digits);

  // Errors when a step follows a ByteLevel step.
  Status add(Step step);
  bool is_byte_level() const { return byte_level_; }

  // Appends the pieces of text (valid UTF-8) in the model's alphabet; never appends empty pieces.
  void split(std::string_view text, std::vector<std::string>& pieces) const;

 private:
  std::vector<Step> steps_;
  std::vector<Regex> gpt2_regex_;  // compiled once when a ByteLevel step uses the regex
  bool byte_level_ = false;
};

}  // namespace se
