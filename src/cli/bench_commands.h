// The `bench` subcommands, one file each; each registers itself under the `bench` parent.
#pragma once

#include <CLI/CLI.hpp>

#include "engine/engine_config.h"

namespace se::cli {

void add_bench_generate_command(CLI::App& bench, int& exit_code);
void add_bench_throughput_command(CLI::App& bench, int& exit_code);

// The engine sizing flags (vLLM names) shared by `serve` and `bench throughput`.
void add_engine_options(CLI::App& command, EngineConfig& config);

}  // namespace se::cli
