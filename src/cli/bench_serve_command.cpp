// `sparse-engine bench serve`: sends --num-prompts streamed completions with random token-id prompts of
// --input-len tokens and --output-len generated tokens (ignore_eos, greedy) to a running server, arriving as a
// Poisson process at --request-rate (inf: all at once), at most --max-concurrency in flight. One thread per
// request in flight, each with its own connection. Metrics follow `vllm bench serve`: TTFT is the time to the
// first streamed text, ITL the gaps between text chunks, TPOT (latency - TTFT) / (output tokens - 1).
#include "cli/bench_serve_command.h"

#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <mutex>
#include <random>
#include <semaphore>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/status.h"
#include "cli/bench_client.h"

namespace se::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct BenchServeOptions {
  ServerTarget server;
  std::string endpoint = "/v1/completions";
  int num_prompts = 100;
  int input_len = 256;
  int output_len = 64;
  double request_rate = std::numeric_limits<double>::infinity();
  int max_concurrency = 0;  // 0 = no cap
  uint64_t seed = 0;
  int32_t min_token_id = 1000;  // prompt ids are drawn from [min, max): plain text tokens in common vocabularies
  int32_t max_token_id = 10000;
  std::string result_json;
  bool disable_progress = false;
};

struct RequestMetrics {
  bool ok = false;
  std::string error;
  int input_len = 0;
  int output_len = 0;
  double latency = 0.0;  // seconds
  double ttft = 0.0;
  std::vector<double> itls;
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Reads one SSE event ("data: ..." lines) of a streamed completion into `m`.
void read_event(const std::string& event, Clock::time_point start, Clock::time_point& last, RequestMetrics& m) {
  if (event.rfind("data: ", 0) != 0) return;
  const std::string payload = event.substr(6);
  if (payload == "[DONE]") return;
  const nlohmann::json chunk = nlohmann::json::parse(payload, nullptr, false);
  if (chunk.is_discarded()) return;
  if (chunk.contains("error")) {
    m.error = chunk["error"].value("message", std::string("error event"));
    return;
  }
  if (auto usage = chunk.find("usage"); usage != chunk.end() && usage->is_object()) {
    m.input_len = usage->value("prompt_tokens", 0);
    m.output_len = usage->value("completion_tokens", 0);
  }
  const auto& choices = chunk.value("choices", nlohmann::json::array());
  if (choices.empty() || choices[0].value("text", std::string()).empty()) return;
  const Clock::time_point now = Clock::now();
  if (m.ttft == 0.0) m.ttft = std::chrono::duration<double>(now - start).count();
  else m.itls.push_back(std::chrono::duration<double>(now - last).count());
  last = now;
}

RequestMetrics run_request(const std::string& base_url, const BenchServeOptions& o, const std::string& model,
                           const std::vector<int32_t>& prompt) {
  RequestMetrics m;
  httplib::Client client(base_url);
  client.set_connection_timeout(30, 0);
  client.set_read_timeout(3600, 0);  // a queued request may wait long for its first byte
  httplib::Request req;
  req.method = "POST";
  req.path = o.endpoint;
  req.set_header("Content-Type", "application/json");
  req.body = nlohmann::json{{"model", model},           {"prompt", prompt},        {"max_tokens", o.output_len},
                            {"ignore_eos", true},       {"temperature", 0.0},      {"stream", true},
                            {"stream_options", {{"include_usage", true}}}}
                 .dump();
  std::string buffer;
  const Clock::time_point start = Clock::now();
  Clock::time_point last = start;
  req.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    buffer.append(data, size);
    for (size_t end = buffer.find("\n\n"); end != std::string::npos; end = buffer.find("\n\n")) {
      read_event(buffer.substr(0, end), start, last, m);
      buffer.erase(0, end + 2);
    }
    return true;
  };
  httplib::Result res = client.send(req);
  m.latency = seconds_since(start);
  if (!res) {
    m.error = "connection failed: " + httplib::to_string(res.error());
  } else if (res->status != 200) {
    m.error = fmt::format("HTTP {}: {}", res->status, buffer);
  } else if (m.error.empty()) {
    m.ok = m.output_len > 0;
    if (!m.ok) m.error = "the stream ended without usage";
  }
  return m;
}

