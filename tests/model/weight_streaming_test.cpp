// The streaming load (load_model with a WeightSink) and ModelWeightsBuilder: a load hands over one weight at a
// time, so its host peak stays near the largest weight whatever the model's size; the weights it streams are the
// ones the map load returns (same dummy seed, same FP8 dequantization); the builder stacks them into the forward's
// layout, in fp32 as the CPU runs them and in BF16 as a GPU does (the GPU's conversion and row placement, run on
// the host here); FP8 expert weights kept as stored (what a GPU load does) give the logits of the dequantized load,
// from a dummy load and from a checkpoint.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "../loader/safetensors_builder.h"
#include "../loader/test_models.h"
#include "loader/dummy_weights.h"
#include "loader/fp8_block_weights.h"
#include "loader/weight_transforms.h"
#include "model/contiguous_kv_cache.h"
#include "model/model.h"
#include "model/model_loader.h"
#include "model/weight_spec.h"
#include "model/weights_builder.h"
#include "tensor/host_memory.h"

namespace se {
namespace {

using nlohmann::json;

// A Qwen3-MoE config.json with block-scaled FP8 weights (what bench/models/qwen3-30b-a3b-fp8 is, shrunk), in a
// scratch directory of its own; returns the directory.
std::string write_moe_config(const std::string& name, const json& shape) {
  json c = {{"model_type", "qwen3_moe"},
            {"rms_norm_eps", 1e-6},
            {"rope_theta", 1000000.0},
            {"max_position_embeddings", 4096},
            {"norm_topk_prob", true},
            {"tie_word_embeddings", false},
            {"quantization_config", {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {32, 32}}}}};
  c.update(shape);
  const std::string dir = testing::scratch_path(name);
  std::filesystem::create_directories(dir);
  testing::write_text(dir + "/config.json", c.dump());
  return dir;
}

LoadOptions dummy_options() {
  LoadOptions options;
  options.format = LoadFormat::kDummy;
  options.seed = 7;
  options.show_progress = false;
  return options;
}

// Checks each weight against its spec and drops it, keeping only what it saw.
class CheckingSink final : public WeightSink {
 public:
  Status begin(const ModelConfig& config) override {
    specs_ = expected_weights(config);
    return Status::ok();
  }
  Status put(const WeightSpec& spec, Tensor tensor) override {
    EXPECT_EQ(spec.name, specs_.at(names_.size()).name);
    EXPECT_EQ(tensor.shape(), spec.shape) << spec.name;
    EXPECT_EQ(tensor.dtype(), DType::kF32) << spec.name;
    const float* v = tensor.data<float>();
    EXPECT_TRUE(std::all_of(v, v + tensor.numel(), [](float x) { return std::isfinite(x); })) << spec.name;
    names_.push_back(spec.name);
    largest_bytes_ = std::max(largest_bytes_, tensor.nbytes());
    total_bytes_ += tensor.nbytes();
    return Status::ok();
  }
  size_t num_weights() const { return specs_.size(); }
  const std::vector<std::string>& names() const { return names_; }
  size_t largest_bytes() const { return largest_bytes_; }
  size_t total_bytes() const { return total_bytes_; }

