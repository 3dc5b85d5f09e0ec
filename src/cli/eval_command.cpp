// `sparse-engine eval`: the quality of each sparse method and budget against `vanilla` (a command that prints a
// table, not a test). Per model:
//  * long text: windows of --context + --continuation tokens cut from several real documents (eval_texts.h) are
//    prefilled through the method for their first --context tokens (in chunks, as the engine does), then their
//    next --continuation tokens are teacher-forced as decode steps; every step's logits are compared with
//    vanilla's on the same tokens (top-1 agreement and KL(vanilla || method)), with a t interval over windows;
//    with --self-generated the continuation is instead one vanilla writes itself (greedy or seeded sampling, end of
//    generation ignored), and the budgets are fractions of context + continuation: decode-time compression on the
//    model's own long output (eval_replay.h);
//  * RULER-style tasks (eval_ruler.h) at several prompt lengths and needle depths, the passkey, and key-value
//    tracking fed as decode steps (eval_trace.h), answered greedily and scored exactly, with Wilson intervals;
//    vanilla's own row is the ceiling.
// Each method runs over each KV store of --kv-cache-dtype it can keep its KV in (default: the explicit store), its
// rows labelled with the store. Every finished (model, method, budget, store, task, length, sample) cell is appended
// to --results (eval_results.h), so a rerun with the same configuration skips it and a stopped sweep keeps its cells.
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
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/device_memory.h"
#include "cli/commands.h"
#include "cli/engine_options.h"
#include "cli/eval_budget.h"
#include "cli/eval_replay.h"
#include "cli/eval_results.h"
#include "cli/eval_ruler.h"
#include "cli/eval_stats.h"
#include "cli/eval_tasks.h"
#include "cli/eval_trace.h"
#include "cli/model_options.h"
#include "engine/engine.h"
#include "engine/teacher_forcing.h"
#include "loader/progress_bar.h"
#include "sparse/method_registry.h"

namespace se::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct EvalOptions {
  std::vector<std::string> models = {"default"};
  std::string load_format = "auto";
  Device device = Device::kCpu;
  std::vector<std::string> methods;  // empty: every registered method
  std::vector<double> budgets = {0.125, 0.25, 0.5};
  std::vector<std::string> kv_cache_dtypes = {"auto"};  // the KV stores each method runs over
  int context = 4096;
  int continuation = 256;
  bool self_generated = false;          // the continuation is vanilla's own, not the text's
  float generation_temperature = 0.0f;  // of the self-generated continuation; 0: greedy
  std::vector<std::string> texts;  // empty: default_text_paths()
  int num_windows = 20;
  int windows_per_text = 2;
  bool no_text = false;
  std::vector<std::string> tasks;  // empty: every RULER-style task
  std::vector<int> task_lengths = {4096};
  std::vector<double> task_depths = {0.1, 0.3, 0.5, 0.7, 0.9};
  int samples = 50;
  bool no_tasks = false;
  std::string results;
  std::vector<int> passkey_lengths = {2048, 4096, 8192};
  std::vector<double> passkey_depths = {0.1, 0.5, 0.9};
  int passkey_answer_tokens = 8;
  bool passkey_chat = false;
  std::vector<int> trace_lengths;   // key-value tracking: trace tokens fed as decode steps (empty: none)
  std::vector<int> recall_lengths;  // word recall: prose tokens fed as decode steps (empty: none)
  bool no_passkey = false;
  bool report_only = false;  // render from --results alone, computing nothing
  uint64_t seed = 0;
  int prefill_chunk = EngineConfig{}.max_num_batched_tokens;
  int page_size = EngineConfig{}.page_size;
  std::vector<std::string> budget_keys;     // [METHOD:]KEY=KIND
  std::vector<std::string> method_configs;  // NAME=JSON
  std::string output;
};

// One table row: a method at one budget (or at its defaults), over one KV store.
struct Row {
  std::string method;
  KvStoreKind store = KvStoreKind::kExplicit;
  nlohmann::json base_config = nlohmann::json::object();  // from --method-config
  nlohmann::ordered_json resolved;                        // the method's config under base_config, defaults filled
  std::optional<BudgetKey> key;
  double fraction = 1.0;  // of each prompt; meaningful with `key`

  // The configuration for a sequence whose budget is a fraction of `num_tokens` tokens.
  nlohmann::json config_for(int32_t num_tokens) const {
    nlohmann::json config = base_config;
    if (key) config[key->key] = budget_value(*key, fraction, num_tokens, resolved);
    return config;
  }
};

// The tokens a long-text budget is a fraction of: the context, or with --self-generated the whole sequence at its
// end (what the method holds is then compared with everything vanilla holds).
int32_t text_budget_tokens(const EvalOptions& o) { return o.context + (o.self_generated ? o.continuation : 0); }

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

// The rows, and the (method, store) pairs left out because the method cannot keep its KV in the store (each with
// the reason).
struct Plan {
  std::vector<Row> rows;
  std::vector<std::string> left_out;
};

// The registry's entry of `name` (an empty one for a name the registry lacks, which create_method refuses).
MethodInfo method_info(const std::string& name) {
  for (const MethodInfo& info : registered_methods())
    if (info.name == name) return info;
  return {};
}

