#include "server/openai_request.h"

#include <gtest/gtest.h>

namespace se::server {
namespace {

using nlohmann::json;

ApiResult<OpenAiRequest> completion(const json& body, int max_n = 8) {
  return parse_completion_request(body, RequestLimits{max_n});
}
ApiResult<OpenAiRequest> chat(const json& body) { return parse_chat_request(body, RequestLimits{8}); }

json user_chat(json extra = json::object()) {
  json body = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  body.update(extra);
  return body;
}

// Expects a 400 whose param and message name `field`.
template <typename T>
void expect_bad_field(const ApiResult<T>& result, const std::string& field) {
  ASSERT_FALSE(result.is_ok()) << "expected an error naming " << field;
  EXPECT_EQ(result.error().http_status, 400);
  EXPECT_EQ(result.error().param, field);
  EXPECT_NE(result.error().message.find(field), std::string::npos) << result.error().message;
}

TEST(ParseJsonBody, RejectsInvalidUtf8MalformedJsonAndNonObjects) {
  auto bad_utf8 = parse_json_body("{\"prompt\": \"caf\xC3\x28\"}");
  ASSERT_FALSE(bad_utf8.is_ok());
  EXPECT_EQ(bad_utf8.error().http_status, 400);
  EXPECT_NE(bad_utf8.error().message.find("UTF-8"), std::string::npos);

  auto malformed = parse_json_body("{\"prompt\": ");
  ASSERT_FALSE(malformed.is_ok());
  EXPECT_EQ(malformed.error().http_status, 400);
  EXPECT_NE(malformed.error().message.find("JSON"), std::string::npos);

  auto array = parse_json_body("[1, 2]");
  ASSERT_FALSE(array.is_ok());
  EXPECT_NE(array.error().message.find("array"), std::string::npos);

  auto ok = parse_json_body(R"({"prompt": "caf\u00e9"})");
  ASSERT_TRUE(ok.is_ok());
  EXPECT_EQ(ok.value()["prompt"], "caf\xC3\xA9");
}

TEST(ParseCompletion, AcceptsEachPromptForm) {
  auto text = completion({{"prompt", "Hello"}});
  ASSERT_TRUE(text.is_ok());
  EXPECT_EQ(text->prompt_text, "Hello");

  auto one_string = completion({{"prompt", {"Hello"}}});
  ASSERT_TRUE(one_string.is_ok());
  EXPECT_EQ(one_string->prompt_text, "Hello");

  auto ids = completion({{"prompt", {1, 2, 3}}});
  ASSERT_TRUE(ids.is_ok());
  EXPECT_FALSE(ids->prompt_text.has_value());
  EXPECT_EQ(ids->prompt_ids, (std::vector<int32_t>{1, 2, 3}));

  // As parsed from the wire, where non-negative numbers are unsigned.
  auto parsed = completion(json::parse(R"({"prompt": [504, 3575, 2147483647], "max_tokens": 3, "n": 2})"));
  ASSERT_TRUE(parsed.is_ok()) << parsed.error().message;
  EXPECT_EQ(parsed->prompt_ids, (std::vector<int32_t>{504, 3575, 2147483647}));
  EXPECT_EQ(parsed->params.max_tokens, 3);
  EXPECT_EQ(parsed->n, 2);
  expect_bad_field(completion(json::parse(R"({"prompt": [2147483648]})")), "prompt");
  expect_bad_field(completion(json::parse(R"({"prompt": [18446744073709551615]})")), "prompt");

  auto nested = completion({{"prompt", {{7, 8}}}});
  ASSERT_TRUE(nested.is_ok());
  EXPECT_EQ(nested->prompt_ids, (std::vector<int32_t>{7, 8}));
}

TEST(ParseCompletion, RejectsBadPrompts) {
  expect_bad_field(completion(json::object()), "prompt");
  expect_bad_field(completion({{"prompt", json::array()}}), "prompt");
  expect_bad_field(completion({{"prompt", {"a", "b"}}}), "prompt");
  expect_bad_field(completion({{"prompt", 42}}), "prompt");
  expect_bad_field(completion({{"prompt", {1, -2}}}), "prompt");
  expect_bad_field(completion({{"prompt", {1, 2.5}}}), "prompt");
  expect_bad_field(completion({{"prompt", {1, "x"}}}), "prompt");
  expect_bad_field(completion({{"prompt", {1, 4294967296LL}}}), "prompt");
}

TEST(ParseCompletion, ReadsSamplingFields) {
  auto r = completion({{"prompt", "x"},        {"model", "m"},       {"max_tokens", 7}, {"temperature", 0},
                       {"top_p", 0.5},         {"top_k", 40},        {"min_p", 0.1},    {"seed", 11},
                       {"stop", "\n"},         {"n", 3},             {"stream", true},  {"ignore_eos", true},
                       {"stream_options", {{"include_usage", true}}}, {"logprobs", 2}, {"stop_token_ids", {5}}});
  ASSERT_TRUE(r.is_ok()) << r.error().message;
  EXPECT_EQ(r->model, "m");
  EXPECT_TRUE(r->max_tokens_given);
  EXPECT_EQ(r->params.max_tokens, 7);
  EXPECT_EQ(r->params.temperature, 0.0f);
  EXPECT_FLOAT_EQ(r->params.top_p, 0.5f);
  EXPECT_EQ(r->params.top_k, 40);
  EXPECT_FLOAT_EQ(r->params.min_p, 0.1f);
  EXPECT_EQ(r->params.seed, 11u);
  EXPECT_EQ(r->params.stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(r->params.stop_token_ids, std::vector<int32_t>{5});
  EXPECT_TRUE(r->params.ignore_eos);
  EXPECT_EQ(r->n, 3);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(r->params.logprobs, 2);
}

TEST(ParseCompletion, DefaultsAndNullsMeanNotGiven) {
  auto r = completion({{"prompt", "x"}, {"max_tokens", nullptr}, {"temperature", nullptr}, {"stop", nullptr},
                       {"logprobs", nullptr}, {"stream_options", nullptr}});
  ASSERT_TRUE(r.is_ok()) << r.error().message;
  EXPECT_FALSE(r->max_tokens_given);
  EXPECT_EQ(r->params.temperature, 1.0f);
  EXPECT_TRUE(r->params.stop.empty());
  EXPECT_FALSE(r->logprobs);
  EXPECT_EQ(r->params.logprobs, -1);
  EXPECT_EQ(r->n, 1);
  EXPECT_FALSE(r->stream);
  EXPECT_TRUE(r->model.empty());
}

TEST(UnsupportedFields, AreRejectedByNameUnlessNull) {
  // "user" is an end-user tag that never changes the output; null means "not given" to OpenAI clients.
  auto tagged = completion({{"prompt", "x"}, {"user", "me"}, {"presence_penalty", nullptr}});
  EXPECT_TRUE(tagged.is_ok()) << tagged.error().message;
  expect_bad_field(completion({{"prompt", "x"}, {"presence_penalty", 0.5}}), "presence_penalty");
  // Values that ask for nothing, as many clients send by default, pass.
  auto neutral = chat(user_chat({{"presence_penalty", 0}, {"frequency_penalty", 0.0}, {"repetition_penalty", 1.0},
                                 {"logit_bias", json::object()}}));
  EXPECT_TRUE(neutral.is_ok()) << neutral.error().message;
  expect_bad_field(chat(user_chat({{"repetition_penalty", 1.1}})), "repetition_penalty");
  expect_bad_field(completion({{"prompt", "x"}, {"some_extension", {1, 2}}}), "some_extension");
  expect_bad_field(completion({{"prompt", "x"}, {"tools", json::array()}}), "tools");
  expect_bad_field(chat(user_chat({{"parallel_tool_calls", false}})), "parallel_tool_calls");
  expect_bad_field(chat(user_chat({{"logit_bias", {{"1", 5}}}})), "logit_bias");
  // Each endpoint's own fields belong to it alone.
  expect_bad_field(completion({{"prompt", "x"}, {"messages", json::array()}}), "messages");
  expect_bad_field(completion({{"prompt", "x"}, {"top_logprobs", 2}}), "top_logprobs");
  expect_bad_field(chat(user_chat({{"prompt", "x"}})), "prompt");
  expect_bad_field(chat(user_chat({{"echo", false}})), "echo");
}

json weather_tool() {
  return {{"type", "function"},
          {"function",
           {{"name", "get_weather"},
            {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}};
}

TEST(Tools, ChoiceAndListAreChecked) {
  auto plain = chat(user_chat({{"tools", json::array({weather_tool()})}}));
  ASSERT_TRUE(plain.is_ok()) << plain.error().message;
  EXPECT_EQ(plain->tool_choice, ToolChoice::kAuto);
  EXPECT_EQ(plain->chat_extras.tools[0]["function"]["name"], "get_weather");
  auto named = chat(user_chat({{"tools", json::array({weather_tool()})},
                               {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}}));
  ASSERT_TRUE(named.is_ok()) << named.error().message;
  EXPECT_EQ(named->tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(named->tool_name, "get_weather");
  expect_bad_field(chat(user_chat({{"tools", json::array({weather_tool()})},
                                   {"tool_choice", {{"type", "function"}, {"function", {{"name", "other"}}}}}})),
                   "tool_choice");
  expect_bad_field(chat(user_chat({{"tool_choice", "required"}})), "tool_choice");
  expect_bad_field(chat(user_chat({{"tools", json::array({weather_tool()})}, {"tool_choice", "sometimes"}})),
                   "tool_choice");
  expect_bad_field(chat(user_chat({{"tools", json::array({{{"type", "function"}}})}})), "tools[0]");
  expect_bad_field(chat(user_chat({{"tools", json::array({weather_tool(), weather_tool()})}})), "tools[1]");
  expect_bad_field(chat(user_chat({{"chat_template_kwargs", 3}})), "chat_template_kwargs");
  auto kwargs = chat(user_chat({{"chat_template_kwargs", {{"enable_thinking", false}}}}));
  ASSERT_TRUE(kwargs.is_ok());
  EXPECT_EQ(kwargs->chat_extras.template_kwargs["enable_thinking"], false);
}

TEST(Tools, AssistantCallArgumentsAreParsedForTheTemplate) {
  json call = {{"id", "c1"},
               {"type", "function"},
               {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}};
  auto r = chat(
      {{"messages", json::array({{{"role", "user"}, {"content", "hi"}},
                                 {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array({call})}},
                                 {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "sunny"}}})}});
  ASSERT_TRUE(r.is_ok()) << r.error().message;
  EXPECT_EQ(r->messages[1]["tool_calls"][0]["function"]["arguments"]["city"], "Paris");
  call["function"]["arguments"] = "not json";
  expect_bad_field(
      chat(
          {{"messages", json::array({{{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({call})}}})}}),
      "messages[0].tool_calls[0]");
}

TEST(ResponseFormat, SchemasCompileOrNameWhatIsUnsupported) {
  auto object = chat(user_chat({{"response_format", {{"type", "json_object"}}}}));
  ASSERT_TRUE(object.is_ok());
  EXPECT_TRUE(object->response_grammar.has_value());
  auto text = completion({{"prompt", "x"}, {"response_format", {{"type", "text"}}}});
  ASSERT_TRUE(text.is_ok());
  EXPECT_FALSE(text->response_grammar.has_value());
  json schema = {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}, {"minimum", 1}}}}}};
  auto bad = chat(user_chat(
      {{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}}}}}}));
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.error().param, "response_format");
  EXPECT_NE(bad.error().message.find("minimum"), std::string::npos) << bad.error().message;
  expect_bad_field(chat(user_chat({{"response_format", {{"type", "grammar"}}}})), "response_format");
  expect_bad_field(chat(user_chat({{"response_format", {{"type", "json_schema"}}}})), "response_format");
  expect_bad_field(chat(user_chat({{"tools", json::array({weather_tool()})},
                                   {"tool_choice", "required"},
                                   {"response_format", {{"type", "json_object"}}}})),
                   "response_format");
}

