// GPT-2's reversible byte <-> printable-character mapping used by byte-level BPE vocabularies:
// printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100.. in byte order.
// Pure functions over constant tables; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace se::byte_level {

char32_t byte_to_char(uint8_t byte);
// The byte a mapped character stands for; nullopt for characters outside the alphabet.
std::optional<uint8_t> char_to_byte(char32_t cp);

// Each byte of text replaced by its UTF-8 encoded mapped character.
std::string encode(std::string_view bytes);
// True when every character of text (valid UTF-8) is in the byte alphabet.
bool in_alphabet(std::string_view text);
// Appends the bytes a byte-level spelling stands for; characters outside the alphabet are kept as
// their UTF-8 (as HF's ByteLevel decoder does).
void decode_append(std::string_view spelling, std::string& out);

}  // namespace se::byte_level
