#include "server/tool_call_parser.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "server/chat_output_parser.h"

namespace se::server {
namespace {

struct Parsed {
  std::string content;
  nlohmann::json calls;
  std::vector<ToolCallDelta> deltas;
};

Parsed run(ToolCallFormat format, const std::vector<std::string>& pieces) {
  ToolCallParser parser(format, "call_");
  Parsed out;
  for (const std::string& piece : pieces) {
    ToolParseDelta d = parser.push(piece);
    out.content += d.content;
    out.deltas.insert(out.deltas.end(), d.calls.begin(), d.calls.end());
  }
  ToolParseDelta d = parser.flush();
  out.content += d.content;
  out.deltas.insert(out.deltas.end(), d.calls.begin(), d.calls.end());
  out.calls = tool_calls_json(out.deltas);
  return out;
}

// The text cut at every point, and byte by byte, parses as the whole does; every call's first delta carries its
// id and name and the later ones only arguments.
void expect_parse(ToolCallFormat format, const std::string& text, const std::string& content,
                  const nlohmann::json& calls) {
  std::vector<std::vector<std::string>> cuts = {{text}};
  for (size_t cut = 0; cut <= text.size(); ++cut) cuts.push_back({text.substr(0, cut), text.substr(cut)});
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  cuts.push_back(bytes);
  for (const auto& pieces : cuts) {
    Parsed p = run(format, pieces);
    EXPECT_EQ(p.content, content) << text << " in " << pieces.size() << " pieces";
    EXPECT_EQ(p.calls, calls) << text << " in " << pieces.size() << " pieces";
    std::vector<bool> seen(calls.size(), false);
    for (const ToolCallDelta& d : p.deltas) {
      ASSERT_LT(static_cast<size_t>(d.index), seen.size());
      EXPECT_EQ(!d.id.empty(), !seen[static_cast<size_t>(d.index)]) << "the id comes with the first delta only";
      EXPECT_EQ(!d.name.empty(), !seen[static_cast<size_t>(d.index)]);
      seen[static_cast<size_t>(d.index)] = true;
    }
  }
}

nlohmann::json call(int index, const std::string& name, const std::string& args) {
  return {{"id", "call_" + std::to_string(index)},
          {"type", "function"},
          {"function", {{"name", name}, {"arguments", args}}}};
}

TEST(ToolCallParser, HermesCallsBetweenText) {
  expect_parse(ToolCallFormat::kHermes,
               "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
               "\"days\": [1, {\"x\": \"}\"}]}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}"
               "\n</tool_call>",
               "Let me check.",
               nlohmann::json::array({call(0, "get_weather", "{\"city\": \"Paris\", \"days\": [1, {\"x\": \"}\"}]}"),
                                      call(1, "now", "{}")}));
}

TEST(ToolCallParser, HermesWithoutCallsIsContent) {
  expect_parse(ToolCallFormat::kHermes, "no calls <tool here", "no calls <tool here", nlohmann::json::array());
}

TEST(ToolCallParser, HermesArgumentsBeforeNameAreReadWhole) {
  expect_parse(ToolCallFormat::kHermes, "<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"f\"}</tool_call>", "",
               nlohmann::json::array({call(0, "f", "{\"a\":1}")}));
}

TEST(ToolCallParser, HermesMalformedCallStaysContent) {
  expect_parse(ToolCallFormat::kHermes, "<tool_call>{\"nam\": 1}</tool_call>x", "<tool_call>{\"nam\": 1}</tool_call>x",
               nlohmann::json::array());
  expect_parse(ToolCallFormat::kHermes, "<tool_call>oops</tool_call>", "<tool_call>oops</tool_call>",
               nlohmann::json::array());
}

TEST(ToolCallParser, HermesCallCutShortKeepsWhatStreamed) {
  expect_parse(ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"ab", "",
               nlohmann::json::array({call(0, "f", "{\"q\": \"ab")}));
}

TEST(ToolCallParser, Llama3JsonCalls) {
  expect_parse(ToolCallFormat::kLlama3Json,
               "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": 1}}; {\"name\": \"g\", \"parameters\": {}}", "",
               nlohmann::json::array({call(0, "f", "{\"x\": 1}"), call(1, "g", "{}")}));
  expect_parse(ToolCallFormat::kLlama3Json, "Sure: {\"name\": \"f\"}", "Sure: {\"name\": \"f\"}",
               nlohmann::json::array());
}

TEST(ToolCallParser, SyntaxRoundTrips) {
  for (ToolCallFormat format : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json}) {
    const ToolCallSyntax syntax = tool_call_syntax(format, "lookup");
    expect_parse(format, syntax.prefix + "{\"k\":\"v\"}" + syntax.suffix, "",
                 nlohmann::json::array({call(0, "lookup", "{\"k\":\"v\"}")}));
  }
}

TEST(ChatOutputParser, ReasoningThenToolCalls) {
  ChatOutputParser parser({ReasoningFormat::kDeepSeekR1, ToolCallFormat::kHermes, "id"});
  ChatDelta all;
  const std::string text = "think</think>ok<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
  for (char c : text) all.append(parser.push(std::string(1, c)));
  all.append(parser.flush());
  EXPECT_EQ(all.reasoning, "think");
  EXPECT_EQ(all.content, "ok");
  EXPECT_EQ(parser.num_calls(), 1);
  EXPECT_EQ(tool_calls_json(all.calls)[0]["function"]["name"], "f");
}

}  // namespace
}  // namespace se::server