TEST(Timeout, IsPositiveSecondsOnBothEndpoints) {
  auto none = chat(user_chat());
  ASSERT_TRUE(none.is_ok());
  EXPECT_FALSE(none->timeout_s.has_value());
  auto given = chat(user_chat({{"timeout", 2.5}}));
  ASSERT_TRUE(given.is_ok()) << given.error().message;
  EXPECT_EQ(given->timeout_s, 2.5);
  auto completion_timeout = completion({{"prompt", "x"}, {"timeout", 1}});
  ASSERT_TRUE(completion_timeout.is_ok());
  EXPECT_EQ(completion_timeout->timeout_s, 1.0);
  expect_bad_field(chat(user_chat({{"timeout", 0}})), "timeout");
  expect_bad_field(chat(user_chat({{"timeout", -1}})), "timeout");
  expect_bad_field(chat(user_chat({{"timeout", "5"}})), "timeout");
}

TEST(ParseCompletion, NamesKnownFieldsOfTheWrongType) {
  expect_bad_field(completion({{"prompt", "x"}, {"max_tokens", "10"}}), "max_tokens");
  expect_bad_field(completion({{"prompt", "x"}, {"max_tokens", 10.5}}), "max_tokens");
  expect_bad_field(completion({{"prompt", "x"}, {"temperature", "hot"}}), "temperature");
  expect_bad_field(completion({{"prompt", "x"}, {"top_k", 1.5}}), "top_k");
  expect_bad_field(completion({{"prompt", "x"}, {"stream", "yes"}}), "stream");
  expect_bad_field(completion({{"prompt", "x"}, {"stop", 5}}), "stop");
  expect_bad_field(completion({{"prompt", "x"}, {"stop", {"a", 1}}}), "stop");
  expect_bad_field(completion({{"prompt", "x"}, {"model", 3}}), "model");
  expect_bad_field(completion({{"prompt", "x"}, {"logprobs", true}}), "logprobs");
  expect_bad_field(completion({{"prompt", "x"}, {"seed", "1"}}), "seed");
  expect_bad_field(completion({{"prompt", "x"}, {"stream_options", "usage"}}), "stream_options");
  expect_bad_field(completion({{"prompt", "x"}, {"stream_options", {{"include_usage", 1}}}}),
                   "stream_options.include_usage");
}

