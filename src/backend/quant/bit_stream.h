// Packing of b-bit codes into a byte stream: code j occupies bits [j*b, (j+1)*b) of the stream, lowest bit first
// (byte k holds stream bits [8k, 8k+8)), so a code may straddle two bytes when b does not divide 8. Unused high
// bits of the last byte are zero. Used by the TurboQuant codes and QJL signs. Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace se {

inline size_t bit_stream_bytes(int64_t n, int32_t bits) { return static_cast<size_t>((n * bits + 7) / 8); }

// codes[j] < 2^bits, j < n -> out[bit_stream_bytes(n, bits)].
inline void pack_bit_stream(const uint8_t* codes, int64_t n, int32_t bits, uint8_t* out) {
  for (size_t k = 0; k < bit_stream_bytes(n, bits); ++k) out[k] = 0;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t bit = j * bits;
    const uint32_t v = static_cast<uint32_t>(codes[j]) << (bit % 8);
    out[bit / 8] |= static_cast<uint8_t>(v);
    if ((bit % 8) + bits > 8) out[bit / 8 + 1] |= static_cast<uint8_t>(v >> 8);
  }
}

inline uint32_t unpack_bit_stream(const uint8_t* bytes, int64_t j, int32_t bits) {
  const int64_t bit = j * bits;
  uint32_t v = bytes[bit / 8];
  if ((bit % 8) + bits > 8) v |= static_cast<uint32_t>(bytes[bit / 8 + 1]) << 8;
  return (v >> (bit % 8)) & ((1u << bits) - 1u);
}

}  // namespace se
