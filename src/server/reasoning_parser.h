// ReasoningParser: splits a chat completion's text into reasoning and content at the <think> ... </think> tags
// (--reasoning-parser, vLLM's names). Text arrives in pieces (streamed deltas) and a tag may straddle two
// pieces: the parser holds back a tail that may begin a tag until the next piece or flush() decides it. One
// parser per choice; not thread-safe.
//   qwen3: reasoning only when the text opens with <think>; otherwise all of it is content.
//   deepseek_r1: the template opens the thinking block in the prompt, so the text starts as reasoning (a leading
//   <think> is dropped) until </think>; without </think> all of it is reasoning.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace se::server {

enum class ReasoningFormat { kQwen3, kDeepSeekR1 };

// The format of a --reasoning-parser name; nullopt when unknown.
std::optional<ReasoningFormat> reasoning_format_from_name(std::string_view name);
// Every --reasoning-parser name.
std::vector<std::string> reasoning_parser_names();

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningParser {
 public:
  explicit ReasoningParser(ReasoningFormat format) : format_(format) {}

  // The reasoning and content that `text` settles; a possible partial tag at its end is held back.
  ReasoningDelta push(std::string_view text);
  // The end of the text: whatever is held back is what it looked like.
  ReasoningDelta flush();

 private:
  enum class Phase { kStart, kReasoning, kContent };

  ReasoningFormat format_;
  Phase phase_ = Phase::kStart;
  std::string pending_;  // text not yet assigned: a possible tag prefix
};

}  // namespace se::server
