#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/utf8.h"

namespace se::byte_level {
namespace {

constexpr bool kept_as_is(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Tables {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 512> to_byte{};  // every mapped character is below U+0200
  std::array<std::string, 256> encoded;

  Tables() {
    to_byte.fill(-1);
    char32_t next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      to_char[b] = kept_as_is(b) ? static_cast<char32_t>(b) : next_extra++;
      to_byte[to_char[b]] = static_cast<int16_t>(b);
      append_utf8(encoded[b], to_char[b]);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

char32_t byte_to_char(uint8_t byte) { return tables().to_char[byte]; }

std::optional<uint8_t> char_to_byte(char32_t cp) {
  if (cp >= 512 || tables().to_byte[cp] < 0) return std::nullopt;
  return static_cast<uint8_t>(tables().to_byte[cp]);
}

std::string encode(std::string_view bytes) {
  const Tables& t = tables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += t.encoded[static_cast<uint8_t>(c)];
  return out;
}

bool in_alphabet(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (!char_to_byte(utf8::next(text, pos))) return false;
  }
  return true;
}

void decode_append(std::string_view spelling, std::string& out) {
  size_t pos = 0;
  while (pos < spelling.size()) {
    const size_t start = pos;
    const char32_t cp = utf8::next(spelling, pos);
    if (auto b = char_to_byte(cp)) {
      out.push_back(static_cast<char>(*b));
    } else {
      out.append(spelling.substr(start, pos - start));
    }
  }
}

}  // namespace se::byte_level
