// `sparse-engine eval`: the quality of each sparse method and budget against `vanilla` (a command that prints a
// table, not a test). Two tasks, per model:
//  * long text: each window of --context + --continuation tokens of a real document is prefilled through the
//    method for its first --context tokens (in chunks, as the engine does), then its next --continuation tokens
//    are teacher-forced as decode steps; every step's logits are compared with vanilla's on the same tokens
//    (top-1 agreement and KL(vanilla || method));
//  * passkey retrieval: a passkey hidden at several depths of filler text, answered greedily.
// Budgets are fractions of each prompt, turned into each method's own key by eval_budget.h. The model is driven
// through TeacherForcedSequence (the method's cache under a SparseController, no engine thread), so teacher
// forcing is exact.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/engine_options.h"
#include "cli/eval_budget.h"
#include "cli/eval_tasks.h"
#include "cli/model_options.h"
#include "engine/engine.h"
#include "engine/teacher_forcing.h"
#include "sparse/method_registry.h"

namespace se::cli {

namespace {

using Clock = std::chrono::steady_clock;

// Prose from Debian-packaged documentation (base-files ships the licenses on every Debian system).
const std::vector<std::string> kDefaultTexts = {
    "/usr/share/common-licenses/GPL-3",
    "/usr/share/common-licenses/LGPL-2.1",
    "/usr/share/common-licenses/GFDL-1.3",
    "/usr/share/common-licenses/MPL-1.1",
};

struct EvalOptions {
  std::vector<std::string> models = {"default"};
  std::string load_format = "auto";
  std::vector<std::string> methods;  // empty: every registered method
  std::vector<double> budgets = {0.125, 0.25, 0.5};
  int context = 4096;
  int continuation = 64;
  std::vector<std::string> texts = kDefaultTexts;
  std::vector<int> passkey_lengths = {2048, 4096, 8192};
  std::vector<double> passkey_depths = {0.1, 0.5, 0.9};
  int passkey_answer_tokens = 8;
  bool passkey_chat = false;
  bool no_passkey = false;
  uint64_t seed = 0;
  int prefill_chunk = EngineConfig{}.max_num_batched_tokens;
  int page_size = EngineConfig{}.page_size;
  std::vector<std::string> budget_keys;     // KEY=KIND
  std::vector<std::string> method_configs;  // NAME=JSON
  std::string output;
};

// One table row: a method at one budget (or at its defaults), and what it scored.
struct Row {
  std::string method;
  nlohmann::json base_config = nlohmann::json::object();  // from --method-config
  std::optional<BudgetKey> key;
  double fraction = 1.0;  // of each prompt; meaningful with `key`

  int64_t num_steps = 0;
  int64_t num_agree = 0;
  double kl_sum = 0.0;
  double held_sum = 0.0;  // held / dense pages at the end of each long-text run
  int num_held = 0;
  std::map<int32_t, std::pair<int, int>> passkey;  // prompt length -> (found, asked)
  double seconds = 0.0;
  std::string error;

  // The configuration for a prompt of `num_tokens` tokens.
  nlohmann::json config_for(int32_t num_tokens) const {
    nlohmann::json config = base_config;
    if (key) config[key->key] = budget_value(*key, fraction, num_tokens);
    return config;
  }
};

std::string percent(double value) { return fmt::format("{:.1f}%", 100.0 * value); }

// The command line this process runs, shell-quoted where needed (for the report).
std::string command_line() {
  std::ifstream file("/proc/self/cmdline", std::ios::binary);
  std::string out, arg;
  while (std::getline(file, arg, '\0')) {
    const bool plain = !arg.empty() && arg.find_first_not_of(
                                           "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                           "0123456789-_./,=:+@%") == std::string::npos;
    std::string quoted = arg;
    if (!plain) {
      quoted = "'";
      for (char c : arg) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
      quoted += "'";
    }
    out += (out.empty() ? "" : " ") + quoted;
  }
  return out;
}

// The rows in registry order, each method's --method-config merged in; every configuration is built once here
// so a bad one fails before any model loads.
Result<std::vector<Row>> plan_rows(const EvalOptions& o) {
  std::vector<BudgetKey> overrides;
  for (const std::string& spec : o.budget_keys) {
    SE_ASSIGN_OR_RETURN(BudgetKey key, parse_budget_key(spec));
    overrides.push_back(std::move(key));
  }
  const std::vector<BudgetKey> table = merge_budget_keys(default_budget_keys(), overrides);
  std::map<std::string, nlohmann::json> base_configs;
  for (const std::string& spec : o.method_configs) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0) return invalid_argument("--method-config '{}' must read NAME=JSON", spec);
    nlohmann::json config = nlohmann::json::parse(spec.substr(eq + 1), nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object())
      return invalid_argument("--method-config '{}': the part after '=' must be a JSON object", spec);
    base_configs[spec.substr(0, eq)] = std::move(config);
  }
  std::vector<std::string> names = o.methods;
  if (names.empty())
    for (const MethodInfo& info : registered_methods()) names.push_back(info.name);
  for (const auto& [name, config] : base_configs)
    if (std::find(names.begin(), names.end(), name) == names.end())
      return invalid_argument("--method-config names '{}', which --methods does not evaluate", name);
  for (double fraction : o.budgets)
    if (!(fraction > 0.0 && fraction <= 1.0)) return invalid_argument("--budgets: {} is not in (0, 1]", fraction);

