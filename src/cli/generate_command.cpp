// `sparse-engine generate`: one prompt (or one chat turn) in, streamed text out. It runs through the serving
// Engine (one request), so --sparse-method and the other engine flags apply exactly as under `serve`.
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/engine_options.h"
#include "cli/model_options.h"
#include "cli/sampling_options.h"
#include "engine/engine.h"

namespace se::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct GenerateOptions {
  ModelOptions model;
  EngineConfig engine;
  SamplingParams sampling;
  std::string prompt;
  std::string system;
  bool chat = false;
  bool quiet_stats = false;
};

Result<std::vector<int32_t>> prompt_ids(const GenerateOptions& opts, const ModelBundle& bundle) {
  const Tokenizer& tokenizer = *bundle.tokenizer;
  if (!opts.chat) return tokenizer.encode(opts.prompt, /*add_special=*/true, /*parse_special=*/false);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!opts.system.empty()) messages.push_back({{"role", "system"}, {"content", opts.system}});
  messages.push_back({{"role", "user"}, {"content", opts.prompt}});
  SE_ASSIGN_OR_RETURN(std::string rendered, bundle.render_chat(messages));
  // The template writes any BOS itself, as HF's apply_chat_template does.
  return tokenizer.encode(rendered, /*add_special=*/false, /*parse_special=*/true);
}

int run_generate(const GenerateOptions& opts) {
  if (Status sparse = check_sparse_options(opts.engine); !sparse.is_ok()) return report_usage_error(sparse);
  auto bundle = opts.model.load(opts.engine.device, opts.engine.tensor_parallel_size);
  if (!bundle.is_ok()) return report_error(bundle.status());
  if (!bundle->tokenizer) return report_error(invalid_argument("model '{}' has no tokenizer", bundle->name));
  auto ids = prompt_ids(opts, *bundle);
  if (!ids.is_ok()) return report_error(ids.status());
  const int num_prompt_tokens = static_cast<int>(ids->size());

  auto engine = Engine::create(*bundle, opts.engine);
  if (!engine.is_ok()) return report_error(engine.status());
  const Clock::time_point start = Clock::now();
  auto stream = (*engine)->submit({"generate", std::move(*ids), opts.sampling});
  if (!stream.is_ok()) return report_error(stream.status());

  Clock::time_point first_token = start;
  bool seen_token = false;
  RequestOutput last;
  while (!last.finished) {
    std::optional<RequestOutput> out = (*stream)->next(std::chrono::seconds(60));
    if (!out) continue;
    if (!seen_token && !out->tokens.empty()) {
      seen_token = true;
      first_token = Clock::now();
    }
    if (!out->text.empty()) {
      std::fwrite(out->text.data(), 1, out->text.size(), stdout);
      std::fflush(stdout);
    }
    last = std::move(*out);
  }
  const Clock::time_point end = Clock::now();
  (*engine)->shutdown(/*drain=*/false);
  if (last.finish_reason == FinishReason::kError) return report_error(internal_error("{}", last.error));
  std::fputc('\n', stdout);
  if (!opts.quiet_stats) {
    const double prefill_seconds = std::chrono::duration<double>(first_token - start).count();
    const double decode_seconds = std::chrono::duration<double>(end - first_token).count();
    const int num_generated = last.num_output_tokens;
    const double decode_rate =
        num_generated > 1 && decode_seconds > 0 ? static_cast<double>(num_generated - 1) / decode_seconds : 0.0;
    std::fprintf(stderr, "[%d prompt tokens in %.2f s, %d generated at %.1f tok/s, finish: %s, sparse method %s]\n",
                 num_prompt_tokens, prefill_seconds, num_generated, decode_rate,
                 std::string(finish_reason_name(last.finish_reason)).c_str(), opts.engine.sparse_method.c_str());
  }
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand("generate", "generate text from a prompt, streamed token by token");
  opts->model.add_to(*cmd);
  add_sampling_options(*cmd, opts->sampling, 256);
  cmd->add_option("--prompt,-p", opts->prompt, "the prompt text")->required();
  cmd->add_flag("--chat", opts->chat, "wrap the prompt as a user turn in the model's chat template");
  cmd->add_option("--system", opts->system, "system prompt (with --chat)");
  cmd->add_flag("--quiet-stats", opts->quiet_stats, "do not print timing statistics to stderr");
  add_engine_options(*cmd, opts->engine);
  cmd->callback([opts, &exit_code] { exit_code = run_generate(*opts); });
}

}  // namespace se::cli
