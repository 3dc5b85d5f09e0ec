// The long-text corpus of `sparse-engine eval`: real prose installed on every Debian system (the licenses of
// base-files, then the packages' copyright files), listed in a fixed order, and the teacher-forcing windows cut
// from it. Plain functions; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "tokenizer/tokenizer.h"

namespace se::cli {

// `num_tokens` consecutive tokens of one document.
struct TextWindow {
  std::string path;
  int64_t offset = 0;        // of the first token, in the document's tokens
  std::vector<int32_t> ids;  // [num_tokens]; the document's BOS opens every window when the model adds one
};

// /usr/share/common-licenses/* then /usr/share/doc/*/copyright under `root` ("/" normally), each list sorted by
// path; links resolved, and a file whose bytes equal an earlier one's left out.
std::vector<std::string> default_text_paths(const std::string& root = "/");

// Up to `max_windows` windows of `num_tokens` tokens, taken round-robin over `paths` (file 1's first window,
// file 2's first, ..., then file 1's second), each file cut into consecutive non-overlapping windows from its
// start, at most `per_text` of them. Files too short for one window are named in `skipped`. A file is only read
// while windows are still wanted. Errors: a file that cannot be read.
Result<std::vector<TextWindow>> load_text_windows(const Tokenizer& tokenizer, const std::vector<std::string>& paths,
                                                  int32_t num_tokens, int max_windows, int per_text,
                                                  std::vector<std::string>& skipped);

}  // namespace se::cli
