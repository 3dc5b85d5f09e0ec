// rkv as a registered method: its configuration (defaults, bad values named), its memory model against the
// trigger it runs (the generated part is admitted at the most it ever holds), and its scores through the backend's
// redundancy_aware_scores against the reference's pooling and mix written out here.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>

#include "backend/device_memory.h"
#include "backend/ops.h"
#include "sparse/method_registry.h"
#include "sparse/methods/observation_window_scores.h"
#include "sparse/methods/rkv_scores.h"

namespace se {
namespace {

Status create_status(const nlohmann::json& config) { return create_method("rkv", config).status(); }

TEST(RkvMethodTest, ConfigDefaultsAndErrors) {
  auto method = create_method("rkv", nullptr);
  ASSERT_TRUE(method.is_ok());
  EXPECT_EQ((*method)->config(),
            nlohmann::ordered_json::parse(R"({"budget":1024,"buffer":128,"window":8,"kernel":7,"mix_lambda":0.07})"));
  EXPECT_TRUE(create_status({{"budget", 64}, {"buffer", 16}, {"window", 8}}).is_ok());
  for (const auto& [config, words] : std::vector<std::pair<nlohmann::json, std::string>>{
           {{{"kernel", 4}}, "'kernel' = 4 must be odd"},
           {{{"budget", 8}}, "'window' = 8 must be below 'budget' = 8"},
           {{{"buffer", 4}}, "'buffer' = 4 must be at least 'window' = 8"},
           {{{"mix_lambda", 1.5}}, "mix_lambda"},
           {{{"budgte", 10}}, "budgte"},
       }) {
    const Status s = create_status(config);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << config.dump();
    EXPECT_NE(s.message().find(words), std::string::npos) << s.message();
  }
}

// Replays the trigger over single decode steps: the generated tokens resident before each step's compression never
// exceed what resident_pages admits, and the bound is reached.
TEST(RkvMethodTest, ResidentPagesCoverTheTransientPeak) {
  const nlohmann::json config = {{"budget", 40}, {"buffer", 16}, {"window", 4}};
  auto method = create_method("rkv", config);
  ASSERT_TRUE(method.is_ok());
  const KvLayout layout{2, 2, 8, 4, DType::kF32};
  RkvParams params;
  params.budget = 40;
  params.buffer = 16;
  params.window = 4;
  constexpr int32_t kPrompt = 13;
  int32_t resident = 0;
  bool reached = false;
  for (int32_t decoded = 1; decoded <= 400; ++decoded) {
    ++resident;
    const int64_t admitted = (*method)->resident_pages(layout, kPrompt, kPrompt + decoded);
    ASSERT_LE(layout.pages_for_tokens(kPrompt + resident), admitted) << decoded;
    reached |= layout.pages_for_tokens(kPrompt + resident) == admitted && decoded > params.budget + params.buffer;
    if (rkv_should_compress(resident, decoded, 1, params)) resident = params.budget;
  }
  EXPECT_TRUE(reached);
  EXPECT_EQ((*method)->resident_pages(layout, kPrompt, kPrompt), layout.pages_for_tokens(kPrompt));
}

// rkv_scores on random queries and keys (GQA group 2, a kernel wider than some heads' edges) equals the importance
// max-pooled with -inf padding (the SnapKV family's pool_scores) and mixed with the redundancy, step by step.
TEST(RkvMethodTest, ScoresPoolTheImportanceAndSubtractTheRedundancy) {
  RkvParams params;
  params.window = 3;
  params.kernel = 5;
  params.mix_lambda = 0.3f;
  constexpr int32_t kTokens = 41, kHeads = 4, kKvHeads = 2, kDim = 16, kScored = kTokens - 3;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> q(size_t{3} * kHeads * kDim), k(size_t{kTokens} * kKvHeads * kDim);
  for (float& x : q) x = normal(rng);
  for (float& x : k) x = normal(rng);
  const RkvScores got = rkv_scores(q.data(), k.data(), kTokens, kHeads, kKvHeads, kDim, params);
  std::vector<float> importance(size_t{kKvHeads} * kScored), redundancy(size_t{kKvHeads} * kTokens);
  group_max_attention_importance(TensorView{importance.data(), DType::kF32, {kKvHeads, kScored}, Device::kCpu},
                                 TensorView{q.data(), DType::kF32, {3, kHeads, kDim}, Device::kCpu},
                                 TensorView{k.data(), DType::kF32, {kScored, kKvHeads, kDim}, Device::kCpu});
  key_redundancy(TensorView{redundancy.data(), DType::kF32, {kKvHeads, kTokens}, Device::kCpu},
                 TensorView{k.data(), DType::kF32, {kTokens, kKvHeads, kDim}, Device::kCpu},
                 params.similarity_threshold);
  ASSERT_EQ(got.num_prefix, kScored);
  std::vector<float> pooled(kScored);
  for (int32_t h = 0; h < kKvHeads; ++h) {
    pool_scores(importance.data() + size_t{kScored} * h, pooled.data(), kScored, params.kernel, WindowPooling::kMax);
    for (int32_t j = 0; j < kScored; ++j) {
      const float want =
          params.mix_lambda * pooled[j] - (1.0f - params.mix_lambda) * redundancy[size_t{kTokens} * h + j];
      EXPECT_NEAR(got.values[size_t{kScored} * h + j], want, 1e-7f * (1.0f + std::abs(want))) << h << " " << j;
    }
  }
}

// At mix_lambda 1 the scores are the pooled importance alone, and the redundancy, weighted 0, is not computed: its
// scratch, poisoned with NaN beforehand, must not reach the scores.
TEST(RkvMethodTest, LambdaOneScoresByImportanceAlone) {
  RkvParams params;
  params.window = 2;
  params.kernel = 3;
  params.mix_lambda = 1.0f;
  constexpr int32_t kTokens = 30, kHeads = 2, kKvHeads = 1, kDim = 8, kScored = kTokens - 2;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::vector<float> q(size_t{2} * kHeads * kDim), k(size_t{kTokens} * kKvHeads * kDim);
  for (float& x : q) x = normal(rng);
  for (float& x : k) x = normal(rng);
  RkvScratch scratch;
  scratch.redundancy = empty_on(Device::kCpu, DType::kF32, {kKvHeads, kTokens});
  std::fill_n(scratch.redundancy.view().ptr<float>(), kKvHeads * kTokens, std::numeric_limits<float>::quiet_NaN());
  std::vector<float> got(kScored), importance(kScored), want(kScored);
  rkv_score(TensorView{got.data(), DType::kF32, {kKvHeads, kScored}, Device::kCpu},
            TensorView{q.data(), DType::kF32, {2, kHeads, kDim}, Device::kCpu},
            TensorView{k.data(), DType::kF32, {kTokens, kKvHeads, kDim}, Device::kCpu}, params, scratch);
  group_max_attention_importance(TensorView{importance.data(), DType::kF32, {kKvHeads, kScored}, Device::kCpu},
                                 TensorView{q.data(), DType::kF32, {2, kHeads, kDim}, Device::kCpu},
                                 TensorView{k.data(), DType::kF32, {kScored, kKvHeads, kDim}, Device::kCpu});
  pool_scores(importance.data(), want.data(), kScored, params.kernel, WindowPooling::kMax);
  for (int32_t j = 0; j < kScored; ++j) EXPECT_EQ(got[j], want[j]) << j;
}

}  // namespace
}  // namespace se
