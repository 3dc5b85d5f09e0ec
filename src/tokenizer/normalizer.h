// Normalizer: the text rewrites HF tokenizers apply before pre-tokenization (Unicode normal forms,
// lowercasing, literal or regex replacement, prepending), as an ordered list of steps.
// Immutable after construction; apply() is safe from many threads.
#pragma once

#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "tokenizer/regex.h"

namespace se {

class Normalizer {
 public:
  enum class Form { kNfc, kNfd, kNfkc, kNfkd };
  struct UnicodeForm {
    Form form;
  };
  struct Lowercase {};
  // Replaces every occurrence of a literal string, or of a regex when `regex` is set.
  struct Replace {
    std::string literal;
    std::vector<Regex> regex;  // empty, or one compiled pattern
    std::string content;
  };
  // Prepends `prefix` to non-empty text.
  struct Prepend {
    std::string prefix;
  };
  using Step = std::variant<UnicodeForm, Lowercase, Replace, Prepend>;

  void add(Step step) { steps_.push_back(std::move(step)); }
  bool empty() const { return steps_.empty(); }

  // text must be valid UTF-8; so is the result.
  std::string apply(std::string_view text) const;

 private:
  std::vector<Step> steps_;
};

}  // namespace se
