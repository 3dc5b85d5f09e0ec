#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "structured/grammar_matcher.h"
#include "structured/grammar_state.h"
#include "structured/json_grammar.h"
#include "structured/vocab_trie.h"

namespace se {
namespace {

JsonGrammar schema_grammar(const nlohmann::ordered_json& schema) {
  Result<JsonGrammar> g = JsonGrammar::from_schema(schema);
  EXPECT_TRUE(g.is_ok()) << g.status().to_string();
  return std::move(g).value();
}

// Whether the whole of `text` is a complete output of `grammar`.
bool accepts(const JsonGrammar& grammar, const std::string& text) {
  GrammarState state(grammar);
  for (char c : text)
    if (!state.advance(grammar, static_cast<uint8_t>(c))) return false;
  return state.accepting(grammar);
}

// Whether `text` can still be continued into an output.
bool is_prefix(const JsonGrammar& grammar, const std::string& text) {
  GrammarState state(grammar);
  for (char c : text)
    if (!state.advance(grammar, static_cast<uint8_t>(c))) return false;
  return true;
}

const nlohmann::ordered_json kPersonSchema = nlohmann::ordered_json::parse(R"({
  "type": "object",
  "properties": {
    "name": {"type": "string"},
    "age": {"type": "integer"},
    "score": {"type": "number"},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
    "role": {"enum": ["admin", "user", 3]},
    "ok": {"type": "boolean"},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"const": "75001"}},
                "required": ["city"]}
  },
  "required": ["name", "age", "ok"]
})");

TEST(JsonGrammar, AnyObjectAcceptsJsonObjectsOnly) {
  const JsonGrammar g = JsonGrammar::any_object();
  for (const char* ok : {"{}", R"({"a":1})", R"({"a":[1,2.5e-3,{"b":null}],"c":"\u00e9\n","d":true,"e":false})",
                         "{\"x\":\"caf\xc3\xa9\"}"})
    EXPECT_TRUE(accepts(g, ok)) << ok;
  for (const char* bad : {"[]", "1", R"({"a":})", R"({"a":01})", R"({"a":1,})", R"({a:1})", R"({"a":"\x"})",
                          "{\"a\":\"\xff\"}", R"({"a":1} )", R"({"a":-})", "{\"a\":\"\n\"}"})
    EXPECT_FALSE(accepts(g, bad)) << bad;
  EXPECT_TRUE(is_prefix(g, R"({"a":[1,)"));
  EXPECT_FALSE(accepts(g, R"({"a":[1,)"));
}

TEST(JsonGrammar, SchemaObjectFollowsPropertiesAndRequired) {
  const JsonGrammar g = schema_grammar(kPersonSchema);
  EXPECT_TRUE(accepts(g, R"({"name":"Ann","age":31,"ok":true})"));
  EXPECT_TRUE(accepts(g, R"({"name":"Ann","age":-2,"score":1.5,"tags":["a","b"],"role":3,"ok":false,)"
                         R"("address":{"city":"Paris","zip":"75001"}})"));
  EXPECT_TRUE(accepts(g, R"({"name":"","age":0,"role":"user","ok":true,"address":{"city":"X"}})"));
  EXPECT_FALSE(accepts(g, R"({"age":31,"name":"Ann","ok":true})")) << "properties come in the schema's order";
  EXPECT_FALSE(accepts(g, R"({"name":"Ann","ok":true})")) << "age is required";
  EXPECT_FALSE(accepts(g, R"({"name":"Ann","age":1.5,"ok":true})")) << "age is an integer";
  EXPECT_FALSE(accepts(g, R"({"name":"Ann","age":1,"tags":["a","b","c"],"ok":true})")) << "maxItems";
  EXPECT_FALSE(accepts(g, R"({"name":"Ann","age":1,"role":"root","ok":true})")) << "enum";
  EXPECT_FALSE(accepts(g, R"({"name":"Ann","age":1,"ok":true,"address":{"zip":"75001"}})")) << "city required";
  EXPECT_FALSE(accepts(g, R"({"name":"Ann","age":1,"ok":true,"extra":1})")) << "no other property";
  EXPECT_FALSE(accepts(g, R"({"name":1,"age":1,"ok":true})"));
}

