#include "cli/bench_client.h"

#include <httplib.h>

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

namespace se::cli {

Summary summarize_ms(std::vector<double> seconds) {
  Summary s;
  if (seconds.empty()) return s;
  std::sort(seconds.begin(), seconds.end());
  auto percentile = [&](double q) {
    const double pos = q * static_cast<double>(seconds.size() - 1);
    const size_t lo = static_cast<size_t>(pos);
    const size_t hi = std::min(lo + 1, seconds.size() - 1);
    return seconds[lo] + (seconds[hi] - seconds[lo]) * (pos - static_cast<double>(lo));
  };
  double sum = 0, sq = 0;
  for (double v : seconds) sum += v;
  s.mean = sum / static_cast<double>(seconds.size());
  for (double v : seconds) sq += (v - s.mean) * (v - s.mean);
  s.std = std::sqrt(sq / static_cast<double>(seconds.size()));
  s.median = percentile(0.5);
  s.p99 = percentile(0.99);
  return {s.mean * 1e3, s.median * 1e3, s.p99 * 1e3, s.std * 1e3};
}

Result<std::string> first_model(const std::string& base_url) {
  httplib::Client client(base_url);
  client.set_connection_timeout(10, 0);
  httplib::Result res = client.Get("/v1/models");
  if (!res) return unavailable("cannot reach {}: {}", base_url, httplib::to_string(res.error()));
  const nlohmann::json body = nlohmann::json::parse(res->body, nullptr, false);
  if (res->status != 200 || body.is_discarded() || !body.contains("data") || body["data"].empty())
    return unavailable("{}/v1/models answered {}: {}", base_url, res->status, res->body);
  return body["data"][0].value("id", std::string());
}

}  // namespace se::cli