 private:
  std::vector<WeightSpec> specs_;
  std::vector<std::string> names_;
  size_t largest_bytes_ = 0;
  size_t total_bytes_ = 0;
};

TEST(WeightStreamingTest, DummyLoadHoldsAboutOneWeightOnTheHost) {
  // ~340 MB of fp32 weights, the embedding table and the head the largest (65 MB each).
  const std::string dir = write_moe_config("streaming_peak", {{"vocab_size", 32000},
                                                              {"hidden_size", 512},
                                                              {"intermediate_size", 1024},
                                                              {"num_hidden_layers", 4},
                                                              {"num_attention_heads", 8},
                                                              {"num_key_value_heads", 4},
                                                              {"head_dim", 64},
                                                              {"num_experts", 32},
                                                              {"num_experts_per_tok", 4},
                                                              {"moe_intermediate_size", 256}});
  CheckingSink sink;
  const size_t before = host_tensor_bytes();
  reset_host_tensor_peak();
  auto loaded = load_model(dir, dummy_options(), sink);
  const size_t peak = host_tensor_peak_bytes() - before;
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  RecordProperty("host_peak_bytes", std::to_string(peak));
  RecordProperty("largest_weight_bytes", std::to_string(sink.largest_bytes()));
  EXPECT_TRUE(loaded->weights.empty());
  EXPECT_EQ(sink.names().size(), sink.num_weights());
  // The bound means something only when the model is much larger than it.
  ASSERT_GT(sink.total_bytes(), 4 * sink.largest_bytes());
  EXPECT_LT(peak, 2 * sink.largest_bytes())
      << "peak " << peak << " B, largest weight " << sink.largest_bytes() << " B, model " << sink.total_bytes() << " B";
  EXPECT_LE(host_tensor_bytes(), before);  // nothing left behind
}

// The values of `t` as `dtype` rounds them, in fp32.
std::vector<float> values(const Tensor& t, DType dtype) {
  const Tensor f = cast_weight(cast_weight(t, dtype), DType::kF32);
  return std::vector<float>(f.data<float>(), f.data<float>() + f.numel());
}

// `field` holds `part` (as `dtype` rounds it) in `blocks` equal blocks, block b at block index b * stride + offset
// of the field: rows of a stacked matrix (one block), or each expert's gate or up half (stride 2).
void expect_holds(const Tensor& field, const Tensor& part, DType dtype, int64_t blocks, int64_t stride, int64_t offset,
                  const std::string& name) {
  ASSERT_TRUE(field.defined()) << name;
  const std::vector<float> f = values(field, DType::kF32), p = values(part, dtype);
  const auto block = static_cast<int64_t>(p.size()) / blocks;
  int64_t mismatches = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t i = 0; i < block; ++i)
      mismatches += f[static_cast<size_t>((b * stride + offset) * block + i)] != p[static_cast<size_t>(b * block + i)];
  }
  EXPECT_EQ(mismatches, 0) << name;
}

// Every field of `w` against the map load's weights, with matrices as `matrix_dtype` rounds them.
void expect_built_from(const ModelWeights& w, const ModelConfig& c, const std::map<std::string, Tensor>& map,
                       DType matrix_dtype) {
  const auto whole = [&](const Tensor& field, const std::string& name, bool matrix) {
    EXPECT_EQ(field.dtype(), matrix ? matrix_dtype : DType::kF32) << name;
    expect_holds(field, map.at(name), matrix ? matrix_dtype : DType::kF32, 1, 1, 0, name);
  };
  whole(w.embed_tokens, "model.embed_tokens.weight", true);
  whole(w.lm_head, "lm_head.weight", true);
  whole(w.final_norm, "model.norm.weight", false);
  const int64_t q = c.q_size(), kv = c.kv_size();
  for (int i = 0; i < c.num_layers; ++i) {
    const LayerWeights& l = w.layers[static_cast<size_t>(i)];
    const auto name = [i](const std::string& suffix) { return hf_layer_name(i, suffix); };
    whole(l.input_norm, name("input_layernorm.weight"), false);
    whole(l.post_attention_norm, name("post_attention_layernorm.weight"), false);
    whole(l.q_norm, name("self_attn.q_norm.weight"), false);
    whole(l.k_norm, name("self_attn.k_norm.weight"), false);
    whole(l.o_proj, name("self_attn.o_proj.weight"), true);
    // Row r of a projection is row (first + r) of the stack: offsets counted in rows of `hidden` elements.
    const int64_t qkv_rows = q + 2 * kv;
    ASSERT_EQ(l.qkv.shape(), (Shape{qkv_rows, c.hidden_size}));
    expect_holds(l.qkv, map.at(name("self_attn.q_proj.weight")), matrix_dtype, 1, 1, 0, name("q"));
    const Tensor qkv_as_kv_blocks = l.qkv.reshape({qkv_rows / kv, kv * c.hidden_size});
    expect_holds(qkv_as_kv_blocks, map.at(name("self_attn.k_proj.weight")), matrix_dtype, 1, 1, q / kv, name("k"));
    expect_holds(qkv_as_kv_blocks, map.at(name("self_attn.v_proj.weight")), matrix_dtype, 1, 1, q / kv + 1, name("v"));
    if (c.layers[static_cast<size_t>(i)].moe) {
      const int64_t experts = c.num_experts;
      whole(l.router, name("mlp.gate.weight"), true);
      whole(l.experts_down, name("mlp.experts.down_proj.weight"), true);
      ASSERT_EQ(l.experts_gate_up.shape(), (Shape{experts, 2 * c.moe_intermediate_size, c.hidden_size}));
      expect_holds(l.experts_gate_up, map.at(name("mlp.experts.gate_proj.weight")), matrix_dtype, experts, 2, 0,
                   name("experts gate"));
      expect_holds(l.experts_gate_up, map.at(name("mlp.experts.up_proj.weight")), matrix_dtype, experts, 2, 1,
                   name("experts up"));
      EXPECT_FALSE(l.gate_up.defined());
    } else {
      whole(l.down, name("mlp.down_proj.weight"), true);
      ASSERT_EQ(l.gate_up.shape(), (Shape{2 * c.intermediate_size, c.hidden_size}));
      expect_holds(l.gate_up, map.at(name("mlp.gate_proj.weight")), matrix_dtype, 1, 2, 0, name("gate"));
      expect_holds(l.gate_up, map.at(name("mlp.up_proj.weight")), matrix_dtype, 1, 2, 1, name("up"));
      EXPECT_FALSE(l.experts_gate_up.defined());
    }
  }
}

