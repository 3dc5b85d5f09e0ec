// Prometheus text exposition (format 0.0.4) of the engine's counters and histograms for GET /metrics. Every
// metric is prefixed `sparse_engine_` and labelled with the served model name, as vLLM labels its own.
// Pure function; thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "engine/engine_stats.h"

namespace se::server {

inline constexpr std::string_view kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

std::string render_prometheus(const EngineStats& stats, std::string_view model_name);

}  // namespace se::server
