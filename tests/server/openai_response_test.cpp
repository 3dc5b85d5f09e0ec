#include "server/openai_response.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>

namespace se::server {
namespace {

using nlohmann::json;

// A toy vocabulary: id -> bytes. 9 is the first two bytes of "€" (E2 82 AC), an incomplete character.
std::string token_bytes(int32_t id) {
  static const std::map<int32_t, std::string> kVocab = {
      {1, "Hel"}, {2, "lo"}, {3, " wörld"}, {4, "!"}, {9, "\xE2\x82"}};
  auto it = kVocab.find(id);
  return it == kVocab.end() ? std::string() : it->second;
}

ResponseFormatter formatter(Endpoint endpoint, bool logprobs = false, bool include_usage = false) {
  return ResponseFormatter(endpoint, "id-1", "m", 1700000000, logprobs, include_usage, token_bytes);
}

TokenOutput token(int32_t id, float logprob, std::vector<TokenLogprob> top = {}) {
  TokenOutput t;
  t.token_id = id;
  t.text = token_bytes(id);
  t.logprob = logprob;
  t.top = std::move(top);
  return t;
}

RequestOutput delta(std::string text, std::vector<TokenOutput> tokens, FinishReason finish = FinishReason::kNone) {
  RequestOutput out;
  out.text = std::move(text);
  out.tokens = std::move(tokens);
  out.finished = finish != FinishReason::kNone;
  out.finish_reason = finish;
  out.num_prompt_tokens = 5;
  out.num_cached_tokens = 2;
  out.num_output_tokens = 2;
  return out;
}

// Splits "data: {...}\n\n" events and parses each payload; [DONE] comes back as the string "[DONE]".
std::vector<json> parse_sse(const std::string& events) {
  std::vector<json> out;
  size_t pos = 0;
  while (pos < events.size()) {
    EXPECT_EQ(events.compare(pos, 6, "data: "), 0) << events.substr(pos);
    const size_t end = events.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos);
    const std::string payload = events.substr(pos + 6, end - pos - 6);
    out.push_back(payload == "[DONE]" ? json("[DONE]") : json::parse(payload));
    pos = end + 2;
  }
  return out;
}

TEST(Usage, CountsThePromptOnceAndSumsCompletions) {
  std::vector<ChoiceState> choices(2);
  choices[0].absorb(delta("a", {}), false);
  choices[1].absorb(delta("b", {}), false);
  const Usage usage = usage_of(choices);
  EXPECT_EQ(usage.to_json(), json::parse(R"({"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9,
                                            "prompt_tokens_details": {"cached_tokens": 2}})"));
}

TEST(FullResponse, CompletionShape) {
  ChoiceState choice;
  choice.absorb(delta("Hello", {token(1, -0.5f), token(2, -0.25f)}), false);
  RequestOutput last = delta("", {}, FinishReason::kStop);
  last.stop_reason = "!";
  choice.absorb(last, false);
  const json body = formatter(Endpoint::kCompletions).full_response(std::vector<ChoiceState>{choice});
  EXPECT_EQ(body["id"], "id-1");
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["created"], 1700000000);
  EXPECT_EQ(body["model"], "m");
  ASSERT_EQ(body["choices"].size(), 1u);
  EXPECT_EQ(body["choices"][0]["index"], 0);
  EXPECT_EQ(body["choices"][0]["text"], "Hello");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["choices"][0]["stop_reason"], "!");
  EXPECT_TRUE(body["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(body["usage"]["total_tokens"], 7);
}

TEST(FullResponse, ChatShapeWithSeveralChoices) {
  std::vector<ChoiceState> choices(2);
  choices[0].absorb(delta("one", {}, FinishReason::kLength), false);
  choices[1].absorb(delta("two", {}, FinishReason::kStop), false);
  const json body = formatter(Endpoint::kChatCompletions).full_response(choices);
  EXPECT_EQ(body["object"], "chat.completion");
  ASSERT_EQ(body["choices"].size(), 2u);
  EXPECT_EQ(body["choices"][0]["message"], json::parse(R"({"role": "assistant", "content": "one"})"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["choices"][1]["index"], 1);
  EXPECT_EQ(body["choices"][1]["finish_reason"], "stop");
  EXPECT_TRUE(body["choices"][1]["stop_reason"].is_null());
}

TEST(Logprobs, CompletionLegacyFormat) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<TokenOutput> tokens = {token(1, -0.5f, {{1, -0.5f}, {4, -2.0f}}), token(3, neg_inf),
                                     token(2, -0.25f)};
  size_t offset = 0;
  const json lp = formatter(Endpoint::kCompletions, true).logprobs_json(tokens, offset);
  EXPECT_EQ(lp["tokens"], json({"Hel", " wörld", "lo"}));
  EXPECT_EQ(lp["token_logprobs"], json({-0.5, -9999.0, -0.25}));
  // Offsets count characters: " wörld" is 6 characters in 7 bytes.
  EXPECT_EQ(lp["text_offset"], json({0, 3, 9}));
  EXPECT_EQ(offset, 11u);
  EXPECT_EQ(lp["top_logprobs"][0], json::parse(R"({"Hel": -0.5, "!": -2.0})"));
  EXPECT_EQ(lp["top_logprobs"][1], json::parse(R"({" wörld": -9999.0})"));
}

TEST(Logprobs, ChatFormatKeepsRawBytes) {
  std::vector<TokenOutput> tokens = {token(9, -1.0f, {{9, -1.0f}, {4, -3.0f}})};
  size_t offset = 0;
  const json lp = formatter(Endpoint::kChatCompletions, true).logprobs_json(tokens, offset);
  ASSERT_EQ(lp["content"].size(), 1u);
  const json& entry = lp["content"][0];
  EXPECT_EQ(entry["token"], "\xEF\xBF\xBD");  // U+FFFD stands in for the incomplete character
  EXPECT_EQ(entry["bytes"], json({0xE2, 0x82}));
  EXPECT_EQ(entry["logprob"], -1.0);
  ASSERT_EQ(entry["top_logprobs"].size(), 2u);
  EXPECT_EQ(entry["top_logprobs"][1], json::parse(R"({"token": "!", "logprob": -3.0, "bytes": [33]})"));
}

TEST(Streaming, ChatChunksThenUsageThenDone) {
  ResponseFormatter f = formatter(Endpoint::kChatCompletions, false, /*include_usage=*/true);
  ChoiceState state;
  std::string events = f.stream_start(1);
  events += f.stream_delta(0, delta("Hel", {token(1, -0.1f)}), state);
  EXPECT_EQ(f.stream_delta(0, delta("", {token(2, -0.1f)}), state), "");  // nothing new to say
  events += f.stream_delta(0, delta("lo", {}, FinishReason::kLength), state);
  events += f.stream_end(usage_of(std::vector<ChoiceState>{state}));
  const std::vector<json> chunks = parse_sse(events);
  ASSERT_EQ(chunks.size(), 5u);
  EXPECT_EQ(chunks[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(chunks[0]["choices"][0]["delta"], json::parse(R"({"role": "assistant", "content": ""})"));
  EXPECT_TRUE(chunks[0]["usage"].is_null());
  EXPECT_EQ(chunks[1]["choices"][0]["delta"]["content"], "Hel");
  EXPECT_TRUE(chunks[1]["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(chunks[2]["choices"][0]["delta"]["content"], "lo");
  EXPECT_EQ(chunks[2]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(chunks[3]["choices"], json::array());
  EXPECT_EQ(chunks[3]["usage"]["completion_tokens"], 2);
  EXPECT_EQ(chunks[4], "[DONE]");
  EXPECT_EQ(state.text, "Hello");
}

TEST(Streaming, CompletionChunksCarryLogprobsAndOffsets) {
  ResponseFormatter f = formatter(Endpoint::kCompletions, /*logprobs=*/true);
  ChoiceState state;
  EXPECT_EQ(f.stream_start(1), "");
  std::string events = f.stream_delta(0, delta("", {token(1, -0.1f)}), state);  // logprobs are news
  events += f.stream_delta(0, delta("Hello", {token(2, -0.2f)}, FinishReason::kStop), state);
  events += f.stream_end(Usage{});
  const std::vector<json> chunks = parse_sse(events);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0]["object"], "text_completion");
  EXPECT_FALSE(chunks[0].contains("usage"));
  EXPECT_EQ(chunks[0]["choices"][0]["text"], "");
  EXPECT_EQ(chunks[0]["choices"][0]["logprobs"]["text_offset"], json({0}));
  EXPECT_EQ(chunks[1]["choices"][0]["text"], "Hello");
  EXPECT_EQ(chunks[1]["choices"][0]["logprobs"]["text_offset"], json({3}));
  EXPECT_EQ(chunks[1]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(chunks[2], "[DONE]");
}

TEST(Streaming, SseEventNeverThrowsOnBadBytes) {
  const std::string event = sse_event(json{{"text", std::string("bad \xFF byte")}});
  EXPECT_EQ(event.rfind("data: ", 0), 0u);
  EXPECT_EQ(event.substr(event.size() - 2), "\n\n");
  EXPECT_NE(event.find("\xEF\xBF\xBD"), std::string::npos);
}

}  // namespace
}  // namespace se::server

namespace se::server {
namespace {

TEST(ChainFields, BodyAndChunksCarryTheChain) {
  ResponseFormatter chain_formatter = formatter(Endpoint::kChatCompletions);
  chain_formatter.set_chain_id("chain-7");
  RequestOutput last = delta("hi", {}, FinishReason::kStop);
  last.chain_status = ChainStatus::kResumed;
  std::vector<ChoiceState> choices(1);
  choices[0].absorb(last, false);
  const json body = chain_formatter.full_response(choices);
  EXPECT_EQ(body["chain_id"], "chain-7");
  EXPECT_EQ(body["chain_status"], "resumed");
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 2);

  ChoiceState streamed;
  const std::vector<json> first = parse_sse(chain_formatter.stream_delta(0, delta("a", {}), streamed));
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0]["chain_id"], "chain-7");
  EXPECT_FALSE(first[0].contains("chain_status"));  // known once the turn finished
  const std::vector<json> end = parse_sse(chain_formatter.stream_delta(0, last, streamed));
  EXPECT_EQ(end[0]["chain_status"], "resumed");

  const json plain = formatter(Endpoint::kChatCompletions).full_response(choices);
  EXPECT_FALSE(plain.contains("chain_id"));
  EXPECT_FALSE(plain.contains("chain_status"));
}

}  // namespace
}  // namespace se::server
