// ChatTemplate / jinja::Template API behaviour that the jinja2 comparisons cannot cover: error
// locations, render limits against runaway templates, hostile inputs, options and thread safety.
#include "chat/chat_template.h"

#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "base/mapped_file.h"
#include "chat/jinja/template.h"

namespace se {
namespace {

using jinja::Template;
using Json = nlohmann::ordered_json;

Result<std::string> render(const std::string& source, const Json& vars = Json::object(),
                           const jinja::RenderOptions& options = {}) {
  SE_ASSIGN_OR_RETURN(Template tmpl, Template::parse(source));
  return tmpl.render(vars, options);
}

std::string fixture(const std::string& name) {
  Result<std::string> text =
      read_file(std::string(SE_SOURCE_DIR) + "/tests/chat/templates/" + name);
  EXPECT_TRUE(text.is_ok()) << text.status().to_string();
  return text.is_ok() ? *text : "";
}

void expect_error(const Result<std::string>& r, StatusCode code, const std::string& needle) {
  ASSERT_FALSE(r.is_ok()) << "rendered: " << *r;
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().to_string();
}

TEST(ChatTemplateErrorsTest, SyntaxErrorsCarryLineAndColumn) {
  expect_error(render("Hello\n{% if x %}\n  {{ 1 + }}\n{% endif %}"), StatusCode::kInvalidArgument,
               "line 3, column 10: unexpected 'end of print statement'");
  expect_error(render("a\n{% for x in y %}\nb"), StatusCode::kInvalidArgument,
               "line 3, column 2: Unexpected end of template");
  expect_error(render("x\n\n  {{ 'a'|strip }}"), StatusCode::kInvalidArgument,
               "line 3, column 10: No filter named 'strip'.");
  expect_error(render("{% if true %}\n{% endfi %}"), StatusCode::kInvalidArgument,
               "line 2, column 4: Encountered unknown tag 'endfi'.");
  expect_error(render("\xff{{ x }}"), StatusCode::kInvalidArgument, "not valid UTF-8");
  // Columns count code points, not bytes.
  expect_error(render("日本 {{ ) }}"), StatusCode::kInvalidArgument,
               "line 1, column 7: unexpected ')'");
}

TEST(ChatTemplateErrorsTest, RuntimeErrorsCarryLine) {
  expect_error(render("a\n\n{{ x.y.z }}"), StatusCode::kInvalidArgument,
               "line 3: UndefinedError: 'x' is undefined");
  expect_error(render("{% macro m() %}\n{{ 1 // 0 }}{% endmacro %}\n{{ m() }}"),
               StatusCode::kInvalidArgument, "line 2: ZeroDivisionError");
}

TEST(ChatTemplateErrorsTest, RaiseExceptionMessageIsExact) {
  Result<std::string> r =
      render("line\n{{ raise_exception('Roles must alternate: ' ~ n) }}", {{"n", 3}});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "Roles must alternate: 3");
}

TEST(ChatTemplateLimitsTest, RunawayLoopsHitTheStepLimit) {
  jinja::RenderOptions options;
  options.limits.max_steps = 2'000'000;
  expect_error(
      render("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
             Json::object(), options),
      StatusCode::kResourceExhausted, "steps");
  // The default limit also stops it.
  expect_error(
      render("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"),
      StatusCode::kResourceExhausted, "steps");
}

TEST(ChatTemplateLimitsTest, OutputAndStringSizesAreBounded) {
  jinja::RenderOptions options;
  options.limits.max_output_bytes = 1 << 20;
  expect_error(
      render("{% for a in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", Json::object(), options),
      StatusCode::kResourceExhausted, "output exceeded");
  expect_error(render("{{ 'x' * 1000000000000 }}"), StatusCode::kResourceExhausted, "larger than");
  expect_error(render("{{ [1, 2] * 1000000000000 }}"), StatusCode::kResourceExhausted,
               "larger than");
  expect_error(
      render("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
             "{% endfor %}{{ ns.s|length }}"),
      StatusCode::kResourceExhausted, "larger than");
  expect_error(render("{{ 'x'|center(10000000000) }}"), StatusCode::kResourceExhausted,
               "larger than");
}

TEST(ChatTemplateLimitsTest, RecursionAndNestingAreBounded) {
  expect_error(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
               StatusCode::kResourceExhausted, "nested deeper");
  expect_error(render("{% for n in tree recursive %}{{ loop(tree) }}{% endfor %}", {{"tree", {1}}}),
               StatusCode::kResourceExhausted, "nested deeper");
  expect_error(
      render("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
             "{% endfor %}"),
      StatusCode::kResourceExhausted, "nested deeper");
  // Macro recursion multiplies statement nesting; the evaluation depth bound keeps the stack safe.
  std::string nested = "{% macro f(n) %}";
  for (int i = 0; i < 150; ++i) nested += "{% if true %}";
  nested += "{{ f(n + 1) }}";
  for (int i = 0; i < 150; ++i) nested += "{% endif %}";
  expect_error(render(nested + "{% endmacro %}{{ f(0) }}"), StatusCode::kResourceExhausted,
               "nested deeper");
  // Hostile syntax nesting is a parse error, not a stack overflow.
  std::string parens = "{{ " + std::string(20000, '(') + "1" + std::string(20000, ')') + " }}";
  expect_error(render(parens), StatusCode::kInvalidArgument, "nesting");
  std::string chain = "{{ 1";
  for (int i = 0; i < 50000; ++i) chain += " + 1";
  expect_error(render(chain + " }}"), StatusCode::kInvalidArgument, "nesting");
  std::string ifs;
  for (int i = 0; i < 5000; ++i) ifs += "{% if true %}";
  expect_error(render(ifs), StatusCode::kInvalidArgument, "nesting");
  // Deeply nested JSON input is rejected before rendering.
  Json deep = Json::array();
  for (int i = 0; i < 2000; ++i) deep = Json::array({deep});
  expect_error(render("{{ x|length }}", {{"x", deep}}), StatusCode::kInvalidArgument,
               "nested too deeply");
}

// Random token soup must parse or fail cleanly and render or fail cleanly, never crash or hang.
TEST(ChatTemplateLimitsTest, RandomTemplatesNeverCrash) {
  static const char* kPieces[] = {
      "{{",          "}}",         "{%",     "%}",        "{#",          "#}",      "{%-",
      "-%}",         " if ",       " for ",  " in ",      " set ",       " endif ", " endfor ",
      " macro ",     " endmacro ", " x ",    " y ",       " loop ",      "(",       ")",
      "[",           "]",          "{",      "}",         ",",           ":",       "|",
      " is ",        " not ",      " and ",  " or ",      "'s'",         "\"t\"",   "1",
      "2.5",         "-",          "+",      "*",         "/",           "//",      "%",
      "**",          "~",          ".",      "=",         "==",          " else ",  " elif ",
      " raw ",       " endraw ",   "\n",     " ",         " namespace ", " range ", " length ",
      " tojson ",    " caller ",   " call ", " endcall ", " ns.a ",      " break ", " continue ",
      " recursive ", " select ",   " map ",  " join ",    "é",           " none ",  " true "};
  std::mt19937 rng(1234);
  jinja::RenderOptions options;
  options.limits.max_steps = 20000;
  options.limits.max_output_bytes = 1 << 16;
  Json vars = {{"x", {1, 2, {{"a", "b"}}}}, {"y", "text"}};
  int num_parsed = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string source;
    int len = 1 + static_cast<int>(rng() % 30);
    for (int k = 0; k < len; ++k) source += kPieces[rng() % std::size(kPieces)];
    Result<Template> tmpl = Template::parse(source);
    if (!tmpl.is_ok()) {
      EXPECT_EQ(tmpl.status().code(), StatusCode::kInvalidArgument) << source;
      continue;
    }
    ++num_parsed;
    Result<std::string> out = tmpl->render(vars, options);
    if (!out.is_ok()) {
      StatusCode code = out.status().code();
      EXPECT_TRUE(code == StatusCode::kInvalidArgument || code == StatusCode::kResourceExhausted)
          << source << " -> " << out.status().to_string();
    }
  }
  EXPECT_GT(num_parsed, 100);
}

