#include "cli/bench_client.h"

#include <httplib.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
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

void ServerTarget::add_to(CLI::App& command) {
  command.add_option("--host", host, "server host")->capture_default_str();
  command.add_option("--port", port, "server port")->capture_default_str();
  command.add_option("--base-url", base_url, "server URL, e.g. http://host:8000 (overrides --host/--port)");
  command.add_option("--model", model, "model name to send (default: the first one /v1/models lists)");
}

std::string ServerTarget::url() const {
  return base_url.empty() ? fmt::format("http://{}:{}", host, port) : base_url;
}

Result<std::string> ServerTarget::resolve_model() const {
  if (!model.empty()) return model;
  const std::string base_url = url();
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
