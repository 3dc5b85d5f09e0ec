// Tensor parallelism's sharding plan (Megatron's): each of `size` ranks holds a part of every layer and the ranks
// together compute the whole model. Attention splits by heads (q/k/v column-parallel, a whole number of query heads
// per rank; KV heads split the same way, or where there are fewer KV heads than ranks each rank keeps a copy of the
// one its query heads read); o_proj is row-parallel, its partial products summed by an all-reduce. The gated MLP
// splits its width (gate/up column-parallel, down row-parallel, all-reduce), and so does every expert of a
// mixture, whose router each rank runs whole (so every rank picks the same experts). The embedding table and the
// head split the vocabulary: each rank looks up the tokens it holds (an all-reduce joins them) and computes the
// logits of its rows (an all-gather joins them). Norms are whole on every rank. A rank's model is an ordinary Model
// over its shard_config, whose head, KV head and MLP counts are the rank's own, so the layers and the KV cache
// built from it see only the rank's part. Multi-head latent attention splits by heads too (q or q_b, kv_b
// column-parallel, o_proj row-parallel), while the latent's down projection is whole on every rank: each rank
// computes and keeps the whole shared latent, which its heads read. Pure; thread-safe.
#pragma once

#include "base/status.h"
#include "model/config.h"
#include "model/weight_spec.h"
#include "tensor/tensor.h"

namespace se {

// The config of rank layout.rank's part of `config`; errors name the count that `layout.size` does not divide
// (heads, KV heads, MLP or expert width).
Result<ModelConfig> shard_config(const ModelConfig& config, ShardLayout layout);

// Rank layout.rank's part of weight `spec` of `config` (the whole model's), as spec.split says: `tensor` itself
// when the weight is replicated or there is one rank, else a new host tensor of the same dtype. Preconditions:
// shard_config(config, layout) is ok; tensor is on the host, shaped spec.shape.
Tensor shard_weight(const ModelConfig& config, ShardLayout layout, const WeightSpec& spec, const Tensor& tensor);

// The first KV head of `num_kv_heads` that rank `layout.rank` holds (it holds max(1, num_kv_heads / size)).
int first_kv_head(int num_kv_heads, ShardLayout layout);

}  // namespace se
