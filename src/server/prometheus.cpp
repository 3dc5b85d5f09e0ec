#include "server/prometheus.h"

#include <fmt/format.h>

namespace se::server {

namespace {

constexpr std::string_view kPrefix = "sparse_engine_";

// Label values escape backslash, double quote and newline.
std::string escape_label(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

class Exposition {
 public:
  explicit Exposition(std::string_view model_name)
      : labels_(fmt::format("model_name=\"{}\"", escape_label(model_name))) {}

  template <typename T>
  void scalar(std::string_view name, std::string_view type, std::string_view help, T value) {
    header(name, type, help);
    text_ += fmt::format("{}{}{{{}}} {}\n", kPrefix, name, labels_, value);
  }

  void histogram(std::string_view name, std::string_view help, const LatencyHistogram& h) {
    header(name, "histogram", help);
    uint64_t cumulative = 0;
    for (size_t i = 0; i < h.bounds.size(); ++i) {
      cumulative += i < h.counts.size() ? h.counts[i] : 0;
      text_ += fmt::format("{}{}_bucket{{{},le=\"{}\"}} {}\n", kPrefix, name, labels_, h.bounds[i], cumulative);
    }
    text_ += fmt::format("{}{}_bucket{{{},le=\"+Inf\"}} {}\n", kPrefix, name, labels_, h.count);
    text_ += fmt::format("{}{}_sum{{{}}} {}\n", kPrefix, name, labels_, h.sum);
    text_ += fmt::format("{}{}_count{{{}}} {}\n", kPrefix, name, labels_, h.count);
  }

  std::string take() { return std::move(text_); }

 private:
  void header(std::string_view name, std::string_view type, std::string_view help) {
    text_ += fmt::format("# HELP {}{} {}\n# TYPE {}{} {}\n", kPrefix, name, help, kPrefix, name, type);
  }

  std::string labels_;
  std::string text_;
};

double ratio(double num, double den) { return den > 0 ? num / den : 0.0; }

}  // namespace

std::string render_prometheus(const EngineStats& s, std::string_view model_name) {
  Exposition e(model_name);
  e.scalar("num_requests_running", "gauge", "Requests scheduled on the engine.", s.num_running);
  e.scalar("num_requests_waiting", "gauge", "Requests queued, not yet running.", s.num_waiting);
  e.scalar("kv_pages_total", "gauge", "KV cache pages in the pool.", s.num_kv_pages_total);
  e.scalar("kv_pages_used", "gauge", "KV cache pages held by live requests.", s.num_kv_pages_used);
  e.scalar("kv_pages_free", "gauge", "KV cache pages in the free list.", s.num_kv_pages_free);
  e.scalar("kv_pages_cached", "gauge", "KV cache pages held only by the idle prefix cache (reclaimable).",
           s.num_kv_pages_cached);
  e.scalar("kv_pages_chains", "gauge", "KV cache pages held by idle Chain Cache chains (reclaimable).",
           s.num_kv_pages_chains);
  e.scalar("num_chains", "gauge", "Chain Cache chains, idle or with a turn in flight.", s.num_chains);
  e.scalar("kv_host_pages_total", "gauge", "KV pages of the host tier (0 without one).", s.num_kv_host_pages_total);
  e.scalar("kv_host_pages_used", "gauge", "Host tier KV pages held by offloaded state.", s.num_kv_host_pages_used);
  e.scalar("num_chains_on_host", "gauge", "Idle Chain Cache chains whose KV is on the host tier.",
           s.num_chains_on_host);
  e.scalar("kv_cache_usage_perc", "gauge", "Fraction of KV cache pages used (1 = full).",
           ratio(static_cast<double>(s.num_kv_pages_used), static_cast<double>(s.num_kv_pages_total)));
  e.scalar("prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
           s.prefix_cache_queries_total);
  e.scalar("prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
           s.prefix_cache_hits_total);
  e.scalar("prefix_cache_hit_rate", "gauge", "Prefix cache hits / queries since start (0 before any query).",
           ratio(static_cast<double>(s.prefix_cache_hits_total), static_cast<double>(s.prefix_cache_queries_total)));
  e.scalar("prompt_tokens_total", "counter", "Prompt tokens processed.", s.prompt_tokens_total);
  e.scalar("generation_tokens_total", "counter", "Tokens generated.", s.generation_tokens_total);
  e.scalar("requests_finished_total", "counter", "Requests that finished (stop or length).",
           s.requests_finished_total);
  e.scalar("requests_aborted_total", "counter", "Requests aborted (client gone or shutdown).",
           s.requests_aborted_total);
  e.scalar("preemptions_total", "counter", "Requests preempted to free KV pages.", s.preemptions_total);
  e.scalar("engine_steps_total", "counter", "Model forwards of the serving loop.", s.steps_total);
  e.scalar("attended_kv_tokens_total", "counter",
           "KV tokens attention read (per step, layer, sequence and KV head, after eviction and selection).",
           s.attended_kv_tokens_total);
  e.scalar("method_metadata_bytes_total", "counter",
           "Bytes of per-page method metadata decode selections read (e.g. per-page key bounds).",
           s.method_metadata_bytes_total);
  e.scalar("compression_steps_total", "counter", "Steps in which the sparse method returned KV pages to the pool.",
           s.compression_steps_total);
  e.scalar("compression_freed_pages_total", "counter", "KV pages the sparse method's compressions returned.",
           s.compression_freed_pages_total);
  e.scalar("compression_seconds_total", "counter", "Time the sparse method spent compressing at the ends of steps.",
           s.compression_seconds_total);
  e.scalar("kv_pages_used_peak", "gauge", "The most KV pages held at once, at a step's peak.",
           s.num_kv_pages_used_peak);
  e.scalar("kv_host_pages_used_peak", "gauge", "The most host tier KV pages held when a step ended.",
           s.num_kv_host_pages_used_peak);
  e.scalar("host_gap_seconds_total", "counter",
           "Decode time the device waited for the host between CUDA-graph steps.", s.host_gap_seconds_total);
  e.histogram("time_to_first_token_seconds", "Time from arrival to the first generated token.",
              s.time_to_first_token);
  e.histogram("inter_token_latency_seconds", "Time between consecutive generated tokens.", s.inter_token_latency);
  e.histogram("e2e_request_latency_seconds", "Time from arrival to the end of a request.", s.e2e_request_latency);
  return e.take();
}

}  // namespace se::server