// The rows in registry order, each method's --method-config merged in, per method every store in --kv-cache-dtype
// order and then every budget; every configuration is built once here so a bad one fails before any model loads.
Result<Plan> plan_rows(const EvalOptions& o) {
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
  if (o.budgets.empty()) return invalid_argument("--budgets is empty");
  for (double fraction : o.budgets)
    if (!(fraction > 0.0 && fraction <= 1.0)) return invalid_argument("--budgets: {} is not in (0, 1]", fraction);
  std::vector<KvStoreKind> stores;
  for (const std::string& text : o.kv_cache_dtypes) {
    SE_ASSIGN_OR_RETURN(KvStoreKind store, parse_kv_cache_dtype(text));
    if (std::find(stores.begin(), stores.end(), store) != stores.end())
      return invalid_argument("--kv-cache-dtype names the {} store twice", kv_store_kind_name(store));
    stores.push_back(store);
  }

  Plan plan;
  for (const std::string& name : names) {
    Row base;
    base.method = name;
    if (auto it = base_configs.find(name); it != base_configs.end()) base.base_config = it->second;
    // The budget key comes from the method's defaults: --method-config may shrink what the default budget must
    // fit (a per-window budget's window), so the method is built with a budget set.
    SE_ASSIGN_OR_RETURN(std::unique_ptr<MethodRuntime> defaults, create_method(name, nullptr));
    base.resolved = defaults->config();
    SE_ASSIGN_OR_RETURN(base.key, find_budget_key(name, base.resolved, table, method_info(name).budget_per_window));
    if (base.key && base.base_config.contains(base.key->key))
      return invalid_argument("--method-config for '{}' sets its budget key '{}', which --budgets sets", name,
                              base.key->key);
    for (const auto& [key, value] : base.base_config.items()) base.resolved[key] = value;
    // The window a share of it counts from: the default, or the one --method-config sets.
    if (base.key && base.key->kind == BudgetKind::kWindowShare)
      SE_RETURN_IF_ERROR(budget_window(name, base.resolved).status());
    if (base.key) base.fraction = o.budgets.front();
    SE_ASSIGN_OR_RETURN(std::unique_ptr<MethodRuntime> method,
                        create_method(name, base.config_for(text_budget_tokens(o))));
    for (KvStoreKind store : stores) {
      if (Status fits = check_kv_store_supports(store, o.device, method->traits(), name); !fits.is_ok()) {
        plan.left_out.push_back(fits.message());
        continue;
      }
      base.store = store;
      if (!base.key) {
        plan.rows.push_back(base);
        continue;
      }
      for (double fraction : o.budgets) {
        Row row = base;
        row.fraction = fraction;
        SE_RETURN_IF_ERROR(create_method(name, row.config_for(text_budget_tokens(o))).status());
        plan.rows.push_back(std::move(row));
      }
    }
  }
  if (plan.rows.empty()) return invalid_argument("no method runs over the stores asked for");
  return plan;
}

// The method and, unless it is the explicit store, the store it runs over: "METHOD (kivi2)".
std::string method_label(const Row& row) {
  return row.store == KvStoreKind::kExplicit ? row.method
                                             : fmt::format("{} ({})", row.method, kv_store_kind_name(row.store));
}

std::string row_label(const Row& row) {
  return row.key ? fmt::format("{} {}", method_label(row), percent(row.fraction)) : method_label(row);
}

// What every run on one model shares.
struct ModelContext {
  const EvalOptions& o;
  const ModelBundle& bundle;
  MethodEnvironment environment;  // as the engine gives it to methods
  std::string title;

  Result<std::unique_ptr<TeacherForcedSequence>> start(const std::string& method, nlohmann::json config,
                                                       int32_t max_tokens,
                                                       KvStoreKind store = KvStoreKind::kExplicit) const {
    TeacherForcingOptions options{method, std::move(config), o.page_size, o.prefill_chunk, max_tokens, environment};
    options.store = store;
    return TeacherForcedSequence::create(*bundle.model, options);
  }

  // The identity of one cell of the results file: everything its result depends on (the budget is a fraction
  // of `budget_tokens`).
  nlohmann::json cell(const Row& row, std::string_view task, int32_t length, int sample, nlohmann::json settings,
                      int32_t budget_tokens) const {
    settings["method_config"] = row.config_for(budget_tokens);
    settings["page_size"] = o.page_size;
    settings["prefill_chunk"] = o.prefill_chunk;
    // A GPU's bf16 results are not the CPU's; a CPU cell keeps the key results files have always had.
    if (o.device != Device::kCpu) settings["device"] = device_name(o.device);
    return {{"model", title},
            {"method", row.method},
            {"budget", row.key ? row.fraction : 1.0},
            {"kv_cache_dtype", kv_store_kind_name(row.store)},
            {"task", task},
            {"context", length},
            {"sample", sample},
            {"settings", settings}};
  }
};

// A long-text window as every row replays it: its context, the continuation fed as decode steps and vanilla's
// log-probabilities at each of those steps. The continuation is the text's own, or with --self-generated the one
// vanilla writes from the context (window `index` seeds a sampled one).
struct TextReplay {
  std::vector<int32_t> prompt, continuation;
  StepLogProbs reference;
};

SamplingParams generation_sampling(const EvalOptions& o, int index) {
  SamplingParams sampling;
  sampling.temperature = o.generation_temperature;
  sampling.seed = o.seed * 1000003 + static_cast<uint64_t>(index);
  return sampling;
}

