// The KV cache scales of an FP8 checkpoint (loader/kv_cache_scales.h): each of the names checkpoints use, scalar or
// per KV head, and the checkpoints whose scales cannot be used, refused with the tensor named.
#include "loader/kv_cache_scales.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "safetensors_builder.h"
#include "test_models.h"

namespace se {
namespace {

constexpr int32_t kLayers = 2, kHeads = 3;

Tensor values(std::vector<float> v) {
  Tensor t = Tensor::empty(DType::kF32, Shape{static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

Tensor scalar(float s) {
  Tensor t = Tensor::empty(DType::kF32, Shape{});
  t.data<float>()[0] = s;
  return t;
}

Result<std::optional<KvCacheScales>> read(const std::string& name, const std::map<std::string, Tensor>& tensors) {
  const std::string path = testing::scratch_path(name + ".safetensors");
  testing::write_bytes(path, testing::safetensors_bytes(tensors));
  auto checkpoint = SafetensorsCheckpoint::open_files({path});
  SE_CHECK(checkpoint.is_ok(), "{}", checkpoint.status().to_string());
  return read_kv_cache_scales(*checkpoint, kLayers, kHeads, path);
}

TEST(KvCacheScalesTest, ReadsEveryNamingScalarOrPerHead) {
  // Layer 0 in vLLM's names with one scale per head, layer 1 in compressed-tensors' with one for the layer.
  auto scales = read("scales", {{"model.layers.0.self_attn.k_scale", values({0.1f, 0.2f, 0.3f})},
                                {"model.layers.0.self_attn.v_scale", values({0.4f, 0.5f, 0.6f})},
                                {"model.layers.1.self_attn.k_proj.output_scale", scalar(0.7f)},
                                {"model.layers.1.self_attn.v_proj.output_scale", values({0.8f})},
                                {"model.embed_tokens.weight", values({1.0f})}});
  ASSERT_TRUE(scales.is_ok()) << scales.status().to_string();
  ASSERT_TRUE(scales->has_value());
  EXPECT_EQ((*scales)->num_kv_heads, kHeads);
  EXPECT_EQ((*scales)->k, (std::vector<float>{0.1f, 0.2f, 0.3f, 0.7f, 0.7f, 0.7f}));
  EXPECT_EQ((*scales)->v, (std::vector<float>{0.4f, 0.5f, 0.6f, 0.8f, 0.8f, 0.8f}));
  const KvCacheScales rank1 = (*scales)->heads(1, 2);  // a tensor-parallel rank's KV heads
  EXPECT_EQ(rank1.k, (std::vector<float>{0.2f, 0.3f, 0.7f, 0.7f}));
  EXPECT_EQ(rank1.v, (std::vector<float>{0.5f, 0.6f, 0.8f, 0.8f}));

  // The oldest format: one kv_scale for keys and values.
  auto both = read("kv_scale", {{"model.layers.0.self_attn.kv_scale", scalar(2.0f)},
                                {"model.layers.1.self_attn.kv_scale", scalar(3.0f)}});
  ASSERT_TRUE(both.is_ok() && both->has_value()) << both.status().to_string();
  EXPECT_EQ((*both)->k, (std::vector<float>{2, 2, 2, 3, 3, 3}));
  EXPECT_EQ((*both)->v, (*both)->k);

  auto none = read("no_scales", {{"model.embed_tokens.weight", values({1.0f})}});
  ASSERT_TRUE(none.is_ok());
  EXPECT_FALSE(none->has_value());
}

TEST(KvCacheScalesTest, RefusesScalesItCannotUse) {
  const auto refused = [](const std::string& name, const std::map<std::string, Tensor>& tensors,
                          const std::string& named) {
    auto scales = read(name, tensors);
    ASSERT_FALSE(scales.is_ok()) << name;
    EXPECT_EQ(scales.status().code(), StatusCode::kDataLoss) << name;
    EXPECT_NE(scales.status().message().find(named), std::string::npos) << scales.status().to_string();
  };
  refused("one_layer",
          {{"model.layers.0.self_attn.k_scale", scalar(1)}, {"model.layers.0.self_attn.v_scale", scalar(1)}},
          "layer 1 has none");
  refused("second_layer_only",
          {{"model.layers.1.self_attn.k_scale", scalar(1)}, {"model.layers.1.self_attn.v_scale", scalar(1)}},
          "layer 0 has none");
  refused("keys_only", {{"model.layers.0.self_attn.k_scale", scalar(1)}}, "model.layers.0.self_attn.k_scale");
  refused("two_values",
          {{"model.layers.0.self_attn.k_scale", values({1, 2})},
           {"model.layers.0.self_attn.v_scale", scalar(1)},
           {"model.layers.1.self_attn.k_scale", scalar(1)},
           {"model.layers.1.self_attn.v_scale", scalar(1)}},
          "holds 2 values");
  for (const float bad : {0.0f, -1.0f, NAN, INFINITY})
    refused("bad_value",
            {{"model.layers.0.self_attn.k_scale", scalar(1)},
             {"model.layers.0.self_attn.v_scale", scalar(bad)},
             {"model.layers.1.self_attn.k_scale", scalar(1)},
             {"model.layers.1.self_attn.v_scale", scalar(1)}},
            "model.layers.0.self_attn.v_scale");
}

}  // namespace
}  // namespace se
