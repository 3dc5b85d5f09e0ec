// The UTF-8 encoder the tokenizer and the chat templates share. Stateless; thread-safe.
#pragma once

#include <string>

namespace se {

// Appends the UTF-8 encoding of `cp`, a Unicode scalar value (1 to 4 bytes).
void append_utf8(std::string& out, char32_t cp);

}  // namespace se
