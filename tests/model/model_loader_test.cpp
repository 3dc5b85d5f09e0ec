// load_model on synthetic models: the same random HF weights written as an HF directory and as a
// GGUF file (the way llama.cpp's converter writes it: renamed, llama Q/K rows permuted, Gemma norms
// + 1) must load identically.
#include "model/model_loader.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <random>

#include "../loader/gguf_builder.h"
#include "model/hf_config.h"
#include "model/weight_spec.h"
#include "model/arch/gemma3.h"
#include "model/arch/llama.h"
#include "../loader/safetensors_builder.h"
#include "../loader/test_models.h"
#include "typed_config.h"

namespace se {
namespace {

using testing::typed;

using nlohmann::json;
using testing::GgufBuilder;

json base_config(const std::string& model_type) {
  json c = {{"model_type", model_type}, {"hidden_size", 64},
            {"intermediate_size", 96},  {"num_hidden_layers", 2},
            {"num_attention_heads", 4}, {"num_key_value_heads", 2},
            {"vocab_size", 40},         {"rms_norm_eps", 1e-5},
            {"rope_theta", 10000.0},    {"max_position_embeddings", 128},
            {"bos_token_id", 1},        {"eos_token_id", 2}};
  if (model_type == "gemma3_text") {
    c["head_dim"] = 32;
    c["sliding_window"] = 16;
    c["num_hidden_layers"] = 7;
    c["rope_theta"] = 1e6;
  }
  if (model_type == "qwen3") c["head_dim"] = 32;
  if (model_type == "llama") c["tie_word_embeddings"] = false;
  return c;
}

std::map<std::string, Tensor> random_weights(const json& normalized, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::map<std::string, Tensor> w;
  for (const WeightSpec& spec : expected_weights(typed(normalized))) {
    Tensor t = Tensor::empty(DType::kF32, spec.shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(rng);
    w[spec.name] = t;
  }
  return w;
}

// What convert_hf_to_gguf.py would write for `hf` weights, as F32 tensors.
void write_gguf(const std::string& path, const json& c, const std::map<std::string, Tensor>& hf,
                const std::function<void(GgufBuilder&)>& extra = nullptr) {
  const ModelConfig d = typed(c);
  const std::string arch = d.arch == "gemma3" ? "gemma3" : c["model_type"].get<std::string>();
  GgufBuilder b;
  b.add_string("general.architecture", arch);
  b.add_u32(arch + ".block_count", static_cast<uint32_t>(d.num_layers));
  b.add_u32(arch + ".context_length", c["max_position_embeddings"].get<uint32_t>());
  b.add_u32(arch + ".embedding_length", static_cast<uint32_t>(d.hidden_size));
  b.add_u32(arch + ".feed_forward_length", static_cast<uint32_t>(d.intermediate_size));
  b.add_u32(arch + ".attention.head_count", static_cast<uint32_t>(d.num_heads));
  b.add_u32(arch + ".attention.head_count_kv", static_cast<uint32_t>(d.num_kv_heads));
  b.add_u32(arch + ".attention.key_length", static_cast<uint32_t>(d.head_dim));
  b.add_f32(arch + ".attention.layer_norm_rms_epsilon", c["rms_norm_eps"].get<float>());
  b.add_f32(arch + ".rope.freq_base", c["rope_theta"].get<float>());
  if (d.arch == "gemma3") b.add_u32(arch + ".attention.sliding_window", 16);
  std::vector<std::string> tokens;
  for (int64_t i = 0; i < d.vocab_size; ++i) tokens.push_back("t" + std::to_string(i));
  b.add_string_array("tokenizer.ggml.tokens", tokens);
  b.add_u32("tokenizer.ggml.bos_token_id", 1);
  b.add_u32("tokenizer.ggml.eos_token_id", 2);
  if (extra) extra(b);
  for (const WeightSpec& spec : expected_weights(d)) {
    if (!hf.count(spec.name)) continue;  // lets tests write incomplete files
    Tensor t = hf.at(spec.name);
    if (d.arch == "llama" && spec.name.find("q_proj") != std::string::npos) t = permute_qk_rows(t, d.num_heads);
    if (d.arch == "llama" && spec.name.find("k_proj") != std::string::npos) t = permute_qk_rows(t, d.num_kv_heads);
    if (d.arch == "gemma3" && spec.kind == WeightKind::kNorm) t = gemma_norm_multiplier(t);
    std::vector<int64_t> dims;
    for (int i = t.rank() - 1; i >= 0; --i) dims.push_back(t.dim(i));
    b.add_f32_tensor(spec.gguf_name, dims, std::vector<float>(t.data<float>(), t.data<float>() + t.numel()));
  }
  b.write(path);
}

void expect_same_weights(const LoadedModel& a, const LoadedModel& b) {
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (const auto& [name, t] : a.weights) {
    const Tensor& u = b.weights.at(name);
    ASSERT_EQ(t.shape(), u.shape()) << name;
    EXPECT_EQ(std::memcmp(t.raw(), u.raw(), t.nbytes()), 0) << name;
  }
}

class ModelLoaderArchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelLoaderArchTest, GgufAndHfDirLoadTheSameModel) {
  const std::string model_type = GetParam();
  json raw = base_config(model_type);
  json c = *normalize_hf_config(raw, "test");
  auto hf_weights = random_weights(c, 11);
  const std::string dir = testing::write_hf_dir(testing::scratch_path("hf_" + model_type), raw, hf_weights);
  // Gemma's HF checkpoints store w where the model applies 1 + w: internally (and in GGUF) the
  // norms are 1 + w.
  std::map<std::string, Tensor> internal = hf_weights;
  for (const WeightSpec& spec : expected_weights(typed(c))) {
    if (model_type == "gemma3_text" && spec.kind == WeightKind::kNorm)
      internal[spec.name] = gemma_norm_multiplier(hf_weights[spec.name]);
  }
  const std::string gguf = testing::scratch_path(model_type + ".gguf");
  write_gguf(gguf, c, hf_weights);

