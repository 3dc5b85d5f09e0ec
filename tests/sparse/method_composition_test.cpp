// Composing a decode-time method with a prompt-time one through the registry ("prompt_method" / "prompt_config"
// in the decode-time method's config): the valid pairings build, with both configs resolved and both methods'
// ops; every other pairing is an error that names the valid ones; the memory model is the prompt method's with
// the decode method's generated tokens resident as decode tokens.
#include <gtest/gtest.h>

#include "sparse/method_registry.h"

namespace se {
namespace {

std::vector<std::string> names_composing_as(Composition composition) {
  std::vector<std::string> names;
  for (const MethodInfo& info : registered_methods())
    if (info.composition == composition) names.push_back(info.name);
  return names;
}

TEST(MethodCompositionTest, EveryValidPairingBuildsWithBothConfigsAndOps) {
  const std::vector<std::string> decode_time = names_composing_as(Composition::kDecodeTime);
  const std::vector<std::string> prompt_time = names_composing_as(Composition::kPromptTime);
  ASSERT_FALSE(decode_time.empty());
  ASSERT_FALSE(prompt_time.empty());
  for (const std::string& decode : decode_time)
    for (const std::string& prompt : prompt_time) {
      auto alone = create_method(prompt, nullptr);
      auto plain = create_method(decode, nullptr);
      auto composed = create_method(decode, {{"prompt_method", prompt}});
      ASSERT_TRUE(alone.is_ok() && plain.is_ok());
      ASSERT_TRUE(composed.is_ok()) << decode << "+" << prompt << ": " << composed.status().to_string();
      const MethodRuntime& m = **composed;
      EXPECT_EQ(m.name(), decode);
      // The decode method's own defaults, then the prompt method's name and resolved defaults.
      nlohmann::ordered_json want = (*plain)->config();
      want["prompt_method"] = prompt;
      want["prompt_config"] = (*alone)->config();
      EXPECT_EQ(m.config(), want);
      for (const OpId op : (*alone)->traits().ops)
        EXPECT_NE(std::find(m.traits().ops.begin(), m.traits().ops.end(), op), m.traits().ops.end())
            << decode << "+" << prompt << " lacks " << op_name(op);
      EXPECT_EQ(m.traits().prefill_policy, (*alone)->traits().prefill_policy);
      EXPECT_EQ(m.traits().family, MethodFamily::kEviction);
      EXPECT_FALSE(m.traits().keeps_full_history);
    }
}

TEST(MethodCompositionTest, InvalidPairingsNameTheValidOnes) {
  const std::string decode = names_composing_as(Composition::kDecodeTime).front();
  const std::string prompt = names_composing_as(Composition::kPromptTime).front();
  std::vector<std::pair<std::string, nlohmann::json>> bad = {
      {decode, {{"prompt_method", "no_such_method"}}},
      {decode, {{"prompt_method", 3}}},
      {decode, {{"prompt_config", {{"budget", 32}}}}},  // a prompt_config alone
      {decode, {{"prompt_method", prompt}, {"prompt_config", {{"no_such_key", 1}}}}},
      {prompt, {{"prompt_method", prompt}}},  // a prompt-time method takes none
  };
  for (const MethodInfo& info : registered_methods())
    if (info.composition != Composition::kPromptTime) bad.push_back({decode, {{"prompt_method", info.name}}});
  for (const auto& [name, config] : bad) {
    const Status s = create_method(name, config).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << name << " " << config.dump();
    EXPECT_NE(s.message().find(name + ":"), std::string::npos) << s.message();
  }
  const Status unknown = create_method(decode, {{"prompt_method", "no_such_method"}}).status();
  EXPECT_NE(unknown.message().find(prompt), std::string::npos) << "the valid prompt methods are listed";
  const Status key =
      create_method(decode, {{"prompt_method", prompt}, {"prompt_config", {{"no_such_key", 1}}}}).status();
  EXPECT_NE(key.message().find("no_such_key"), std::string::npos) << key.message();
}

// Over a long decode, the composed method admits exactly the prompt method's pages for its compressed prompt plus
// the decode method's generated tokens resident (which the decode method alone admits on top of the whole prompt).
TEST(MethodCompositionTest, ResidentPagesArePromptMethodsWithDecodeMethodsGeneratedTokens) {
  const KvLayout layout{2, 2, 8, 1, DType::kF32};  // pages of one token: pages count tokens exactly
  const nlohmann::json prompt_config = {{"budget", 32}, {"window", 8}};
  for (const std::string& decode : names_composing_as(Composition::kDecodeTime))
    for (const std::string& prompt : names_composing_as(Composition::kPromptTime)) {
      auto alone = create_method(prompt, prompt_config);
      auto plain = create_method(decode, nullptr);
      auto composed = create_method(decode, {{"prompt_method", prompt}, {"prompt_config", prompt_config}});
      ASSERT_TRUE(alone.is_ok() && plain.is_ok() && composed.is_ok()) << composed.status().to_string();
      for (const int32_t num_prompt : {20, 100}) {
        // Prefill: what the prompt method holds.
        for (const int32_t n : {1, num_prompt / 2, num_prompt})
          EXPECT_EQ((*composed)->resident_pages(layout, num_prompt, n),
                    (*alone)->resident_pages(layout, num_prompt, n));
        for (int32_t decoded = 1; decoded <= 3000; decoded += 7) {
          // The decode method alone: the whole prompt plus its generated tokens resident, per stream.
          const int64_t plain_pages = (*plain)->resident_pages(layout, num_prompt, num_prompt + decoded);
          const auto generated = static_cast<int32_t>(plain_pages / layout.num_streams() - num_prompt);
          ASSERT_GT(generated, 0);
          const int64_t composed_pages = (*composed)->resident_pages(layout, num_prompt, num_prompt + decoded);
          EXPECT_EQ(composed_pages, (*alone)->resident_pages(layout, num_prompt, num_prompt + generated))
              << decode << "+" << prompt << " prompt " << num_prompt << " decoded " << decoded;
          if (num_prompt <= 32) EXPECT_EQ(composed_pages, plain_pages);  // a prompt within the budget stays whole
        }
      }
    }
}

}  // namespace
}  // namespace se
