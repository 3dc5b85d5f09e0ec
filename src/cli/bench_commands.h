// The `bench` subcommands, one file each; each registers itself under the `bench` parent.
#pragma once

#include <CLI/CLI.hpp>

#include "cli/engine_options.h"

namespace se::cli {

void add_bench_generate_command(CLI::App& bench, int& exit_code);
void add_bench_throughput_command(CLI::App& bench, int& exit_code);
void add_bench_decode_command(CLI::App& bench, int& exit_code);

}  // namespace se::cli
