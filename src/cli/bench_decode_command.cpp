// `sparse-engine bench decode`: steady-state decode throughput of B long-context sequences resident together,
// through the serving engine. Protocol: random prompt ids, greedy with EOS ignored, prefix caching off; every
// prompt is prefilled (the scheduler admits what the MemoryOracle lets in, eviction methods in waves as their
// compression frees pages), then `--warmup-steps` decode steps run, then a timed window of `--steps` decode steps
// with every sequence resident. Reported per batch: decode tokens/s over the window, ms per step, KV pages in
// use, and the step's roofline: the bytes a step must read (every weight matrix once, of a mixture of experts only
// the experts the batch chose, plus the KV tokens attention read and the method metadata its selection read, the
// last three counted by the engine) over the bandwidth
// measured in the same process; and the host gap, per step the time the device waited for the host between
// CUDA-graph steps (ModelRunner::host_gap_seconds; 0 for eager steps).
//
// `--batch auto` submits --max-num-seqs requests, lets the scheduler admit what fits, then keeps the largest
// batch whose growth over the warm-up and the window still fits the pool (newer requests are aborted). An
// explicit batch that cannot be admitted whole is reported and skipped. A batch above the default --max-num-seqs
// raises it (said on stderr); one above a --max-num-seqs given is refused.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "backend/device_memory.h"
#include "base/logging.h"
#include "cli/bench_commands.h"
#include "cli/bench_csv.h"
#include "cli/model_options.h"
#include "engine/engine.h"
#include "kv/kv_layout.h"
#include "sparse/method_registry.h"
#include "sparse/method_traits.h"

namespace se::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct DecodeBenchOptions {
  ModelOptions model;
  EngineConfig engine;
  int input_len = 32768;
  int steps = 256;
  int warmup_steps = 32;
  std::string batches = "1";
  uint64_t seed = 0;
  std::string csv_path;
  bool max_num_seqs_given = false;  // --max-num-seqs on the command line
};

struct DecodePoint {
  int batch = 0;
  double prefill_seconds = 0;
  double step_ms = 0;
  double decode_tok_s = 0;
  int64_t kv_pages_used = 0;
  int64_t kv_pages_total = 0;
  double kv_bytes_per_step = 0;
  double metadata_bytes_per_step = 0;
  double expert_bytes_per_step = 0;  // expert weights the MoE layers read: the experts the batch chose
  double host_gap_ms = 0;  // per step, the device waiting for the host between graph replays
};

// Bytes one decode step reads of the weights every step reads: every matrix once (the embedding table is only
// gathered, unless it is also the lm_head), norms, biases, routers, shared experts and latent-attention projections
// too. Not the routed experts: a step reads those its batch chose (DecodePoint::expert_bytes_per_step).
double weight_bytes_per_step(const ModelWeights& w) {
  double bytes = static_cast<double>(w.lm_head.nbytes() + w.final_norm.nbytes());
  for (const LayerWeights& l : w.layers)
    for (const Tensor* t : {&l.input_norm,
                            &l.qkv,
                            &l.qkv_bias,
                            &l.q_norm,
                            &l.k_norm,
                            &l.o_proj,
                            &l.post_attention_norm,
                            &l.pre_feedforward_norm,
                            &l.post_feedforward_norm,
                            &l.gate_up,
                            &l.down,
                            &l.router,
                            &l.shared_gate_up,
                            &l.shared_down,
                            &l.q_a,
                            &l.q_a_norm,
                            &l.q_proj,
                            &l.kv_a,
                            &l.kv_a_norm,
                            &l.kv_b})
      if (t->defined()) bytes += static_cast<double>(t->nbytes());
  return bytes;
}

// Copy bandwidth of `device` in bytes/s (read + written), best of a few 1 GiB copies.
double measure_copy_bandwidth(Device device) {
  constexpr int64_t kBytes = int64_t{1} << 30;
  Tensor src = empty_on(device, DType::kU8, {kBytes});
  Tensor dst = empty_on(device, DType::kU8, {kBytes});
  copy(dst.view(), src.view());  // first touch
  synchronize(device);
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const auto start = Clock::now();
    copy(dst.view(), src.view());
    synchronize(device);
    best = std::max(best, 2.0 * kBytes / std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

Result<std::vector<int>> parse_batches(const std::string& text) {
  std::vector<int> batches;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    at = comma + 1;
    if (item == "auto") {
      batches.push_back(0);
      continue;
    }
    char* end = nullptr;
    const long n = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || n <= 0 || n > (1 << 20))
      return invalid_argument("--batch: '{}' is not a list of positive integers and 'auto'", text);
    batches.push_back(static_cast<int>(n));
  }
  return batches;
}

