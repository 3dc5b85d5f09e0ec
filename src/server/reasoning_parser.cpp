#include "server/reasoning_parser.h"

#include <algorithm>
#include <utility>

namespace se::server {

namespace {

constexpr std::string_view kOpenTag = "<think>";
constexpr std::string_view kCloseTag = "</think>";

// The length of the longest tail of `text` that is a proper prefix of `tag`: text that may still become it.
size_t partial_tag_tail(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

// vLLM's parser names, which are those of the model families that write the format.
constexpr std::pair<std::string_view, ReasoningFormat> kFormats[] = {{"qwen3", ReasoningFormat::kQwen3},
                                                                     {"deepseek_r1", ReasoningFormat::kDeepSeekR1}};
}  // namespace

std::optional<ReasoningFormat> reasoning_format_from_name(std::string_view name) {
  for (const auto& [known, format] : kFormats)
    if (name == known) return format;
  return std::nullopt;
}

std::vector<std::string> reasoning_parser_names() {
  std::vector<std::string> names;
  for (const auto& entry : kFormats) names.emplace_back(entry.first);
  return names;
}

ReasoningDelta ReasoningParser::push(std::string_view text) {
  pending_ += text;
  ReasoningDelta out;
  if (phase_ == Phase::kStart) {
    // Decide once the text is either the opening tag or cannot become it.
    const size_t n = std::min(pending_.size(), kOpenTag.size());
    if (pending_.compare(0, n, kOpenTag.substr(0, n)) == 0) {
      if (n < kOpenTag.size()) return out;  // still a prefix of <think>
      pending_.erase(0, kOpenTag.size());
      phase_ = Phase::kReasoning;
    } else {
      phase_ = format_ == ReasoningFormat::kDeepSeekR1 ? Phase::kReasoning : Phase::kContent;
    }
  }
  if (phase_ == Phase::kReasoning) {
    const size_t close = pending_.find(kCloseTag);
    if (close == std::string::npos) {
      const size_t keep = partial_tag_tail(pending_, kCloseTag);
      out.reasoning = pending_.substr(0, pending_.size() - keep);
      pending_.erase(0, pending_.size() - keep);
      return out;
    }
    out.reasoning = pending_.substr(0, close);
    pending_.erase(0, close + kCloseTag.size());
    phase_ = Phase::kContent;
  }
  out.content = std::move(pending_);
  pending_.clear();
  return out;
}

ReasoningDelta ReasoningParser::flush() {
  ReasoningDelta out;
  // A text that ended inside "<think" (kStart) or inside "</think" (kReasoning) keeps those characters as what
  // they were: content before any reasoning began, reasoning after.
  if (phase_ == Phase::kReasoning || (phase_ == Phase::kStart && format_ == ReasoningFormat::kDeepSeekR1)) {
    out.reasoning = std::move(pending_);
  } else {
    out.content = std::move(pending_);
  }
  pending_.clear();
  return out;
}

}  // namespace se::server
