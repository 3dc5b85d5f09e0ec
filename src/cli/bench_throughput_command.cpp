// `sparse-engine bench throughput`: offline throughput through the serving engine, like `vllm bench
// throughput`: N requests of random prompts with a fixed number of output tokens (EOS ignored), at most
// --concurrency in flight at once, timed from the first submission to the last token.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "cli/bench_commands.h"
#include "cli/model_options.h"
#include "engine/engine.h"
#include "loader/progress_bar.h"

namespace se::cli {

namespace {

struct ThroughputOptions {
  ModelOptions model;
  EngineConfig engine;
  int num_prompts = 16;
  int input_len = 128;
  int output_len = 64;
  int concurrency = 0;  // 0 = all at once
  uint64_t seed = 0;
};

int run_throughput(const ThroughputOptions& o) {
  if (Status sparse = check_sparse_options(o.engine); !sparse.is_ok()) return report_usage_error(sparse);
  auto bundle = o.model.load(o.engine.device, o.engine.tensor_parallel_size);
  if (!bundle.is_ok()) return report_error(bundle.status());
  auto engine = Engine::create(*bundle, o.engine);
  if (!engine.is_ok()) return report_error(engine.status());
  std::mt19937_64 rng(o.seed);
  const int vocab = bundle->model->config().vocab_size;
  std::uniform_int_distribution<int32_t> token(100, std::min(vocab, 30000) - 1);
  SamplingParams params;
  params.temperature = 0.0f;
  params.ignore_eos = true;
  params.max_tokens = o.output_len;
  const int concurrency = o.concurrency > 0 ? o.concurrency : o.num_prompts;

  ProgressBar progress("requests", o.num_prompts, true);
  std::deque<std::shared_ptr<OutputStream>> in_flight;
  int submitted = 0, finished = 0;
  int64_t output_tokens = 0;
  const auto start = std::chrono::steady_clock::now();
  while (finished < o.num_prompts) {
    while (submitted < o.num_prompts && static_cast<int>(in_flight.size()) < concurrency) {
      std::vector<int32_t> prompt(static_cast<size_t>(o.input_len));
      for (int32_t& t : prompt) t = token(rng);
      auto stream = (*engine)->submit({"bench-" + std::to_string(submitted), std::move(prompt), params});
      if (!stream.is_ok()) return report_error(stream.status());
      in_flight.push_back(*stream);
      ++submitted;
    }
    // Drain the oldest stream to its end; others keep running in the engine meanwhile.
    std::shared_ptr<OutputStream> stream = in_flight.front();
    in_flight.pop_front();
    while (true) {
      auto out = stream->next(std::chrono::milliseconds(600000));
      if (!out) return report_error(internal_error("a request stalled for 10 minutes"));
      if (!out->finished) continue;
      if (out->finish_reason == FinishReason::kError) return report_error(internal_error("{}", out->error));
      output_tokens += out->num_output_tokens;
      break;
    }
    ++finished;
    progress.advance();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  progress.finish();
  const EngineStats stats = (*engine)->stats();
  std::printf("bench throughput: %s, %d requests x (%d prompt + %d output tokens), concurrency %d, sparse method %s\n",
              bundle->name.c_str(), o.num_prompts, o.input_len, o.output_len, concurrency,
              o.engine.sparse_method.c_str());
  std::printf("| requests/s | output tok/s | total tok/s | elapsed s | preemptions |\n|---|---|---|---|---|\n");
  std::printf("| %.3f | %.1f | %.1f | %.2f | %llu |\n", o.num_prompts / seconds, output_tokens / seconds,
              (output_tokens + static_cast<double>(o.num_prompts) * o.input_len) / seconds, seconds,
              static_cast<unsigned long long>(stats.preemptions_total));
  return 0;
}

}  // namespace

void add_bench_throughput_command(CLI::App& bench, int& exit_code) {
  auto o = std::make_shared<ThroughputOptions>();
  CLI::App* cmd = bench.add_subcommand("throughput", "offline throughput of N requests through the engine");
  o->model.add_to(*cmd);
  add_engine_options(*cmd, o->engine);
  cmd->add_option("--num-prompts", o->num_prompts, "requests")->capture_default_str();
  cmd->add_option("--input-len", o->input_len, "prompt tokens per request (random ids)")->capture_default_str();
  cmd->add_option("--output-len", o->output_len, "output tokens per request (EOS ignored)")->capture_default_str();
  cmd->add_option("--concurrency", o->concurrency, "requests in flight at most (0 = all)")->capture_default_str();
  cmd->add_option("--seed", o->seed, "prompt seed")->capture_default_str();
  cmd->callback([o, &exit_code] { exit_code = run_throughput(*o); });
}

}  // namespace se::cli