TEST(ChatTemplateApiTest, RendersQwen3WithOptions) {
  Result<ChatTemplate> tmpl = ChatTemplate::parse(fixture("Qwen-Qwen3-0.6B.jinja"));
  ASSERT_TRUE(tmpl.is_ok()) << tmpl.status().to_string();
  Json messages = Json::parse(R"([{"role": "user", "content": "Hi"}])");
  ChatTemplateOptions options;
  options.add_generation_prompt = true;
  options.extra_variables = {{"enable_thinking", false}};
  Result<std::string> out = tmpl->render(messages, options);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(*out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // The unordered nlohmann::json overload gives the same prompt.
  Result<std::string> same = tmpl->render(nlohmann::json::parse(messages.dump()), options);
  ASSERT_TRUE(same.is_ok());
  EXPECT_EQ(*same, *out);
}

TEST(ChatTemplateApiTest, StrftimeNowUsesThePinnedTime) {
  Result<ChatTemplate> tmpl =
      ChatTemplate::parse(fixture("meta-llama-Llama-3.2-3B-Instruct.jinja"));
  ASSERT_TRUE(tmpl.is_ok()) << tmpl.status().to_string();
  ChatTemplateOptions options;
  std::tm now{};
  now.tm_year = 2025 - 1900;
  now.tm_mon = 2;
  now.tm_mday = 7;
  options.now = now;
  options.bos_token = "<|begin_of_text|>";
  Result<std::string> out =
      tmpl->render(Json::parse(R"([{"role": "user", "content": "Hi"}])"), options);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(
      *out,
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
      "December 2023\nToday Date: 07 Mar 2025\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>"
      "\n\nHi<|eot_id|>");
}

TEST(ChatTemplateApiTest, VariablesAndReasoningAliases) {
  Result<ChatTemplate> tmpl = ChatTemplate::parse(
      "{{ bos_token is defined }}|{{ tools is none }}|{{ documents is none }}|{{ flag }}|"
      "{% for m in messages %}{{ m.reasoning_content }}/{{ m.thinking }}/{{ m|list|join(',') }};{% "
      "endfor %}");
  ASSERT_TRUE(tmpl.is_ok()) << tmpl.status().to_string();
  ChatTemplateOptions options;
  options.extra_variables = {{"flag", "F"}};
  Json messages = Json::parse(R"([{"role": "assistant", "content": "a", "reasoning": "r"},
                                  {"role": "user", "content": "u"}])");
  Result<std::string> out = tmpl->render(messages, options);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(
      *out,
      "False|True|True|F|r/r/thinking,role,content,reasoning,reasoning_content;//role,content;");
}

