// The TurboQuant KV slot (vLLM's turboquant_* kv-cache dtypes): one token of one KV head is a key record then a
// value record, bytes in this order (D = head_dim, S(n, b) = ceil(n * b / 8) bytes of a bit_stream.h stream):
//   key, key_bits 2..4  codes S(D, key_bits): Lloyd-Max cells of the rotated unit key (TurboQuantMse), then
//                       fp16 ||k|| (2 bytes, little-endian)
//   key, key_bits 8     D e4m3 codes of k itself (no rotation, no scale: vLLM casts the key)
//   value               codes S(D, value_bits): asymmetric uniform over the token's D values, then fp16 scale and
//                       fp16 minimum (4 bytes): scale = max((max - min) / (2^b - 1), 1e-8) and
//                       q = clamp(trunc((v - min) / scale + 0.5), 0, 2^b - 1), all in fp32; v reads back as
//                       q * fp16(scale) + fp16(min)
// Attention reads keys in the rotated domain: with y = Pi q, q . decode(k) = ||k|| * y . c[idx] (divided by
// ||c[idx]|| under norm correction, which renormalizes the centroid vector to unit length before it is scaled),
// so a query is rotated once per head and no key is ever rotated back. Pure functions and a const codec,
// thread-safe.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "backend/quant/bit_stream.h"
#include "backend/quant/turboquant.h"
#include "tensor/dtype.h"

namespace se {

// The seed of the store's rotation: one Haar rotation per cache, shared by every layer and KV head.
inline constexpr uint64_t kTurboQuantKvSeed = 42;
// vLLM's floor on a value record's scale (a constant row would otherwise divide by zero).
inline constexpr float kTurboQuantMinValueScale = 1e-8f;

struct TurboQuantKvFormat {
  int32_t key_bits = 0;          // 8: e4m3 keys; 2..4: TurboQuantMse codes of the rotated unit key
  int32_t value_bits = 0;        // 2..8
  bool norm_correction = false;  // renormalize the centroid vector before scaling it by ||k||
  // The paper's store instead (turboquant_prod_kv.h): half the channels outliers at key_bits + 1 bits, keys
  // TurboQuantProd, values TurboQuantMse; key_bits == value_bits, 2 or 3.
  bool outlier_split = false;
  bool key_fp8() const { return key_bits == 8; }
};

struct TurboQuantSlotLayout {
  size_t key_bytes = 0;
  size_t value_bytes = 0;
  size_t slot_bytes() const { return key_bytes + value_bytes; }
};

// The outlier channels of the paper's store: half of them (rounded down).
inline int32_t turboquant_num_outliers(int32_t head_dim) { return head_dim / 2; }

inline TurboQuantSlotLayout turboquant_slot_layout(int32_t head_dim, const TurboQuantKvFormat& format) {
  TurboQuantSlotLayout l;
  if (format.outlier_split) {  // turboquant_prod_kv.h's records
    const int32_t outliers = turboquant_num_outliers(head_dim), regular = head_dim - outliers, b = format.key_bits;
    l.key_bytes = bit_stream_bytes(outliers, b) + bit_stream_bytes(outliers, 1) + bit_stream_bytes(regular, b - 1) +
                  bit_stream_bytes(regular, 1) + 8;
    l.value_bytes = bit_stream_bytes(outliers, b + 1) + bit_stream_bytes(regular, b) + 4;
    return l;
  }
  l.key_bytes = format.key_fp8() ? static_cast<size_t>(head_dim) : bit_stream_bytes(head_dim, format.key_bits) + 2;
  l.value_bytes = bit_stream_bytes(head_dim, format.value_bits) + 4;
  return l;
}

inline uint16_t read_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline void write_u16(uint16_t v, uint8_t* p) {
  p[0] = static_cast<uint8_t>(v & 0xff);
  p[1] = static_cast<uint8_t>(v >> 8);
}

// Value record [value_bytes] -> out [dim].
inline void turboquant_decode_value(const uint8_t* record, int32_t dim, int32_t bits, float* out) {
  const uint8_t* params = record + bit_stream_bytes(dim, bits);
  const float scale = f16_to_f32(read_u16(params)), minimum = f16_to_f32(read_u16(params + 2));
  for (int32_t j = 0; j < dim; ++j) out[j] = static_cast<float>(unpack_bit_stream(record, j, bits)) * scale + minimum;
}

// Key record of an MSE format -> the decoded key in the rotated domain, out [dim] = ||k|| * c[idx] (/ ||c[idx]||).
inline void turboquant_decode_rotated_key(const uint8_t* record, int32_t dim, int32_t bits, const float* centroids,
                                          bool norm_correction, float* out) {
  float gain = f16_to_f32(read_u16(record + bit_stream_bytes(dim, bits)));
  float sum_squares = 0.0f;
  for (int32_t j = 0; j < dim; ++j) {
    out[j] = centroids[unpack_bit_stream(record, j, bits)];
    sum_squares += out[j] * out[j];
  }
  if (norm_correction && sum_squares > 0.0f) gain /= std::sqrt(sum_squares);
  for (int32_t j = 0; j < dim; ++j) out[j] *= gain;
}

// Encodes slots of one format; holds the rotation and codebook its keys use (none for e4m3 keys).
class TurboQuantKvCodec {
 public:
  TurboQuantKvCodec(int32_t head_dim, TurboQuantKvFormat format, uint64_t seed = kTurboQuantKvSeed);

  int32_t head_dim() const { return head_dim_; }
  const TurboQuantKvFormat& format() const { return format_; }
  const TurboQuantSlotLayout& layout() const { return layout_; }
  // fp32 copies for attention: Pi [head_dim, head_dim] row-major and the 2^key_bits centroids; empty for e4m3 keys.
  const std::vector<float>& rotation() const { return rotation_; }
  const std::vector<float>& centroids() const { return centroids_; }

  // k, v [head_dim] -> slot [layout().slot_bytes()].
  void encode(const float* k, const float* v, uint8_t* slot) const;
  // The slot's key and value in the original domain (the rotation undone), out [head_dim] each.
  void decode(const uint8_t* slot, float* k, float* v) const;

 private:
  int32_t head_dim_;
  TurboQuantKvFormat format_;
  TurboQuantSlotLayout layout_;
  std::optional<TurboQuantMse> keys_;
  std::vector<float> rotation_;
  std::vector<float> centroids_;
};

// Value record of v [dim] at `bits`.
void turboquant_encode_value(const float* v, int32_t dim, int32_t bits, uint8_t* record);

}  // namespace se
