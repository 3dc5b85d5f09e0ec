#include "sparse/sparse_controller.h"

namespace se {

void SparseController::prepare_step(const ForwardBatch& batch) {
  StepContext ctx{batch, cache_};
  method_.prepare_step(ctx);
}

void SparseController::finish_step(const ForwardBatch& batch) {
  StepContext ctx{batch, cache_};
  method_.finish_step(ctx);
}

void SparseController::attend(int layer, const LayerConfig& layer_config, const ForwardBatch& batch, TensorView q,
                              TensorView k, TensorView v, TensorView out, const AttentionParams& params) {
  const AttentionView dense = cache_.build_view(layer, batch);
  write_kv(dense, k, v);
  LayerContext ctx{layer, layer_config, batch, q, k, v, out, dense, params, cache_};
  selection_.reset(dense.num_seqs, dense.num_kv_heads, method_.selection_unit());
  for (int32_t i = 0; i < dense.num_seqs; ++i) {
    if (batch.sequences[static_cast<size_t>(i)].is_decode(batch.positions)) {
      method_.build_decode_selection(ctx, i, selection_);
    } else {
      method_.build_prefill_selection(ctx, i, selection_);
    }
  }
  paged_attention(out, q, selection_.apply(dense), params);
  method_.on_attention_end(ctx);
}

void SparseController::on_layer_end(int layer, const ForwardBatch& batch, TensorView hidden) {
  method_.on_layer_end(layer, batch, hidden);
}

void SparseController::close(int32_t seq) {
  method_.on_sequence_end(seq);
  cache_.close(seq);
}

}  // namespace se
