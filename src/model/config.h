// ModelConfig: the typed description of a decoder-only model, built from a normalized HF-style config.json
// (hf_config.h; gguf_model.h writes one from GGUF metadata): the common fields here, the architecture's own by its
// registry entry (model/arch/). Plain data; immutable after load.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "backend/ops.h"
#include "base/status.h"

namespace se {

struct LayerConfig {
  bool sliding = false;  // sliding-window attention (window = ModelConfig::sliding_window)
  bool moe = false;      // the MLP is the mixture of experts (ModelConfig::num_experts), not the dense one
  RopeParams rope;
};

// Tensor parallelism: a model split over `size` ranks, of which this is `rank` (model/tensor_parallel.h).
struct ShardLayout {
  int rank = 0;
  int size = 1;
};

struct ModelConfig {
  std::string arch;        // registry name (ArchSpec::name)
  std::string model_type;  // as written in config.json
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  int sliding_window = 0;
  std::vector<LayerConfig> layers;

  float attention_scale = 1.0f;       // multiplies q.k
  float attn_logit_softcap = 0.0f;    // 0 = off
  float final_logit_softcap = 0.0f;   // 0 = off
  float embedding_scale = 1.0f;       // Gemma multiplies embeddings by sqrt(hidden_size)
  Activation activation = Activation::kSilu;
  bool attention_bias = false;        // Qwen2: q/k/v projections carry biases
  bool qk_norm = false;               // Qwen3, Gemma 3: RMSNorm over each head of q and k before RoPE
  bool sandwich_norm = false;         // Gemma 3: extra norms after attention and after the MLP
  bool tie_word_embeddings = false;

  // Mixture of experts: each MoE layer routes a token to num_experts_per_tok of num_experts gated MLPs of width
  // moe_intermediate_size (0 experts: a dense model).
  int num_experts = 0;
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  bool norm_topk_prob = false;              // renormalize the chosen experts' router probabilities to sum to 1
  float routed_scaling_factor = 1.0f;       // multiplies the chosen experts' weights when they are not renormalized
  int shared_expert_intermediate_size = 0;  // width of the MLP every token runs besides its experts (0: none)

  // Multi-head latent attention (DeepSeek-V2; kv_lora_rank 0: none). Keys and values come from one latent of
  // kv_lora_rank per token (expanded per head by kv_b) plus a RoPE key of qk_rope_head_dim shared by the heads;
  // queries from q_lora_rank (0: a single q projection). head_dim is qk_nope_head_dim + qk_rope_head_dim, each
  // head's q and k laid out [rope ; nope]; each head's value fills the first v_head_dim of its head_dim.
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;

  // The rank this config describes. With size > 1 the head, KV head and MLP widths above are the rank's part
  // (shard_config); vocab_size stays the whole vocabulary, of which the rank holds vocab_shard_rows().
  ShardLayout shard;
  // Ranks that hold each of the rank's KV heads: more than 1 where the model has fewer KV heads than ranks, and each
  // copy then serves only part of the head's query group.
  int kv_head_copies = 1;

  int bos_token_id = -1;
  std::vector<int> eos_token_ids;

  int q_size() const { return num_heads * head_dim; }
  int kv_size() const { return num_kv_heads * head_dim; }
  bool latent_attention() const { return kv_lora_rank > 0; }
  // Rows of the embedding table and head on each rank: the vocabulary in equal parts, the last padded.
  int vocab_shard_rows() const { return (vocab_size + shard.size - 1) / shard.size; }
};

// Normalizes an HF-style config.json through the architecture registry; errors name the offending key.
Result<ModelConfig> parse_model_config(const nlohmann::json& config);

}  // namespace se
