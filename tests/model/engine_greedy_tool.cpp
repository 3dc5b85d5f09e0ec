// Test tool: greedy generation of one prompt (token ids) through the serving engine on the CPU (paged KV cache,
// the scheduler's chunked prefill, the chosen sparse method), printing the output ids as JSON ({"tokens": [...]})
// on stdout; errors on stderr with exit status 1.
// usage: engine_greedy_tool MODEL LOAD_FORMAT TOKENS_JSON MAX_TOKENS MAX_BATCHED_TOKENS PAGE_SIZE [METHOD [CONFIG]]
//   MAX_BATCHED_TOKENS below the prompt's length splits its prefill into chunks; METHOD (default vanilla) and its
//   --sparse-config JSON CONFIG as the CLI takes them.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/model_bundle.h"

int main(int argc, char** argv) {
  if (argc < 7 || argc > 9) {
    std::fprintf(stderr,
                 "usage: %s MODEL LOAD_FORMAT TOKENS_JSON MAX_TOKENS MAX_BATCHED_TOKENS PAGE_SIZE [METHOD [CONFIG]]\n",
                 argv[0]);
    return 2;
  }
  const auto fail = [](const se::Status& status) {
    std::fprintf(stderr, "%s\n", status.to_string().c_str());
    return 1;
  };
  se::LoadOptions options;
  options.show_progress = false;
  auto format = se::parse_load_format(argv[2]);
  if (!format.is_ok()) return fail(format.status());
  options.format = *format;
  auto bundle = se::ModelBundle::load(argv[1], options);
  if (!bundle.is_ok()) return fail(bundle.status());
  se::EngineConfig config;
  config.max_num_batched_tokens = std::stoi(argv[5]);
  config.page_size = std::stoi(argv[6]);
  config.kv_cache_memory = int64_t{64} << 20;
  if (argc > 7) config.sparse_method = argv[7];
  if (argc > 8) config.sparse_config = nlohmann::json::parse(argv[8]);
  auto engine = se::Engine::create(*bundle, config);
  if (!engine.is_ok()) return fail(engine.status());

  std::ifstream in(argv[3]);
  se::SamplingParams sampling;
  sampling.temperature = 0.0f;
  sampling.max_tokens = std::stoi(argv[4]);
  sampling.ignore_eos = true;
  auto stream = (*engine)->submit({"greedy", nlohmann::json::parse(in).get<std::vector<int32_t>>(), sampling});
  if (!stream.is_ok()) return fail(stream.status());
  std::vector<int32_t> tokens;
  while (true) {
    auto out = (*stream)->next(std::chrono::milliseconds(120000));
    if (!out) return fail(se::internal_error("the engine produced nothing for 120 s"));
    if (!out->error.empty()) return fail(se::internal_error("{}", out->error));
    for (const se::TokenOutput& t : out->tokens) tokens.push_back(t.token_id);
    if (out->finished) break;
  }
  (*engine)->shutdown(/*drain=*/true);
  std::cout << nlohmann::json{{"tokens", tokens}}.dump() << "\n";
  return 0;
}
