// Test tool for logits parity with HF transformers on the device: greedy continuations of token-id prompts through
// the GPU engine (bf16 weights, paged KV, CUDA graphs as served), with the top-N logprobs of every generated step.
// usage: engine_logprobs_tool MODEL_DIR REQUEST_JSON OUT_JSON
//   REQUEST_JSON {"prompts": [[ids]], "max_tokens": N, "logprobs": K}
//   OUT_JSON gets [{"tokens": [ids], "top": [[[id, logprob] x K] per step]}], one entry per prompt, in order.
#include <chrono>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/model_bundle.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s MODEL_DIR REQUEST_JSON OUT_JSON\n", argv[0]);
    return 2;
  }
  se::LoadOptions options;
  options.dtype = se::DType::kBF16;
  auto bundle = se::ModelBundle::load(argv[1], options, se::Device::kCuda);
  if (!bundle.is_ok()) {
    std::fprintf(stderr, "%s\n", bundle.status().to_string().c_str());
    return 1;
  }
  const nlohmann::json request = nlohmann::json::parse(std::ifstream(argv[2]));
  se::EngineConfig config;
  config.device = se::Device::kCuda;
  config.max_model_len = 4096;
  config.gpu_memory_utilization = 0.5;
  auto engine = se::Engine::create(*bundle, config);
  if (!engine.is_ok()) {
    std::fprintf(stderr, "%s\n", engine.status().to_string().c_str());
    return 1;
  }
  // One at a time: each prompt's continuation is the batch-1 decode path.
  nlohmann::json results = nlohmann::json::array();
  int index = 0;
  for (const auto& prompt : request.at("prompts")) {
    se::GenerationRequest r;
    r.request_id = "p" + std::to_string(index++);
    r.prompt_ids = prompt.get<std::vector<int32_t>>();
    r.params.temperature = 0.0f;
    r.params.max_tokens = request.at("max_tokens").get<int>();
    r.params.logprobs = request.at("logprobs").get<int>();
    r.params.ignore_eos = true;
    auto stream = (*engine)->submit(std::move(r));
    if (!stream.is_ok()) {
      std::fprintf(stderr, "%s\n", stream.status().to_string().c_str());
      return 1;
    }
    nlohmann::json tokens = nlohmann::json::array(), top = nlohmann::json::array();
    for (bool finished = false; !finished;) {
      const std::optional<se::RequestOutput> out = (*stream)->next(std::chrono::milliseconds(60000));
      if (!out) {
        std::fprintf(stderr, "no output for a minute\n");
        return 1;
      }
      if (out->finish_reason == se::FinishReason::kError) {
        std::fprintf(stderr, "%s\n", out->error.c_str());
        return 1;
      }
      for (const se::TokenOutput& t : out->tokens) {
        tokens.push_back(t.token_id);
        nlohmann::json step = nlohmann::json::array();
        for (const se::TokenLogprob& alt : t.top) step.push_back({alt.token_id, alt.logprob});
        top.push_back(step);
      }
      finished = out->finished;
    }
    results.push_back({{"tokens", tokens}, {"top", top}});
  }
  std::ofstream(argv[3]) << results.dump() << "\n";
  return 0;
}
