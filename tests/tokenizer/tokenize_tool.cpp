// tokenize_tool: drives Tokenizer from the command line for the Python oracle tests.
//   tokenize_tool (--gguf PATH | --json PATH [--config PATH]) MODE [--add-special]
//   [--no-parse-special]
//                 [--skip-special]
// MODE encode: stdin has one JSON string per line; prints one JSON array of ids per line.
// MODE decode: stdin has one JSON array of ids per line; prints one JSON string per line (an
//              invalid id prints {"error": message}).
// MODE info:   prints vocab size, BOS/EOS, EOG ids and special flags as one JSON object.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loader/gguf_file.h"
#include "tokenizer/tokenizer.h"

namespace {

using Json = nlohmann::json;

int fail(const std::string& message) {
  std::cerr << "tokenize_tool: " << message << "\n";
  return 2;
}

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::strict); }

}  // namespace

int main(int argc, char** argv) {
  std::string gguf_path, json_path, config_path, mode;
  bool add_special = false, parse_special = true, skip_special = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--gguf" || arg == "--json" || arg == "--config") && i + 1 < argc) {
      (arg == "--gguf" ? gguf_path : arg == "--json" ? json_path : config_path) = argv[++i];
    } else if (arg == "--add-special") {
      add_special = true;
    } else if (arg == "--no-parse-special") {
      parse_special = false;
    } else if (arg == "--skip-special") {
      skip_special = true;
    } else if (arg == "encode" || arg == "decode" || arg == "info") {
      mode = arg;
    } else {
      return fail("unknown argument " + arg);
    }
  }
  if (mode.empty() || gguf_path.empty() == json_path.empty()) {
    return fail("usage: (--gguf PATH | --json PATH [--config PATH]) encode|decode|info [flags]");
  }
  se::Result<se::Tokenizer> tokenizer = [&]() -> se::Result<se::Tokenizer> {
    if (!gguf_path.empty()) {
      SE_ASSIGN_OR_RETURN(se::GgufFile gguf, se::GgufFile::open(gguf_path));
      return se::Tokenizer::from_gguf(gguf);
    }
    return se::Tokenizer::from_hf_files(json_path, config_path);
  }();
  if (!tokenizer.is_ok()) return fail(tokenizer.status().to_string());
  const se::Tokenizer& tok = *tokenizer;

  if (mode == "info") {
    Json info;
    info["vocab_size"] = tok.vocab_size();
    info["bos_id"] = tok.bos_id() ? Json(*tok.bos_id()) : Json(nullptr);
    info["eos_id"] = tok.eos_id() ? Json(*tok.eos_id()) : Json(nullptr);
    info["bos_token"] = tok.bos_token();
    info["eos_token"] = tok.eos_token();
    info["add_bos"] = tok.add_bos();
    info["add_eos"] = tok.add_eos();
    info["eog_ids"] = tok.eog_ids();
    std::vector<int32_t> special;
    for (int32_t id = 0; id < tok.vocab_size(); ++id) {
      if (tok.is_special(id)) special.push_back(id);
    }
    info["special_ids"] = special;
    info["has_chat_template"] = !tok.chat_template().empty();
    std::cout << dump(info) << "\n";
    return 0;
  }

  std::ios::sync_with_stdio(false);
  std::string line;
  std::string out;
  while (std::getline(std::cin, line)) {
    Json in;
    try {
      in = Json::parse(line);
    } catch (const Json::exception& e) {
      return fail(std::string("bad input line: ") + e.what());
    }
    if (mode == "encode") {
      if (!in.is_string()) return fail("encode expects JSON strings");
      out += dump(Json(tok.encode(in.get<std::string>(), add_special, parse_special)));
    } else {
      if (!in.is_array()) return fail("decode expects JSON arrays of ids");
      const auto ids = in.get<std::vector<int32_t>>();
      se::Result<std::string> text = tok.decode(ids, skip_special);
      out += text.is_ok() ? dump(Json(*text)) : dump(Json{{"error", text.status().to_string()}});
    }
    out += '\n';
    if (out.size() > (1 << 20)) {
      std::fwrite(out.data(), 1, out.size(), stdout);
      out.clear();
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}
