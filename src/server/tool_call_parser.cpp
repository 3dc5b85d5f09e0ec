#include "server/tool_call_parser.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>

namespace se::server {

namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

size_t partial_tag_tail(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

size_t skip_space(std::string_view s, size_t pos) {
  while (pos < s.size() && is_space(s[pos])) ++pos;
  return pos;
}

// Consumes `token` at `pos` (after spaces); false when the text there differs or is too short yet.
bool expect(std::string_view s, size_t& pos, std::string_view token) {
  pos = skip_space(s, pos);
  if (s.substr(pos, token.size()) != token) return false;
  pos += token.size();
  return true;
}

struct CallHead {
  std::string name;
  size_t args_begin = 0;  // the arguments object's opening brace
};

// The head {"name": "...", "arguments"|"parameters": { of a call as the models write it. A call written in
// another order or with escapes in its name is read whole once complete instead.
std::optional<CallHead> read_head(std::string_view body) {
  size_t pos = 0;
  if (!expect(body, pos, "{") || !expect(body, pos, "\"name\"") || !expect(body, pos, ":") || !expect(body, pos, "\""))
    return std::nullopt;
  const size_t name_end = body.find_first_of("\"\\", pos);
  if (name_end == std::string_view::npos || body[name_end] != '"') return std::nullopt;
  CallHead head{std::string(body.substr(pos, name_end - pos)), 0};
  pos = name_end + 1;
  if (!expect(body, pos, ",")) return std::nullopt;
  size_t key = pos;
  if (!expect(body, key, "\"arguments\"")) {
    key = pos;
    if (!expect(body, key, "\"parameters\"")) return std::nullopt;
  }
  if (!expect(body, key, ":")) return std::nullopt;
  key = skip_space(body, key);
  if (key >= body.size() || body[key] != '{') return std::nullopt;
  head.args_begin = key;
  return head;
}

}  // namespace

std::optional<ToolCallFormat> tool_call_format_from_name(std::string_view name) {
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "llama3_json") return ToolCallFormat::kLlama3Json;
  return std::nullopt;
}

ToolCallSyntax tool_call_syntax(ToolCallFormat format, std::string_view name) {
  const std::string quoted = nlohmann::json(std::string(name)).dump();
  if (format == ToolCallFormat::kHermes)
    return {fmt::format("<tool_call>\n{{\"name\": {}, \"arguments\": ", quoted), "}\n</tool_call>"};
  return {fmt::format("{{\"name\": {}, \"parameters\": ", quoted), "}"};
}

bool ToolCallParser::Extent::feed(char c) {
  if (in_string) {
    if (escape) {
      escape = false;
    } else if (c == '\\') {
      escape = true;
    } else if (c == '"') {
      in_string = false;
    }
    return false;
  }
  if (c == '"') in_string = true;
  if (c == '{' || c == '[') ++depth;
  if (c == '}' || c == ']') return --depth == 0;
  return false;
}

ToolCallParser::ToolCallParser(ToolCallFormat format, std::string id_prefix)
    : format_(format), id_prefix_(std::move(id_prefix)) {
  if (format_ == ToolCallFormat::kHermes) mode_ = Mode::kText;
}

void ToolCallParser::start_call() {
  after_call_ = false;
  body_.clear();
  body_started_ = false;
  body_extent_ = Extent{};
  head_done_ = false;
  args_begin_ = args_scanned_ = 0;
  args_done_ = false;
  args_extent_ = Extent{};
  mode_ = Mode::kCall;
}

std::string ToolCallParser::raw_call_text() const {
  return format_ == ToolCallFormat::kHermes ? std::string(kHermesOpen) + body_ : body_;
}

void ToolCallParser::emit_streamed(ToolParseDelta& out) {
  if (!head_done_) {
    std::optional<CallHead> head = read_head(body_);
    if (!head) return;
    head_done_ = true;
    args_begin_ = args_scanned_ = head->args_begin;
    out.calls.push_back({num_calls_, id_prefix_ + std::to_string(num_calls_), std::move(head->name), ""});
  }
  const size_t from = args_scanned_;
  while (!args_done_ && args_scanned_ < body_.size()) args_done_ = args_extent_.feed(body_[args_scanned_++]);
  if (args_scanned_ > from) out.calls.push_back({num_calls_, "", "", body_.substr(from, args_scanned_ - from)});
}