Result<TextReplay> text_replay(const ModelContext& ctx, const TextWindow& window, int index) {
  const auto ids = std::span<const int32_t>(window.ids);
  const auto context = static_cast<size_t>(ctx.o.context);
  TextReplay replay;
  replay.prompt.assign(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(context));
  SE_ASSIGN_OR_RETURN(auto run, ctx.start("vanilla", nullptr, ctx.o.context + ctx.o.continuation));
  if (ctx.o.self_generated) {
    SE_ASSIGN_OR_RETURN(WrittenContinuation written,
                        write_continuation(*run, replay.prompt, ctx.o.continuation, generation_sampling(ctx.o, index)));
    replay.continuation = std::move(written.tokens);
    replay.reference = std::move(written.log_probs);
    return replay;
  }
  const auto continuation = ids.subspan(context, static_cast<size_t>(ctx.o.continuation));
  replay.continuation.assign(continuation.begin(), continuation.end());
  SE_ASSIGN_OR_RETURN(replay.reference, forced_log_probs(*run, replay.prompt, replay.continuation));
  return replay;
}

// One method on one window against vanilla: {"steps", "agree", "kl", "held"} (kl: mean over steps; held:
// held / dense pages at the end).
Result<nlohmann::json> score_window(const ModelContext& ctx, const TextReplay& replay, const Row& row) {
  SE_ASSIGN_OR_RETURN(auto run, ctx.start(row.method, row.config_for(text_budget_tokens(ctx.o)),
                                          ctx.o.context + ctx.o.continuation, row.store));
  SE_ASSIGN_OR_RETURN(ReplayScore score, replay_against(*run, replay.prompt, replay.continuation, replay.reference));
  return nlohmann::json{
      {"steps", score.steps}, {"agree", score.agree}, {"kl", score.mean_kl}, {"held", run->held_bytes_fraction()}};
}

// One method on one prompt, prefilled, and `forced` fed after it as decode steps: its greedy answer of at most
// `num_answer` tokens (stopping at end of generation). The budget is a fraction of the prompt and forced tokens.
Result<std::string> greedy_answer(const ModelContext& ctx, const std::vector<int32_t>& prompt,
                                  const std::vector<int32_t>& forced, int num_answer, const Row& row) {
  const auto num_fed = static_cast<int32_t>(prompt.size() + forced.size());
  SE_ASSIGN_OR_RETURN(auto run, ctx.start(row.method, row.config_for(num_fed), num_fed + num_answer, row.store));
  SE_ASSIGN_OR_RETURN(Tensor logits, run->prefill(prompt));
  for (int32_t token : forced) {
    SE_ASSIGN_OR_RETURN(logits, run->decode(token));
  }
  std::vector<int32_t> output;
  for (int i = 0; i < num_answer; ++i) {
    const float* row_logits = logits.data<float>();
    const int32_t token = static_cast<int32_t>(std::max_element(row_logits, row_logits + logits.numel()) - row_logits);
    if (ctx.bundle.tokenizer->is_eog(token)) break;
    output.push_back(token);
    if (i + 1 == num_answer) break;
    SE_ASSIGN_OR_RETURN(logits, run->decode(token));
  }
  return ctx.bundle.tokenizer->decode(output, /*skip_special=*/true);
}

// One prompt of a scored task, as every row answers it.
struct PromptCase {
  std::string task;
  int32_t length = 0;  // the requested prompt length (the cell's context)
  int sample = 0;
  std::vector<int32_t> ids;
  RulerSample scored;  // answers (and, for RULER tasks, the rest of the sample)
  int answer_tokens = 0;
  nlohmann::json settings;      // what the cell's result depends on besides the method
  std::vector<int32_t> forced;  // fed as decode steps after the prompt, before the answer
  int32_t budget_tokens = 0;    // what the budget is a fraction of
};

// A row's results per (task, length), aggregated from the results file.
struct TaskScore {
  int64_t correct = 0, total = 0;
  double seconds = 0.0;
};
struct WindowScores {
  std::vector<double> agreement, kl, held;
  double seconds = 0.0;
};

struct ModelReport {
  std::string title;
  std::string setup;
  std::vector<std::pair<std::string, int32_t>> task_columns;  // (task, length), in plan order
  std::vector<Row> rows;
  std::vector<WindowScores> text;                                          // per row
  std::vector<std::map<std::pair<std::string, int32_t>, TaskScore>> tasks;  // per row
  std::vector<std::string> errors;                                         // per row
  int64_t cells_run = 0, cells_reused = 0, cells_missing = 0;
};

// Finds `cell` in `results` or computes it with `fn` (which returns the result object) and records it. Under
// --report-only a cell not in the file is counted missing and comes back empty.
template <typename Fn>
Result<std::optional<nlohmann::json>> cell_result(const EvalOptions& o, ResultsFile& results,
                                                  const nlohmann::json& cell, ModelReport& report, Fn&& fn) {
  if (const nlohmann::json* found = results.find(cell)) {
    report.cells_reused += 1;
    return std::optional<nlohmann::json>(*found);
  }
  if (o.report_only) {
    report.cells_missing += 1;
    return std::optional<nlohmann::json>();
  }
  const Clock::time_point start = Clock::now();
  SE_ASSIGN_OR_RETURN(nlohmann::json result, fn());
  result["seconds"] = std::chrono::duration<double>(Clock::now() - start).count();
  SE_RETURN_IF_ERROR(results.append(cell, result));
  report.cells_run += 1;
  return std::optional<nlohmann::json>(std::move(result));
}