// Polls the engine's published stats until `done` holds for a snapshot (each snapshot follows one step). Timing
// reads the snapshots' own timestamps, so the polling period only delays the answer; it stays long enough not to
// take a core from the forward.
template <typename Predicate>
Result<EngineStats> wait_for(const Engine& engine, Predicate done, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    EngineStats s = engine.stats();
    if (done(s)) return s;
    std::this_thread::sleep_for(std::chrono::microseconds(250));
  }
  return unavailable("the engine did not reach the benchmark's next phase within {} s", timeout.count());
}

// One batch point on a fresh engine. `batch` 0 = auto.
Result<DecodePoint> run_point(const ModelBundle& bundle, const DecodeBenchOptions& o, int batch) {
  EngineConfig config = o.engine;
  config.enable_prefix_caching = false;
  config.prefix_cache_mode = "off";
  const int decode_tokens = o.warmup_steps + o.steps;
  const int max_model_len = config.max_model_len > 0 ? config.max_model_len : bundle.model->config().max_position_embeddings;
  if (o.input_len + decode_tokens + 2 > max_model_len)
    return invalid_argument("--input-len {} plus {} decode steps exceeds the context of {} tokens", o.input_len,
                            decode_tokens, max_model_len);
  const int num_requests = batch > 0 ? batch : config.max_num_seqs;
  if (config.max_num_seqs < num_requests) {
    // A batch's sequences run at once; a --max-num-seqs given below a batch is refused before this.
    SE_LOG_WARN("--max-num-seqs raised from its default {} to --batch {}", config.max_num_seqs, num_requests);
    config.max_num_seqs = num_requests;
  }
  SE_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::create(bundle, config));
  // The KV budget may hold the method's per-sequence state for fewer sequences (kv_budget.h).
  if (batch > 0 && engine->config().max_num_seqs < batch)
    return resource_exhausted("the KV cache budget runs {} sequences of {} at once, fewer than batch {}",
                              engine->config().max_num_seqs, config.sparse_method, batch);

  std::mt19937_64 rng(o.seed + static_cast<uint64_t>(batch));
  const int vocab = bundle.model->config().vocab_size;
  std::uniform_int_distribution<int32_t> token(100, std::min(vocab, 30000) - 1);
  SamplingParams params;
  params.temperature = 0.0f;
  params.ignore_eos = true;
  // Early sequences decode while later ones still prefill: room for every admission step (each runs at least a
  // chunk of max_num_batched_tokens less the decode rows), then the warm-up and the window. Never reached: the
  // requests are aborted after the window.
  const int64_t chunk = std::max(64, config.max_num_batched_tokens - num_requests);
  const int64_t admission_steps =
      2 * ((int64_t{num_requests} * o.input_len + chunk - 1) / chunk) + num_requests + 16;
  params.max_tokens = static_cast<int>(std::min<int64_t>(max_model_len - o.input_len, admission_steps + decode_tokens));
  std::vector<std::string> ids;
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < num_requests; ++i) {
    std::vector<int32_t> prompt(static_cast<size_t>(o.input_len));
    for (int32_t& t : prompt) t = token(rng);
    ids.push_back("decode-" + std::to_string(i));
    requests.push_back({ids.back(), std::move(prompt), params});
  }
  const auto start = Clock::now();
  // One batch: every run admits the requests in the same steps.
  SE_ASSIGN_OR_RETURN(const std::vector<std::shared_ptr<OutputStream>> streams, engine->submit_batch(std::move(requests)));
  const auto abort_all = [&] {
    for (const std::string& id : ids) engine->abort(id);
  };

  // Admission ends when every prompt is in, or when nothing prefills and the rest keep waiting (the pool is full),
  // or, for `auto`, at the first preemption: the running sequences outgrew the pool, which dense ones, never giving
  // pages back, always do while later prompts wait. The scheduler preempts the newest, so the running sequences
  // stay the oldest requests.
  const uint64_t all_prompt_tokens = static_cast<uint64_t>(num_requests) * static_cast<uint64_t>(o.input_len);
  uint64_t stalled_since = 0;
  auto admitted = wait_for(
      *engine,
      [&](const EngineStats& s) {
        if (s.num_prefilling > 0 || s.num_running == 0) {
          stalled_since = 0;
          return false;
        }
        if (batch == 0 && s.preemptions_total > 0) return true;
        if (s.num_waiting == 0) return s.prompt_tokens_total >= all_prompt_tokens;
        if (stalled_since == 0) stalled_since = s.steps_total;
        return s.steps_total >= stalled_since + 4;
      },
      std::chrono::seconds(3600));
  if (!admitted.is_ok()) {
    abort_all();
    return admitted.status();
  }
  const double prefill_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (batch > 0 && admitted->preemptions_total > 0) {
    abort_all();
    return resource_exhausted("requests were preempted while prefilling: batch {} does not stay resident", num_requests);
  }

  int resident = admitted->num_running;
  if (batch > 0 && resident < batch) {
    abort_all();
    return resource_exhausted("only {} of {} sequences of {} tokens fit the KV pool at once", resident, batch,
                              o.input_len);
  }
  // Keep the oldest sequences whose growth over the warm-up and the window fits: each stream may open
  // ceil(decode_tokens / page_size) + 1 pages (the methods that evict as they decode open fewer).
  const ModelConfig& mc = bundle.model->config();
  // The engine's store: a latent-attention model keeps one shared latent row per token (one stream per layer) under
  // the methods that keep it.
  SE_ASSIGN_OR_RETURN(const KvStoreKind requested_store, parse_kv_cache_dtype(config.kv_cache_dtype));
  SE_ASSIGN_OR_RETURN(const std::unique_ptr<MethodRuntime> method,
                      create_method(config.sparse_method, config.sparse_config));
  SE_ASSIGN_OR_RETURN(const KvStoreKind store,
                      model_kv_store(requested_store, mc.latent_attention(), method->traits()));
  const bool shared_latent = store == KvStoreKind::kSharedLatent;
  const int32_t kv_heads = shared_latent ? 1 : mc.num_kv_heads;
  const int32_t kv_head_dim = shared_latent ? mc.kv_lora_rank + mc.qk_rope_head_dim : mc.head_dim;
  const int64_t growth_per_seq =
      static_cast<int64_t>(mc.num_layers) * kv_heads * ((decode_tokens + config.page_size - 1) / config.page_size + 1);
  // Aborting a running sequence returns about used_per_seq pages; waiting ones hold none.
  const int64_t admitted_seqs = resident;
  const int64_t used_per_seq = (admitted->num_kv_pages_used + admitted_seqs - 1) / admitted_seqs;
  const auto growth_fits = [&](int64_t kept) {
    return admitted->num_kv_pages_total - admitted->num_kv_pages_used + (admitted_seqs - kept) * used_per_seq >=
           kept * growth_per_seq;
  };
  while (resident > 1 && !growth_fits(resident)) --resident;
  for (int i = resident; i < num_requests; ++i) engine->abort(ids[static_cast<size_t>(i)]);
  if (batch > 0 && resident < batch) {
    abort_all();
    return resource_exhausted("batch {} fits its prompts but not its {} decode steps", batch, decode_tokens);
  }

  // The window: `warmup` decode steps after the batch settles, then `steps` timed ones.
  SE_ASSIGN_OR_RETURN(const EngineStats settled, wait_for(*engine, [&](const EngineStats& s) {
    return s.num_running == resident && s.num_waiting == 0 && s.num_prefilling == 0;
  }, std::chrono::seconds(600)));
  const uint64_t first_step = settled.steps_total + static_cast<uint64_t>(o.warmup_steps);
  SE_ASSIGN_OR_RETURN(const EngineStats begin, wait_for(*engine, [&](const EngineStats& s) {
    return s.steps_total >= first_step;
  }, std::chrono::seconds(600)));
  // A profiler attached with its capture off records the timed window only, not the prompts' prefill.
  set_profiler_capture(config.device, true);
  SE_ASSIGN_OR_RETURN(const EngineStats end, wait_for(*engine, [&](const EngineStats& s) {
    return s.steps_total >= begin.steps_total + static_cast<uint64_t>(o.steps);
  }, std::chrono::seconds(3600)));
  set_profiler_capture(config.device, false);
  abort_all();
  const uint64_t timed_steps = end.steps_total - begin.steps_total;
  if (end.num_running != resident || end.preemptions_total != admitted->preemptions_total ||
      end.generation_tokens_total - begin.generation_tokens_total != timed_steps * static_cast<uint64_t>(resident))
    return internal_error("the batch of {} did not stay resident through the window ({} running at its end, {} "
                          "preemptions)", resident, end.num_running, end.preemptions_total);

  DecodePoint p;
  p.batch = resident;
  p.prefill_seconds = prefill_seconds;
  const double window = std::chrono::duration<double>(end.published_at - begin.published_at).count();
  p.step_ms = 1e3 * window / static_cast<double>(timed_steps);
  p.decode_tok_s = static_cast<double>(timed_steps) * resident / window;
  p.kv_pages_used = end.num_kv_pages_used;
  p.kv_pages_total = end.num_kv_pages_total;
  // The store's real bytes per token (FP8 codes are one byte per element; KIVI's codes, group parameters and
  // residual window at the length a stream attends over: the prompt and the decoded tokens, or what an eviction
  // method kept of the prompt, quantized after it compressed; a TurboQuant slot; a shared latent's row);
  // FP8's scales are per layer.
  const double attended_tokens = static_cast<double>(end.attended_kv_tokens_total - begin.attended_kv_tokens_total);
  const double stream_steps = static_cast<double>(timed_steps) * resident * mc.num_layers * kv_heads;
  const double kv_token_bytes =
      make_kv_layout(mc.num_layers, kv_heads, kv_head_dim, config.page_size, config.device, store,
                     config.kivi_group_size, config.kivi_residual, config.max_num_batched_tokens)
          .bytes_per_token(std::max<int64_t>(std::llround(attended_tokens / stream_steps), 1));
  p.kv_bytes_per_step = attended_tokens * kv_token_bytes / static_cast<double>(timed_steps);
  p.metadata_bytes_per_step =
      static_cast<double>(end.method_metadata_bytes_total - begin.method_metadata_bytes_total) /
      static_cast<double>(timed_steps);
  p.expert_bytes_per_step = static_cast<double>(end.expert_weight_bytes_total - begin.expert_weight_bytes_total) /
                            static_cast<double>(timed_steps);
  p.host_gap_ms = 1e3 * (end.host_gap_seconds_total - begin.host_gap_seconds_total) / static_cast<double>(timed_steps);
  return p;
}