class ProgressBar {
 public:
  ProgressBar(int total, bool enabled) : total_(total), enabled_(enabled && isatty(fileno(stderr))) {}
  void tick() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++done_;
    if (!enabled_) return;
    constexpr int kWidth = 40;
    const int filled = done_ * kWidth / std::max(total_, 1);
    std::fprintf(stderr, "\r%5d/%d [%s%s] %.1f s", done_, total_, std::string(static_cast<size_t>(filled), '=').c_str(),
                 std::string(static_cast<size_t>(kWidth - filled), ' ').c_str(), seconds_since(start_));
    if (done_ == total_) std::fputc('\n', stderr);
    std::fflush(stderr);
  }

 private:
  std::mutex mutex_;
  int total_;
  int done_ = 0;
  bool enabled_;
  Clock::time_point start_ = Clock::now();
};

void print_summary(const nlohmann::json& r) {
  auto line = [](const char* name, const std::string& value) { std::printf("%-40s %s\n", name, value.c_str()); };
  std::printf("============ Serving Benchmark Result ============\n");
  line("Successful requests:", fmt::format("{}", r["completed"].get<int>()));
  line("Failed requests:", fmt::format("{}", r["failed"].get<int>()));
  line("Benchmark duration (s):", fmt::format("{:.2f}", r["duration"].get<double>()));
  line("Total input tokens:", fmt::format("{}", r["total_input_tokens"].get<int64_t>()));
  line("Total generated tokens:", fmt::format("{}", r["total_output_tokens"].get<int64_t>()));
  line("Request throughput (req/s):", fmt::format("{:.2f}", r["request_throughput"].get<double>()));
  line("Output token throughput (tok/s):", fmt::format("{:.2f}", r["output_throughput"].get<double>()));
  line("Total token throughput (tok/s):", fmt::format("{:.2f}", r["total_token_throughput"].get<double>()));
  for (const auto& [key, title] : {std::pair<std::string, std::string>{"ttft", "Time to First Token"},
                                   {"tpot", "Time per Output Token (excl. 1st token)"},
                                   {"itl", "Inter-token Latency"}}) {
    std::printf("%s\n", fmt::format("{:-^50}", title).c_str());
    std::string name = key;
    std::transform(name.begin(), name.end(), name.begin(), [](char c) { return static_cast<char>(std::toupper(c)); });
    for (const auto& [stat, label] : {std::pair<std::string, std::string>{"mean", "Mean"}, {"median", "Median"},
                                      {"p99", "P99"}}) {
      line(fmt::format("{} {} (ms):", label, name).c_str(),
           fmt::format("{:.2f}", r[fmt::format("{}_{}_ms", stat, key)].get<double>()));
    }
  }
  std::printf("==================================================\n");
}

