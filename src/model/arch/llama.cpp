// Llama 2/3.x and SmolLM2: pre-norm blocks, SwiGLU MLP, RoPE (optionally llama3- or linearly scaled).
#include "model/arch/llama.h"

#include <array>
#include <cstring>

#include "base/check.h"
#include "model/arch/arch_registry.h"
#include "model/hf_config.h"
#include "model/layers/attention.h"
#include "model/layers/gated_mlp.h"

namespace se {

void pre_norm_block(const BlockInputs& in, SublayerAddFn mlp_add, SublayerAddFn attention_add) {
  const float eps = in.config.rms_norm_eps;
  const TensorView h = in.ws.hidden(in.t);
  const TensorView x = in.ws.normed(in.t);
  rms_norm(x, h, in.weights.input_norm.view(), eps);
  attention_add(in, h, x);
  rms_norm(x, h, in.weights.post_attention_norm.view(), eps);
  mlp_add(in, h, x);
}

void llama_block(const BlockInputs& in) { pre_norm_block(in, &gated_mlp_add); }

void llama_layer_weights(const ModelConfig& config, int layer, std::vector<WeightSpec>& specs) {
  append_attention_weights(config, layer, specs);
  append_layer_norm(config, layer, "post_attention_layernorm.weight", "ffn_norm.weight", specs);
  append_gated_mlp_weights(config, layer, specs);
}

Status llama_finish_hf(nlohmann::json& hf, const std::string& source) { return require_silu(hf, source); }

namespace {

// Moves rows within each head: row `from(r)` of a head in `t` becomes row r of the result.
template <typename RowMap>
Tensor regroup_rows(const Tensor& t, int64_t num_heads, RowMap from) {
  SE_CHECK(t.rank() >= 1 && num_heads > 0 && t.dim(0) % (2 * num_heads) == 0, "Q/K rows {} for {} heads",
           t.shape().to_string(), num_heads);
  const int64_t rows = t.dim(0);
  const int64_t head_dim = rows / num_heads;
  const size_t row_bytes = t.nbytes() / static_cast<size_t>(rows);
  Tensor out = Tensor::empty(t.dtype(), t.shape());
  const auto* src = static_cast<const uint8_t*>(t.raw());
  auto* dst = static_cast<uint8_t*>(out.raw());
  for (int64_t h = 0; h < num_heads; ++h) {
    for (int64_t r = 0; r < head_dim; ++r) {
      const int64_t s = from(r, head_dim / 2);
      std::memcpy(dst + (h * head_dim + r) * row_bytes, src + (h * head_dim + s) * row_bytes, row_bytes);
    }
  }
  return out;
}

}  // namespace

Tensor unpermute_qk_rows(const Tensor& t, int64_t num_heads) {
  // HF row r = j*half + i sits at GGUF row 2i + j.
  return regroup_rows(t, num_heads, [](int64_t r, int64_t half) { return 2 * (r % half) + r / half; });
}

Tensor permute_qk_rows(const Tensor& t, int64_t num_heads) {
  // GGUF row r = 2i + j comes from HF row j*half + i.
  return regroup_rows(t, num_heads, [](int64_t r, int64_t half) { return (r % 2) * half + r / 2; });
}

namespace {
constexpr std::array<std::string_view, 1> kModelTypes = {"llama"};

Status configure(const nlohmann::json&, ModelConfig&) { return Status::ok(); }

// llama.cpp's converter interleaves the rotary halves of each Q and K head (LlamaModel.permute); undo it.
Tensor from_gguf_tensor(const ModelConfig& config, const WeightSpec& spec, Tensor t) {
  if (spec.gguf_name.find(".attn_q.") != std::string::npos) return unpermute_qk_rows(t, config.num_heads);
  if (spec.gguf_name.find(".attn_k.") != std::string::npos) return unpermute_qk_rows(t, config.num_kv_heads);
  return t;
}
}  // namespace

const ArchSpec kLlamaArch{.name = "llama",
                          .model_types = kModelTypes,
                          .hf_architecture = "LlamaForCausalLM",
                          .gguf_architecture = "llama",
                          .prepare_hf = nullptr,
                          .finish_hf = &llama_finish_hf,
                          .from_gguf_metadata = nullptr,
                          .configure = &configure,
                          .layer_weights = &llama_layer_weights,
                          .from_gguf_tensor = &from_gguf_tensor,
                          .from_hf_tensor = nullptr,
                          .block = &llama_block};

}  // namespace se
