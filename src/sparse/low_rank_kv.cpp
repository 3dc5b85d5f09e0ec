#include "sparse/low_rank_kv.h"

#include <algorithm>
#include <cmath>

#include "backend/device_memory.h"
#include "model/model.h"
#include "sparse/thin_svd.h"

namespace se {

namespace {

// Rows [first_row, first_row + rows) of the weight w [*, cols] factored to `rank`: up [rows, rank] = U sqrt(S),
// down (rank rows of `cols`, written at down_rows) = sqrt(S) V^T.
void factor_rows(const float* w, int32_t first_row, int32_t rows, int32_t cols, int32_t rank, float* up,
                 float* down_rows) {
  const std::vector<double> a(w + static_cast<int64_t>(first_row) * cols,
                              w + static_cast<int64_t>(first_row + rows) * cols);
  const ThinSvd svd = thin_svd(a, rows, cols);
  for (int32_t j = 0; j < rank; ++j) {
    const double root = std::sqrt(svd.sigma[static_cast<size_t>(j)]);
    for (int32_t i = 0; i < rows; ++i)
      up[static_cast<int64_t>(i) * rank + j] = static_cast<float>(svd.u[static_cast<size_t>(i) * svd.k + j] * root);
    for (int32_t c = 0; c < cols; ++c)
      down_rows[static_cast<int64_t>(j) * cols + c] =
          static_cast<float>(root * svd.vt[static_cast<size_t>(j) * cols + c]);
  }
}

}  // namespace

int32_t low_rank_group_heads(int32_t num_kv_heads, int32_t group_size) {
  for (int32_t g = std::min(group_size, num_kv_heads); g > 1; --g)
    if (num_kv_heads % g == 0) return g;
  return 1;
}

Result<LowRankKv> LowRankKv::decompose(const Model& model, LowRankKvShape shape) {
  const ModelConfig& c = model.config();
  if (model.device() != Device::kCpu)
    return unimplemented("low-rank KV: the projections are factored on the CPU only (the model is on {})",
                         device_name(model.device()));
  if (c.latent_attention())
    return unimplemented("low-rank KV: this model's KV is already a latent (multi-head latent attention)");
  const int32_t group_dim = shape.group_heads * c.head_dim;
  if (shape.group_heads < 1 || c.num_kv_heads % shape.group_heads != 0)
    return invalid_argument("low-rank KV: a group of {} KV heads does not divide the model's {}", shape.group_heads,
                            c.num_kv_heads);
  const int32_t max_rank = std::min(group_dim, c.hidden_size);
  for (const int32_t rank : {shape.k_rank, shape.v_rank})
    if (rank < 1 || rank > max_rank)
      return invalid_argument("low-rank KV: rank {} is outside [1, {}] (a group of {} heads of {} over hidden {})",
                              rank, max_rank, shape.group_heads, c.head_dim, c.hidden_size);
  LowRankKv lr;
  lr.shape_ = shape;
  lr.num_groups_ = c.num_kv_heads / shape.group_heads;
  const int32_t groups = lr.num_groups_, width = lr.row_width(), hidden = c.hidden_size;
  lr.layers_.resize(static_cast<size_t>(c.num_layers));
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = model.weights().layers[static_cast<size_t>(l)];
    SE_CHECK(w.qkv.dtype() == DType::kF32, "low-rank KV: CPU weights are f32, got {}", dtype_name(w.qkv.dtype()));
    Layer& layer = lr.layers_[static_cast<size_t>(l)];
    layer.down = Tensor::empty(DType::kF32, {int64_t{groups} * width, hidden});
    layer.up_k = Tensor::empty(DType::kF32, {groups, group_dim, shape.k_rank});
    layer.up_v = Tensor::empty(DType::kF32, {groups, group_dim, shape.v_rank});
    const float* qkv = w.qkv.data<float>();
    for (int32_t g = 0; g < groups; ++g) {
      float* down = layer.down.data<float>() + static_cast<int64_t>(g) * width * hidden;
      factor_rows(qkv, c.q_size() + g * group_dim, group_dim, hidden, shape.k_rank,
                  layer.up_k.data<float>() + static_cast<int64_t>(g) * group_dim * shape.k_rank, down);
      factor_rows(qkv, c.q_size() + c.kv_size() + g * group_dim, group_dim, hidden, shape.v_rank,
                  layer.up_v.data<float>() + static_cast<int64_t>(g) * group_dim * shape.v_rank,
                  down + static_cast<int64_t>(shape.k_rank) * hidden);
    }
    LatentKvView& v = layer.view;
    v.up_k = layer.up_k.data<float>();
    v.up_v = layer.up_v.data<float>();
    if (w.qkv_bias.defined()) {
      v.k_bias = w.qkv_bias.data<float>() + c.q_size();
      v.v_bias = w.qkv_bias.data<float>() + c.q_size() + c.kv_size();
    }
    if (c.qk_norm) v.k_norm = w.k_norm.data<float>();
    v.norm_eps = c.rms_norm_eps;
    v.k_rank = shape.k_rank;
    v.v_rank = shape.v_rank;
    v.group_heads = shape.group_heads;
    v.kv_head_dim = c.head_dim;
  }
  return lr;
}

KvLayout LowRankKv::store_layout(KvLayout layout) const {
  layout.store = KvStoreKind::kLowRankLatent;
  layout.num_kv_heads = num_groups_;
  layout.head_dim = row_width();
  return layout;
}

}  // namespace se
