// `sparse-engine bench throughput`: offline throughput through the serving engine, like `vllm bench
// throughput`: N requests of random prompts with a fixed number of output tokens (EOS ignored), at most
// --concurrency in flight at once (the next waits until one finishes), timed from the first submission to the last
// token. With a long output and one fixed pool (--kv-cache-memory) for every method it is the long-generation
// benchmark of decode-time compression: besides tokens/s over the whole run it reports the most KV pages in use at
// once, the pages the method's compressions returned to the pool, the preemptions (the pool ran short and the
// newest sequence recomputes later), and the steps that compressed with the share of the run their compression
// took (EngineStats; bench/long_generation_sweep.py sweeps methods and concurrencies). A --max-num-seqs given below
// --concurrency stays (the requests past it wait in the engine's queue, as in vLLM); unset, it follows --concurrency.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "backend/device_memory.h"
#include "cli/bench_commands.h"
#include "cli/bench_csv.h"
#include "base/logging.h"
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
  bool max_num_seqs_given = false;  // --max-num-seqs on the command line
  uint64_t seed = 0;
  std::string csv_path;
};

struct ThroughputRun {
  double seconds = 0;
  int64_t output_tokens = 0;
  EngineStats stats;  // at the end of the run
};

// Submits the requests, at most `concurrency` in flight, and collects every stream to its end. Each pass reads what
// every stream in flight has produced, so a request that finishes out of order (one preempted earlier finishes
// late) frees its place at once.
Result<ThroughputRun> run_requests(Engine& engine, const ThroughputOptions& o, int concurrency, int vocab) {
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> token(100, std::min(vocab, 30000) - 1);
  SamplingParams params;
  params.temperature = 0.0f;
  params.ignore_eos = true;
  params.max_tokens = o.output_len;

  ProgressBar progress("requests", o.num_prompts, true);
  std::vector<std::shared_ptr<OutputStream>> in_flight;
  int submitted = 0, finished = 0;
  ThroughputRun run;
  const auto start = std::chrono::steady_clock::now();
  auto last_progress = start;
  while (finished < o.num_prompts) {
    while (submitted < o.num_prompts && static_cast<int>(in_flight.size()) < concurrency) {
      std::vector<int32_t> prompt(static_cast<size_t>(o.input_len));
      for (int32_t& t : prompt) t = token(rng);
      SE_ASSIGN_OR_RETURN(std::shared_ptr<OutputStream> stream,
                          engine.submit({"bench-" + std::to_string(submitted), std::move(prompt), params}));
      in_flight.push_back(std::move(stream));
      ++submitted;
    }
    bool progressed = false;
    for (size_t i = 0; i < in_flight.size();) {
      bool done = false;
      while (std::optional<RequestOutput> out = in_flight[i]->next(std::chrono::milliseconds(0))) {
        progressed = true;
        if (!out->finished) continue;
        if (out->finish_reason == FinishReason::kError) return internal_error("{}", out->error);
        run.output_tokens += out->num_output_tokens;
        done = true;
        break;
      }
      if (!done) {
        ++i;
        continue;
      }
      in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(i));
      ++finished;
      progress.advance();
    }
    const auto now = std::chrono::steady_clock::now();
    if (progressed) {
      last_progress = now;
    } else if (now - last_progress > std::chrono::minutes(10)) {
      return internal_error("no request produced a token for 10 minutes");
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  progress.finish();
  // The engine publishes its stats after the step whose tokens the streams just delivered: wait for that snapshot.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  run.stats = engine.stats();
  while (run.stats.generation_tokens_total < static_cast<uint64_t>(run.output_tokens) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    run.stats = engine.stats();
  }
  // EOS is ignored: every request writes exactly --output-len tokens, however often it was preempted.
  if (run.output_tokens != int64_t{o.num_prompts} * o.output_len ||
      run.stats.generation_tokens_total != static_cast<uint64_t>(run.output_tokens))
    return internal_error("{} requests of {} tokens produced {} output tokens ({} counted by the engine)",
                          o.num_prompts, o.output_len, run.output_tokens, run.stats.generation_tokens_total);
  return run;
}

int run_throughput(const ThroughputOptions& o) {
  if (Status sparse = check_sparse_options(o.engine); !sparse.is_ok()) return report_usage_error(sparse);
  if (o.num_prompts < 1 || o.input_len < 1 || o.output_len < 1)
    return report_usage_error(invalid_argument("--num-prompts, --input-len and --output-len must be positive"));
  if (o.concurrency < 0)
    return report_usage_error(
        invalid_argument("--concurrency {} is negative (0 = every request at once)", o.concurrency));
  auto bundle = o.model.load(o.engine.device, o.engine.tensor_parallel_size);
  if (!bundle.is_ok()) return report_error(bundle.status());
  const ModelConfig& mc = bundle->model->config();
  const int max_model_len = o.engine.max_model_len > 0 ? o.engine.max_model_len : mc.max_position_embeddings;
  if (int64_t{o.input_len} + o.output_len > max_model_len)
    return report_usage_error(invalid_argument("--input-len {} plus --output-len {} exceeds the context of {} tokens",
                                               o.input_len, o.output_len, max_model_len));
  const int concurrency = o.concurrency > 0 ? std::min(o.concurrency, o.num_prompts) : o.num_prompts;
  EngineConfig config = o.engine;
  if (o.max_num_seqs_given && config.max_num_seqs < concurrency) {
    // As vLLM does: the engine keeps the user's --max-num-seqs and the requests past it wait in its queue.
    SE_LOG_WARN(
        "--max-num-seqs {} runs at most {} of the {} requests in flight at once; the others wait in the "
        "engine's queue",
        config.max_num_seqs, config.max_num_seqs, concurrency);
  } else if (config.max_num_seqs < concurrency) {
    // Unset, it follows --concurrency: the engine may run every request the benchmark lets in, and the pool
    // decides how many actually fit.
    SE_LOG_WARN("--max-num-seqs raised from its default {} to --concurrency {}", config.max_num_seqs, concurrency);
    config.max_num_seqs = concurrency;
  }
  auto engine = Engine::create(*bundle, config);
  if (!engine.is_ok()) return report_error(engine.status());
  auto run = run_requests(**engine, o, concurrency, mc.vocab_size);
  if (!run.is_ok()) return report_error(run.status());
  const EngineStats& s = run->stats;
  const double seconds = run->seconds;
  const std::string sparse_config = o.engine.sparse_config.is_null() ? "{}" : o.engine.sparse_config.dump();
  const double output_tok_s = static_cast<double>(run->output_tokens) / seconds;
  const double total_tok_s =
      (static_cast<double>(run->output_tokens) + static_cast<double>(o.num_prompts) * o.input_len) / seconds;
  const double compression_share = s.compression_seconds_total / seconds;
  std::printf(
      "bench throughput: %s on %s, %d requests x (%d prompt + %d output tokens), concurrency %d (%d running at "
      "most), sparse method %s %s, KV pool %lld pages\n",
      bundle->name.c_str(), std::string(device_name(o.engine.device)).c_str(), o.num_prompts, o.input_len, o.output_len,
      concurrency, (*engine)->config().max_num_seqs, o.engine.sparse_method.c_str(), sparse_config.c_str(),
      static_cast<long long>(s.num_kv_pages_total));
  std::printf(
      "| requests/s | output tok/s | total tok/s | elapsed s | preemptions | peak KV pages | pages freed by "
      "compression | compression steps | compression share |\n|---|---|---|---|---|---|---|---|---|\n");
  std::printf("| %.3f | %.1f | %.1f | %.2f | %llu | %lld | %llu | %llu | %.1f%% |\n", o.num_prompts / seconds,
              output_tok_s, total_tok_s, seconds, static_cast<unsigned long long>(s.preemptions_total),
              static_cast<long long>(s.num_kv_pages_used_peak),
              static_cast<unsigned long long>(s.compression_freed_pages_total),
              static_cast<unsigned long long>(s.compression_steps_total), 100.0 * compression_share);
  if (!o.csv_path.empty()) {
    append_csv(o.csv_path,
               "model,device,method,sparse_config,kv_cache_dtype,input_len,output_len,num_prompts,concurrency,"
               "output_tokens,elapsed_s,output_tok_s,total_tok_s,steps,preemptions,kv_pages_total,kv_pages_peak,"
               "compression_steps,compression_freed_pages,compression_s,compression_share,admission",
               fmt::format("{},{},{},{},{},{},{},{},{},{},{:.3f},{:.2f},{:.2f},{},{},{},{},{},{},{:.3f},{:.4f},{}",
                           csv_field(bundle->name), device_name(o.engine.device), csv_field(o.engine.sparse_method),
                           csv_field(sparse_config), csv_field(o.engine.kv_cache_dtype), o.input_len, o.output_len,
                           o.num_prompts, concurrency, run->output_tokens, seconds, output_tok_s, total_tok_s,
                           s.steps_total, s.preemptions_total, s.num_kv_pages_total, s.num_kv_pages_used_peak,
                           s.compression_steps_total, s.compression_freed_pages_total, s.compression_seconds_total,
                           compression_share, admission_name(o.engine.admission)));
  }
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
  cmd->add_option("--csv", o->csv_path, "append the run's row to this CSV file");
  cmd->callback([o, cmd, &exit_code] {
    o->max_num_seqs_given = cmd->count("--max-num-seqs") > 0;
    exit_code = run_throughput(*o);
  });
}

}  // namespace se::cli
