// Test tool: runs prompts (token ids) through the model on the CPU reference path and reports, per prompt, the
// last-position logits (raw float32, appended to LOGITS_FILE) and a greedy continuation (JSON on stdout).
// usage: model_logits_tool MODEL REQUEST_JSON LOGITS_FILE   with REQUEST_JSON {"prompts": [[ids]], "continue": N}
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "model/model_loader.h"
#include "model/contiguous_kv_cache.h"
#include "model/model.h"

namespace {

int32_t argmax_row(const se::Tensor& logits) {
  const float* row = logits.data<float>();
  return static_cast<int32_t>(std::max_element(row, row + logits.dim(1)) - row);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s MODEL REQUEST_JSON LOGITS_FILE\n", argv[0]);
    return 2;
  }
  auto loaded = se::load_model(argv[1]);
  if (!loaded.is_ok()) {
    std::fprintf(stderr, "%s\n", loaded.status().to_string().c_str());
    return 1;
  }
  auto model = se::Model::create(loaded->config, loaded->weights);
  if (!model.is_ok()) {
    std::fprintf(stderr, "%s\n", model.status().to_string().c_str());
    return 1;
  }
  loaded->weights.clear();
  std::ifstream in(argv[2]);
  const nlohmann::json request = nlohmann::json::parse(in);
  const int num_continue = request.at("continue").get<int>();
  std::ofstream logits_out(argv[3], std::ios::binary);
  nlohmann::json continuations = nlohmann::json::array();

  for (const auto& prompt : request.at("prompts")) {
    se::ContiguousKvCache cache(model->config(), 1);
    se::ForwardWorkspace workspace = model->make_workspace();
    se::ForwardBatch batch;
    batch.token_ids = prompt.get<std::vector<int32_t>>();
    const int32_t n = batch.num_tokens();
    for (int32_t i = 0; i < n; ++i) batch.positions.push_back(i);
    batch.sequences = {{0, 0, n}};
    batch.logit_rows = {n - 1};
    se::Tensor logits = model->forward(batch, cache, workspace);
    logits_out.write(static_cast<const char*>(logits.raw()), static_cast<std::streamsize>(logits.nbytes()));

    std::vector<int32_t> generated;
    int32_t position = n;
    for (int step = 0; step < num_continue; ++step) {
      const int32_t token = argmax_row(logits);
      generated.push_back(token);
      batch.token_ids = {token};
      batch.positions = {position++};
      batch.sequences = {{0, 0, 1}};
      batch.logit_rows = {0};
      logits = model->forward(batch, cache, workspace);
    }
    continuations.push_back(generated);
  }
  std::cout << nlohmann::json{{"continuations", continuations}}.dump() << "\n";
  return 0;
}