TEST(JsonGrammar, TopLevelScalarsAndArrays) {
  EXPECT_TRUE(accepts(schema_grammar({{"type", "number"}}), "-12.5E+3"));
  EXPECT_FALSE(accepts(schema_grammar({{"type", "number"}}), "12."));
  EXPECT_TRUE(accepts(schema_grammar({{"type", "integer"}}), "120"));
  EXPECT_TRUE(accepts(schema_grammar({{"enum", {1, 12}}}), "1"));
  EXPECT_TRUE(accepts(schema_grammar({{"enum", {1, 12}}}), "12"));
  EXPECT_FALSE(accepts(schema_grammar({{"enum", {1, 12}}}), "123"));
  const JsonGrammar arr = schema_grammar({{"type", "array"}, {"items", {{"type", "integer"}}}, {"minItems", 1}});
  EXPECT_TRUE(accepts(arr, "[1,2,3]"));
  EXPECT_FALSE(accepts(arr, "[]"));
  EXPECT_TRUE(accepts(schema_grammar({{"type", "null"}}), "null"));
}

TEST(JsonGrammar, UnsupportedKeywordsAreNamed) {
  for (const auto& [schema, word] : std::vector<std::pair<nlohmann::ordered_json, std::string>>{
           {{{"type", "string"}, {"pattern", "a+"}}, "pattern"},
           {{{"type", "object"}, {"properties", {{"a", {{"type", "integer"}, {"minimum", 0}}}}}}, "minimum"},
           {{{"anyOf", nlohmann::ordered_json::array()}}, "anyOf"},
           {{{"type", {"string", "null"}}}, "type"},
           {{{"type", "object"}, {"additionalProperties", {{"type", "string"}}}}, "additionalProperties"}}) {
    Result<JsonGrammar> g = JsonGrammar::from_schema(schema);
    ASSERT_FALSE(g.is_ok()) << schema.dump();
    EXPECT_NE(g.status().message().find(word), std::string::npos) << g.status().message();
  }
}

TEST(JsonGrammar, ChoiceOfToolCalls) {
  Result<JsonGrammar> g =
      JsonGrammar::choice({{"<call>{\"name\": \"f\", \"arguments\": ",
                            {{"type", "object"}, {"properties", {{"x", {{"type", "integer"}}}}}, {"required", {"x"}}},
                            "}</call>"},
                           {"<call>{\"name\": \"g\", \"arguments\": ", {{"type", "object"}}, "}</call>"}});
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  EXPECT_TRUE(accepts(*g, "<call>{\"name\": \"f\", \"arguments\": {\"x\":5}}</call>"));
  EXPECT_TRUE(accepts(*g, "<call>{\"name\": \"g\", \"arguments\": {\"any\":[1]}}</call>"));
  EXPECT_FALSE(accepts(*g, "<call>{\"name\": \"f\", \"arguments\": {}}</call>"));
  EXPECT_FALSE(accepts(*g, "<call>{\"name\": \"h\", \"arguments\": {}}</call>"));
}