int run_decode_bench(const DecodeBenchOptions& o) {
  if (Status sparse = check_sparse_options(o.engine); !sparse.is_ok()) return report_usage_error(sparse);
  auto batches = parse_batches(o.batches);
  if (!batches.is_ok()) return report_usage_error(batches.status());
  const int largest_batch = *std::max_element(batches->begin(), batches->end());
  if (o.max_num_seqs_given && o.engine.max_num_seqs < largest_batch)
    return report_usage_error(invalid_argument(
        "--max-num-seqs {} is below --batch {}: a batch's sequences decode together; raise --max-num-seqs or leave "
        "it out (it then follows the batch)",
        o.engine.max_num_seqs, largest_batch));
  if (o.input_len < 1 || o.steps < 1 || o.warmup_steps < 0)
    return report_usage_error(invalid_argument("--input-len and --steps must be positive, --warmup-steps >= 0"));
  auto bundle = o.model.load(o.engine.device, o.engine.tensor_parallel_size);
  if (!bundle.is_ok()) return report_error(bundle.status());
  const double bandwidth = measure_copy_bandwidth(o.engine.device);
  const double weight_bytes = weight_bytes_per_step(bundle->model->weights());
  const std::string config = o.engine.sparse_config.is_null() ? "{}" : o.engine.sparse_config.dump();
  std::printf(
      "bench decode: %s on %s, sparse method %s %s, KV cache %s, %d prompt tokens, %d warm-up + %d timed "
      "decode steps\n"
      "weights every step reads %.2f GB (MoE experts apart); measured copy bandwidth %.0f GB/s (read + write)\n",
      bundle->name.c_str(), std::string(device_name(o.engine.device)).c_str(), o.engine.sparse_method.c_str(),
      config.c_str(), o.engine.kv_cache_dtype.c_str(), o.input_len, o.warmup_steps, o.steps, weight_bytes / 1e9,
      bandwidth / 1e9);
  std::printf(
      "| batch | decode tok/s | ms/step | KV GB read/step | metadata GB read/step | roofline ms | of roofline | "
      "KV pages used/total | prefill s | host gap ms/step | expert GB read/step |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  int failures = 0;
  for (int batch : *batches) {
    auto point = run_point(*bundle, o, batch);
    if (!point.is_ok()) {
      std::printf("| %s | %s |\n", batch > 0 ? std::to_string(batch).c_str() : "auto",
                  point.status().to_string().c_str());
      ++failures;
      continue;
    }
    const double roofline_ms =
        1e3 *
        (weight_bytes + point->expert_bytes_per_step + point->kv_bytes_per_step + point->metadata_bytes_per_step) /
        bandwidth;
    std::printf("| %d | %.1f | %.3f | %.3f | %.3f | %.3f | %.0f%% | %lld/%lld | %.1f | %.3f | %.3f |\n", point->batch,
                point->decode_tok_s, point->step_ms, point->kv_bytes_per_step / 1e9,
                point->metadata_bytes_per_step / 1e9, roofline_ms, 100.0 * roofline_ms / point->step_ms,
                static_cast<long long>(point->kv_pages_used), static_cast<long long>(point->kv_pages_total),
                point->prefill_seconds, point->host_gap_ms, point->expert_bytes_per_step / 1e9);
    std::fflush(stdout);
    if (!o.csv_path.empty()) {
      append_csv(
          o.csv_path,
          "model,device,method,sparse_config,input_len,batch,decode_tok_s,step_ms,weight_gb,kv_gb_per_step,"
          "metadata_gb_per_step,roofline_ms,of_roofline,kv_pages_used,kv_pages_total,bandwidth_gbs,prefill_s,"
          "host_gap_ms,expert_gb_per_step,kv_cache_dtype",
          fmt::format("{},{},{},{},{},{},{:.2f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{},{},{:.1f},{:.2f},{:.4f},"
                      "{:.4f},{}",
                      csv_field(bundle->name), device_name(o.engine.device), csv_field(o.engine.sparse_method),
                      csv_field(config), o.input_len, point->batch, point->decode_tok_s, point->step_ms,
                      weight_bytes / 1e9, point->kv_bytes_per_step / 1e9, point->metadata_bytes_per_step / 1e9,
                      roofline_ms, roofline_ms / point->step_ms, point->kv_pages_used, point->kv_pages_total,
                      bandwidth / 1e9, point->prefill_seconds, point->host_gap_ms, point->expert_bytes_per_step / 1e9,
                      csv_field(o.engine.kv_cache_dtype)));
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

void add_bench_decode_command(CLI::App& bench, int& exit_code) {
  auto o = std::make_shared<DecodeBenchOptions>();
  CLI::App* cmd = bench.add_subcommand("decode", "steady-state decode tokens/s of B resident long-context sequences");
  o->model.add_to(*cmd);
  add_engine_options(*cmd, o->engine);
  cmd->add_option("--input-len", o->input_len, "prompt tokens per sequence (random ids)")->capture_default_str();
  cmd->add_option("--steps,--output-len", o->steps, "timed decode steps")->capture_default_str();
  cmd->add_option("--warmup-steps", o->warmup_steps, "decode steps before the timed window")->capture_default_str();
  cmd->add_option("--batch", o->batches, "'auto' (the largest batch that stays resident) or N[,N...]")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "prompt seed")->capture_default_str();
  cmd->add_option("--csv", o->csv_path, "append one row per batch to this CSV file");
  cmd->callback([o, cmd, &exit_code] {
    o->max_num_seqs_given = cmd->count("--max-num-seqs") > 0;
    exit_code = run_decode_bench(*o);
  });
}

}  // namespace se::cli