void ToolCallParser::end_call(ToolParseDelta& out) {
  if (head_done_) {
    ++num_calls_;
    return;
  }
  // Not in the streamable shape: read it whole.
  const nlohmann::json call = nlohmann::json::parse(body_, nullptr, /*allow_exceptions=*/false);
  const nlohmann::json* args = nullptr;
  if (call.is_object()) {
    for (const char* key : {"arguments", "parameters"})
      if (call.contains(key)) args = &call[key];
  }
  if (args == nullptr || !call.contains("name") || !call["name"].is_string()) {
    out.content += raw_call_text();
    mode_ = Mode::kText;
    return;
  }
  out.calls.push_back({num_calls_, id_prefix_ + std::to_string(num_calls_), call["name"].get<std::string>(),
                       args->is_string() ? args->get<std::string>() : args->dump()});
  ++num_calls_;
}

bool ToolCallParser::feed_call(char c, ToolParseDelta& out) {
  body_ += c;
  if (!body_started_) {
    if (is_space(c)) return false;
    if (c != '{') {
      mode_ = Mode::kMalformed;
      return false;
    }
    body_started_ = true;
  }
  return body_extent_.feed(c);
}

ToolParseDelta ToolCallParser::push(std::string_view text) {
  pending_ += text;
  ToolParseDelta out;
  size_t pos = 0;
  while (pos < pending_.size()) {
    const std::string_view rest = std::string_view(pending_).substr(pos);
    if (mode_ == Mode::kStart) {  // llama3_json: a call only at the start, after an optional <|python_tag|>
      const size_t first = skip_space(rest, 0);
      if (first == rest.size()) break;
      const std::string_view head = rest.substr(first);
      if (head.size() < kPythonTag.size() && kPythonTag.substr(0, head.size()) == head) break;
      if (head.substr(0, kPythonTag.size()) == kPythonTag) {
        pos += first + kPythonTag.size();
      } else if (head.front() == '{') {
        pos += first;
        start_call();
      } else {
        mode_ = Mode::kText;
      }
    } else if (mode_ == Mode::kText) {
      if (after_call_) {
        // Whitespace between calls, or after the last, is layout, not content: hold it until text follows.
        const size_t first = skip_space(rest, 0);
        const std::string_view next = rest.substr(first);
        if (next.size() < kHermesOpen.size() && kHermesOpen.substr(0, next.size()) == next) break;
        if (next.starts_with(kHermesOpen)) pos += first;
        after_call_ = false;
        continue;
      }
      const size_t open = format_ == ToolCallFormat::kHermes ? rest.find(kHermesOpen) : std::string_view::npos;
      if (open == std::string_view::npos) {
        const size_t keep = format_ == ToolCallFormat::kHermes ? partial_tag_tail(rest, kHermesOpen) : 0;
        out.content += rest.substr(0, rest.size() - keep);
        pos = pending_.size() - keep;
        break;
      }
      out.content += rest.substr(0, open);
      pos += open + kHermesOpen.size();
      start_call();
    } else if (mode_ == Mode::kCall) {
      bool closed = false;
      while (pos < pending_.size() && mode_ == Mode::kCall && !closed) closed = feed_call(pending_[pos++], out);
      if (mode_ == Mode::kCall) emit_streamed(out);
      if (closed) {
        end_call(out);
        if (mode_ == Mode::kCall) mode_ = Mode::kAfterCall;
      }
    } else if (mode_ == Mode::kMalformed) {
      // Kept whole until the text ends: it goes back as content then.
      body_ += rest;
      pos = pending_.size();
    } else {  // kAfterCall: hermes skips to its closing tag; llama3_json to ";" and the next call
      if (format_ == ToolCallFormat::kHermes) {
        const size_t close = rest.find(kHermesClose);
        if (close == std::string_view::npos) {
          pos = pending_.size() - partial_tag_tail(rest, kHermesClose);
          break;
        }
        pos += close + kHermesClose.size();
        mode_ = Mode::kText;
        after_call_ = true;
      } else {
        const size_t next = rest.find_first_not_of(" \n\t\r;");
        if (next == std::string_view::npos) {
          pos = pending_.size();
          break;
        }
        pos += next;
        if (rest[next] == '{') {
          start_call();
        } else {
          mode_ = Mode::kText;
        }
      }
    }
  }
  pending_.erase(0, pos);
  return out;
}

ToolParseDelta ToolCallParser::flush() {
  ToolParseDelta out;
  if (mode_ == Mode::kCall || mode_ == Mode::kMalformed) {
    if (head_done_) {
      ++num_calls_;  // cut short (length): it keeps what was streamed
    } else {
      out.content += raw_call_text();
    }
  } else if ((mode_ == Mode::kText && !after_call_) || mode_ == Mode::kStart) {
    out.content += pending_;
  }
  pending_.clear();
  mode_ = Mode::kText;
  return out;
}

}  // namespace se::server
