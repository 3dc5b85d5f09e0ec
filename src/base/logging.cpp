#include "base/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <string>

namespace se {

namespace {
void ensure_stderr_logger() {
  static const bool installed = [] {
    auto logger = spdlog::stderr_color_mt("se");
    logger->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    spdlog::set_default_logger(logger);
    return true;
  }();
  (void)installed;
}
}  // namespace

void set_log_level(std::string_view level) {
  ensure_stderr_logger();
  spdlog::level::level_enum parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") parsed = spdlog::level::info;
  spdlog::set_level(parsed);
}

}  // namespace se
