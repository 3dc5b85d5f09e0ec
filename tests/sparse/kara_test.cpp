// kara as a registered method: its configuration (defaults, bad values named), its memory model against the
// periodic policy it runs (the generated part is admitted at the most it ever holds), and the query ring it keeps
// per sequence beside the pool.
#include <gtest/gtest.h>

#include "sparse/method_registry.h"
#include "sparse/methods/kara_selection.h"

namespace se {
namespace {

TEST(KaraMethodTest, ConfigDefaultsAndErrors) {
  auto method = create_method("kara", nullptr);
  ASSERT_TRUE(method.is_ok());
  EXPECT_EQ((*method)->config(),
            nlohmann::ordered_json::parse(R"({"window":512,"buffer":64,"candidates":64,"budget":160,"period":128,
                                              "length_exponent":1.0})"));
  for (const auto& [config, words] : std::vector<std::pair<nlohmann::json, std::string>>{
           {{{"budget", 600}}, "'budget' = 600 exceeds 'window' = 512"},
           {{{"period", 0}}, "period"},
           {{{"candidates", 0}}, "candidates"},
           {{{"length_exponent", -1.0}}, "length_exponent"},
           {{{"windows", 10}}, "windows"},
       }) {
    const Status s = create_method("kara", config).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << config.dump();
    EXPECT_NE(s.message().find(words), std::string::npos) << s.message();
  }
}

// Replays the periodic policy over single decode steps, for a period that divides window + buffer and one that
// does not: the generated tokens resident before each compression never exceed what resident_pages admits, and
// the bound is reached.
TEST(KaraMethodTest, ResidentPagesCoverTheTransientPeak) {
  for (const int period : {8, 12}) {
    const nlohmann::json config = {
        {"window", 32}, {"buffer", 8}, {"candidates", 4}, {"budget", 12}, {"period", period}};
    auto method = create_method("kara", config);
    ASSERT_TRUE(method.is_ok());
    const KvLayout layout{2, 2, 8, 4, DType::kF32};
    KaraParams params;
    params.window = 32;
    params.buffer = 8;
    params.budget = 12;
    params.period = period;
    constexpr int32_t kPrompt = 9;
    int32_t compressed = 0, uncompressed = 0;
    bool reached = false;
    for (int32_t decoded = 1; decoded <= 500; ++decoded) {
      ++uncompressed;
      const int64_t held = layout.pages_for_tokens(kPrompt + compressed + uncompressed);
      const int64_t admitted = (*method)->resident_pages(layout, kPrompt, kPrompt + decoded);
      ASSERT_LE(held, admitted) << "period " << period << " decoded " << decoded;
      reached |= held == admitted && compressed > 0;
      if (kara_should_compress(decoded, uncompressed, params)) {
        compressed += uncompressed - params.window - params.buffer + params.budget;
        uncompressed = params.buffer;
      }
    }
    EXPECT_TRUE(reached) << period;
  }
}

// The ring holds window + buffer bf16 query rows per layer, composed or not (SnapKV keeps nothing per sequence);
// R-KV's holds its window.
TEST(KaraMethodTest, SequenceDeviceBytesAreTheQueryRing) {
  const KvLayout layout{3, 2, 8, 4, DType::kF32};
  const nlohmann::json config = {{"window", 32}, {"buffer", 8}, {"budget", 12}};
  auto kara = create_method("kara", config);
  ASSERT_TRUE(kara.is_ok());
  EXPECT_EQ((*kara)->sequence_device_bytes(layout, 64), int64_t{3} * 40 * 64 * 2);
  nlohmann::json composed = config;
  composed["prompt_method"] = "snapkv";
  auto kara_snapkv = create_method("kara", composed);
  ASSERT_TRUE(kara_snapkv.is_ok()) << kara_snapkv.status().to_string();
  EXPECT_EQ((*kara_snapkv)->sequence_device_bytes(layout, 64), int64_t{3} * 40 * 64 * 2);
  auto rkv = create_method("rkv", {{"window", 8}});
  ASSERT_TRUE(rkv.is_ok());
  EXPECT_EQ((*rkv)->sequence_device_bytes(layout, 64), int64_t{3} * 8 * 64 * 2);
  EXPECT_EQ((*create_method("snapkv", nullptr))->sequence_device_bytes(layout, 64), 0);
}

}  // namespace
}  // namespace se
