// Tensor parallelism's sharded forward on the CPU (ranks as threads of one LocalCommGroup): a model split over 2 and
// 4 ranks gives the logits of the whole model within fp32 tolerance, for Llama (GQA; at 4 ranks its 2 KV heads are
// replicated), Qwen3 (q/k norms), Qwen3-MoE (experts split by width), Gemma 3 (sandwich norms, the _out layers)
// and DeepSeek-V2 (latent attention split by heads, the latent whole on every rank; shared experts), over a
// prefill of two ragged sequences and the decode steps after it; a vocabulary the ranks do not divide is padded.
// The sharding plan's checks (counts that do not divide) are errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../support/tiny_model.h"
#include "model/contiguous_kv_cache.h"
#include "model/tensor_parallel.h"
#include "model/weight_spec.h"
#include "parallel/local_comm_group.h"

namespace se {
namespace {

ModelConfig config_of(const nlohmann::json& hf) {
  auto normalized = normalize_hf_config(hf, "tiny");
  SE_CHECK(normalized.is_ok(), "{}", normalized.status().to_string());
  auto config = parse_model_config(*normalized);
  SE_CHECK(config.is_ok(), "{}", config.status().to_string());
  return *config;
}

// Two sequences prefilled together (ragged), then `decode_steps` steps of one token each.
std::vector<ForwardBatch> batches(int vocab, int decode_steps) {
  std::vector<ForwardBatch> out;
  ForwardBatch prefill;
  const int lengths[] = {7, 4};
  for (int s = 0; s < 2; ++s) {
    SequenceSlice slice{s, prefill.num_tokens(), lengths[s], 0};
    for (int i = 0; i < lengths[s]; ++i) {
      prefill.token_ids.push_back((s * 31 + i * 17 + 5) % vocab);
      prefill.positions.push_back(i);
    }
    prefill.sequences.push_back(slice);
    prefill.logit_rows.push_back(prefill.num_tokens() - 1);
  }
  prefill.logit_rows.insert(prefill.logit_rows.begin(), 2);  // a row mid-prompt too
  out.push_back(prefill);
  for (int step = 0; step < decode_steps; ++step) {
    ForwardBatch decode;
    for (int s = 0; s < 2; ++s) {
      decode.token_ids.push_back((step * 13 + s * 7 + 1) % vocab);
      decode.positions.push_back(lengths[s] + step);
      decode.sequences.push_back({s, s, 1, 0});
      decode.logit_rows.push_back(s);
    }
    out.push_back(decode);
  }
  return out;
}

// The logits of each batch, run in order on `model` with a cache of its own.
std::vector<Tensor> run(const Model& model, const std::vector<ForwardBatch>& steps) {
  ContiguousKvCache cache(model.config(), 2);
  ForwardWorkspace ws = model.make_workspace();
  std::vector<Tensor> logits;
  logits.reserve(steps.size());
  for (const ForwardBatch& batch : steps) logits.push_back(model.forward(batch, cache, ws).clone());
  return logits;
}

// Each rank's logits of a model split over `size` ranks, all in one thread group.
std::vector<std::vector<Tensor>> run_sharded(const ModelConfig& config, const std::map<std::string, Tensor>& weights,
                                             int size, const std::vector<ForwardBatch>& steps) {
  LocalCommGroup group(size);
  std::vector<std::vector<Tensor>> logits(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      auto model = Model::create(config, weights, Device::kCpu, group.communicator(r));
      SE_CHECK(model.is_ok(), "{}", model.status().to_string());
      logits[static_cast<size_t>(r)] = run(*model, steps);
    });
  }
  for (std::thread& t : threads) t.join();
  return logits;
}

void expect_close(const Tensor& expected, const Tensor& actual, const std::string& what) {
  ASSERT_EQ(expected.shape(), actual.shape()) << what;
  float scale = 0.0f;
  for (int64_t i = 0; i < expected.numel(); ++i) scale = std::max(scale, std::abs(expected.data<float>()[i]));
  const float tolerance = 1e-5f * std::max(scale, 1.0f);
  for (int64_t i = 0; i < expected.numel(); ++i) {
    ASSERT_NEAR(expected.data<float>()[i], actual.data<float>()[i], tolerance) << what << " element " << i;
  }
}

struct Case {
  std::string model_type;
  int size;
  int vocab = 96;
  friend void PrintTo(const Case& c, std::ostream* os) {
    *os << c.model_type << " over " << c.size << " ranks, vocabulary " << c.vocab;
  }
};

class TensorParallelForwardTest : public testing::TestWithParam<Case> {};