int run_bench_serve(const BenchServeOptions& o) {
  if (o.num_prompts < 1 || o.input_len < 1 || o.output_len < 1 || !(o.request_rate > 0) ||
      o.min_token_id < 0 || o.max_token_id <= o.min_token_id) {
    std::fprintf(stderr, "error: --num-prompts, --input-len, --output-len and --request-rate must be positive\n");
    return 2;
  }
  const std::string base_url = o.server.url();
  const Result<std::string> resolved = o.server.resolve_model();
  if (!resolved.is_ok()) return std::fprintf(stderr, "error: %s\n", resolved.status().message().c_str()), 1;
  const std::string& model = *resolved;

  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> token(o.min_token_id, o.max_token_id - 1);
  std::exponential_distribution<double> gap(std::isinf(o.request_rate) ? 1.0 : o.request_rate);
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(o.num_prompts));
  std::vector<double> arrivals(prompts.size(), 0.0);
  double t = 0.0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (int k = 0; k < o.input_len; ++k) prompts[i].push_back(token(rng));
    if (!std::isinf(o.request_rate)) t += gap(rng);
    arrivals[i] = t;
  }

  std::printf("bench serve: %s at %s, %d prompts of %d tokens, %d output tokens, rate %s, concurrency %s\n",
              model.c_str(), base_url.c_str(), o.num_prompts, o.input_len, o.output_len,
              std::isinf(o.request_rate) ? "inf" : fmt::format("{}", o.request_rate).c_str(),
              o.max_concurrency > 0 ? std::to_string(o.max_concurrency).c_str() : "unlimited");
  std::counting_semaphore<> slots(o.max_concurrency > 0 ? o.max_concurrency : o.num_prompts);
  std::vector<RequestMetrics> results(prompts.size());
  std::vector<std::thread> threads;
  ProgressBar progress(o.num_prompts, !o.disable_progress);
  const Clock::time_point start = Clock::now();
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(arrivals[i])));
    slots.acquire();
    threads.emplace_back([&, i] {
      results[i] = run_request(base_url, o, model, prompts[i]);
      slots.release();
      progress.tick();
    });
  }
  for (std::thread& thread : threads) thread.join();
  const double duration = seconds_since(start);

  int completed = 0;
  int64_t input_tokens = 0, output_tokens = 0;
  std::vector<double> ttfts, tpots, itls;
  std::string first_error;
  for (const RequestMetrics& m : results) {
    if (!m.ok) {
      if (first_error.empty()) first_error = m.error;
      continue;
    }
    ++completed;
    input_tokens += m.input_len;
    output_tokens += m.output_len;
    ttfts.push_back(m.ttft);
    if (m.output_len > 1) tpots.push_back((m.latency - m.ttft) / (m.output_len - 1));
    itls.insert(itls.end(), m.itls.begin(), m.itls.end());
  }
  nlohmann::json r = {{"model", model},
                      {"base_url", base_url},
                      {"num_prompts", o.num_prompts},
                      {"input_len", o.input_len},
                      {"output_len", o.output_len},
                      {"request_rate",
                       std::isinf(o.request_rate) ? nlohmann::json("inf") : nlohmann::json(o.request_rate)},
                      {"max_concurrency", o.max_concurrency},
                      {"duration", duration},
                      {"completed", completed},
                      {"failed", o.num_prompts - completed},
                      {"total_input_tokens", input_tokens},
                      {"total_output_tokens", output_tokens},
                      {"request_throughput", completed / duration},
                      {"output_throughput", static_cast<double>(output_tokens) / duration},
                      {"total_token_throughput", static_cast<double>(input_tokens + output_tokens) / duration}};
  for (const auto& [key, values] : {std::pair<std::string, const std::vector<double>*>{"ttft", &ttfts},
                                    {"tpot", &tpots}, {"itl", &itls}}) {
    const Summary s = summarize_ms(*values);
    r["mean_" + key + "_ms"] = s.mean;
    r["median_" + key + "_ms"] = s.median;
    r["p99_" + key + "_ms"] = s.p99;
    r["std_" + key + "_ms"] = s.std;
  }
  print_summary(r);
  if (!first_error.empty()) std::fprintf(stderr, "first error: %s\n", first_error.c_str());
  if (!o.result_json.empty()) {
    std::ofstream out(o.result_json);
    out << r.dump(2) << "\n";
    if (!out) return std::fprintf(stderr, "error: cannot write %s\n", o.result_json.c_str()), 1;
  }
  return completed == o.num_prompts ? 0 : 1;
}

}  // namespace

void add_bench_serve_command(CLI::App& bench, int& exit_code) {
  auto o = std::make_shared<BenchServeOptions>();
  CLI::App* cmd = bench.add_subcommand("serve", "load-test a running OpenAI-compatible server (like vllm bench serve)");
  o->server.add_to(*cmd);
  cmd->add_option("--endpoint", o->endpoint, "completions path")->capture_default_str();
  cmd->add_option("--num-prompts", o->num_prompts, "requests to send")->capture_default_str();
  cmd->add_option("--input-len", o->input_len, "prompt tokens per request (random ids)")->capture_default_str();
  cmd->add_option("--output-len", o->output_len, "generated tokens per request (EOS ignored)")->capture_default_str();
  cmd->add_option("--request-rate", o->request_rate, "mean arrivals per second, Poisson (inf = all at once)")
      ->capture_default_str();
  cmd->add_option("--max-concurrency", o->max_concurrency, "requests in flight at most (0 = no cap)")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of prompts and arrival times")->capture_default_str();
  cmd->add_option("--min-token-id", o->min_token_id, "prompt token ids are drawn from [min, max)")
      ->capture_default_str();
  cmd->add_option("--max-token-id", o->max_token_id, "prompt token ids are drawn from [min, max)")
      ->capture_default_str();
  cmd->add_option("--result-json", o->result_json, "write the metrics as JSON to this file");
  cmd->add_flag("--disable-progress", o->disable_progress, "no progress bar on the terminal");
  cmd->callback([o, &exit_code] { exit_code = run_bench_serve(*o); });
}

}  // namespace se::cli
