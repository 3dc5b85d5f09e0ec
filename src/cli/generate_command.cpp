// `sparse-engine generate`: one prompt (or one chat turn) in, streamed text out.
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "cli/sampling_options.h"
#include "engine/sequence_generator.h"

namespace se::cli {

namespace {

struct GenerateOptions {
  ModelOptions model;
  SamplingParams sampling;
  std::string prompt;
  std::string system;
  bool chat = false;
  bool quiet_stats = false;
};

int run_generate(const GenerateOptions& opts) {
  auto bundle = opts.model.load();
  if (!bundle.is_ok()) return report_error(bundle.status());
  if (!bundle->tokenizer) return report_error(invalid_argument("model '{}' has no tokenizer", bundle->name));
  const Tokenizer& tokenizer = *bundle->tokenizer;

  std::vector<int32_t> prompt_ids;
  if (opts.chat) {
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!opts.system.empty()) messages.push_back({{"role", "system"}, {"content", opts.system}});
    messages.push_back({{"role", "user"}, {"content", opts.prompt}});
    auto rendered = bundle->render_chat(messages);
    if (!rendered.is_ok()) return report_error(rendered.status());
    // The template writes any BOS itself, as HF's apply_chat_template does.
    prompt_ids = tokenizer.encode(*rendered, /*add_special=*/false, /*parse_special=*/true);
  } else {
    prompt_ids = tokenizer.encode(opts.prompt, /*add_special=*/true, /*parse_special=*/false);
  }

  SequenceGenerator generator(*bundle->model, &tokenizer);
  auto result = generator.generate(prompt_ids, opts.sampling, [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  if (!result.is_ok()) return report_error(result.status());
  std::fputc('\n', stdout);
  if (!opts.quiet_stats) {
    const double decode_rate = result->output_ids.size() > 1 && result->decode_seconds > 0
                                   ? static_cast<double>(result->output_ids.size() - 1) / result->decode_seconds
                                   : 0.0;
    std::fprintf(stderr, "[%d prompt tokens in %.2f s, %zu generated at %.1f tok/s, finish: %s]\n",
                 result->num_prompt_tokens, result->prefill_seconds, result->output_ids.size(), decode_rate,
                 std::string(finish_reason_name(result->finish_reason)).c_str());
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
  cmd->callback([opts, &exit_code] { exit_code = run_generate(*opts); });
}

}  // namespace se::cli
