// The sparse-engine subcommands. Each add_*_command registers its CLI11 subcommand and the callback that runs
// it; the callback sets the process exit code through `exit_code` (0 ok, 1 runtime error, 2 bad usage).
#pragma once

#include <CLI/CLI.hpp>

namespace se::cli {

void add_generate_command(CLI::App& app, int& exit_code);
void add_inspect_command(CLI::App& app, int& exit_code);
void add_tokenize_command(CLI::App& app, int& exit_code);
void add_bench_command(CLI::App& app, int& exit_code);
void add_methods_command(CLI::App& app, int& exit_code);
void add_eval_command(CLI::App& app, int& exit_code);

}  // namespace se::cli