  std::vector<Row> rows;
  for (const std::string& name : names) {
    Row base;
    base.method = name;
    if (auto it = base_configs.find(name); it != base_configs.end()) base.base_config = it->second;
    SE_ASSIGN_OR_RETURN(std::unique_ptr<MethodRuntime> method, create_method(name, base.base_config));
    base.key = find_budget_key(method->config(), table);
    if (base.key && base.base_config.contains(base.key->key))
      return invalid_argument("--method-config for '{}' sets its budget key '{}', which --budgets sets", name,
                              base.key->key);
    if (!base.key) {
      rows.push_back(base);
      continue;
    }
    for (double fraction : o.budgets) {
      Row row = base;
      row.fraction = fraction;
      SE_RETURN_IF_ERROR(create_method(name, row.config_for(o.context)).status());
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

std::string row_label(const Row& row) {
  return row.key ? fmt::format("{} {}", row.method, percent(row.fraction)) : row.method;
}

// What every run on one model shares.
struct ModelContext {
  const EvalOptions& o;
  const ModelBundle& bundle;
  MethodEnvironment environment;  // as the engine gives it to methods

  Result<std::unique_ptr<TeacherForcedSequence>> start(const std::string& method, nlohmann::json config,
                                                       int32_t max_tokens) const {
    return TeacherForcedSequence::create(
        *bundle.model,
        TeacherForcingOptions{method, std::move(config), o.page_size, o.prefill_chunk, max_tokens, environment});
  }
};

// Vanilla's log-probabilities at every teacher-forced decode step of `window`: [continuation][vocab].
Result<std::vector<std::vector<float>>> reference_steps(const ModelContext& ctx, const TextWindow& window) {
  const auto ids = std::span<const int32_t>(window.ids);
  SE_ASSIGN_OR_RETURN(auto run, ctx.start("vanilla", nullptr, static_cast<int32_t>(ids.size())));
  SE_RETURN_IF_ERROR(run->prefill(ids.first(static_cast<size_t>(ctx.o.context))).status());
  std::vector<std::vector<float>> steps;
  for (int i = 0; i < ctx.o.continuation; ++i) {
    SE_ASSIGN_OR_RETURN(Tensor logits, run->decode(ids[static_cast<size_t>(ctx.o.context + i)]));
    steps.emplace_back(logits.data<float>(), logits.data<float>() + logits.numel());
    log_softmax_in_place(steps.back());
  }
  return steps;
}

// One method on one window: accumulates agreement and KL against `reference` into `row`.
Status score_window(const ModelContext& ctx, const TextWindow& window, const std::vector<std::vector<float>>& reference,
                    Row& row) {
  const auto ids = std::span<const int32_t>(window.ids);
  SE_ASSIGN_OR_RETURN(auto run, ctx.start(row.method, row.config_for(ctx.o.context), static_cast<int32_t>(ids.size())));
  SE_RETURN_IF_ERROR(run->prefill(ids.first(static_cast<size_t>(ctx.o.context))).status());
  for (int i = 0; i < ctx.o.continuation; ++i) {
    SE_ASSIGN_OR_RETURN(Tensor logits, run->decode(ids[static_cast<size_t>(ctx.o.context + i)]));
    const StepComparison step =
        compare_step(reference[static_cast<size_t>(i)], {logits.data<float>(), static_cast<size_t>(logits.numel())});
    row.num_steps += 1;
    row.num_agree += step.top1_agrees ? 1 : 0;
    row.kl_sum += step.kl;
  }
  row.held_sum += static_cast<double>(run->num_held_pages()) / static_cast<double>(run->num_dense_pages());
  row.num_held += 1;
  return Status::ok();
}

// One method on one passkey prompt: greedy answer, then whether it names the passkey.
Result<bool> answer_passkey(const ModelContext& ctx, const PasskeyPrompt& prompt, const Row& row, std::string& answer) {
  const int32_t num_prompt = static_cast<int32_t>(prompt.ids.size());
  const int num_answer = ctx.o.passkey_answer_tokens;
  SE_ASSIGN_OR_RETURN(auto run, ctx.start(row.method, row.config_for(num_prompt), num_prompt + num_answer));
  SE_ASSIGN_OR_RETURN(Tensor logits, run->prefill(prompt.ids));
  std::vector<int32_t> output;
  for (int i = 0; i < num_answer; ++i) {
    const float* row_logits = logits.data<float>();
    const int32_t token = static_cast<int32_t>(std::max_element(row_logits, row_logits + logits.numel()) - row_logits);
    if (ctx.bundle.tokenizer->is_eog(token)) break;
    output.push_back(token);
    if (i + 1 == num_answer) break;
    SE_ASSIGN_OR_RETURN(logits, run->decode(token));
  }
  SE_ASSIGN_OR_RETURN(answer, ctx.bundle.tokenizer->decode(output, /*skip_special=*/true));
  return passkey_found(answer, prompt.passkey);
}

// Runs `fn(row)` for every row still without an error, timing it and recording a failure as the row's error.
template <typename Fn>
void for_each_row(std::vector<Row>& rows, Fn&& fn) {
  for (Row& row : rows) {
    if (!row.error.empty()) continue;
    const Clock::time_point start = Clock::now();
    const Status status = fn(row);
    row.seconds += std::chrono::duration<double>(Clock::now() - start).count();
    if (!status.is_ok()) {
      row.error = status.message();
      std::fprintf(stderr, "  %s: error: %s\n", row_label(row).c_str(), row.error.c_str());
    }
  }
}

struct ModelReport {
  std::string title;
  std::string setup;
  std::vector<int32_t> passkey_lengths;
  std::vector<Row> rows;
};

Result<ModelReport> evaluate_model(const EvalOptions& o, const std::string& model_arg, std::vector<Row> rows) {
  ModelOptions model_options;
  model_options.model = model_arg;
  model_options.load_format = o.load_format;
  SE_ASSIGN_OR_RETURN(ModelBundle bundle, model_options.load());
  if (!bundle.tokenizer) return invalid_argument("model '{}' has no tokenizer", bundle.name);
  const Model& model = *bundle.model;
  const ModelContext ctx{o, bundle, method_environment(bundle)};
  const int32_t max_positions = model.config().max_position_embeddings;
  if (o.context + o.continuation > max_positions)
    return invalid_argument("--context {} + --continuation {} exceed the context of {} ({} tokens)", o.context,
                            o.continuation, bundle.name, max_positions);
  ModelReport report;
  report.title = bundle.name == "default"
                     ? fmt::format("default ({})", std::filesystem::path(bundle.path).filename().string())
                     : bundle.name;

  std::vector<std::string> skipped;
  SE_ASSIGN_OR_RETURN(std::vector<TextWindow> windows,
                      load_text_windows(*bundle.tokenizer, o.texts, o.context + o.continuation, skipped));
  for (const std::string& s : skipped)
    std::fprintf(stderr, "[%s] skipped %s: too short\n", report.title.c_str(), s.c_str());
  for (size_t w = 0; w < windows.size(); ++w) {
    const TextWindow& window = windows[w];
    std::fprintf(stderr, "[%s] text %zu/%zu %s\n", report.title.c_str(), w + 1, windows.size(), window.path.c_str());
    SE_ASSIGN_OR_RETURN(auto reference, reference_steps(ctx, window));
    for_each_row(rows, [&](Row& row) {
      const int64_t steps_before = row.num_steps, agree_before = row.num_agree;
      const double kl_before = row.kl_sum;
      SE_RETURN_IF_ERROR(score_window(ctx, window, reference, row));
      const double n = static_cast<double>(row.num_steps - steps_before);
      std::fprintf(stderr, "  %-24s agreement %6s  KL %.4f\n", row_label(row).c_str(),
                   percent(static_cast<double>(row.num_agree - agree_before) / n).c_str(),
                   (row.kl_sum - kl_before) / n);
      return Status::ok();
    });
  }

  // Passkey lengths beyond the model's context are clamped to it (the answer needs room too).
  const int32_t max_passkey = max_positions - o.passkey_answer_tokens - (o.passkey_chat ? 64 : 0);
  for (int length : o.no_passkey ? std::vector<int>{} : o.passkey_lengths) {
    const int32_t num_tokens = std::min<int32_t>(length, max_passkey);
    if (std::find(report.passkey_lengths.begin(), report.passkey_lengths.end(), num_tokens) ==
        report.passkey_lengths.end())
      report.passkey_lengths.push_back(num_tokens);
  }
  uint64_t trial = 0;
  for (int32_t num_tokens : report.passkey_lengths) {
    for (double depth : o.passkey_depths) {
      SE_ASSIGN_OR_RETURN(PasskeyPrompt prompt,
                          make_passkey_prompt(bundle, num_tokens, depth, o.seed * 1000003 + trial++, o.passkey_chat));
      std::fprintf(stderr, "[%s] passkey %d tokens, depth %.2f (%s)\n", report.title.c_str(), num_tokens, prompt.depth,
                   prompt.passkey.c_str());
      for_each_row(rows, [&](Row& row) {
        std::string answer;
        SE_ASSIGN_OR_RETURN(bool found, answer_passkey(ctx, prompt, row, answer));
        auto& [num_found, num_asked] = row.passkey[num_tokens];
        num_found += found ? 1 : 0;
        num_asked += 1;
        std::fprintf(stderr, "  %-24s %s %s\n", row_label(row).c_str(), found ? "found " : "missed",
                     nlohmann::json(answer).dump().c_str());
        return Status::ok();
      });
    }
  }

  std::string lengths;
  for (int32_t l : report.passkey_lengths) lengths += (lengths.empty() ? "" : ", ") + std::to_string(l);
  std::string depths;
  for (double d : o.passkey_depths) depths += (depths.empty() ? "" : ", ") + fmt::format("{:g}", d);
  std::string texts;
  for (const TextWindow& w : windows) texts += (texts.empty() ? "" : ", ") + ("`" + w.path + "`");
  report.setup = fmt::format(
      "Long text: {} window(s) of {} context + {} teacher-forced tokens ({}). Passkey: {} prompt tokens x depths "
      "{}, {} prompt, greedy, {} answer tokens.",
      windows.size(), o.context, o.continuation, texts.empty() ? "none long enough" : texts,
      lengths.empty() ? "no" : lengths, depths, o.passkey_chat ? "chat-template" : "plain", o.passkey_answer_tokens);
  report.rows = std::move(rows);
  return report;
}

std::string render_report(const EvalOptions& o, const std::vector<ModelReport>& reports, double seconds) {
  std::string md;
  md += "# Sparse methods against vanilla: next-token agreement, KL and passkey retrieval\n\n";
  md += fmt::format("Produced by `sparse-engine eval` in {:.0f} s:\n\n```sh\n{}\n```\n\n", seconds, command_line());
  md +=
      "Long text: each window's first `--context` tokens are prefilled through the method (in chunks of "
      "`--prefill-chunk` tokens, as the engine does), then its next `--continuation` tokens are teacher-forced as "
      "decode steps; every decode step's logits are compared with vanilla's on the same tokens. *Top-1 "
      "agreement*: the share of steps whose argmax equals vanilla's. *Mean KL*: KL(vanilla || method) in nats, "
      "averaged over steps. *KV held*: pages the sequence holds after the run over what vanilla holds. Passkey: "
      "found / asked per prompt length. The budget is a fraction of each prompt (the context for long text, the "
      "whole prompt for passkey), set through the method's budget key.\n";
  for (const ModelReport& report : reports) {
    md += fmt::format("\n## {}\n\n{}\n\n", report.title, report.setup);
    md += "| method | budget | config (long text) | top-1 agreement | mean KL | KV held |";
    for (int32_t l : report.passkey_lengths) md += fmt::format(" passkey {} |", l);
    md += " time (s) |\n|---|---|---|---|---|---|";
    for (size_t i = 0; i < report.passkey_lengths.size(); ++i) md += "---|";
    md += "---|\n";
    for (const Row& row : report.rows) {
      const nlohmann::json config = row.config_for(o.context);
      std::string config_text = config.empty() ? "defaults" : "`" + config.dump() + "`";
      md += fmt::format("| {} | {} | {} |", row.method, row.key ? percent(row.fraction) : "—", config_text);
      if (!row.error.empty()) {
        md += fmt::format(" error: {} |", row.error);
        for (size_t i = 0; i < report.passkey_lengths.size() + 2; ++i) md += " |";
        md += fmt::format(" {:.0f} |\n", row.seconds);
        continue;
      }
      if (row.num_steps > 0) {
        md += fmt::format(" {} | {:.4f} | {} |",
                          percent(static_cast<double>(row.num_agree) / static_cast<double>(row.num_steps)),
                          row.kl_sum / static_cast<double>(row.num_steps), percent(row.held_sum / row.num_held));
      } else {
        md += " — | — | — |";
      }
      for (int32_t l : report.passkey_lengths) {
        auto it = row.passkey.find(l);
        md += it == row.passkey.end() ? " — |" : fmt::format(" {}/{} |", it->second.first, it->second.second);
      }
      md += fmt::format(" {:.0f} |\n", row.seconds);
    }
  }
  return md;
}

int run_eval(const EvalOptions& o) {
  if (o.context < 1 || o.continuation < 1)
    return report_usage_error(invalid_argument("--context and --continuation must be positive"));
  if (o.prefill_chunk < 1) return report_usage_error(invalid_argument("--prefill-chunk must be positive"));
  for (double depth : o.passkey_depths)
    if (!(depth >= 0.0 && depth <= 1.0))
      return report_usage_error(invalid_argument("--passkey-depths: {} is not in [0, 1]", depth));
  auto rows = plan_rows(o);
  if (!rows.is_ok()) return report_usage_error(rows.status());
  const Clock::time_point start = Clock::now();
  std::vector<ModelReport> reports;
  for (const std::string& model : o.models) {
    auto report = evaluate_model(o, model, *rows);
    if (!report.is_ok()) return report_error(report.status());
    reports.push_back(std::move(*report));
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const std::string md = render_report(o, reports, seconds);
  std::fwrite(md.data(), 1, md.size(), stdout);
  if (!o.output.empty()) {
    std::ofstream out(o.output, std::ios::binary);
    out << md;
    if (!out) return report_error(internal_error("cannot write --output '{}'", o.output));
    std::fprintf(stderr, "wrote %s\n", o.output.c_str());
  }
  return 0;
}

}  // namespace

void add_eval_command(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<EvalOptions>();
  CLI::App* cmd = app.add_subcommand("eval", "quality of the sparse methods against vanilla (agreement, KL, passkey)");
  cmd->add_option("--models", o->models,
                  "models, comma-separated: 'default' (SmolLM2-135M-Instruct), .gguf files, "
                  "HF directories")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--load-format", o->load_format, "auto | gguf | safetensors")->capture_default_str();
  cmd->add_option("--methods", o->methods, "methods, comma-separated (default: every registered method)")
      ->delimiter(',');
  cmd->add_option("--budgets", o->budgets, "budgets as fractions of each prompt, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--context", o->context, "long text: prompt tokens prefilled through the method")
      ->capture_default_str();
  cmd->add_option("--continuation", o->continuation, "long text: tokens teacher-forced as decode steps")
      ->capture_default_str();
  cmd->add_option("--texts", o->texts, "long text: documents, comma-separated (one window each, from the start)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--passkey-lengths", o->passkey_lengths, "passkey prompt lengths in tokens, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--passkey-depths", o->passkey_depths, "passkey depths in [0, 1], comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--passkey-answer-tokens", o->passkey_answer_tokens, "greedy tokens of each passkey answer")
      ->capture_default_str();
  cmd->add_flag("--no-passkey", o->no_passkey, "skip the passkey task");
  cmd->add_flag("--passkey-chat", o->passkey_chat, "ask the passkey through the chat template (default: plain)");
  cmd->add_option("--seed", o->seed, "seed of the passkeys")->capture_default_str();
  cmd->add_option("--prefill-chunk", o->prefill_chunk,
                  "prompt tokens per forward (the engine's "
                  "--max-num-batched-tokens)")
      ->capture_default_str();
  cmd->add_option("--page-size", o->page_size, "tokens per KV page")->capture_default_str();
  cmd->add_option("--budget-key", o->budget_keys,
                  "KEY=tokens|kept|evicted|none: how a config key takes the budget (repeatable; adds to or "
                  "overrides the built-in table)");
  cmd->add_option("--method-config", o->method_configs,
                  "NAME=JSON: extra hyperparameters of one method, under every budget (repeatable)");
  cmd->add_option("--output", o->output, "also write the Markdown report here (e.g. docs/quality.md)");
  cmd->callback([o, &exit_code] { exit_code = run_eval(*o); });
}

}  // namespace se::cli
