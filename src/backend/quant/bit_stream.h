// Packing of b-bit codes into a byte stream: code j occupies bits [j*b, (j+1)*b) of the stream, lowest bit first
// (byte k holds stream bits [8k, 8k+8)), so a code may straddle two bytes when b does not divide 8. Unused high
// bits of the last byte are zero. Used by the TurboQuant codes and QJL signs. Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace se {

inline size_t bit_stream_bytes(int64_t n, int32_t bits) { return static_cast<size_t>((n * bits + 7) / 8); }

// Sets code j (< 2^bits) of a stream whose bits [j*bits, (j+1)*bits) are still zero, so an encoder can write its
// codes as it computes them into a stream it zeroed first.
inline void write_bit_stream_code(uint8_t* out, int64_t j, int32_t bits, uint32_t code) {
  const int64_t bit = j * bits;
  const uint32_t v = code << (bit % 8);
  out[bit / 8] |= static_cast<uint8_t>(v);
  if ((bit % 8) + bits > 8) out[bit / 8 + 1] |= static_cast<uint8_t>(v >> 8);
}

inline uint32_t unpack_bit_stream(const uint8_t* bytes, int64_t j, int32_t bits) {
  const int64_t bit = j * bits;
  uint32_t v = bytes[bit / 8];
  if ((bit % 8) + bits > 8) v |= static_cast<uint32_t>(bytes[bit / 8 + 1]) << 8;
  return (v >> (bit % 8)) & ((1u << bits) - 1u);
}

}  // namespace se
