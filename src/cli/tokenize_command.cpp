// `sparse-engine tokenize`: text -> token ids as JSON, or with --ids, ids -> text.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "cli/model_resolver.h"
#include "model/model_loader.h"

namespace se::cli {

namespace {

struct TokenizeOptions {
  ModelOptions model;
  std::string text;
  std::string ids;
  bool add_special = false;
  bool parse_special = false;
};

Result<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::string normalized = text;
  for (char& c : normalized)
    if (c == ',' || c == '[' || c == ']') c = ' ';
  std::istringstream in(normalized);
  std::string word;
  while (in >> word) {
    try {
      size_t used = 0;
      const long v = std::stol(word, &used);
      if (used != word.size() || v < INT32_MIN || v > INT32_MAX) throw std::invalid_argument(word);
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      return invalid_argument("--ids: '{}' is not a token id", word);
    }
  }
  return ids;
}

int run_tokenize(const TokenizeOptions& opts) {
  auto path = resolve_model_path(opts.model.model);
  if (!path.is_ok()) return report_error(path.status());
  auto format = parse_load_format(opts.model.load_format);
  if (!format.is_ok()) return report_error(format.status());
  // Only the vocabulary is needed: GGUF metadata or the directory's tokenizer.json.
  Result<std::optional<Tokenizer>> tokenizer = invalid_argument("unreachable");
  if (*format == LoadFormat::kGguf || (*format == LoadFormat::kAuto && path->ends_with(".gguf"))) {
    auto gguf = GgufFile::open(*path);
    if (!gguf.is_ok()) return report_error(gguf.status());
    LoadedModel vocab_only;
    vocab_only.gguf = std::move(gguf).value();
    tokenizer = load_tokenizer(vocab_only);
  } else {
    LoadedModel dir_only;
    dir_only.hf_dir = std::filesystem::is_directory(*path) ? *path : std::filesystem::path(*path).parent_path().string();
    tokenizer = load_tokenizer(dir_only);
  }
  if (!tokenizer.is_ok()) return report_error(tokenizer.status());
  if (!*tokenizer) return report_error(not_found("{}: no tokenizer", *path));
  if (!opts.ids.empty()) {
    auto ids = parse_ids(opts.ids);
    if (!ids.is_ok()) return report_error(ids.status());
    auto text = (*tokenizer)->decode(*ids, /*skip_special=*/false);
    if (!text.is_ok()) return report_error(text.status());
    std::cout << *text << "\n";
    return 0;
  }
  const auto ids = (*tokenizer)->encode(opts.text, opts.add_special, opts.parse_special);
  std::cout << nlohmann::json(ids).dump() << "\n";
  return 0;
}

}  // namespace

void add_tokenize_command(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand("tokenize", "print the token ids of --text as JSON, or decode --ids");
  opts->model.add_to(*cmd);
  auto* text = cmd->add_option("--text,-t", opts->text, "text to encode");
  auto* ids = cmd->add_option("--ids", opts->ids, "token ids to decode, e.g. '[1, 2, 3]' or '1,2,3'");
  text->excludes(ids);
  cmd->add_flag("--add-special", opts->add_special, "add BOS/EOS as the model does for a sequence");
  cmd->add_flag("--parse-special", opts->parse_special, "match special tokens written in the text");
  cmd->callback([opts, &exit_code, text, ids] {
    if (text->count() == 0 && ids->count() == 0) {
      std::fprintf(stderr, "error: tokenize needs --text or --ids\n");
      exit_code = 2;
      return;
    }
    exit_code = run_tokenize(*opts);
  });
}

}  // namespace se::cli
