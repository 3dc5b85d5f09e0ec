// Test tool: runs one prompt (token ids) through a mixture-of-experts model on the CPU reference path, the first
// half as one prefill and the rest one decode step at a time, and reports every position's logits (raw float32
// [tokens, vocab] to LOGITS_FILE) and, per MoE layer, the experts each position was routed to (JSON on stdout:
// {"experts": {"<layer>": [[e, ...] per position]}}).
// usage: moe_parity_tool MODEL LOAD_FORMAT TOKENS_JSON LOGITS_FILE   (LOAD_FORMAT as --load-format takes it)
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/contiguous_kv_cache.h"
#include "model/model.h"
#include "model/model_loader.h"

namespace {

// The reference KV cache, plus a record of the routing the MoE layers report.
class RecordingHooks final : public se::ForwardHooks {
 public:
  explicit RecordingHooks(const se::ModelConfig& config) : cache_(config, 1) {}

  void attend(int layer, const se::LayerConfig& layer_config, const se::ForwardBatch& batch, se::TensorView q,
              se::TensorView k, se::TensorView v, se::TensorView out, const se::AttentionParams& params) override {
    cache_.attend(layer, layer_config, batch, q, k, v, out, params);
  }
  void on_expert_choice(int layer, const se::ForwardBatch& batch, se::TensorView experts) override {
    const auto* ids = static_cast<const int32_t*>(experts.data);
    const int64_t k = experts.shape[1];
    for (int64_t row = 0; row < experts.shape[0]; ++row)
      experts_[layer].push_back(std::vector<int32_t>(ids + row * k, ids + (row + 1) * k));
  }
  const std::map<int, std::vector<std::vector<int32_t>>>& experts() const { return experts_; }

 private:
  se::ContiguousKvCache cache_;
  std::map<int, std::vector<std::vector<int32_t>>> experts_;  // layer -> per position
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s MODEL LOAD_FORMAT TOKENS_JSON LOGITS_FILE\n", argv[0]);
    return 2;
  }
  se::LoadOptions options;
  options.show_progress = false;
  auto format = se::parse_load_format(argv[2]);
  if (!format.is_ok()) {
    std::fprintf(stderr, "%s\n", format.status().to_string().c_str());
    return 2;
  }
  options.format = *format;
  auto loaded = se::load_model(argv[1], options);
  if (!loaded.is_ok()) {
    std::fprintf(stderr, "%s\n", loaded.status().to_string().c_str());
    return 1;
  }
  auto model = se::Model::create(loaded->config, loaded->weights);
  if (!model.is_ok()) {
    std::fprintf(stderr, "%s\n", model.status().to_string().c_str());
    return 1;
  }
  std::ifstream in(argv[3]);
  const std::vector<int32_t> tokens = nlohmann::json::parse(in).get<std::vector<int32_t>>();
  const auto n = static_cast<int32_t>(tokens.size());
  RecordingHooks hooks(model->config());
  se::ForwardWorkspace workspace = model->make_workspace();
  std::ofstream logits_out(argv[4], std::ios::binary);

  const int32_t prefill = std::max(1, n / 2);
  int32_t begin = 0;
  while (begin < n) {
    const int32_t count = begin == 0 ? prefill : 1;
    se::ForwardBatch batch;
    batch.token_ids.assign(tokens.begin() + begin, tokens.begin() + begin + count);
    for (int32_t i = 0; i < count; ++i) {
      batch.positions.push_back(begin + i);
      batch.logit_rows.push_back(i);
    }
    batch.sequences = {{0, 0, count}};
    const se::Tensor logits = model->forward(batch, hooks, workspace);
    logits_out.write(static_cast<const char*>(logits.raw()), static_cast<std::streamsize>(logits.nbytes()));
    begin += count;
  }
  nlohmann::json experts = nlohmann::json::object();
  for (const auto& [layer, rows] : hooks.experts()) experts[std::to_string(layer)] = rows;
  std::cout << nlohmann::json{{"experts", experts}}.dump() << "\n";
  return 0;
}
