// Regex: a compiled PCRE2 pattern in UTF + UCP mode, JIT-compiled when the platform allows, that
// lists the non-overlapping matches of a text the way HF tokenizers' Oniguruma iterator does.
// \s and \S are rewritten to the Unicode White_Space set so they mean what they mean in Oniguruma.
// Immutable after compile(); find_all() is safe from many threads (match state is per thread).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace se {

class Regex {
 public:
  using Span = std::pair<size_t, size_t>;  // [begin, end) byte offsets

  // Errors name the pattern and PCRE2's message with its offset.
  static Result<Regex> compile(std::string_view pattern);

  // Appends the matches in text (valid UTF-8), left to right. An empty match directly after the
  // previous match is skipped by advancing one character, as Oniguruma's iterator does. If PCRE2
  // fails (a resource limit), the rest of text is reported as one match.
  void find_all(std::string_view text, std::vector<Span>& matches) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  std::shared_ptr<void> code_;  // pcre2_code_8, freed with pcre2_code_free_8
};

}  // namespace se