TEST_P(TensorParallelForwardTest, ShardedLogitsEqualTheWholeModels) {
  const Case& c = GetParam();
  nlohmann::json hf = test::tiny_config(c.model_type);
  hf["vocab_size"] = c.vocab;
  const ModelConfig config = config_of(hf);
  const std::map<std::string, Tensor> weights = dummy_weights(config, DType::kF32, 3, nullptr);
  const std::vector<ForwardBatch> steps = batches(c.vocab, 3);

  auto whole = Model::create(config, weights);
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  const std::vector<Tensor> expected = run(*whole, steps);
  const std::vector<std::vector<Tensor>> sharded = run_sharded(config, weights, c.size, steps);
  for (int r = 0; r < c.size; ++r) {
    for (size_t step = 0; step < steps.size(); ++step) {
      expect_close(expected[step], sharded[static_cast<size_t>(r)][step],
                   c.model_type + " rank " + std::to_string(r) + " step " + std::to_string(step));
      // Every rank returns the same gathered logits, bit for bit.
      ASSERT_EQ(
          std::memcmp(sharded[0][step].raw(), sharded[static_cast<size_t>(r)][step].raw(), sharded[0][step].nbytes()),
          0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TensorParallelForwardTest,
                         testing::Values(Case{"llama", 2}, Case{"llama", 4}, Case{"qwen3", 2}, Case{"qwen3", 4},
                                         Case{"qwen3_moe", 2}, Case{"qwen3_moe", 4}, Case{"gemma3_text", 2},
                                         Case{"deepseek_v2", 2}, Case{"deepseek_v2", 4}, Case{"llama", 4, 98},
                                         Case{"qwen3", 2, 97}),
                         [](const testing::TestParamInfo<Case>& info) {
                           return info.param.model_type + "_tp" + std::to_string(info.param.size) + "_vocab" +
                                  std::to_string(info.param.vocab);
                         });

TEST(ShardConfigTest, SplitsHeadsAndWidthsAndKeepsTheVocabulary) {
  nlohmann::json hf = test::tiny_config("qwen3_moe");
  hf["num_key_value_heads"] = 4;
  const ModelConfig config = config_of(hf);
  auto shard = shard_config(config, {1, 2});
  ASSERT_TRUE(shard.is_ok()) << shard.status().to_string();
  EXPECT_EQ(shard->num_heads, 2);
  EXPECT_EQ(shard->num_kv_heads, 2);
  EXPECT_EQ(shard->intermediate_size, 64);
  EXPECT_EQ(shard->moe_intermediate_size, 16);
  EXPECT_EQ(shard->num_experts, 8);
  EXPECT_EQ(shard->vocab_size, 96);
  EXPECT_EQ(shard->vocab_shard_rows(), 48);
  EXPECT_EQ(shard->shard.rank, 1);
  EXPECT_EQ(shard->shard.size, 2);
}

TEST(ShardConfigTest, RefusesCountsTheRanksDoNotDivide) {
  const ModelConfig config = config_of(test::tiny_config("llama"));  // 4 heads, 2 KV heads, width 128
  auto three = shard_config(config, {0, 3});
  ASSERT_FALSE(three.is_ok());
  EXPECT_NE(three.status().message().find("does not divide the model's 4 attention heads"), std::string::npos)
      << three.status().to_string();
  nlohmann::json hf = test::tiny_config("llama");
  hf["num_attention_heads"] = 8;
  hf["num_key_value_heads"] = 8;
  hf["head_dim"] = 8;
  hf["intermediate_size"] = 100;
  auto width = shard_config(config_of(hf), {0, 8});
  ASSERT_FALSE(width.is_ok());
  EXPECT_NE(width.status().message().find("intermediate_size"), std::string::npos) << width.status().to_string();
  EXPECT_FALSE(shard_config(config, {2, 2}).is_ok());
}

TEST(ShardConfigTest, RefusesKvHeadsThatNeitherDivideNorRepeat) {
  nlohmann::json hf = test::tiny_config("llama");
  hf["num_attention_heads"] = 12;
  hf["num_key_value_heads"] = 3;
  hf["head_dim"] = 8;
  hf["intermediate_size"] = 96;
  auto shard = shard_config(config_of(hf), {0, 2});
  ASSERT_FALSE(shard.is_ok());
  EXPECT_NE(shard.status().message().find("3 KV heads"), std::string::npos) << shard.status().to_string();
}

TEST(ShardWeightTest, KvHeadsFewerThanRanksAreRepeatedForTheRanksThatReadThem) {
  const ModelConfig config = config_of(test::tiny_config("llama"));  // 4 heads over 2 KV heads of 16 rows
  const WeightSpec spec = expected_weights(config)[3];               // k_proj of layer 0
  ASSERT_EQ(spec.split, WeightSplit::kKvHeads) << spec.name;
  Tensor k = Tensor::empty(DType::kF32, spec.shape);
  for (int64_t i = 0; i < k.numel(); ++i) {
    const int64_t row = i / config.hidden_size;
    k.data<float>()[i] = static_cast<float>(row);
  }
  for (int rank = 0; rank < 4; ++rank) {
    const Tensor part = shard_weight(config, {rank, 4}, spec, k);
    ASSERT_EQ(part.shape(), Shape({16, config.hidden_size}));
    const int kv_head = rank / 2;  // what query head `rank` reads
    EXPECT_EQ(part.data<float>()[0], static_cast<float>(kv_head * 16)) << "rank " << rank;
  }
}

TEST(ShardWeightTest, TheLastVocabularyPartIsPaddedWithZeros) {
  nlohmann::json hf = test::tiny_config("llama");
  hf["vocab_size"] = 10;
  const ModelConfig config = config_of(hf);
  const WeightSpec spec = expected_weights(config)[0];
  Tensor table = Tensor::empty(DType::kF32, spec.shape);
  for (int64_t i = 0; i < table.numel(); ++i) {
    const int64_t row = i / 64;
    table.data<float>()[i] = 1.0f + static_cast<float>(row);
  }
  const Tensor last = shard_weight(config, {3, 4}, spec, table);  // rows 9 and one pad row
  ASSERT_EQ(last.shape(), Shape({3, 64}));
  EXPECT_EQ(last.data<float>()[0], 10.0f);
  EXPECT_EQ(last.data<float>()[64], 0.0f);
  EXPECT_EQ(last.data<float>()[2 * 64], 0.0f);
}

}  // namespace
}  // namespace se
