// method_model_tool MODEL REQUEST.json OUT.json: runs sparse methods on a real model (CPU reference path, fp32)
// and reports which original prompt positions every (layer, KV head) stream keeps after the method compressed the
// prompt. The external-reference comparison (tools/kvpress_compare.py, docs/fidelity.md) reads it; so does
// test_method_model_tool.py.
//
// Per run: the method is built (registry, MethodEnvironment from the request), the prompt is prefilled as ONE
// chunk through the SparseController (prepare_step, the model's forward, finish_step, on_computed: the engine's
// order), with the controller as the model's hooks behind a thin wrapper that records every layer's post-RoPE
// keys of the prompt. Transient passes (kvzip's context reconstruction) run the same model through the same
// wrapper, not recorded. After finish_step each stream's stored key rows are matched to the recorded rows
// (exact fp32 bytes), which names the original position of every kept token.
//
// REQUEST: {"page_size": 16 (optional), "prompts": [[token ids]],
//           "runs": [{"method": name, "config": {...}, "prompt": index into prompts}],
//           optional "encode": {text: [ids]} (the tokenizer methods see; absent = none), "chat_suffix": str}
// OUT: {"model": {"num_layers", "num_heads", "num_kv_heads", "head_dim", "vocab_size"},
//       "prompt_logits": [per prompt: last-row logits of its first run's prefill (the forward is dense)],
//       "runs": [{"method", "config" (resolved), "prompt", "num_tokens",
//                 "kept": [layer][kv_head] original positions, ascending,
//                 "resident_pages": pages held after the step, "reported_pages": the method's resident_pages}]}
// Exits non-zero with a message on any error (bad request, method config, unmatched key row).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "base/check.h"
#include "model/model_loader.h"
#include "model/model.h"
#include "sparse/method_registry.h"
#include "sparse/sparse_controller.h"

namespace se {
namespace {

// The model's hooks: forwards everything to the controller and, while `recording`, copies each layer's new
// post-RoPE keys (k [T, Hkv, D] F32) of the prompt. Single thread.
class KeyRecorder final : public ForwardHooks {
 public:
  KeyRecorder(SparseController& controller, int num_layers)
      : controller_(controller), keys_(static_cast<size_t>(num_layers)) {}

  bool recording = false;

  void begin_forward(const ForwardBatch& batch) override { controller_.begin_forward(batch); }
  void attend(int layer, const LayerConfig& layer_config, const ForwardBatch& batch, TensorView q, TensorView k,
              TensorView v, TensorView out, const AttentionParams& params) override {
    if (recording) {
      const float* src = static_cast<const float*>(k.data);
      keys_[static_cast<size_t>(layer)].assign(src, src + k.shape[0] * k.shape[1] * k.shape[2]);
    }
    controller_.attend(layer, layer_config, batch, q, k, v, out, params);
  }
  void on_layer_end(int layer, const ForwardBatch& batch, TensorView hidden) override {
    controller_.on_layer_end(layer, batch, hidden);
  }

  // [T, Hkv, D] keys of layer `layer` recorded during the prompt's forward.
  const std::vector<float>& keys(int layer) const { return keys_[static_cast<size_t>(layer)]; }

