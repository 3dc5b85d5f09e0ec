#include "model/model.h"

#include "backend/device_memory.h"
#include "base/check.h"
#include "model/arch/arch_registry.h"
#include "model/weights_builder.h"

namespace se {

namespace {

Status check_device(const ModelConfig& config, Device device) {
  if (device != Device::kCpu && config.latent_attention())
    return unimplemented("multi-head latent attention has no {} kernels yet; run this model with --device cpu",
                         device_name(device));
  return Status::ok();
}

}  // namespace

Result<Model> Model::create(const ModelConfig& config, const std::map<std::string, Tensor>& tensors, Device device) {
  SE_RETURN_IF_ERROR(check_device(config, device));
  ModelWeightsBuilder builder(device, matrix_dtype(device));
  SE_RETURN_IF_ERROR(builder.begin(config));
  SE_RETURN_IF_ERROR(builder.put_all(tensors));
  SE_ASSIGN_OR_RETURN(ModelWeights weights, builder.finish());
  return Model(arch_of(config), config, std::move(weights), device);
}

Result<Model> Model::from_weights(const ModelConfig& config, ModelWeights weights, Device device) {
  SE_RETURN_IF_ERROR(check_device(config, device));
  return Model(arch_of(config), config, std::move(weights), device);
}

Model::Model(const ArchSpec& arch, ModelConfig config, ModelWeights weights, Device device)
    : arch_(&arch), config_(std::move(config)), weights_(std::move(weights)), device_(device) {}

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
  embedding(h, weights_.embed_tokens.view(), ws.token_ids(t));
  if (c.embedding_scale != 1.0f) scale_inplace(h, c.embedding_scale);
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const auto l = static_cast<size_t>(layer);
    arch_->block(BlockInputs{layer, c, c.layers[l], weights_.layers[l], batch, t, hooks, ws});
    hooks.on_layer_end(layer, batch, h);
  }

  Tensor logits = ws.logits(num_rows);
  if (num_rows == 0) return logits;
  // The sampled rows of the residual stream, gathered as an embedding lookup into h.
  const TensorView last = ws.last(num_rows);
  embedding(last, h, ws.logit_rows(num_rows));
  const TensorView last_normed = ws.last_normed(num_rows);
  rms_norm(last_normed, last, weights_.final_norm.view(), c.rms_norm_eps);
  linear(logits.view(), last_normed, weights_.lm_head.view());
  if (c.final_logit_softcap > 0.0f) softcap_inplace(logits.view(), c.final_logit_softcap);
  return logits;
}

}  // namespace se
