// `sparse-engine bench replay`: replays synthetic multi-turn agent sessions (agent_trace.h) against a running
// server, every session a sequence of streamed chat turns and the sessions concurrent, with or without Chain
// Cache fields; reports end-to-end time, output tokens/s, TTFT and the prefill tokens the server's prefix reuse
// avoided (usage.prompt_tokens_details.cached_tokens).
#pragma once

#include <CLI/CLI.hpp>

namespace se::cli {

// Registers `replay` under the `bench` subcommand.
void add_bench_replay_command(CLI::App& bench, int& exit_code);

}  // namespace se::cli