TEST(ParseCompletion, RejectsOutOfRangeValues) {
  expect_bad_field(completion({{"prompt", "x"}, {"max_tokens", 1000000000000LL}}), "max_tokens");
  expect_bad_field(completion({{"prompt", "x"}, {"logprobs", 21}}), "logprobs");
  expect_bad_field(completion({{"prompt", "x"}, {"n", 9}}, /*max_n=*/8), "n");
  expect_bad_field(completion({{"prompt", "x"}, {"n", 0}}), "n");
  expect_bad_field(completion({{"prompt", "x"}, {"echo", true}}), "echo");
  // Impossible sampling values come back from SamplingParams::validate(), which names the field.
  for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{
           {"max_tokens", -5}, {"max_tokens", 0}, {"temperature", -1}, {"top_p", 0}, {"top_k", -2}, {"min_p", 2}}) {
    auto r = completion({{"prompt", "x"}, {key, value}});
    ASSERT_FALSE(r.is_ok()) << key << "=" << value;
    EXPECT_EQ(r.error().http_status, 400);
    EXPECT_NE(r.error().message.find(key), std::string::npos) << r.error().message;
  }
  auto empty_stop = completion({{"prompt", "x"}, {"stop", {""}}});
  ASSERT_FALSE(empty_stop.is_ok());
  EXPECT_NE(empty_stop.error().message.find("stop"), std::string::npos);
}

