// rkv as a registered method: its configuration (defaults, bad values named), and its memory model against the
// trigger it runs (the generated part is admitted at the most it ever holds).
#include <gtest/gtest.h>

#include "sparse/method_registry.h"
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

}  // namespace
}  // namespace se