TEST(WeightStreamingTest, StreamedWeightsAreTheMapLoadsInTheForwardsLayout) {
  // Layer 1 dense (mlp_only_layers): both the experts' and the dense MLP's stacking.
  const std::string dir = write_moe_config("streaming_equal", {{"vocab_size", 96},
                                                               {"hidden_size", 64},
                                                               {"intermediate_size", 96},
                                                               {"num_hidden_layers", 2},
                                                               {"num_attention_heads", 4},
                                                               {"num_key_value_heads", 2},
                                                               {"head_dim", 16},
                                                               {"num_experts", 8},
                                                               {"num_experts_per_tok", 3},
                                                               {"moe_intermediate_size", 32},
                                                               {"mlp_only_layers", {1}}});
  auto map_load = load_model(dir, dummy_options());
  ASSERT_TRUE(map_load.is_ok()) << map_load.status().to_string();
  for (const DType matrix_dtype : {DType::kF32, DType::kBF16}) {
    ModelWeightsBuilder builder(Device::kCpu, matrix_dtype);
    auto streamed = load_model(dir, dummy_options(), builder);
    ASSERT_TRUE(streamed.is_ok()) << streamed.status().to_string();
    auto weights = builder.finish();
    ASSERT_TRUE(weights.is_ok()) << weights.status().to_string();
    expect_built_from(*weights, streamed->config, map_load->weights, matrix_dtype);
  }
  // The FP8 round trip is in what both loads streamed: a quantized weight differs from its dummy values.
  const Tensor& q = map_load->weights.at("model.layers.0.self_attn.q_proj.weight");
  const Tensor raw = dummy_tensor("model.layers.0.self_attn.q_proj.weight", q.shape(), DummyFill::kNormal, 7);
  EXPECT_NE(values(q, DType::kF32), values(raw, DType::kF32));
}

TEST(WeightStreamingTest, BuilderNamesWhatIsWrong) {
  const std::string dir = write_moe_config("streaming_errors", {{"vocab_size", 96},
                                                                {"hidden_size", 64},
                                                                {"intermediate_size", 96},
                                                                {"num_hidden_layers", 1},
                                                                {"num_attention_heads", 4},
                                                                {"num_key_value_heads", 2},
                                                                {"head_dim", 16},
                                                                {"num_experts", 4},
                                                                {"num_experts_per_tok", 2},
                                                                {"moe_intermediate_size", 32}});
  auto loaded = load_model(dir, dummy_options());
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  ModelWeightsBuilder builder(Device::kCpu, DType::kF32);
  ASSERT_TRUE(builder.begin(loaded->config).is_ok());
  const Tensor& q = loaded->weights.at("model.layers.0.self_attn.q_proj.weight");
  EXPECT_NE(builder.place("model.layers.0.mlp.gate_proj.weight", q).message().find("mlp.gate_proj"), std::string::npos);
  EXPECT_NE(builder.place("model.layers.0.self_attn.k_proj.weight", q).message().find("k_proj"), std::string::npos);
  EXPECT_TRUE(builder.place("model.layers.0.self_attn.q_proj.weight", q).is_ok());
  EXPECT_NE(builder.place("model.layers.0.self_attn.q_proj.weight", q).message().find("twice"), std::string::npos);
  auto partial = builder.finish();
  ASSERT_FALSE(partial.is_ok());
  EXPECT_NE(partial.status().message().find("model.embed_tokens.weight"), std::string::npos);
}