TEST(ParseChat, NormalizesMessages) {
  json body = user_chat({{"messages",
                          {{{"role", "developer"}, {"content", "be brief"}},
                           {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}, "b"}}},
                           {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array()}},
                           {{"role", "tool"}, {"content", "42"}, {"tool_call_id", "t1"}}}}});
  auto r = chat(body);
  ASSERT_TRUE(r.is_ok()) << r.error().message;
  ASSERT_EQ(r->messages.size(), 4u);
  EXPECT_EQ(r->messages[0]["role"], "system");
  EXPECT_EQ(r->messages[1]["content"], "a\nb");
  EXPECT_EQ(r->messages[2]["content"], "");
  EXPECT_TRUE(r->messages[2].contains("tool_calls"));
  EXPECT_EQ(r->messages[3]["tool_call_id"], "t1");
  EXPECT_EQ(r->endpoint, Endpoint::kChatCompletions);
}

TEST(ParseChat, RejectsBadMessages) {
  expect_bad_field(chat({{"model", "m"}}), "messages");
  expect_bad_field(chat({{"messages", json::array()}}), "messages");
  expect_bad_field(chat({{"messages", "hi"}}), "messages");
  expect_bad_field(chat({{"messages", {"hi"}}}), "messages[0]");
  expect_bad_field(chat({{"messages", {{{"role", "wizard"}, {"content", "x"}}}}}), "messages[0].role");
  expect_bad_field(chat({{"messages", {{{"content", "x"}}}}}), "messages[0].role");
  expect_bad_field(chat({{"messages", {{{"role", "user"}}}}}), "messages[0].content");
  expect_bad_field(chat({{"messages", {{{"role", "user"}, {"content", 5}}}}}), "messages[0].content");
  expect_bad_field(chat({{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}}),
                   "messages[0].content[0]");
}

