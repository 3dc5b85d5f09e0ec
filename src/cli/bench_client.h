// What the client-side benchmarks (`bench serve`, `bench replay`) share: the server they talk to and its model,
// and summarizing latency samples. Thread-safe (no shared state).
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/status.h"

namespace se::cli {

struct Summary {
  double mean = 0, median = 0, p99 = 0, std = 0;
};

// Mean, median, 99th percentile (linear interpolation, as numpy) and standard deviation of samples in seconds,
// reported in milliseconds.
Summary summarize_ms(std::vector<double> seconds);

// The server a benchmark sends to: --host/--port or --base-url, and the --model name to send.
struct ServerTarget {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string base_url;  // overrides host and port, e.g. http://10.0.0.2:8000
  std::string model;     // default: the first model the server lists

  void add_to(CLI::App& command);
  std::string url() const;
  // `model`, or the first model /v1/models lists; kUnavailable when the server cannot be reached or lists none.
  Result<std::string> resolve_model() const;
};

}  // namespace se::cli
