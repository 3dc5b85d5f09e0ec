#include "tokenizer/pretokenizer.h"

#include <utility>

#include "base/check.h"
#include "tokenizer/byte_level.h"

namespace se {
namespace {

struct Part {
  size_t begin;
  size_t end;
  bool is_match;
};

// The whole of text as alternating gaps and matches (HF's Pattern::find_matches) of regex, or of
// literal when regex is null.
std::vector<Part> find_parts(std::string_view text, const Regex* regex, std::string_view literal) {
  std::vector<Regex::Span> spans;
  if (regex != nullptr) {
    regex->find_all(text, spans);
  } else if (!literal.empty()) {
    for (size_t at = text.find(literal); at != std::string_view::npos;
         at = text.find(literal, at + literal.size())) {
      spans.emplace_back(at, at + literal.size());
    }
  }
  std::vector<Part> parts;
  size_t prev = 0;
  for (const auto& [begin, end] : spans) {
    if (prev != begin) parts.push_back({prev, begin, false});
    parts.push_back({begin, end, true});
    prev = end;
  }
  if (prev != text.size()) parts.push_back({prev, text.size(), false});
  return parts;
}

// Applies HF's delimiter behaviour; the result's is_match flags are meaningless except for
// kRemoved, where matched parts are dropped.
std::vector<Part> apply_behavior(std::vector<Part> parts, PreTokenizer::Behavior behavior) {
  using B = PreTokenizer::Behavior;
  std::vector<Part> out;
  out.reserve(parts.size());
  bool previous_match = false;
  switch (behavior) {
    case B::kIsolated:
      return parts;
    case B::kRemoved:
      for (const Part& p : parts) {
        if (!p.is_match) out.push_back(p);
      }
      return out;
    case B::kMergedWithPrevious:
      for (const Part& p : parts) {
        if (p.is_match && !previous_match && !out.empty()) {
          out.back().end = p.end;
        } else {
          out.push_back(p);
        }
        previous_match = p.is_match;
      }
      return out;
    case B::kMergedWithNext:
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().begin = it->begin;
        } else {
          out.push_back(*it);
        }
        previous_match = it->is_match;
      }
      return {out.rbegin(), out.rend()};
    case B::kContiguous:
      for (const Part& p : parts) {
        if (p.is_match == previous_match && !out.empty()) {
          out.back().end = p.end;
        } else {
          out.push_back(p);
        }
        previous_match = p.is_match;
      }
      return out;
  }
  return parts;
}

void split_one(std::string_view text, const Regex* regex, std::string_view literal,
               PreTokenizer::Behavior behavior, bool invert, std::vector<std::string>& out) {
  std::vector<Part> parts = find_parts(text, regex, literal);
  if (invert) {
    for (Part& p : parts) p.is_match = !p.is_match;
  }
  for (const Part& p : apply_behavior(std::move(parts), behavior)) {
    if (p.end > p.begin) out.emplace_back(text.substr(p.begin, p.end - p.begin));
  }
}

}  // namespace

Result<PreTokenizer::Split> PreTokenizer::regex_split(std::string_view pattern, Behavior behavior,
                                                      bool invert) {
  SE_ASSIGN_OR_RETURN(Regex regex, Regex::compile(pattern));
  Split split;
  split.regex.push_back(std::move(regex));
  split.behavior = behavior;
  split.invert = invert;
  return split;
}

PreTokenizer::Split PreTokenizer::digits(bool individual_digits) {
  // Rust's char::is_numeric is the N category.
  Result<Split> split =
      regex_split(individual_digits ? R"(\p{N})" : R"(\p{N}+)", Behavior::kIsolated);
  SE_CHECK(split.is_ok(), "{}", split.status().to_string());
  return std::move(split).value();
}

Status PreTokenizer::add(Step step) {
  if (byte_level_) {
    return unimplemented("a pre-tokenizer step after ByteLevel is not supported");
  }
  if (const auto* b = std::get_if<ByteLevel>(&step)) {
    byte_level_ = true;
    if (b->use_regex) {
      SE_ASSIGN_OR_RETURN(Regex regex, Regex::compile(kGpt2SplitPattern));
      gpt2_regex_.push_back(std::move(regex));
    }
  }
  steps_.push_back(std::move(step));
  return Status::ok();
}

void PreTokenizer::split(std::string_view text, std::vector<std::string>& pieces) const {
  if (text.empty()) return;
  std::vector<std::string> current;
  current.emplace_back(text);
  std::vector<std::string> next;
  for (const Step& step : steps_) {
    next.clear();
    if (const auto* s = std::get_if<Split>(&step)) {
      const Regex* regex = s->regex.empty() ? nullptr : &s->regex.front();
      for (const std::string& piece : current) {
        split_one(piece, regex, s->literal, s->behavior, s->invert, next);
      }
    } else {
      const auto& b = std::get<ByteLevel>(step);
      for (std::string& piece : current) {
        if (b.add_prefix_space && piece.front() != ' ') piece.insert(piece.begin(), ' ');
        if (b.use_regex) {
          split_one(piece, &gpt2_regex_.front(), {}, Behavior::kIsolated, false, next);
        } else {
          next.push_back(std::move(piece));
        }
      }
    }
    std::swap(current, next);
  }
  for (std::string& piece : current) {
    if (piece.empty()) continue;
    pieces.push_back(byte_level_ ? byte_level::encode(piece) : std::move(piece));
  }
}

}  // namespace se
