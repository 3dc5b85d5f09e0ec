// ToolCallParser: finds the tool calls in a chat completion's content (--tool-call-parser, vLLM's names) and
// turns them into OpenAI's tool_calls, streamed as OpenAI streams them: a call's first delta carries its index,
// id and function name, later deltas pieces of its arguments text. Text arrives in pieces; a tag or call may
// straddle them. One parser per choice; not thread-safe.
//   hermes (Qwen, Hermes): <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, anywhere in the text.
//   llama3_json (Llama 3.x): the text opens with {"name": ..., "parameters": {...}} (after an optional
//   <|python_tag|>); several calls are separated by ";".
// A call whose JSON is not an object with a string "name" and its arguments stays in the content as written.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace se::server {

enum class ToolCallFormat { kHermes, kLlama3Json };

// The format of a --tool-call-parser name; nullopt when unknown.
std::optional<ToolCallFormat> tool_call_format_from_name(std::string_view name);

// The text a model of `format` writes for one call of `name`, around its arguments object: what constrained
// decoding makes the model write when a call is required.
struct ToolCallSyntax {
  std::string prefix;
  std::string suffix;
};
ToolCallSyntax tool_call_syntax(ToolCallFormat format, std::string_view name);

struct ToolCallDelta {
  int index = 0;
  std::string id;         // the first delta of a call only
  std::string name;       // the first delta of a call only
  std::string arguments;  // the next piece of the arguments' JSON text
};

struct ToolParseDelta {
  std::string content;
  std::vector<ToolCallDelta> calls;
};

class ToolCallParser {
 public:
  // Call ids are `id_prefix` followed by the call's index.
  ToolCallParser(ToolCallFormat format, std::string id_prefix);

  ToolParseDelta push(std::string_view text);
  // The end of the text: a call cut short keeps what was streamed of it, or stays content if its name never came.
  ToolParseDelta flush();
  int num_calls() const { return num_calls_; }

 private:
  enum class Mode { kStart, kText, kCall, kMalformed, kAfterCall };

  // Tracks where one JSON object or array ends, from its opening bracket on.
  struct Extent {
    int depth = 0;
    bool in_string = false;
    bool escape = false;
    bool feed(char c);  // true when `c` closes the value
  };

  void start_call();
  // Adds one character to the call's text; true when it closed the call's object.
  bool feed_call(char c, ToolParseDelta& out);
  // Emits the name once the call's head is readable, then the arguments text scanned so far.
  void emit_streamed(ToolParseDelta& out);
  // The call's object is complete: emit what streaming did not, or give the text back as content.
  void end_call(ToolParseDelta& out);
  std::string raw_call_text() const;

  ToolCallFormat format_;
  std::string id_prefix_;
  Mode mode_ = Mode::kStart;
  std::string pending_;  // text not yet assigned (a possible tag prefix)
  int num_calls_ = 0;
  bool after_call_ = false;  // hermes: only whitespace since the last call's closing tag

  // The call being read.
  std::string body_;  // its text after the opening tag
  bool body_started_ = false;
  Extent body_extent_;
  bool head_done_ = false;  // name emitted; its arguments stream from args_begin_
  size_t args_begin_ = 0;
  size_t args_scanned_ = 0;  // body_ offset up to which the arguments were scanned (and emitted)
  bool args_done_ = false;
  Extent args_extent_;
};

}  // namespace se::server
