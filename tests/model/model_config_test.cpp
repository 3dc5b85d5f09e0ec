// parse_model_config on the rope scalings whose defaults come from transformers.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/model.h"

namespace se {
namespace {

nlohmann::json qwen3_8b_yarn() {
  std::ifstream in(std::string(SE_SOURCE_DIR) + "/bench/models/qwen3-8b-yarn/config.json");
  return nlohmann::json::parse(in);
}

TEST(ModelConfigTest, YarnServesFactorTimesTheTrainedContext) {
  auto c = parse_model_config(qwen3_8b_yarn());
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->max_position_embeddings, 131072);  // 4 x 32,768 over the config's 40,960
  const RopeParams& rope = c->layers[0].rope;
  EXPECT_EQ(rope.scaling, RopeScaling::kYarn);
  EXPECT_EQ(rope.original_max_position, 32768);
  EXPECT_FLOAT_EQ(rope.beta_fast, 32.0f);
  EXPECT_FLOAT_EQ(rope.beta_slow, 1.0f);
  EXPECT_TRUE(rope.truncate);
  EXPECT_FLOAT_EQ(rope.attention_factor, static_cast<float>(0.1 * std::log(4.0) + 1.0));
}

TEST(ModelConfigTest, YarnAttentionFactorFromMscalesOrGivenOutright) {
  nlohmann::json hf = qwen3_8b_yarn();
  hf["max_position_embeddings"] = 163840;
  hf["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 40.0},  {"original_max_position_embeddings", 4096},
                        {"mscale", 0.707}, {"mscale_all_dim", 0.707}, {"beta_fast", 16}, {"beta_slow", 2}};
  auto c = parse_model_config(hf);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_FLOAT_EQ(c->layers[0].rope.attention_factor, 1.0f);  // equal mscales cancel, as in DeepSeek-V3
  EXPECT_FLOAT_EQ(c->layers[0].rope.beta_fast, 16.0f);
  EXPECT_EQ(c->max_position_embeddings, 163840);

  hf["rope_scaling"]["attention_factor"] = 0.5;
  c = parse_model_config(hf);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_FLOAT_EQ(c->layers[0].rope.attention_factor, 0.5f);

  // The trained context defaults to max_position_embeddings.
  hf["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 2.0}};
  c = parse_model_config(hf);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->layers[0].rope.original_max_position, 163840);
  EXPECT_EQ(c->max_position_embeddings, 327680);
}

TEST(ModelConfigTest, RejectsBadYarn) {
  nlohmann::json hf = qwen3_8b_yarn();
  for (const nlohmann::json& bad :
       {nlohmann::json{{"rope_type", "yarn"}, {"factor", 4.0}, {"beta_fast", 1}, {"beta_slow", 32}},
        nlohmann::json{{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", -1.0}},
        nlohmann::json{{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 0}},
        nlohmann::json{{"rope_type", "yarn"}, {"factor", 1e6}, {"original_max_position_embeddings", 1 << 30}}}) {
    hf["rope_scaling"] = bad;
    auto c = parse_model_config(hf);
    EXPECT_FALSE(c.is_ok()) << bad.dump();
    if (!c.is_ok()) EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status().to_string();
  }
}

nlohmann::json qwen3_moe(const nlohmann::json& extra) {
  nlohmann::json hf = {{"model_type", "qwen3_moe"}, {"vocab_size", 32},           {"hidden_size", 16},
                       {"intermediate_size", 24},   {"moe_intermediate_size", 8}, {"num_hidden_layers", 6},
                       {"num_attention_heads", 2},  {"num_key_value_heads", 1},   {"head_dim", 8},
                       {"num_experts", 4},          {"num_experts_per_tok", 2}};
  hf.update(extra);
  return hf;
}

TEST(ModelConfigTest, MoeLayersFollowDecoderSparseStepAndMlpOnlyLayers) {
  auto c = parse_model_config(qwen3_moe({{"decoder_sparse_step", 2}, {"mlp_only_layers", {3}}}));
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  std::vector<bool> moe;
  for (const LayerConfig& layer : c->layers) moe.push_back(layer.moe);
  EXPECT_EQ(moe, (std::vector<bool>{false, true, false, false, false, true}));
  EXPECT_FALSE(c->norm_topk_prob);  // transformers' default
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->moe_intermediate_size, 8);

  auto all = parse_model_config(qwen3_moe({{"norm_topk_prob", true}}));
  ASSERT_TRUE(all.is_ok());
  for (const LayerConfig& layer : all->layers) EXPECT_TRUE(layer.moe);
  EXPECT_TRUE(all->norm_topk_prob);

  auto too_many = parse_model_config(qwen3_moe({{"num_experts_per_tok", 5}}));
  EXPECT_EQ(too_many.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.status().message().find("num_experts_per_tok"), std::string::npos);
}

}  // namespace
}  // namespace se
