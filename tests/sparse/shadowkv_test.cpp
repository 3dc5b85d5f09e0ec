// shadowkv as a registered method: its configuration (the reference's defaults, bad values named) and its traits
// (its rewritten pages are its own, so no radix sharing; a retained chain carries its sketch).
#include <gtest/gtest.h>

#include "sparse/method_registry.h"

namespace se {
namespace {

TEST(ShadowKvMethodTest, ConfigDefaultsAndErrors) {
  auto method = create_method("shadowkv", nullptr);
  ASSERT_TRUE(method.is_ok()) << method.status().to_string();
  EXPECT_EQ((*method)->config(), nlohmann::ordered_json::parse(R"({"sparse_budget":2048,"chunk_size":8,"rank":160,
                                     "local_chunks":4,"outlier_chunks":48,"min_prompt_tokens":4097})"));
  for (const auto& [config, words] : std::vector<std::pair<nlohmann::json, std::string>>{
           {{{"sparse_budget", 100}}, "'sparse_budget' = 100 is not a whole number of chunks of 'chunk_size' = 8"},
           {{{"rank", 0}}, "rank"},
           {{{"chunk_size", 0}}, "chunk_size"},
           {{{"outlier_chunks", -1}}, "outlier_chunks"},
           {{{"budget", 64}}, "budget"},
       }) {
    const Status s = create_method("shadowkv", config).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << config.dump();
    EXPECT_NE(s.message().find(words), std::string::npos) << s.message();
  }
}

TEST(ShadowKvMethodTest, Traits) {
  auto method = create_method("shadowkv", nullptr);
  ASSERT_TRUE(method.is_ok());
  const MethodTraits& traits = (*method)->traits();
  EXPECT_EQ(traits.family, MethodFamily::kDynamicSelection);
  EXPECT_FALSE(traits.keeps_full_history);
  EXPECT_EQ(traits.prefix_mode, PrefixMode::kChain);
  EXPECT_EQ(traits.selection_unit, SelectionUnit::kToken);
  EXPECT_FALSE(check_runs_on(Device::kCuda, traits, "shadowkv").is_ok());  // gather_keys has no CUDA kernel
  EXPECT_TRUE(check_runs_on(Device::kCpu, traits, "shadowkv").is_ok());
}

}  // namespace
}  // namespace se
