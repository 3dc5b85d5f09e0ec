// `sparse-engine serve`: the OpenAI-compatible HTTP server over one Engine (vLLM's flag names).
#pragma once

#include <CLI/CLI.hpp>

namespace se::cli {

void add_serve_command(CLI::App& app, int& exit_code);

}  // namespace se::cli
