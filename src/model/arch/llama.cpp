// Llama 2/3.x and SmolLM2: pre-norm blocks, SwiGLU MLP, RoPE (optionally llama3- or linearly scaled).
#include "model/arch/llama.h"

#include <array>

#include "model/arch/arch_registry.h"
#include "model/layers/attention.h"
#include "model/layers/gated_mlp.h"

namespace se {

void llama_block(const BlockInputs& in) {
  const float eps = in.config.rms_norm_eps;
  const TensorView h = in.ws.hidden(in.t);
  const TensorView x = in.ws.normed(in.t);
  rms_norm(x, h, in.weights.input_norm.view(), eps);
  attention_add(in, h, x);
  rms_norm(x, h, in.weights.post_attention_norm.view(), eps);
  gated_mlp_add(in, h, x);
}

namespace {
constexpr std::array<std::string_view, 1> kModelTypes = {"llama"};
Status configure(const nlohmann::json&, ModelConfig&) { return Status::ok(); }
}  // namespace

const ArchSpec kLlamaArch{"llama", kModelTypes, &configure, &llama_block};

}  // namespace se
