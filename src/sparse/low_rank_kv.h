// LowRankKv: a group-head low-rank decomposition of a model's key and value projections, the factors a
// kLowRankLatent store (attention_view.h) is written and read with. Per layer, the KV heads are cut into groups of
// `group_heads` consecutive heads; each group's stacked W_k rows [group_heads * D, hidden] are factored by a plain
// SVD, W = U S V^T truncated to k_rank, into L = U sqrt(S) (up_k) and R = sqrt(S) V^T (the down-projection); W_v
// alike with v_rank. A token's latent is h = R x (what the store keeps), its key L h + b_k (what attention
// rebuilds). Immutable once built; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/attention_view.h"
#include "base/status.h"
#include "kv/kv_layout.h"
#include "tensor/tensor.h"

namespace se {

class Model;

struct LowRankKvShape {
  int32_t group_heads = 0;  // KV heads per group, a divisor of the model's KV heads
  int32_t k_rank = 0;       // latent values per token and group for the keys
  int32_t v_rank = 0;       // and for the values
};

class LowRankKv {
 public:
  // Factors every layer of `model` (fp32 weights on the CPU; the model must outlive the result, whose views point at
  // its k/v biases and k_norm). Errors: kUnimplemented for a model on another device or whose KV is already a latent
  // (MLA); kInvalidArgument when group_heads does not divide the KV heads or a rank is outside [1, group_heads * D].
  static Result<LowRankKv> decompose(const Model& model, LowRankKvShape shape);

  const LowRankKvShape& shape() const { return shape_; }
  int32_t num_groups() const { return num_groups_; }
  // Values one token keeps per group: its key latent, then its value latent.
  int32_t row_width() const { return shape_.k_rank + shape_.v_rank; }
  // Layer `layer`'s down-projection [num_groups * row_width, hidden]: group g's key rows, then its value rows, so
  // x [T, hidden] times its transpose is the store's rows [T, num_groups, row_width].
  TensorView down(int layer) const { return layers_[static_cast<size_t>(layer)].down.view(); }
  // What attention reads besides the pages for layer `layer`.
  LatentKvView view(int layer) const { return layers_[static_cast<size_t>(layer)].view; }
  // `layout` (the model's layers, page size and device dtype) turned into this store's: one stream per (layer,
  // group), row_width values per token.
  KvLayout store_layout(KvLayout layout) const;

 private:
  struct Layer {
    Tensor down;  // [num_groups * row_width, hidden]
    Tensor up_k;  // [num_groups, group_heads * D, k_rank]
    Tensor up_v;  // [num_groups, group_heads * D, v_rank]
    LatentKvView view;
  };

  LowRankKvShape shape_;
  int32_t num_groups_ = 0;
  std::vector<Layer> layers_;
};

// The largest divisor of num_kv_heads that is at most `group_size`: the group a model whose KV heads are not a
// multiple of `group_size` takes.
int32_t low_rank_group_heads(int32_t num_kv_heads, int32_t group_size);

}  // namespace se