// The weights a load of `dir` builds on the CPU, FP8 experts kept as stored or dequantized, and the model's logits
// for a prompt of 9 tokens and one decode step.
struct BuiltModel {
  ModelWeights weights;
  std::vector<float> logits;
};
BuiltModel build_and_run(const std::string& dir, const LoadOptions& options, bool keep_fp8) {
  ModelWeightsBuilder builder(Device::kCpu, DType::kF32);
  builder.keep_fp8_experts(keep_fp8);
  auto loaded = load_model(dir, options, builder);
  SE_CHECK(loaded.is_ok(), "{}", loaded.status().to_string());
  auto weights = builder.finish();
  SE_CHECK(weights.is_ok(), "{}", weights.status().to_string());
  BuiltModel built{*weights, {}};
  auto model = Model::from_weights(loaded->config, std::move(weights).value(), Device::kCpu);
  SE_CHECK(model.is_ok(), "{}", model.status().to_string());
  ContiguousKvCache cache(model->config(), 1);
  ForwardWorkspace ws = model->make_workspace();
  ForwardBatch prompt;
  for (int i = 0; i < 9; ++i) {
    prompt.token_ids.push_back((i * 37 + 11) % 96);
    prompt.positions.push_back(i);
  }
  prompt.sequences.push_back({0, 0, 9, 0});
  prompt.logit_rows.push_back(8);
  ForwardBatch decode;
  decode.token_ids.push_back(42);
  decode.positions.push_back(9);
  decode.sequences.push_back({0, 0, 1, 0});
  decode.logit_rows.push_back(0);
  for (const ForwardBatch* batch : {&prompt, &decode}) {
    const Tensor logits = model->forward(*batch, cache, ws).clone();
    built.logits.insert(built.logits.end(), logits.data<float>(), logits.data<float>() + logits.numel());
  }
  return built;
}

TEST(WeightStreamingTest, Fp8ExpertsKeptAsStoredGiveTheDequantizedModelsLogits) {
  const json shape = {
      {"vocab_size", 96},         {"hidden_size", 64},          {"intermediate_size", 96}, {"num_hidden_layers", 2},
      {"num_attention_heads", 4}, {"num_key_value_heads", 2},   {"head_dim", 16},          {"num_experts", 4},
      {"num_experts_per_tok", 2}, {"moe_intermediate_size", 64}};
  const std::string dir = write_moe_config("streaming_fp8_kept", shape);
  const BuiltModel dequantized = build_and_run(dir, dummy_options(), false);
  const BuiltModel kept = build_and_run(dir, dummy_options(), true);
  const LayerWeights& l = kept.weights.layers[0];
  EXPECT_EQ(l.experts_gate_up.dtype(), DType::kU8);
  EXPECT_EQ(l.experts_gate_up_scale.shape(), (Shape{4, 2 * 64 / 32, 64 / 32}));  // blocks of 32 x 32
  EXPECT_EQ(l.experts_down.dtype(), DType::kU8);
  EXPECT_EQ(l.experts_down_scale.shape(), (Shape{4, 64 / 32, 64 / 32}));
  EXPECT_EQ(dequantized.weights.layers[0].experts_gate_up.dtype(), DType::kF32);
  EXPECT_FALSE(dequantized.weights.layers[0].experts_gate_up_scale.defined());
  EXPECT_EQ(kept.logits, dequantized.logits);

  // The same from a checkpoint storing each expert's projections as F8_E4M3 with their scales (the other weights
  // in fp32): the loader hands the kept experts' codes over as stored.
  auto map_load = load_model(dir, dummy_options());
  ASSERT_TRUE(map_load.is_ok()) << map_load.status().to_string();
  const Fp8BlockQuantization q{32, 32, {}};
  std::map<std::string, Tensor> tensors;
  std::set<std::string> fp8_names;
  for (const WeightSpec& spec : expected_weights(map_load->config)) {
    const Tensor& w = map_load->weights.at(spec.name);
    if (spec.hf_parts.empty()) {
      tensors[spec.name] = w;
      continue;
    }
    const int64_t part_numel = w.numel() / w.dim(0);
    for (size_t e = 0; e < spec.hf_parts.size(); ++e) {
      Tensor part = Tensor::empty(DType::kF32, {w.dim(1), w.dim(2)});
      std::memcpy(part.raw(), w.data<float>() + static_cast<int64_t>(e) * part_numel, part.nbytes());
      Fp8BlockWeight stored = quantize_fp8_blocks(part, q);
      tensors[spec.hf_parts[e]] = stored.codes;
      tensors[fp8_scale_name(spec.hf_parts[e])] = stored.scale_inv;
      fp8_names.insert(spec.hf_parts[e]);
    }
  }
  testing::write_bytes(dir + "/model.safetensors", testing::safetensors_bytes(tensors, fp8_names));
  LoadOptions hf;
  hf.format = LoadFormat::kHf;
  hf.show_progress = false;
  const BuiltModel hf_dequantized = build_and_run(dir, hf, false);
  const BuiltModel hf_kept = build_and_run(dir, hf, true);
  EXPECT_EQ(hf_kept.weights.layers[1].experts_down.dtype(), DType::kU8);
  EXPECT_EQ(hf_kept.logits, hf_dequantized.logits);
}

}  // namespace
}  // namespace se
