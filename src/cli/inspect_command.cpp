// `sparse-engine inspect`: the normalized config, every tensor with dtype and shape, and tokenizer facts.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "cli/model_resolver.h"
#include "model/config.h"

namespace se::cli {

namespace {

nlohmann::json tokenizer_facts(const Tokenizer& t) {
  nlohmann::json eog = nlohmann::json::array();
  for (int32_t id : t.eog_ids()) eog.push_back({{"id", id}, {"text", std::string(t.token_text(id))}});
  auto id_or_null = [](std::optional<int32_t> id) { return id ? nlohmann::json(*id) : nlohmann::json(); };
  return {{"vocab_size", t.vocab_size()},
          {"bos", {{"id", id_or_null(t.bos_id())}, {"text", t.bos_token()}}},
          {"eos", {{"id", id_or_null(t.eos_id())}, {"text", t.eos_token()}}},
          {"add_bos", t.add_bos()},
          {"end_of_generation", eog},
          {"has_chat_template", !t.chat_template().empty()}};
}

int run_inspect(const ModelOptions& opts) {
  auto path = resolve_model_path(opts.model);
  if (!path.is_ok()) return report_error(path.status());
  LoadOptions load;
  auto format = parse_load_format(opts.load_format);
  if (!format.is_ok()) return report_error(format.status());
  load.format = *format;
  load.seed = opts.dummy_seed;
  auto loaded = load_model(*path, load);
  if (!loaded.is_ok()) return report_error(loaded.status());

  nlohmann::json out;
  out["path"] = *path;
  out["source_format"] = loaded->source_format;
  out["config"] = loaded->hf_config;
  out["architecture"] = loaded->config.arch;
  int64_t num_params = 0;
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& [name, tensor] : loaded->weights) {
    num_params += tensor.numel();
    nlohmann::json shape = nlohmann::json::array();
    for (int i = 0; i < tensor.rank(); ++i) shape.push_back(tensor.dim(i));
    tensors.push_back({{"name", name}, {"dtype", std::string(dtype_name(tensor.dtype()))}, {"shape", shape}});
  }
  out["num_parameters"] = num_params;
  out["tensors"] = tensors;
  if (loaded->gguf) {
    nlohmann::json source_types = nlohmann::json::object();
    for (const GgufTensorInfo& info : loaded->gguf->tensors())
      source_types[ggml_type_name(info.type)] = source_types.value(ggml_type_name(info.type), 0) + 1;
    out["gguf"] = {{"version", loaded->gguf->version()}, {"tensor_types", source_types}};
  }
  loaded->weights.clear();
  auto bundle_tokenizer = load_tokenizer(*loaded);
  if (!bundle_tokenizer.is_ok()) return report_error(bundle_tokenizer.status());
  if (*bundle_tokenizer) out["tokenizer"] = tokenizer_facts(**bundle_tokenizer);
  std::cout << out.dump(2) << "\n";
  return 0;
}

}  // namespace

void add_inspect_command(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<ModelOptions>();
  CLI::App* cmd = app.add_subcommand("inspect", "print the normalized config, tensors and tokenizer facts as JSON");
  opts->add_to(*cmd);
  cmd->callback([opts, &exit_code] { exit_code = run_inspect(*opts); });
}

}  // namespace se::cli