// The long-text windows `results` holds cells of for model `title` under this context and continuation (the text's
// own, or with --self-generated vanilla's), each at
// the index (the cell's sample) it was scored under, at most --windows. A report drawn from the file alone takes its
// windows from there: which texts /usr/share/doc holds differs between machines, so the machine that renders may
// lack those of the one that computed.
std::vector<TextWindow> recorded_windows(const ResultsFile& results, const EvalOptions& o, const std::string& title) {
  std::map<int, TextWindow> by_index;
  for (const nlohmann::json& record : results.records()) {
    const nlohmann::json& cell = record["cell"];
    const nlohmann::json& settings = cell["settings"];
    const int index = cell["sample"].get<int>();
    if (cell["model"] != title || cell["task"] != "text" || cell["context"] != o.context ||
        settings.value("continuation", -1) != o.continuation ||
        settings.value("self_generated", false) != o.self_generated || index >= o.num_windows)
      continue;
    by_index[index] = {settings["text"].get<std::string>(), settings["offset"].get<int64_t>(), {}};
  }
  std::vector<TextWindow> windows(static_cast<size_t>(by_index.empty() ? 0 : by_index.rbegin()->first + 1));
  for (auto& [index, window] : by_index) windows[static_cast<size_t>(index)] = std::move(window);
  return windows;
}

