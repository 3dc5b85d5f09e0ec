// The canonical (HF-named) weight set of a model: names, shapes, what each weight is, and the GGUF name of each.
// Every load format (GGUF, safetensors, dummy) produces exactly this set. The common weights (embedding, final
// norm, head) are listed here; each architecture lists its layers' weights (model/arch/), from the building
// blocks below. Pure; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"
#include "tensor/shape.h"

namespace se {

enum class WeightKind {
  kEmbedding,  // [vocab, hidden]
  kLinear,     // [out, in], row-major: y = x W^T; [experts, out, in] for stacked experts
  kBias,       // [out]
  kNorm,       // [dim]; the multiplier applied after normalization (Gemma's 1 + w already folded in)
};

// How tensor parallelism splits a weight over its ranks (model/tensor_parallel.h): every rank keeps a whole
// copy, or one part of the dimension named, for a matrix [out, in] (or stacked experts [experts, out, in]; a bias
// [out] splits as its rows).
enum class WeightSplit {
  kReplicated,
  kVocab,    // rows [vocab, hidden]: the vocabulary in equal parts, the last padded with zero rows
  kOut,      // output rows in equal parts (column-parallel: q, gate, up; a whole number of heads each)
  kKvHeads,  // output rows by KV head, one head on several ranks when there are fewer heads than ranks (k, v)
  kIn,       // input columns in equal parts (row-parallel: o_proj, down; an all-reduce sums the products)
};

struct WeightSpec {
  std::string name;       // e.g. "model.layers.3.self_attn.q_proj.weight"
  std::string gguf_name;  // llama.cpp's name, e.g. "blk.3.attn_q.weight"
  Shape shape;
  WeightKind kind;
  // HF checkpoints that store this weight as one tensor per expert name them here, in expert order; the
  // canonical tensor stacks them along a new first dimension. Empty: stored under `name`.
  std::vector<std::string> hf_parts;
  WeightSplit split = WeightSplit::kReplicated;
};

// Every weight of the model described by `config`, in a stable order (embedding, layer by layer, final norm,
// head). lm_head.weight is absent when the embeddings are tied.
std::vector<WeightSpec> expected_weights(const ModelConfig& config);

// "model.layers.{layer}.{suffix}" and "blk.{layer}.{suffix}".
std::string hf_layer_name(int layer, std::string_view suffix);
std::string gguf_layer_name(int layer, std::string_view suffix);

// Building blocks of the architectures' layer lists. The input norm and the attention projections, with the
// q/k/v biases and q/k norms the config asks for:
void append_attention_weights(const ModelConfig& config, int layer, std::vector<WeightSpec>& specs);
// A [hidden] norm named `hf` / `gguf` after the layer prefixes.
void append_layer_norm(const ModelConfig& config, int layer, std::string_view hf, std::string_view gguf,
                       std::vector<WeightSpec>& specs);
// The dense gated MLP's gate, up and down projections.
void append_gated_mlp_weights(const ModelConfig& config, int layer, std::vector<WeightSpec>& specs);
// The mixture of experts: the router, each expert's projections (HF: one tensor per expert; GGUF: stacked) and
// the shared experts' when the config has them.
void append_moe_weights(const ModelConfig& config, int layer, std::vector<WeightSpec>& specs);

}  // namespace se