  auto from_hf = load_model(dir);
  ASSERT_TRUE(from_hf.is_ok()) << from_hf.status().to_string();
  auto from_gguf = load_model(gguf);
  ASSERT_TRUE(from_gguf.is_ok()) << from_gguf.status().to_string();
  EXPECT_EQ(from_hf->source_format, "hf");
  EXPECT_EQ(from_gguf->source_format, "gguf");
  EXPECT_TRUE(from_gguf->gguf.has_value());
  EXPECT_EQ(from_hf->hf_dir, dir);
  for (const char* key : {"model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                          "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings", "attention_bias",
                          "bos_token_id", "eos_token_id", "max_position_embeddings", "architectures"}) {
    EXPECT_EQ(from_hf->hf_config[key], from_gguf->hf_config[key]) << key;
  }
  EXPECT_FLOAT_EQ(from_hf->hf_config["rope_theta"].get<float>(), from_gguf->hf_config["rope_theta"].get<float>());
  EXPECT_FLOAT_EQ(from_hf->hf_config["rms_norm_eps"].get<float>(), from_gguf->hf_config["rms_norm_eps"].get<float>());
  if (model_type == "gemma3_text") {
    for (const char* key : {"sliding_window", "sliding_window_pattern", "layer_types", "rope_local_base_freq",
                            "query_pre_attn_scalar", "hidden_activation", "final_logit_softcapping"}) {
      EXPECT_EQ(from_hf->hf_config[key], from_gguf->hf_config[key]) << key;
    }
  }
  expect_same_weights(*from_hf, *from_gguf);
  // And both equal the weights we started from, in the internal convention.
  for (const auto& [name, t] : internal) {
    EXPECT_EQ(std::memcmp(t.raw(), from_gguf->weights.at(name).raw(), t.nbytes()), 0) << name;
  }

