// Logging through spdlog. One process-wide logger on stderr; stdout stays free for program output
// (generated text, JSON). Thread-safe.
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace se {

// Sets the level from a name ("trace", "debug", "info", "warn", "error", "off"); unknown names keep "info".
void set_log_level(std::string_view level);

}  // namespace se

#define SE_LOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
#define SE_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define SE_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define SE_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
