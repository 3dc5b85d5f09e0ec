#include "model/model.h"

#include <algorithm>

#include "backend/device_memory.h"
#include "base/check.h"
#include "model/arch/arch_registry.h"
#include "model/sharding_sink.h"
#include "model/tensor_parallel.h"
#include "model/weight_spec.h"
#include "model/weights_builder.h"

namespace se {

Result<Model> Model::create(const ModelConfig& config, const std::map<std::string, Tensor>& tensors, Device device,
                            Communicator& comm) {
  const ShardLayout layout{comm.rank(), comm.size()};
  SE_ASSIGN_OR_RETURN(ModelConfig shard, shard_config(config, layout));
  ModelWeightsBuilder builder(device, matrix_dtype(device));
  if (layout.size == 1) {
    SE_RETURN_IF_ERROR(builder.begin(config));
    SE_RETURN_IF_ERROR(builder.put_all(tensors));
  } else {
    ShardingSink sink(layout.size);
    sink.add_rank(layout.rank, builder);
    SE_RETURN_IF_ERROR(sink.begin(config));
    for (const WeightSpec& spec : expected_weights(config)) {
      if (auto it = tensors.find(spec.name); it != tensors.end()) SE_RETURN_IF_ERROR(sink.put(spec, it->second));
    }
  }
  SE_ASSIGN_OR_RETURN(ModelWeights weights, builder.finish());
  return Model(arch_of(config), std::move(shard), std::move(weights), device, comm);
}

Result<Model> Model::from_weights(const ModelConfig& config, ModelWeights weights, Device device, Communicator& comm) {
  if (config.shard.rank != comm.rank() || config.shard.size != comm.size()) {
    return invalid_argument("weights of tensor-parallel rank {} of {} on a communicator of rank {} of {}",
                            config.shard.rank, config.shard.size, comm.rank(), comm.size());
  }
  return Model(arch_of(config), config, std::move(weights), device, comm);
}

Model::Model(const ArchSpec& arch, ModelConfig config, ModelWeights weights, Device device, Communicator& comm)
    : arch_(&arch), config_(std::move(config)), weights_(std::move(weights)), device_(device), comm_(&comm) {}

Tensor Model::forward(const ForwardBatch& batch, ForwardHooks& hooks, ForwardWorkspace& ws) const {
  prepare_forward(batch, hooks, ws);
  return launch_forward(batch, hooks, ws);
}

void Model::prepare_forward(const ForwardBatch& batch, ForwardHooks& hooks, ForwardWorkspace& ws) const {
  const int64_t t = batch.num_tokens();
  SE_CHECK(t > 0 && static_cast<int64_t>(batch.positions.size()) == t, "forward: {} tokens, {} positions", t,
           batch.positions.size());
  for (int32_t row : batch.logit_rows) SE_CHECK(row >= 0 && row < t, "logit row {} of {}", row, t);
  SE_CHECK(ws.device() == device_, "forward: a {} workspace for a {} model", device_name(ws.device()),
           device_name(device_));
  ws.upload_inputs(batch);
  hooks.begin_forward(batch);
}

Tensor Model::launch_forward(const ForwardBatch& batch, ForwardHooks& hooks, const ForwardWorkspace& ws) const {
  const ModelConfig& c = config_;
  const int64_t t = batch.num_tokens();
  const auto num_rows = static_cast<int64_t>(batch.logit_rows.size());
  const TensorView h = ws.hidden(t);
  embed(h, ws.token_ids(t));
  if (c.embedding_scale != 1.0f) scale_inplace(h, c.embedding_scale);
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const auto l = static_cast<size_t>(layer);
    arch_->block(BlockInputs{layer, c, c.layers[l], weights_.layers[l], batch, t, hooks, ws, *comm_});
    hooks.on_layer_end(layer, batch, h);
  }

  Tensor logits = ws.logits(num_rows);
  if (num_rows == 0) return logits;
  // The sampled rows of the residual stream, gathered as an embedding lookup into h.
  const TensorView last = ws.last(num_rows);
  embedding(last, h, ws.logit_rows(num_rows));
  const TensorView last_normed = ws.last_normed(num_rows);
  rms_norm(last_normed, last, weights_.final_norm.view(), c.rms_norm_eps);
  project_logits(logits.view(), last_normed, ws);
  if (c.final_logit_softcap > 0.0f) softcap_inplace(logits.view(), c.final_logit_softcap);
  return logits;
}

void Model::embed(TensorView h, TensorView ids) const {
  if (comm_->size() == 1) {
    embedding(h, weights_.embed_tokens.view(), ids);
    return;
  }
  vocab_shard_embedding(h, weights_.embed_tokens.view(), ids, int64_t{comm_->rank()} * config_.vocab_shard_rows());
  comm_->all_reduce_sum(h);
}

void Model::project_logits(TensorView logits, TensorView x, const ForwardWorkspace& ws) const {
  if (comm_->size() == 1) {
    linear(logits, x, weights_.lm_head.view());
    return;
  }
  const int64_t rows = x.shape[0], part = config_.vocab_shard_rows(), vocab = config_.vocab_size;
  const TensorView gathered = ws.vocab_shard_logits(rows);  // [ranks, rows, part]
  TensorView own = gathered;
  own.data = gathered.ptr<float>() + comm_->rank() * rows * part;
  own.shape = {rows, part};
  linear(own, x, weights_.lm_head.view());
  comm_->all_gather(gathered, own);
  // Rank k's block holds columns [k * part, (k + 1) * part) of every row; the last block's padding is dropped.
  for (int k = 0; k < comm_->size(); ++k) {
    const int64_t width = std::min(part, vocab - k * part);
    if (width <= 0) break;
    const auto bytes = [](int64_t n) { return static_cast<size_t>(n) * sizeof(float); };
    copy_rows_async(device_, logits.ptr<float>() + k * part, bytes(vocab), gathered.ptr<float>() + k * rows * part,
                    bytes(part), bytes(width), static_cast<size_t>(rows));
  }
}

}  // namespace se