  LoadOptions bf16;
  bf16.dtype = DType::kBF16;
  auto half = load_model(gguf, bf16);
  ASSERT_TRUE(half.is_ok());
  EXPECT_EQ(half->weights.at("model.norm.weight").dtype(), DType::kBF16);
}

INSTANTIATE_TEST_SUITE_P(Archs, ModelLoaderArchTest, ::testing::Values("llama", "qwen2", "qwen3", "gemma3_text"));

TEST(ModelLoaderTest, Llama3RopeFreqsBecomeRopeScaling) {
  json c = *normalize_hf_config(base_config("llama"), "test");
  auto w = random_weights(c, 5);
  const int64_t head_dim = 16;
  // llama.cpp's converter: per rotary pair, 1 / factor blend by wavelength (factor 8, low 1, high
  // 4, ctx 8192).
  std::vector<float> factors;
  for (int64_t i = 0; i < head_dim; i += 2) {
    const double freq = 1.0 / std::pow(10000.0, static_cast<double>(i) / head_dim);
    const double wavelen = 2 * M_PI / freq;
    if (wavelen < 8192.0 / 4) {
      factors.push_back(1.0f);
    } else if (wavelen > 8192.0 / 1) {
      factors.push_back(8.0f);
    } else {
      const double smooth = (8192.0 / wavelen - 1) / (4 - 1);
      factors.push_back(static_cast<float>(1 / ((1 - smooth) / 8 + smooth)));
    }
  }
  const std::string path = testing::scratch_path("llama3_rope.gguf");
  write_gguf(path, c, w, [&](GgufBuilder& b) { b.add_f32_tensor("rope_freqs.weight", {head_dim / 2}, factors); });
  auto m = load_model(path);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  const json& s = m->hf_config["rope_scaling"];
  EXPECT_EQ(s["rope_type"], "llama3");
  EXPECT_EQ(s["factor"], 8.0);
  EXPECT_EQ(s["original_max_position_embeddings"], 8192);

  factors[0] = 3.0f;  // not the llama3 formula: kept as raw factors
  write_gguf(path, c, w, [&](GgufBuilder& b) { b.add_f32_tensor("rope_freqs.weight", {head_dim / 2}, factors); });
  auto raw = load_model(path);
  ASSERT_TRUE(raw.is_ok()) << raw.status().to_string();
  EXPECT_TRUE(raw->hf_config["rope_scaling"].is_null());
  EXPECT_EQ(raw->hf_config["rope_freq_factors"].size(), 8u);
  EXPECT_EQ(raw->hf_config["rope_freq_factors"][0], 3.0);
}

TEST(ModelLoaderTest, LinearRopeScalingFromMetadata) {
  json c = *normalize_hf_config(base_config("qwen3"), "test");
  const std::string path = testing::scratch_path("qwen3_linear.gguf");
  write_gguf(path, c, random_weights(c, 2), [](GgufBuilder& b) {
    b.add_string("qwen3.rope.scaling.type", "linear");
    b.add_f32("qwen3.rope.scaling.factor", 4.0f);
  });
  auto m = load_model(path);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->hf_config["rope_scaling"], (json{{"rope_type", "linear"}, {"factor", 4.0}}));
}

TEST(ModelLoaderTest, DummyWeightsAreDeterministicAndSane) {
  const std::string dir = testing::scratch_path("dummy_cfg");
  std::filesystem::create_directories(dir);
  testing::write_text(dir + "/config.json", base_config("qwen2").dump());
  LoadOptions opt;
  opt.format = LoadFormat::kDummy;
  auto a = load_model(dir, opt);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  auto b = load_model(dir + "/config.json", opt);
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(a->source_format, "dummy");
  EXPECT_EQ(a->hf_dir, dir);
  expect_same_weights(*a, *b);
  EXPECT_EQ(a->weights.size(), expected_weights(a->config).size());
  EXPECT_EQ(a->weights.at("model.norm.weight").data<float>()[3], 1.0f);
  EXPECT_EQ(a->weights.at("model.layers.0.self_attn.q_proj.bias").data<float>()[0], 0.0f);
  const Tensor& e = a->weights.at("model.embed_tokens.weight");
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < e.numel(); ++i) {
    sum += e.data<float>()[i];
    sq += e.data<float>()[i] * e.data<float>()[i];
  }
  const double mean = sum / e.numel(), std = std::sqrt(sq / e.numel() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.002);
  EXPECT_NEAR(std, 0.02, 0.002);
  opt.seed = 1;
  auto c = load_model(dir, opt);
  EXPECT_NE(std::memcmp(e.raw(), c->weights.at("model.embed_tokens.weight").raw(), e.nbytes()), 0);
  // Different tensors get different values.
  EXPECT_NE(std::memcmp(a->weights.at("model.layers.0.mlp.up_proj.weight").raw(),
                        a->weights.at("model.layers.0.mlp.gate_proj.weight").raw(), 64 * 4),
            0);
}

TEST(ModelLoaderTest, ErrorsNameTheInput) {
  auto missing = load_model("/nonexistent/model.gguf");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/model.gguf"), std::string::npos);

  const std::string empty_dir = testing::scratch_path("empty_model_dir");
  std::filesystem::create_directories(empty_dir);
  EXPECT_NE(load_model(empty_dir).status().message().find("config.json"), std::string::npos);

  json c = *normalize_hf_config(base_config("qwen3"), "test");
  auto w = random_weights(c, 1);
  // A GGUF missing one tensor, and one with a wrong shape.
  auto partial = w;
  partial.erase("model.layers.1.mlp.up_proj.weight");
  const std::string gguf = testing::scratch_path("broken.gguf");
  write_gguf(gguf, c, partial);
  auto incomplete = load_model(gguf);
  EXPECT_EQ(incomplete.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(incomplete.status().message().find("blk.1.ffn_up.weight"), std::string::npos);
  EXPECT_NE(incomplete.status().message().find("broken.gguf"), std::string::npos);
  GgufBuilder b;
  b.add_string("general.architecture", "mamba");
  b.write(gguf);
  auto arch = load_model(gguf);
  EXPECT_EQ(arch.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(arch.status().message().find("mamba"), std::string::npos);

  std::map<std::string, Tensor> bad = w;
  bad["model.layers.1.mlp.up_proj.weight"] = testing::ramp(Shape{96, 63});
  const std::string dir = testing::write_hf_dir(testing::scratch_path("bad_shape_hf"), base_config("qwen3"), bad);
  auto shape = load_model(dir);
  EXPECT_EQ(shape.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(shape.status().message().find("model.layers.1.mlp.up_proj.weight"), std::string::npos);
  EXPECT_NE(shape.status().message().find("[96, 63]"), std::string::npos);

  std::map<std::string, Tensor> gone = w;
  gone.erase("model.norm.weight");
  testing::write_hf_dir(dir, base_config("qwen3"), gone);
  EXPECT_NE(load_model(dir).status().message().find("model.norm.weight"), std::string::npos);

  testing::write_text(dir + "/config.json", "{\"model_type\": \"qwen3\"");
  auto bad_json = load_model(dir);
  EXPECT_EQ(bad_json.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_json.status().message().find("config.json"), std::string::npos);
}

}  // namespace
}  // namespace se