TEST(ChatTemplateApiTest, RejectsMalformedMessages) {
  Result<ChatTemplate> tmpl = ChatTemplate::parse("{{ messages|length }}");
  ASSERT_TRUE(tmpl.is_ok());
  ChatTemplateOptions options;
  expect_error(tmpl->render(Json::object(), options), StatusCode::kInvalidArgument, "JSON list");
  expect_error(tmpl->render(Json::parse("[1]"), options), StatusCode::kInvalidArgument,
               "message 0 is not a JSON object");
  options.extra_variables = Json::array();
  expect_error(tmpl->render(Json::array(), options), StatusCode::kInvalidArgument,
               "extra_variables");
}

TEST(ChatTemplateApiTest, ConcurrentRendersOfOneTemplateAgree) {
  Result<ChatTemplate> tmpl = ChatTemplate::parse(fixture("google-gemma-3-4b-it.jinja"));
  ASSERT_TRUE(tmpl.is_ok()) << tmpl.status().to_string();
  Json messages = Json::parse(R"([{"role": "system", "content": "S"},
                                  {"role": "user", "content": "Q"},
                                  {"role": "assistant", "content": " A "},
                                  {"role": "user", "content": "Q2"}])");
  ChatTemplateOptions options;
  options.add_generation_prompt = true;
  options.bos_token = "<bos>";
  const std::string expected =
      "<bos><start_of_turn>user\nS\n\nQ<end_of_turn>\n<start_of_turn>model\nA<end_of_turn>\n"
      "<start_of_turn>user\nQ2<end_of_turn>\n<start_of_turn>model\n";
  std::vector<std::string> outputs(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < outputs.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        Result<std::string> out = tmpl->render(messages, options);
        outputs[t] = out.is_ok() ? *out : out.status().to_string();
        if (outputs[t] != expected) return;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (const std::string& out : outputs) EXPECT_EQ(out, expected);
}

}  // namespace
}  // namespace se
