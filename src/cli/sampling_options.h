// The sampling flags shared by generate and bench (vLLM/OpenAI names and defaults).
#pragma once

#include <CLI/CLI.hpp>

#include "engine/sampling_params.h"

namespace se::cli {

inline void add_sampling_options(CLI::App& command, SamplingParams& params, int default_max_tokens) {
  params.max_tokens = default_max_tokens;
  command.add_option("--max-tokens", params.max_tokens, "tokens to generate at most")->capture_default_str();
  command.add_option("--temperature", params.temperature, "0 = greedy")->capture_default_str();
  command.add_option("--top-p", params.top_p, "nucleus sampling mass")->capture_default_str();
  command.add_option("--top-k", params.top_k, "keep the k most likely tokens (0 = off)")->capture_default_str();
  command.add_option("--min-p", params.min_p, "drop tokens below min_p * p(max)")->capture_default_str();
  command.add_option("--seed", params.seed, "sampling seed");
  command.add_option("--stop", params.stop, "stop string (repeatable)");
  command.add_flag("--ignore-eos", params.ignore_eos, "keep generating past end-of-generation tokens");
}

}  // namespace se::cli
