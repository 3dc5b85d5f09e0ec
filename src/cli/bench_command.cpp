// `sparse-engine bench`: benchmarks that print tables (never tests). `bench generate` measures single-stream
// prompt processing and decode on the reference path, side by side with llama.cpp (llama-cpp-python) in the
// same run, on the F32 copy of the weights and on the original GGUF.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_commands.h"
#include "cli/bench_replay_command.h"
#include "cli/bench_serve_command.h"
#include "cli/commands.h"
#include "cli/model_options.h"
#include "cli/model_resolver.h"
#include "cli/peer_runner.h"
#include "cli/sampling_options.h"
#include "engine/sequence_generator.h"

namespace se::cli {

namespace {

struct BenchGenerateOptions {
  ModelOptions model;
  int prompt_len = 256;
  int gen_len = 64;
  int repeats = 3;
  bool with_llama_cpp = true;
};

struct Rates {
  double prompt_tok_s = 0;
  double decode_tok_s = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<int32_t> random_prompt(int n, int vocab) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> dist(100, std::min(vocab, 30000) - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = dist(rng);
  return ids;
}

Result<Rates> bench_ours(const ModelBundle& bundle, const std::vector<int32_t>& prompt, const BenchGenerateOptions& o) {
  SequenceGenerator generator(*bundle.model, nullptr);
  SamplingParams params;
  params.temperature = 0.0f;
  params.ignore_eos = true;
  params.max_tokens = o.gen_len;
  SE_RETURN_IF_ERROR(generator.generate({prompt.begin(), prompt.begin() + std::min<size_t>(16, prompt.size())}, params)
                         .status());  // warm-up
  std::vector<double> prompt_rates, decode_rates;
  for (int r = 0; r < o.repeats; ++r) {
    SE_ASSIGN_OR_RETURN(GenerationResult g, generator.generate(prompt, params));
    prompt_rates.push_back(static_cast<double>(prompt.size()) / g.prefill_seconds);
    decode_rates.push_back(static_cast<double>(g.output_ids.size() - 1) / g.decode_seconds);
  }
  return Rates{median(prompt_rates), median(decode_rates)};
}

int run_bench_generate(const BenchGenerateOptions& o) {
  auto path = resolve_model_path(o.model.model);
  if (!path.is_ok()) return report_error(path.status());
  auto bundle = o.model.load();
  if (!bundle.is_ok()) return report_error(bundle.status());
  const std::vector<int32_t> prompt = random_prompt(o.prompt_len, bundle->model->config().vocab_size);
  auto ours = bench_ours(*bundle, prompt, o);
  if (!ours.is_ok()) return report_error(ours.status());

  std::printf("bench generate: %s, prompt %d tokens, %d generated tokens, median of %d runs\n",
              bundle->name.c_str(), o.prompt_len, o.gen_len, o.repeats);
  std::printf("| engine | weights | prompt tok/s | decode tok/s |\n|---|---|---|---|\n");
  std::printf("| sparse-engine (CPU) | F32 (dequantized at load) | %.1f | %.2f |\n", ours->prompt_tok_s,
              ours->decode_tok_s);
  if (!o.with_llama_cpp || bundle->source_format != "gguf") return 0;
  PeerRunner peer;
  auto f32 = peer.f32_copy(*path);
  if (!f32.is_ok()) return report_error(f32.status());
  for (const auto& [label, file] : {std::pair<std::string, std::string>{"F32", *f32}, {"original", *path}}) {
    auto rates = peer.run_json("bench_llama_cpp.py", {"--model", file, "--prompt-len", std::to_string(o.prompt_len),
                                                      "--gen-len", std::to_string(o.gen_len), "--repeats",
                                                      std::to_string(o.repeats)});
    if (!rates.is_ok()) return report_error(rates.status());
    std::printf("| llama.cpp (llama-cpp-python) | %s | %.1f | %.2f |\n", label.c_str(),
                rates->at("prompt_tok_s").get<double>(), rates->at("decode_tok_s").get<double>());
    if (label == "F32")
      std::printf("decode ratio ours / llama.cpp on F32 weights: %.2fx\n",
                  ours->decode_tok_s / rates->at("decode_tok_s").get<double>());
  }
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code) {
  CLI::App* bench = app.add_subcommand("bench", "benchmarks (tables, not tests)");
  bench->require_subcommand(1);
  add_bench_generate_command(*bench, exit_code);
  add_bench_throughput_command(*bench, exit_code);
  add_bench_decode_command(*bench, exit_code);
  add_bench_serve_command(*bench, exit_code);
  add_bench_replay_command(*bench, exit_code);
}

void add_bench_generate_command(CLI::App& bench, int& exit_code) {
  auto o = std::make_shared<BenchGenerateOptions>();
  CLI::App* gen = bench.add_subcommand("generate", "single-stream prompt and decode tokens/s vs llama.cpp");
  o->model.add_to(*gen);
  gen->add_option("--prompt-len", o->prompt_len, "prompt tokens (random ids)")->capture_default_str();
  gen->add_option("--gen-len", o->gen_len, "generated tokens (EOS ignored)")->capture_default_str();
  gen->add_option("--repeats", o->repeats, "timed runs; the median is reported")->capture_default_str();
  gen->add_flag("!--no-llama-cpp", o->with_llama_cpp, "skip the llama.cpp side");
  gen->callback([o, &exit_code] { exit_code = run_bench_generate(*o); });
}

}  // namespace se::cli
