// Llama's parts that the architectures keeping its shape (Qwen2, Qwen3, Qwen3-MoE) share: its decoder block,
// its HF config checks, its layer weights, and the Q/K row order llama.cpp's converter gives its GGUF files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/config.h"
#include "model/layers/attention.h"
#include "model/layers/block_inputs.h"
#include "model/weight_spec.h"
#include "tensor/tensor.h"

namespace se {

// Pre-norm block: h += attention_add(norm(h)); h += mlp_add(norm(h)), each residual add fused into its last GEMM.
// A sublayer adds its output of the normed input x to the residual stream h.
using SublayerAddFn = void (*)(const BlockInputs& in, TensorView h, TensorView x);
void pre_norm_block(const BlockInputs& in, SublayerAddFn mlp_add, SublayerAddFn attention_add = &se::attention_add);
// The pre-norm block with the dense gated MLP.
void llama_block(const BlockInputs& in);

// The input norm, attention, post-attention norm (llama.cpp's ffn_norm) and dense gated MLP of `layer`.
void llama_layer_weights(const ModelConfig& config, int layer, std::vector<WeightSpec>& specs);

// A SwiGLU config: hidden_act silu.
Status llama_finish_hf(nlohmann::json& hf, const std::string& source);

// Undoes convert_hf_to_gguf.py's LlamaModel.permute on the rows of a Q or K projection (weight [out, in] or bias
// [out]) with `num_heads` heads (the KV head count for K). The converter regroups each head's rows from HF's
// rotate-half order (first half, second half) into interleaved pairs: GGUF row 2i+j of a head holds HF row
// j*(head_dim/2)+i. Returns a new tensor. Precondition: out is a multiple of 2 * num_heads.
Tensor unpermute_qk_rows(const Tensor& t, int64_t num_heads);
// The inverse of unpermute_qk_rows (what the converter does), for tests and tools.
Tensor permute_qk_rows(const Tensor& t, int64_t num_heads);

}  // namespace se
