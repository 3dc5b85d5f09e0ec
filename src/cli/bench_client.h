// What the client-side benchmarks (`bench serve`, `bench replay`) share: finding the served model and
// summarizing latency samples. Thread-safe (no shared state).
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace se::cli {

struct Summary {
  double mean = 0, median = 0, p99 = 0, std = 0;
};

// Mean, median, 99th percentile (linear interpolation, as numpy) and standard deviation of samples in seconds,
// reported in milliseconds.
Summary summarize_ms(std::vector<double> seconds);

// The first model a server's /v1/models lists; kUnavailable when the server cannot be reached or lists none.
Result<std::string> first_model(const std::string& base_url);

}  // namespace se::cli
