// `sparse-engine bench serve`: a load generator against a running OpenAI-compatible server, like
// `vllm bench serve`: random token-id prompts, Poisson arrivals, a concurrency cap, streamed completions;
// reports throughput and TTFT / TPOT / ITL statistics.
#pragma once

#include <CLI/CLI.hpp>

namespace se::cli {

// Registers `serve` under the `bench` subcommand.
void add_bench_serve_command(CLI::App& bench, int& exit_code);

}  // namespace se::cli
