// UTF-8 helpers for the tokenizer: code point decoding (encoding is base/utf8_encode.h), lossy conversion that replaces
// invalid sequences with U+FFFD (one per maximal invalid subpart, as Rust's from_utf8_lossy and the
// WHATWG decoder do), and the Unicode classes the added-token rules use. Stateless; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/utf8_encode.h"

namespace se::utf8 {

inline constexpr char32_t kReplacement = 0xFFFD;

// Decodes the code point starting at text[pos] and moves pos past it.
// Precondition: text is valid UTF-8 and pos < text.size() is at a sequence start.
char32_t next(std::string_view text, size_t& pos);

// Decodes the last code point of text (valid UTF-8, non-empty) and returns its start offset via
// start.
char32_t last(std::string_view text, size_t& start);

bool is_valid(std::string_view text);

// Appends bytes to out, each maximal invalid subpart replaced by U+FFFD. With final=false an
// incomplete but so-far valid sequence at the very end is left unconsumed (a streaming caller
// prepends it to the next bytes). Returns the number of bytes consumed.
size_t append_lossy(std::string_view bytes, bool final, std::string& out);

// The text itself when valid, else its lossy conversion.
std::string sanitize(std::string_view text);

// The Unicode White_Space property (what \s means in Oniguruma and Rust's regex crate).
bool is_whitespace(char32_t cp);

// Unicode word characters as Rust's regex \w: letters, marks, numbers (Nd, Nl) and connector
// punctuation, plus the joiners U+200C/U+200D.
bool is_word_char(char32_t cp);

}  // namespace se::utf8