TEST(ParseChat, ReadsLogprobsAndMaxCompletionTokens) {
  auto r = chat(user_chat({{"logprobs", true}, {"top_logprobs", 3}, {"max_tokens", 5},
                           {"max_completion_tokens", 9}}));
  ASSERT_TRUE(r.is_ok()) << r.error().message;
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(r->params.logprobs, 3);
  EXPECT_EQ(r->params.max_tokens, 9);

  auto plain = chat(user_chat({{"logprobs", true}}));
  ASSERT_TRUE(plain.is_ok());
  EXPECT_EQ(plain->params.logprobs, 0);

  auto none = chat(user_chat());
  ASSERT_TRUE(none.is_ok());
  EXPECT_EQ(none->params.logprobs, -1);

  expect_bad_field(chat(user_chat({{"top_logprobs", 2}})), "top_logprobs");
  expect_bad_field(chat(user_chat({{"logprobs", 2}})), "logprobs");
  expect_bad_field(chat(user_chat({{"logprobs", true}, {"top_logprobs", 21}})), "top_logprobs");
  expect_bad_field(chat(user_chat({{"max_completion_tokens", "x"}})), "max_completion_tokens");
}

TEST(ResolveMaxTokens, FollowsVllm) {
  OpenAiRequest request;
  auto fill = resolve_max_tokens(request, 100, 2048);
  ASSERT_TRUE(fill.is_ok());
  EXPECT_EQ(fill.value(), 1948);

  auto full = resolve_max_tokens(request, 2048, 2048);
  ASSERT_FALSE(full.is_ok());
  EXPECT_EQ(full.error().http_status, 400);
  EXPECT_NE(full.error().message.find("maximum context length is 2048"), std::string::npos);

  request.max_tokens_given = true;
  request.params.max_tokens = 48;
  auto fits = resolve_max_tokens(request, 2000, 2048);
  ASSERT_TRUE(fits.is_ok());
  EXPECT_EQ(fits.value(), 48);

  request.params.max_tokens = 49;
  auto over = resolve_max_tokens(request, 2000, 2048);
  ASSERT_FALSE(over.is_ok());
  EXPECT_EQ(over.error().param, "max_tokens");
  EXPECT_NE(over.error().message.find("you requested 2049 tokens (2000 in the prompt, 49 in the completion)"),
            std::string::npos)
      << over.error().message;
}

}  // namespace
}  // namespace se::server

namespace se::server {
namespace {

TEST(ChainFields, NullStartsAChainAStringContinuesOne) {
  auto start = chat(user_chat({{"chain_id", nullptr}}));
  ASSERT_TRUE(start.is_ok());
  EXPECT_TRUE(start->chain);
  EXPECT_TRUE(start->chain_id.empty());
  auto plain = chat(user_chat());
  ASSERT_TRUE(plain.is_ok());
  EXPECT_FALSE(plain->chain);

  json body = user_chat({{"chain_id", "c-1"}, {"chain_append_start", 1}});
  body["messages"] = {{{"role", "user"}, {"content", "hi"}},
                      {{"role", "assistant"}, {"content", "hello"}},
                      {{"role", "user"}, {"content", "more"}}};
  body["chain_append_start"] = 2;
  auto append = chat(body);
  ASSERT_TRUE(append.is_ok());
  EXPECT_EQ(append->chain_id, "c-1");
  EXPECT_EQ(append->chain_append_start, 2);
  auto tokens = completion({{"prompt", {1, 2, 3}}, {"chain_id", "c-2"}});
  ASSERT_TRUE(tokens.is_ok());
  EXPECT_EQ(tokens->chain_id, "c-2");
}

TEST(ChainFields, BadChainFieldsNameThemselves) {
  expect_bad_field(chat(user_chat({{"chain_id", 5}})), "chain_id");
  expect_bad_field(chat(user_chat({{"chain_append_start", 1}})), "chain_append_start");  // no chain named
  expect_bad_field(chat(user_chat({{"chain_id", "c"}, {"chain_append_start", 0}})), "chain_append_start");
  // It must point at a message that exists.
  expect_bad_field(chat(user_chat({{"chain_id", "c"}, {"chain_append_start", 1}})), "chain_append_start");
  expect_bad_field(completion({{"prompt", "x"}, {"chain_id", "c"}, {"chain_append_start", 1}}), "chain_append_start");
  auto several = chat(user_chat({{"chain_id", nullptr}, {"n", 2}}));
  ASSERT_FALSE(several.is_ok());
  EXPECT_EQ(several.error().param, "n");
}

}  // namespace
}  // namespace se::server
