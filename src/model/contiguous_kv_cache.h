// ContiguousKvCache: the reference KV store. Each sequence (its id `seq`, 0 .. num_seqs - 1) keeps, per layer, its
// keys and values as one growing contiguous array [num_tokens, Hkv, D] plus their positions, and attention runs
// over all of them.
// This is the ground truth paged and sparse caches are compared against. Single-threaded use.
#pragma once

#include <vector>

#include "model/forward_hooks.h"

namespace se {

class ContiguousKvCache final : public ForwardHooks {
 public:
  ContiguousKvCache(const ModelConfig& config, int num_seqs);

  void attend(int layer, const LayerConfig& layer_config, const ForwardBatch& batch, TensorView q,
              TensorView k, TensorView v, TensorView out, const AttentionParams& params) override;

  // Number of cached tokens of sequence `seq` (equal across layers after a full forward).
  int num_tokens(int seq) const;
  // Drops everything sequence `seq` holds.
  void clear(int seq);
  // Drops the tokens of sequence `seq` from `num_tokens` on (for re-running a suffix).
  void truncate(int seq, int num_tokens);

 private:
  struct LayerStore {
    std::vector<float> k;  // [n, Hkv, D]
    std::vector<float> v;  // [n, Hkv, D]
    std::vector<int32_t> positions;  // [n]
  };
  LayerStore& store(int seq, int layer) {
    return stores_[static_cast<size_t>(seq) * static_cast<size_t>(num_layers_) + static_cast<size_t>(layer)];
  }

  int num_layers_;
  int kv_row_;  // Hkv * D
  int num_kv_heads_;
  int head_dim_;
  std::vector<LayerStore> stores_;  // [seq][layer]
};

}  // namespace se