Result<ModelReport> evaluate_model(const EvalOptions& o, const std::string& model_arg, const std::vector<Row>& rows,
                                   ResultsFile& results) {
  ModelOptions model_options;
  model_options.model = model_arg;
  model_options.load_format = o.load_format;
  // A report alone needs the tokenizer and the config, not the device: the cells keep --device in their key.
  SE_ASSIGN_OR_RETURN(ModelBundle bundle, model_options.load(o.report_only ? Device::kCpu : o.device));
  if (!bundle.tokenizer) return invalid_argument("model '{}' has no tokenizer", bundle.name);
  const Model& model = *bundle.model;
  const Tokenizer& tokenizer = *bundle.tokenizer;
  const int32_t max_positions = model.config().max_position_embeddings;
  if (!o.no_text && o.context + o.continuation > max_positions)
    return invalid_argument("--context {} + --continuation {} exceed the context of {} ({} tokens)", o.context,
                            o.continuation, bundle.name, max_positions);
  ModelReport report;
  report.title = bundle.name == "default"
                     ? fmt::format("default ({})", std::filesystem::path(bundle.path).filename().string())
                     : bundle.name;
  report.rows = rows;
  report.text.resize(rows.size());
  report.tasks.resize(rows.size());
  report.errors.resize(rows.size());
  const ModelContext ctx{o, bundle, method_environment(bundle), report.title};

  std::vector<TextWindow> windows;
  if (!o.no_text && o.report_only) {
    windows = recorded_windows(results, o, report.title);
  } else if (!o.no_text) {
    std::vector<std::string> skipped;
    // A self-generated continuation needs only the context from the text.
    SE_ASSIGN_OR_RETURN(windows, load_text_windows(tokenizer, o.texts.empty() ? default_text_paths() : o.texts,
                                                   o.context + (o.self_generated ? 0 : o.continuation), o.num_windows,
                                                   o.windows_per_text, skipped));
    if (!skipped.empty())
      std::fprintf(stderr, "[%s] %zu text(s) too short for one window\n", report.title.c_str(), skipped.size());
  }

  // The prompts of the scored tasks. Lengths beyond the model's context are clamped to it (the answer needs
  // room too).
  std::vector<PromptCase> cases;
  auto clamp_length = [&](int length, int answer_tokens) {
    return std::min<int32_t>(length, max_positions - answer_tokens - (o.passkey_chat ? 64 : 0));
  };
  const std::optional<int32_t> bos =
      tokenizer.add_bos() ? tokenizer.bos_id() : std::optional<int32_t>{};
  const EncodeFn encode = [&](std::string_view text) { return tokenizer.encode(text, false, false); };
  std::vector<RulerTask> tasks;
  for (const std::string& name : o.no_tasks ? std::vector<std::string>{} : o.tasks) {
    SE_ASSIGN_OR_RETURN(RulerTask task, parse_ruler_task(name));
    tasks.push_back(task);
  }
  if (!o.no_tasks && o.tasks.empty()) tasks = all_ruler_tasks();
  for (RulerTask task : tasks) {
    const int answer_tokens = ruler_answer_tokens(task);
    for (int requested : o.task_lengths) {
      const int32_t length = clamp_length(requested, answer_tokens);
      for (int s = 0; s < o.samples; ++s) {
        const double depth = o.task_depths[static_cast<size_t>(s) % o.task_depths.size()];
        // Distinct per task too, so the needle tasks do not share keys and values sample by sample.
        const uint64_t seed =
            ((o.seed * 1000003 + static_cast<uint64_t>(task) + 1) * 1000003 + static_cast<uint64_t>(length)) *
                1000003 +
            static_cast<uint64_t>(s);
        SE_ASSIGN_OR_RETURN(RulerSample sample, make_ruler_sample(task, encode, bos, length, depth, seed));
        PromptCase c{std::string(ruler_task_name(task)),
                     length,
                     s,
                     sample.ids,
                     sample,
                     answer_tokens,
                     {{"depth", depth}, {"seed", seed}, {"answer_tokens", answer_tokens}},
                     {},
                     length};
        cases.push_back(std::move(c));
      }
    }
  }
  uint64_t trial = 0;
  for (int requested : o.no_passkey ? std::vector<int>{} : o.passkey_lengths) {
    const int32_t length = clamp_length(requested, o.passkey_answer_tokens);
    for (size_t d = 0; d < o.passkey_depths.size(); ++d) {
      const uint64_t seed = o.seed * 1000003 + trial++;
      SE_ASSIGN_OR_RETURN(PasskeyPrompt prompt,
                          make_passkey_prompt(bundle, length, o.passkey_depths[d], seed, o.passkey_chat));
      RulerSample scored;
      scored.answers = {prompt.passkey};
      cases.push_back({"passkey",
                       length,
                       static_cast<int>(d),
                       prompt.ids,
                       scored,
                       o.passkey_answer_tokens,
                       {{"depth", o.passkey_depths[d]},
                        {"seed", seed},
                        {"answer_tokens", o.passkey_answer_tokens},
                        {"chat", o.passkey_chat}},
                       {},
                       length});
    }
  }
  // A sample whose trace is fed as decode steps after its prompt, then answered in `answer_tokens` greedy tokens.
  const auto add_trace_case = [&](const char* task, const char* option, int32_t length, int s, TraceSample sample,
                                  int answer_tokens, nlohmann::json settings) -> Status {
    const auto num_fed = static_cast<int32_t>(sample.prompt.size() + sample.trace.size());
    if (num_fed + answer_tokens > max_positions)
      return invalid_argument("{} {}: {} tokens and the answer exceed the context of {} ({} tokens)", option, length,
                              num_fed, bundle.name, max_positions);
    RulerSample scored;
    scored.answers = {sample.answer};
    settings["answer_tokens"] = answer_tokens;
    cases.push_back({task, length, s, std::move(sample.prompt), scored, answer_tokens, std::move(settings),
                     std::move(sample.trace), num_fed});
    return Status::ok();
  };
  for (int length : o.trace_lengths) {
    for (int s = 0; s < o.samples; ++s) {
      const double depth = o.task_depths[static_cast<size_t>(s) % o.task_depths.size()];
      const uint64_t seed =
          ((o.seed * 1000003 + 7919) * 1000003 + static_cast<uint64_t>(length)) * 1000003 + static_cast<uint64_t>(s);
      SE_ASSIGN_OR_RETURN(TraceSample sample, make_trace_sample(encode, bos, length, depth, seed));
      SE_RETURN_IF_ERROR(add_trace_case("kv_trace", "--trace-lengths", length, s, std::move(sample), kTraceAnswerTokens,
                                        {{"depth", depth}, {"seed", seed}}));
    }
  }
  for (int length : o.recall_lengths) {
    // The filler of sample s: the s-th window of `length` tokens, round-robin over the long-text documents.
    std::vector<std::string> skipped;
    SE_ASSIGN_OR_RETURN(const std::vector<TextWindow> fillers,
                        load_text_windows(tokenizer, o.texts.empty() ? default_text_paths() : o.texts,
                                          length + (bos ? 1 : 0), o.samples, /*per_text=*/1, skipped));
    if (fillers.empty() && o.samples > 0)
      return invalid_argument("--recall-lengths {}: no text holds that many tokens", length);
    for (int s = 0; s < o.samples; ++s) {
      const double depth = o.task_depths[static_cast<size_t>(s) % o.task_depths.size()];
      const uint64_t seed =
          ((o.seed * 1000003 + 104729) * 1000003 + static_cast<uint64_t>(length)) * 1000003 + static_cast<uint64_t>(s);
      const TextWindow& filler = fillers[static_cast<size_t>(s) % fillers.size()];
      const std::span<const int32_t> prose = std::span<const int32_t>(filler.ids).subspan(bos ? 1 : 0);
      SE_ASSIGN_OR_RETURN(TraceSample sample, make_recall_sample(encode, bos, prose, depth, seed));
      SE_RETURN_IF_ERROR(
          add_trace_case("recall", "--recall-lengths", length, s, std::move(sample), kRecallAnswerTokens,
                         {{"depth", depth}, {"seed", seed}, {"text", filler.path}, {"offset", filler.offset}}));
    }
  }
  for (const PromptCase& c : cases) {
    const auto column = std::make_pair(c.task, c.length);
    if (std::find(report.task_columns.begin(), report.task_columns.end(), column) == report.task_columns.end())
      report.task_columns.push_back(column);
  }

  ProgressBar progress(report.title, static_cast<int64_t>((windows.size() + cases.size()) * rows.size()),
                       /*enabled=*/true);
  auto fail = [&](size_t r, const Status& status) {
    if (!report.errors[r].empty()) return;
    report.errors[r] = status.message();
    std::fprintf(stderr, "\n  %s: error: %s\n", row_label(rows[r]).c_str(), report.errors[r].c_str());
  };

  for (size_t w = 0; w < windows.size(); ++w) {
    const TextWindow& window = windows[w];
    nlohmann::json settings = {{"continuation", o.continuation}, {"text", window.path}, {"offset", window.offset}};
    if (o.self_generated) {
      settings["self_generated"] = true;
      settings["temperature"] = o.generation_temperature;
      if (o.generation_temperature > 0.0f) settings["seed"] = *generation_sampling(o, static_cast<int>(w)).seed;
    }
    std::optional<TextReplay> replay;  // computed once, only when a cell needs it
    for (size_t r = 0; r < rows.size(); ++r) {
      progress.advance();
      if (!report.errors[r].empty()) continue;
      const nlohmann::json cell =
          ctx.cell(rows[r], "text", o.context, static_cast<int>(w), settings, text_budget_tokens(o));
      auto result = cell_result(o, results, cell, report, [&]() -> Result<nlohmann::json> {
        if (!replay) {
          SE_ASSIGN_OR_RETURN(TextReplay computed, text_replay(ctx, window, static_cast<int>(w)));
          replay = std::move(computed);
        }
        return score_window(ctx, *replay, rows[r]);
      });
      if (!result.is_ok()) {
        fail(r, result.status());
        continue;
      }
      if (!*result) continue;
      const nlohmann::json& found = **result;
      WindowScores& scores = report.text[r];
      scores.agreement.push_back(found["agree"].get<double>() / found["steps"].get<double>());
      scores.kl.push_back(found["kl"].get<double>());
      scores.held.push_back(found["held"].get<double>());
      scores.seconds += found["seconds"].get<double>();
    }
  }

  for (const PromptCase& c : cases) {
    for (size_t r = 0; r < rows.size(); ++r) {
      progress.advance();
      if (!report.errors[r].empty()) continue;
      auto result = cell_result(o, results, ctx.cell(rows[r], c.task, c.length, c.sample, c.settings, c.budget_tokens),
                                report, [&]() -> Result<nlohmann::json> {
                                  SE_ASSIGN_OR_RETURN(std::string answer,
                                                      greedy_answer(ctx, c.ids, c.forced, c.answer_tokens, rows[r]));
                                  return nlohmann::json{{"correct", ruler_correct(c.scored, answer)},
                                                        {"answer", answer},
                                                        {"expected", c.scored.answers}};
                                });
      if (!result.is_ok()) {
        fail(r, result.status());
        continue;
      }
      if (!*result) continue;
      TaskScore& score = report.tasks[r][{c.task, c.length}];
      score.correct += (**result)["correct"].get<bool>() ? 1 : 0;
      score.total += 1;
      score.seconds += (**result)["seconds"].get<double>();
    }
  }
  progress.finish();

  std::set<std::string> texts;
  for (const TextWindow& w : windows) texts.insert(w.path);
  std::string depths;
  for (double d : o.task_depths) depths += (depths.empty() ? "" : ", ") + fmt::format("{:g}", d);
  const std::string task_setup =
      o.no_tasks && o.trace_lengths.empty() && o.recall_lengths.empty()
          ? std::string("none")
          : fmt::format("{} sample(s) per task and length, needle depths {} in turn, plain prompts, greedy", o.samples,
                        depths);
  const std::string continuation =
      !o.self_generated ? std::string("teacher-forced tokens")
      : o.generation_temperature > 0.0f
          ? fmt::format("tokens vanilla wrote (sampled at temperature {:g}, seeded), replayed; budgets of {} tokens",
                        o.generation_temperature, text_budget_tokens(o))
          : fmt::format("tokens vanilla wrote (greedy), replayed; budgets of {} tokens", text_budget_tokens(o));
  report.setup = fmt::format(
      "Long text: {} window(s) of {} context + {} {} from {} text(s). Tasks: {}. Device {}. "
      "Cells computed now: {}, taken from the results file: {}.{}",
      windows.size(), o.context, o.continuation, continuation, texts.size(), task_setup, device_name(o.device),
      report.cells_run, report.cells_reused,
      report.cells_missing == 0
          ? ""
          : fmt::format(" Not in the results file, left out of this report: {} (so a row's counts may fall short of "
                        "the plan).",
                        report.cells_missing));
  return report;
}

