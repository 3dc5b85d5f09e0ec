#include "cli/eval_texts.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace se::cli {

namespace fs = std::filesystem;

namespace {

Result<std::string> read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return not_found("text '{}': cannot be read", path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

}  // namespace

std::vector<std::string> default_text_paths(const std::string& root) {
  std::vector<std::string> licenses, copyrights;
  std::error_code ec;
  const fs::path base = fs::path(root) / "usr/share";
  for (const auto& entry : fs::directory_iterator(base / "common-licenses", ec))
    if (entry.is_regular_file()) licenses.push_back(entry.path().string());
  for (const auto& entry : fs::directory_iterator(base / "doc", ec)) {
    const fs::path copyright = entry.path() / "copyright";
    if (fs::is_regular_file(copyright)) copyrights.push_back(copyright.string());
  }
  std::sort(licenses.begin(), licenses.end());
  std::sort(copyrights.begin(), copyrights.end());
  licenses.insert(licenses.end(), copyrights.begin(), copyrights.end());
  std::vector<std::string> out;
  std::set<std::string> seen_paths, seen_texts;
  for (const std::string& path : licenses) {
    const std::string canonical = fs::canonical(path, ec).string();
    if (ec || !seen_paths.insert(canonical).second) continue;
    auto text = read_file(canonical);
    if (!text.is_ok() || !seen_texts.insert(std::move(*text)).second) continue;
    out.push_back(canonical);
  }
  return out;
}

Result<std::vector<TextWindow>> load_text_windows(const Tokenizer& tokenizer, const std::vector<std::string>& paths,
                                                  int32_t num_tokens, int max_windows, int per_text,
                                                  std::vector<std::string>& skipped) {
  // Round r takes window r of every file that has one; files are tokenized once, on their first round.
  std::vector<std::vector<int32_t>> ids(paths.size());
  std::vector<bool> read(paths.size(), false);
  std::vector<TextWindow> windows;
  const bool bos = tokenizer.add_bos() && tokenizer.bos_id().has_value();
  for (int round = 0; round < per_text; ++round) {
    bool any = false;
    for (size_t f = 0; f < paths.size() && static_cast<int>(windows.size()) < max_windows; ++f) {
      if (!read[f]) {
        SE_ASSIGN_OR_RETURN(std::string text, read_file(paths[f]));
        ids[f] = tokenizer.encode(text, /*add_special=*/false, /*parse_special=*/false);
        read[f] = true;
      }
      // The BOS (when the model adds one) opens each window and takes one of its tokens.
      const int64_t body = num_tokens - (bos ? 1 : 0);
      const int64_t offset = static_cast<int64_t>(round) * body;
      if (offset + body > static_cast<int64_t>(ids[f].size())) {
        if (round == 0) skipped.push_back(paths[f] + " (" + std::to_string(ids[f].size()) + " tokens)");
        continue;
      }
      TextWindow window{paths[f], offset, {}};
      if (bos) window.ids.push_back(*tokenizer.bos_id());
      window.ids.insert(window.ids.end(), ids[f].begin() + offset, ids[f].begin() + offset + body);
      windows.push_back(std::move(window));
      any = true;
    }
    if (!any || static_cast<int>(windows.size()) >= max_windows) break;
  }
  return windows;
}

}  // namespace se::cli
