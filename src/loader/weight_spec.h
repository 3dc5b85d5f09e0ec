// The canonical (HF-style) weight set of each architecture: names, shapes, and what each weight is,
// plus the GGUF name of each. Every loader (GGUF, safetensors, dummy) produces exactly this set.
// Pure; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "loader/hf_config.h"
#include "tensor/shape.h"

namespace se {

enum class WeightKind {
  kEmbedding,  // [vocab, hidden]
  kLinear,     // [out, in], row-major: y = x W^T
  kBias,       // [out]
  kNorm,  // [dim]; the multiplier applied after normalization (Gemma's 1 + w already folded in)
};

struct WeightSpec {
  std::string name;  // e.g. "model.layers.3.self_attn.q_proj.weight"
  Shape shape;
  WeightKind kind;
};

// Every weight of the model described by `dims`, in a stable order (embedding, layer by layer,
// final norm, head). lm_head.weight is absent when the embeddings are tied.
std::vector<WeightSpec> expected_weights(const ModelDims& dims);

// The llama.cpp (GGUF) tensor name of an HF weight name for `arch`, e.g.
// "model.layers.3.mlp.up_proj.weight" -> "blk.3.ffn_up.weight"; "" when it has none.
std::string gguf_tensor_name(const std::string& hf_name, ModelArch arch);

}  // namespace se