// A t interval can cross a bound the quantity cannot (a share above 100%, a KL below 0); it is cut there.
std::string interval_text(Interval i, bool as_percent) {
  i.low = std::max(0.0, i.low);
  if (as_percent) i.high = std::min(1.0, i.high);
  if (as_percent) return fmt::format("{} [{:.1f}, {:.1f}]", percent(i.estimate), 100 * i.low, 100 * i.high);
  return fmt::format("{:.4f} [{:.4f}, {:.4f}]", i.estimate, i.low, i.high);
}

std::string render_report(const EvalOptions& o, const std::vector<ModelReport>& reports,
                          const std::vector<std::string>& left_out, double seconds) {
  std::string md;
  md += "# Sparse methods against vanilla: next-token agreement, KL and long-context tasks\n\n";
  md += fmt::format("Produced by `sparse-engine eval` in {:.0f} s:\n\n```sh\n{}\n```\n\n", seconds, command_line());
  md +=
      "Long text: each window's first `--context` tokens are prefilled through the method (in chunks of "
      "`--prefill-chunk` tokens, as the engine does), then its next `--continuation` tokens are teacher-forced as "
      "decode steps; every decode step's logits are compared with vanilla's on the same tokens. *Top-1 "
      "agreement*: the share of steps whose argmax equals vanilla's, averaged over windows. *Mean KL*: "
      "KL(vanilla || method) in nats, averaged over steps, then windows. Brackets: 95% t interval over windows. "
      "*KV held*: the KV bytes the sequence holds after the run over what vanilla holds. Tasks: correct / asked with "
      "the 95% Wilson interval; vanilla's row is the ceiling. The budget is a fraction of each prompt (the "
      "context for long text, the whole prompt for tasks), set through the method's budget key. A row over a KV "
      "store other than the explicit one (`--kv-cache-dtype`) names it after the method, as `METHOD (kivi2)`; "
      "the reference is always vanilla over explicit pages. Seconds: the mean time of one cell on this machine. "
      "With --self-generated the continuation is the one vanilla wrote from the context, replayed through every "
      "method, and the budget is a fraction of context + continuation. `kv_trace`: key-value tracking whose "
      "assignments and question are fed as decode steps after a short prompt, the budget a fraction of all of "
      "them. `recall`: prose fed the same way with a line of six code words inside, then its first two words, and "
      "the model must write the other four.\n";
  if (!left_out.empty()) {
    md += "\nLeft out (the method cannot keep its KV in the store):\n\n";
    for (const std::string& reason : left_out) md += "* " + reason + "\n";
  }
  for (const ModelReport& report : reports) {
    md += fmt::format("\n## {}\n\n{}\n", report.title, report.setup);
    md += "\n| method | budget | config (long text) | top-1 agreement | mean KL | KV held | windows | s/window |\n"
          "|---|---|---|---|---|---|---|---|\n";
    for (size_t r = 0; r < report.rows.size(); ++r) {
      const Row& row = report.rows[r];
      const WindowScores& t = report.text[r];
      const nlohmann::json config = row.config_for(text_budget_tokens(o));
      md += fmt::format("| {} | {} | {} |", method_label(row), row.key ? percent(row.fraction) : "—",
                        config.empty() ? "defaults" : "`" + config.dump() + "`");
      if (!report.errors[r].empty()) {
        md += fmt::format(" error: {} | | | | |\n", report.errors[r]);
        continue;
      }
      if (t.agreement.empty()) {
        md += " — | — | — | 0 | — |\n";
        continue;
      }
      md += fmt::format(" {} | {} | {} | {} | {:.1f} |\n", interval_text(mean_interval(t.agreement), true),
                        interval_text(mean_interval(t.kl), false), percent(mean_interval(t.held).estimate),
                        t.agreement.size(), t.seconds / static_cast<double>(t.agreement.size()));
    }
    if (report.task_columns.empty()) continue;
    md += "\n| method | budget |";
    for (const auto& [task, length] : report.task_columns) md += fmt::format(" {} {} |", task, length);
    md += "\n|---|---|";
    for (size_t i = 0; i < report.task_columns.size(); ++i) md += "---|";
    md += "\n";
    for (size_t r = 0; r < report.rows.size(); ++r) {
      const Row& row = report.rows[r];
      md += fmt::format("| {} | {} |", method_label(row), row.key ? percent(row.fraction) : "—");
      for (const auto& column : report.task_columns) {
        auto it = report.tasks[r].find(column);
        if (it == report.tasks[r].end() || it->second.total == 0) {
          md += " — |";
          continue;
        }
        md += fmt::format(" {}/{} = {} |", it->second.correct, it->second.total,
                          interval_text(wilson_interval(it->second.correct, it->second.total), true));
      }
      md += "\n";
    }
    md += "\nSeconds per sample (mean over rows and samples):";
    for (const auto& column : report.task_columns) {
      double sum = 0.0;
      int64_t n = 0;
      for (const auto& scores : report.tasks)
        if (auto it = scores.find(column); it != scores.end()) sum += it->second.seconds, n += it->second.total;
      if (n > 0) md += fmt::format(" {} {}: {:.1f};", column.first, column.second, sum / static_cast<double>(n));
    }
    md += "\n";
  }
  return md;
}

