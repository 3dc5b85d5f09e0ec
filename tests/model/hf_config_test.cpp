#include "model/hf_config.h"

#include <gtest/gtest.h>

#include "typed_config.h"

namespace se {
namespace {

using testing::typed;

using nlohmann::json;

json llama_config() {
  return {{"model_type", "llama"},    {"hidden_size", 64},
          {"intermediate_size", 128}, {"num_hidden_layers", 2},
          {"num_attention_heads", 4}, {"num_key_value_heads", 2},
          {"vocab_size", 100},        {"rms_norm_eps", 1e-5},
          {"rope_theta", 500000.0},   {"max_position_embeddings", 256}};
}

void expect_error(const json& config, StatusCode code, const std::string& needle) {
  auto r = normalize_hf_config(config, "cfg.json");
  ASSERT_FALSE(r.is_ok()) << config.dump();
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_NE(r.status().message().find("cfg.json"), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().to_string();
}

TEST(HfConfigTest, FillsDefaults) {
  auto r = normalize_hf_config(llama_config(), "cfg.json");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const json& c = *r;
  EXPECT_EQ(c["head_dim"], 16);
  EXPECT_EQ(c["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(c["tie_word_embeddings"], false);
  EXPECT_EQ(c["attention_bias"], false);
  EXPECT_EQ(c["hidden_act"], "silu");
  EXPECT_TRUE(c["rope_scaling"].is_null());
  ModelConfig d = typed(c);
  EXPECT_EQ(d.arch, "llama");
  EXPECT_EQ(d.num_kv_heads, 2);
  EXPECT_FALSE(d.qk_norm);

  json q2 = llama_config();
  q2["model_type"] = "qwen2";
  q2.erase("num_key_value_heads");
  auto r2 = normalize_hf_config(q2, "cfg.json");
  ASSERT_TRUE(r2.is_ok());
  EXPECT_EQ((*r2)["num_key_value_heads"], 4);
  EXPECT_TRUE(typed(*r2).attention_bias);  // Qwen2 always has q/k/v biases

  json q3 = llama_config();
  q3["model_type"] = "qwen3";
  q3["head_dim"] = 32;  // Qwen3 head_dim need not be hidden / heads
  auto r3 = normalize_hf_config(q3, "cfg.json");
  ASSERT_TRUE(r3.is_ok());
  EXPECT_EQ(typed(*r3).head_dim, 32);
  EXPECT_TRUE(typed(*r3).qk_norm);
}

TEST(HfConfigTest, Gemma3LayerTypesAndRopeParameters) {
  json g = {{"model_type", "gemma3_text"},
            {"hidden_size", 64},
            {"intermediate_size", 128},
            {"num_hidden_layers", 7},
            {"num_attention_heads", 2},
            {"num_key_value_heads", 1},
            {"head_dim", 32},
            {"vocab_size", 50},
            {"sliding_window", 16},
            // transformers 5 style
            {"rope_parameters",
             {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
              {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}}}};
  auto r = normalize_hf_config(g, "cfg.json");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const json& c = *r;
  EXPECT_EQ(c["sliding_window_pattern"], 6);
  EXPECT_EQ(c["layer_types"][5], "full_attention");
  EXPECT_EQ(c["layer_types"][4], "sliding_attention");
  EXPECT_EQ(c["layer_types"][6], "sliding_attention");
  EXPECT_EQ(c["rope_theta"], 1e6);
  EXPECT_EQ(c["rope_local_base_freq"], 10000.0);
  EXPECT_EQ(c["rope_scaling"]["rope_type"], "linear");
  EXPECT_EQ(c["rope_scaling"]["factor"], 8.0);
  EXPECT_EQ(c["query_pre_attn_scalar"], 32.0);
  EXPECT_EQ(c["hidden_activation"], "gelu_pytorch_tanh");
  EXPECT_TRUE(c["final_logit_softcapping"].is_null());
  EXPECT_EQ(c["tie_word_embeddings"], true);
  ModelConfig d = typed(c);
  EXPECT_TRUE(d.sandwich_norm);
  EXPECT_TRUE(d.qk_norm);

  // A multimodal config is flattened to its text part.
  json mm = {{"model_type", "gemma3"}, {"eos_token_id", 1}, {"text_config", g}};
  mm["text_config"].erase("model_type");
  auto r2 = normalize_hf_config(mm, "cfg.json");
  ASSERT_TRUE(r2.is_ok()) << r2.status().to_string();
  EXPECT_EQ((*r2)["model_type"], "gemma3_text");
  EXPECT_EQ((*r2)["eos_token_id"], 1);
}

TEST(HfConfigTest, RejectsBadConfigs) {
  expect_error(json::array(), StatusCode::kInvalidArgument, "object");
  json c = llama_config();
  c.erase("model_type");
  expect_error(c, StatusCode::kInvalidArgument, "model_type");
  c = llama_config();
  c["model_type"] = "mamba";
  expect_error(c, StatusCode::kUnimplemented, "mamba");
  c = llama_config();
  c.erase("hidden_size");
  expect_error(c, StatusCode::kInvalidArgument, "hidden_size");
  c = llama_config();
  c["num_hidden_layers"] = -1;
  expect_error(c, StatusCode::kInvalidArgument, "num_hidden_layers");
  c = llama_config();
  c["vocab_size"] = "100";
  expect_error(c, StatusCode::kInvalidArgument, "vocab_size");
  c = llama_config();
  c["hidden_size"] = int64_t{1} << 40;
  expect_error(c, StatusCode::kInvalidArgument, "hidden_size");
  c = llama_config();
  c["num_key_value_heads"] = 3;
  expect_error(c, StatusCode::kInvalidArgument, "num_key_value_heads");
  c = llama_config();
  c["hidden_size"] = 66;  // not a multiple of 4 heads, no head_dim
  expect_error(c, StatusCode::kInvalidArgument, "head_dim");
  c = llama_config();
  c["rms_norm_eps"] = -1.0;
  expect_error(c, StatusCode::kInvalidArgument, "rms_norm_eps");
  c = llama_config();
  c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  expect_error(c, StatusCode::kInvalidArgument, "low_freq_factor");
  c = llama_config();
  c["rope_scaling"] = {{"type", "longrope"}};
  expect_error(c, StatusCode::kUnimplemented, "longrope");
  c = llama_config();
  c["hidden_act"] = "relu";
  expect_error(c, StatusCode::kUnimplemented, "relu");
}

}  // namespace
}  // namespace se