 private:
  SparseController& controller_;
  std::vector<std::vector<float>> keys_;
};

MethodEnvironment environment_of(const nlohmann::json& request) {
  MethodEnvironment environment;
  if (request.contains("encode")) {
    const nlohmann::json vocab = request["encode"];
    environment.encode = [vocab](std::string_view text) {
      auto it = vocab.find(std::string(text));
      SE_CHECK(it != vocab.end(), "the request's \"encode\" has no entry for {}", nlohmann::json(text).dump());
      return it->get<std::vector<int32_t>>();
    };
  }
  environment.chat_suffix = request.value("chat_suffix", std::string("\n"));
  return environment;
}

struct RunResult {
  nlohmann::json json;
  std::vector<float> logits;  // [vocab] of the prompt's last row
};

Result<RunResult> run_one(const Model& model, const nlohmann::json& run, const std::vector<int32_t>& prompt,
                          int page_size, const MethodEnvironment& environment) {
  const ModelConfig& mc = model.config();
  const auto num_tokens = static_cast<int32_t>(prompt.size());
  if (num_tokens < 1) return invalid_argument("empty prompt");
  SE_ASSIGN_OR_RETURN(std::unique_ptr<MethodRuntime> method,
                      create_method(run.at("method").get<std::string>(),
                                    run.value("config", nlohmann::json::object()), environment));
  KvLayout layout;
  layout.num_layers = mc.num_layers;
  layout.num_kv_heads = mc.num_kv_heads;
  layout.head_dim = mc.head_dim;
  layout.page_size = page_size;
  layout.dtype = DType::kF32;
  SE_RETURN_IF_ERROR(layout.validate());
  // Room for the prompt, any transient pass on top of it and a spare page per stream.
  const int64_t num_pages =
      std::max(layout.pages_for_tokens(int64_t{num_tokens} + method->transient_extra_tokens(num_tokens) + 1),
               method->peak_pages(layout, num_tokens, 1)) +
      layout.num_streams();
  SE_ASSIGN_OR_RETURN(std::unique_ptr<CacheManager> cache,
                      method->create_cache(CacheSpec{layout, static_cast<int32_t>(num_pages), cpu_allocator(),
                                                     /*enable_prefix_caching=*/false}));
  SparseController controller(*method, *cache);
  KeyRecorder recorder(controller, mc.num_layers);
  ForwardWorkspace workspace = model.make_workspace();
  controller.set_pass_forward([&](const ForwardBatch& batch) { (void)model.forward(batch, recorder, workspace); });

  constexpr int32_t kSeq = 0;
  SE_ASSIGN_OR_RETURN(const int32_t num_cached, controller.open(kSeq, prompt));
  SE_CHECK(num_cached == 0, "prefix cache is off, yet {} tokens were cached", num_cached);
  SE_RETURN_IF_ERROR(cache->reserve(kSeq, num_tokens));
  ForwardBatch batch;
  batch.token_ids = prompt;
  for (int32_t i = 0; i < num_tokens; ++i) batch.positions.push_back(i);
  batch.sequences = {{kSeq, 0, num_tokens, num_tokens}};
  batch.logit_rows = {num_tokens - 1};
  controller.prepare_step(batch);
  recorder.recording = true;
  const Tensor logits = model.forward(batch, recorder, workspace);
  recorder.recording = false;
  controller.finish_step(batch);
  cache->on_computed(kSeq, prompt, num_tokens);

  // Each stored key row -> its original position (exact bytes; every row of a stream is matched once).
  nlohmann::json kept = nlohmann::json::array();
  const int64_t row_floats = mc.head_dim;
  const size_t row_bytes = static_cast<size_t>(row_floats) * sizeof(float);
  for (int layer = 0; layer < mc.num_layers; ++layer) {
    const std::vector<float>& keys = recorder.keys(layer);
    SE_CHECK(static_cast<int64_t>(keys.size()) == int64_t{num_tokens} * mc.num_kv_heads * row_floats,
             "layer {}: recorded {} key floats", layer, keys.size());
    const AttentionView view = cache->build_sequence_view(kSeq, layer);
    nlohmann::json heads = nlohmann::json::array();
    for (int h = 0; h < mc.num_kv_heads; ++h) {
      std::unordered_map<std::string, std::vector<int32_t>> rows;  // key bytes -> positions (descending)
      for (int32_t t = num_tokens - 1; t >= 0; --t) {
        const float* row = keys.data() + (int64_t{t} * mc.num_kv_heads + h) * row_floats;
        rows[std::string(reinterpret_cast<const char*>(row), row_bytes)].push_back(t);
      }
      const int32_t* pages = view.seqs[0].page_ids + static_cast<int64_t>(h) * view.seqs[0].stride;
      std::vector<int32_t> positions;
      for (int32_t j = 0; j < view.seqs[0].num_tokens[h]; ++j) {
        const float* stored = view.element<float>(pages[j / view.page_size], 0, j % view.page_size);
        auto it = rows.find(std::string(reinterpret_cast<const char*>(stored), row_bytes));
        if (it == rows.end() || it->second.empty())
          return data_loss("layer {} head {}: stored key row {} matches no prompt key", layer, h, j);
        positions.push_back(it->second.back());
        it->second.pop_back();
      }
      if (!std::is_sorted(positions.begin(), positions.end()))
        return data_loss("layer {} head {}: kept rows are not in prompt order", layer, h);
      heads.push_back(positions);
    }
    kept.push_back(heads);
  }
  RunResult result;
  result.json = {{"method", run.at("method")},
                 {"config", method->config()},
                 {"prompt", run.at("prompt")},
                 {"num_tokens", num_tokens},
                 {"kept", kept},
                 {"resident_pages", cache->num_held_pages(kSeq)},
                 {"reported_pages", method->resident_pages(layout, num_tokens, num_tokens)}};
  const float* row = logits.data<float>();
  result.logits.assign(row, row + logits.dim(1));
  controller.close(kSeq);
  SE_RETURN_IF_ERROR(cache->check_integrity());
  return result;
}

int run(const std::string& model_path, const std::string& request_path, const std::string& out_path) {
  std::ifstream request_in(request_path);
  if (!request_in) {
    std::fprintf(stderr, "cannot read %s\n", request_path.c_str());
    return 2;
  }
  const nlohmann::json request = nlohmann::json::parse(request_in);
  auto loaded = load_model(model_path);
  if (!loaded.is_ok()) {
    std::fprintf(stderr, "%s\n", loaded.status().to_string().c_str());
    return 1;
  }
  auto model = Model::create(loaded->config, loaded->weights);
  if (!model.is_ok()) {
    std::fprintf(stderr, "%s\n", model.status().to_string().c_str());
    return 1;
  }
  loaded->weights.clear();
  const ModelConfig& mc = model->config();
  const MethodEnvironment environment = environment_of(request);
  const int page_size = request.value("page_size", 16);
  const auto prompts = request.at("prompts").get<std::vector<std::vector<int32_t>>>();

  nlohmann::json runs = nlohmann::json::array();
  std::vector<nlohmann::json> prompt_logits(prompts.size(), nullptr);
  for (const nlohmann::json& run : request.at("runs")) {
    const auto index = run.at("prompt").get<size_t>();
    if (index >= prompts.size()) {
      std::fprintf(stderr, "run %s: prompt %zu of %zu\n", run.dump().c_str(), index, prompts.size());
      return 2;
    }
    auto result = run_one(*model, run, prompts[index], page_size, environment);
    if (!result.is_ok()) {
      std::fprintf(stderr, "run %s: %s\n", run.dump().c_str(), result.status().to_string().c_str());
      return 1;
    }
    if (prompt_logits[index].is_null()) prompt_logits[index] = result->logits;
    runs.push_back(std::move(result->json));
  }
  const nlohmann::json out = {{"model",
                               {{"num_layers", mc.num_layers},
                                {"num_heads", mc.num_heads},
                                {"num_kv_heads", mc.num_kv_heads},
                                {"head_dim", mc.head_dim},
                                {"vocab_size", mc.vocab_size}}},
                              {"prompt_logits", prompt_logits},
                              {"runs", runs}};
  std::ofstream(out_path) << out.dump();
  return 0;
}

}  // namespace
}  // namespace se

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s MODEL REQUEST.json OUT.json\n", argv[0]);
    return 2;
  }
  return se::run(argv[1], argv[2], argv[3]);
}