// The trie walk allows exactly the tokens a token-by-token check from scratch allows, over random outputs of a
// small vocabulary; and end-of-generation only once the value is complete.
TEST(GrammarMatcher, MaskMatchesBruteForce) {
  std::vector<std::string> vocab = {
      "",         "{",         "}",   "\"",   "\":",     "\"name", "\":\"",    "a",
      "ab",       "\\",        "\\u", "00e9", "1",       "12",     "-",        ".",
      "e",        ",",         "[",   "]",    "true",    "tr",     "ue",       "null",
      "\"}",      "\":1",      " ",   "\n",   "\xc3",    "\xa9",   "\xc3\xa9", "age",
      "\"age\":", "{\"",       ",\"", "0",    "\"ok\":", "false",  "}}",       "\"address\":{\"city\":",
      "]}",       "\"tags\":["};
  const int32_t eog = static_cast<int32_t>(vocab.size());
  vocab.push_back("");  // the end-of-generation token: no bytes
  auto trie = std::make_shared<const VocabTrie>(vocab);
  for (const JsonGrammar& grammar : {JsonGrammar::any_object(), schema_grammar(kPersonSchema)}) {
    auto token_grammar = std::make_shared<const TokenGrammar>(TokenGrammar{grammar, trie, {eog}});
    std::mt19937 rng(7);
    for (int trial = 0; trial < 40; ++trial) {
      GrammarMatcher matcher(token_grammar);
      std::string text;
      for (int step = 0; step < 30; ++step) {
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < static_cast<int32_t>(vocab.size()); ++id) {
          bool ok;
          if (id == eog) {
            ok = accepts(grammar, text);
          } else {
            ok = !vocab[static_cast<size_t>(id)].empty() && is_prefix(grammar, text + vocab[static_cast<size_t>(id)]);
          }
          EXPECT_EQ(matcher.is_allowed(id), ok)
              << "after '" << text << "' token '" << vocab[static_cast<size_t>(id)] << "'";
          if (ok) allowed.push_back(id);
        }
        if (allowed.empty()) break;
        const int32_t pick = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
        ASSERT_TRUE(matcher.accept(pick));
        if (pick == eog) break;
        text += vocab[static_cast<size_t>(pick)];
      }
    }
  }
}

TEST(GrammarMatcher, MaskLogitsRefusesOtherTokens) {
  std::vector<std::string> vocab = {"{", "}", "x", ""};
  auto trie = std::make_shared<const VocabTrie>(vocab);
  GrammarMatcher matcher(std::make_shared<const TokenGrammar>(TokenGrammar{JsonGrammar::any_object(), trie, {3}}));
  std::vector<float> logits = {0.5f, 2.0f, 3.0f, 4.0f, 1.0f};  // one id past the vocabulary
  matcher.mask_logits(logits);
  EXPECT_EQ(logits[0], 0.5f);
  for (size_t i : {1, 2, 3, 4}) EXPECT_TRUE(std::isinf(logits[i])) << i;
  ASSERT_TRUE(matcher.accept(0));
  EXPECT_FALSE(matcher.accept(2));
  ASSERT_TRUE(matcher.accept(1));
  EXPECT_TRUE(matcher.is_allowed(3));
  EXPECT_FALSE(matcher.is_allowed(0));
}

// The bits the device masks with: allowed_tokens() over a row wider than the vocabulary (the padding refused), and
// end-of-generation alone at a dead end.
TEST(GrammarMatcher, NextTokenBitsCoverPaddedRowsAndDeadEnds) {
  std::vector<std::string> vocab = {"{", "}", "x", "", "\"\"", "\""};
  auto trie = std::make_shared<const VocabTrie>(vocab);
  GrammarMatcher matcher(std::make_shared<const TokenGrammar>(TokenGrammar{JsonGrammar::any_object(), trie, {3}}));
  std::vector<uint64_t> words(3, ~uint64_t{0});  // 192 ids for a 6-token vocabulary
  matcher.write_next_tokens(words);
  EXPECT_EQ(words, (std::vector<uint64_t>{0b1, 0, 0}));
  ASSERT_TRUE(matcher.accept(0));
  matcher.write_next_tokens(words);
  EXPECT_EQ(words[0], 0b110010u) << "'}', '\"\"' or '\"'";
  ASSERT_TRUE(matcher.accept(1));
  matcher.write_next_tokens(words);
  EXPECT_EQ(words[0], 0b1000u) << "only end-of-generation once the object is complete";

  // "{" then a key that the vocabulary can only close as '""', after which ':' has no token: a dead end.
  GrammarMatcher dead(std::make_shared<const TokenGrammar>(TokenGrammar{JsonGrammar::any_object(), trie, {3}}));
  ASSERT_TRUE(dead.accept(0));
  ASSERT_TRUE(dead.accept(4));
  dead.write_next_tokens(words);
  EXPECT_EQ(words, (std::vector<uint64_t>{0b1000, 0, 0}));
}

}  // namespace
}  // namespace se