int run_eval(const EvalOptions& o) {
  if (o.context < 1 || o.continuation < 1)
    return report_usage_error(invalid_argument("--context and --continuation must be positive"));
  if (o.self_generated && o.no_text)
    return report_usage_error(
        invalid_argument("--self-generated writes the long text's continuation; --no-text "
                         "skips the long text"));
  if (!(o.generation_temperature >= 0.0f && o.generation_temperature <= 100.0f))
    return report_usage_error(
        invalid_argument("--generation-temperature {} is not in [0, 100]", o.generation_temperature));
  if (o.generation_temperature > 0.0f && !o.self_generated)
    return report_usage_error(invalid_argument("--generation-temperature needs --self-generated"));
  for (int length : o.trace_lengths)
    if (length < 1) return report_usage_error(invalid_argument("--trace-lengths: {} is not positive", length));
  for (int length : o.recall_lengths)
    if (length < 1) return report_usage_error(invalid_argument("--recall-lengths: {} is not positive", length));
  if (o.prefill_chunk < 1) return report_usage_error(invalid_argument("--prefill-chunk must be positive"));
  if (o.report_only && o.results.empty()) return report_usage_error(invalid_argument("--report-only needs --results"));
  if (o.device == Device::kCuda && !o.report_only)
    if (const Status usable = cuda_device_status(); !usable.is_ok()) return report_usage_error(usable);
  if (o.num_windows < 0 || o.windows_per_text < 1 || o.samples < 0)
    return report_usage_error(invalid_argument("--windows and --samples must be >= 0, --windows-per-text >= 1"));
  for (const auto* depths : {&o.passkey_depths, &o.task_depths})
    for (double depth : *depths)
      if (!(depth >= 0.0 && depth <= 1.0))
        return report_usage_error(invalid_argument("--passkey-depths / --task-depths: {} is not in [0, 1]", depth));
  if (o.task_depths.empty()) return report_usage_error(invalid_argument("--task-depths is empty"));
  for (const std::string& task : o.tasks)
    if (auto parsed = parse_ruler_task(task); !parsed.is_ok()) return report_usage_error(parsed.status());
  auto plan = plan_rows(o);
  if (!plan.is_ok()) return report_usage_error(plan.status());
  for (const std::string& reason : plan->left_out) std::fprintf(stderr, "left out: %s\n", reason.c_str());
  auto results = ResultsFile::open(o.results);
  if (!results.is_ok()) return report_usage_error(results.status());
  const Clock::time_point start = Clock::now();
  std::vector<ModelReport> reports;
  for (const std::string& model : o.models) {
    auto report = evaluate_model(o, model, plan->rows, *results);
    if (!report.is_ok()) return report_error(report.status());
    reports.push_back(std::move(*report));
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const std::string md = render_report(o, reports, plan->left_out, seconds);
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
  CLI::App* cmd = app.add_subcommand("eval", "quality of the sparse methods against vanilla (agreement, KL, long-context tasks)");
  cmd->add_option("--models", o->models,
                  "models, comma-separated: 'default' (SmolLM2-135M-Instruct), .gguf files, "
                  "HF directories")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--load-format", o->load_format, "auto | gguf | safetensors")->capture_default_str();
  add_device_option(*cmd, o->device, /*check_usable=*/false);
  cmd->add_option("--methods", o->methods, "methods, comma-separated (default: every registered method)")
      ->delimiter(',');
  cmd->add_option("--budgets", o->budgets, "budgets as fractions of each prompt, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--kv-cache-dtype", o->kv_cache_dtypes,
                  "KV stores each method runs over, comma-separated (auto, fp8, kivi2, kivi4, turboquant_*; "
                  "a method that cannot keep its KV in a store is left out of it, with the reason); KIVI "
                  "with its default group 32 and window 128")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--context", o->context, "long text: prompt tokens prefilled through the method")
      ->capture_default_str();
  cmd->add_option("--continuation", o->continuation, "long text: tokens teacher-forced as decode steps")
      ->capture_default_str();
  cmd->add_flag("--self-generated", o->self_generated,
                "long text: the continuation is the one vanilla writes from the context (end of generation "
                "ignored), replayed through every method; budgets are fractions of context + continuation");
  cmd->add_option("--generation-temperature", o->generation_temperature,
                  "long text with --self-generated: sample vanilla's continuation at this temperature, seeded by "
                  "--seed and the window (0: greedy)")
      ->capture_default_str();
  cmd->add_option("--texts", o->texts,
                  "long text: documents, comma-separated (default: /usr/share/common-licenses/* then "
                  "/usr/share/doc/*/copyright, sorted, duplicates left out)")
      ->delimiter(',');
  cmd->add_option("--windows", o->num_windows, "long text: windows in all, taken round-robin over the texts")
      ->capture_default_str();
  cmd->add_option("--windows-per-text", o->windows_per_text,
                  "long text: consecutive non-overlapping windows per text at most")
      ->capture_default_str();
  cmd->add_flag("--no-text", o->no_text, "skip the long-text task");
  cmd->add_option("--tasks", o->tasks,
                  "RULER-style tasks, comma-separated: niah_single, niah_multikey, niah_multivalue, vt, fwe, qa "
                  "(default: all)")
      ->delimiter(',');
  cmd->add_option("--task-lengths", o->task_lengths, "task prompt lengths in tokens, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--task-depths", o->task_depths, "needle depths in [0, 1], used in turn by the samples")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--samples", o->samples, "samples per task and length")->capture_default_str();
  cmd->add_flag("--no-tasks", o->no_tasks, "skip the RULER-style tasks");
  cmd->add_option("--trace-lengths", o->trace_lengths,
                  "key-value tracking (kv_trace): tokens of assignments fed as decode steps after a short prompt, "
                  "then the question, comma-separated; --samples each, the asked line at --task-depths in turn "
                  "(default: none)")
      ->delimiter(',');
  cmd->add_option("--recall-lengths", o->recall_lengths,
                  "word recall (recall): tokens of prose fed as decode steps after a short prompt, a line of six code "
                  "words at a --task-depths depth inside, then the line's first two words; the model must write the "
                  "other four; comma-separated, --samples each, each over its own window of the --texts (default: "
                  "none)")
      ->delimiter(',');
  cmd->add_option("--results", o->results,
                  "JSONL file of finished cells: read first (cells already there are not rerun), appended to");
  cmd->add_flag("--report-only", o->report_only,
                "render the report from --results alone: no cell is computed, a missing one is left out (the model "
                "loads on the CPU, for its tokenizer)");
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
  cmd->add_option("--seed", o->seed, "seed of the passkeys, task samples and sampled continuations")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", o->prefill_chunk,
                  "prompt tokens per forward (the engine's "
                  "--max-num-batched-tokens)")
      ->capture_default_str();
  cmd->add_option("--page-size", o->page_size, "tokens per KV page")->capture_default_str();
  cmd->add_option("--budget-key", o->budget_keys,
                  "[METHOD:]KEY=tokens|kept|evicted|window|none: how a config key (of METHOD only, when named) "
                  "takes the budget; window: a share of the method's own 'window', its default unless --method-config "
                  "sets one (refused for a method without one; repeatable; adds to or overrides the built-in "
                  "table)");
  cmd->add_option("--method-config", o->method_configs,
                  "NAME=JSON: extra hyperparameters of one method, under every budget (repeatable)");
  cmd->add_option("--output", o->output, "also write the Markdown report here (e.g. docs/quality.md)");
  cmd->callback([o, &exit_code] { exit_code = run_eval(*o); });
}

}  // namespace se::cli
