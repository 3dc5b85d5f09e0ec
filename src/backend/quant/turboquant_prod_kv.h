// The paper's TurboQuant KV slot (Zandieh et al., arXiv 2504.19874, section 4.3; `--kv-cache-dtype turboquant_2.5`
// and `turboquant_3.5`). Each (layer, KV head) splits its channels into head_dim / 2 outliers and the rest, once,
// for the cache's life (kv/turboquant_channel_table.h); each half is coded by its own TurboQuant instance (its own
// rotation, codebook and QJL matrix), the outliers at b + 1 bits and the rest at b, so a coordinate costs b + 0.5
// bits on average: 2.5 from b = 2, 3.5 from b = 3. (The paper's own example, 32 channels at 3 bits and 96 at 2,
// averages 2.25; it gives no 3.5-bit split.) Keys are TurboQuantProd (MSE codes at one bit less plus the 1-bit QJL
// signs of the residual, so q . k is estimated without bias), values TurboQuantMse (turboquant.h). A channel order
// [head_dim] lists a stream's outliers ascending, then its other channels ascending (outlier_channel_order).
//
// Slot bytes (D = head_dim, O = D / 2, R = D - O, S(n, b) the bytes of a bit_stream.h stream of n b-bit codes,
// fp16 little-endian):
//   key    S(O, b) MSE codes of the outlier part, S(O, 1) its QJL signs, S(R, b - 1) MSE codes of the rest,
//          S(R, 1) its signs, then ||k_O||, gamma_O, ||k_R||, gamma_R
//   value  S(O, b + 1) codes of the outlier part, S(R, b) of the rest (TurboQuantSplit), then ||v_O||, ||v_R||
// e.g. D = 128: 48 + 44 = 92 bytes at 2.5 bits and 64 + 60 = 124 at 3.5, against 512 for a bf16 key and value.
//
// Attention reads the codes in their own domain, never a dequantized key: with the key's channels in order,
// q . k~ = sum over the parts P of ||k_P|| (Pi_P q_P) . c_P[idx] + sqrt(pi/2) / |P| * gamma_P * (S_P q_P) . sign_P,
// so project_query turns a query into [Pi_O q_O; Pi_R q_R; S_O q_O; S_R q_R] once per head and read_key a slot
// into the matching 2 * D values. Values are summed in the rotated domain (read_value) and rotated back once per
// query (unrotate_value). Const after construction, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/quant/turboquant.h"
#include "backend/quant/turboquant_kv.h"

namespace se {

// The values' instances draw their rotations from seed + this, away from the keys'.
inline constexpr uint64_t kTurboQuantValueSeedOffset = 0x5eedf00d;

class TurboQuantProdKvCodec {
 public:
  // bits 2 or 3 (2.5 or 3.5 effective); head_dim even and at least 4.
  TurboQuantProdKvCodec(int32_t head_dim, int32_t bits, uint64_t seed = kTurboQuantKvSeed);

  int32_t head_dim() const { return head_dim_; }
  int32_t bits() const { return bits_; }
  int32_t num_outliers() const { return key_outlier_.mse().dim(); }
  const TurboQuantSlotLayout& layout() const { return layout_; }
  const TurboQuantProd& key_outlier_codec() const { return key_outlier_; }
  const TurboQuantProd& key_regular_codec() const { return key_regular_; }
  const TurboQuantSplit& value_codec() const { return values_; }

  // k, v [head_dim], their streams' channel orders [head_dim] -> slot [layout().slot_bytes()].
  void encode(const float* k, const float* v, const int32_t* key_order, const int32_t* value_order,
              uint8_t* slot) const;
  // The slot's key and value in the original channels, out [head_dim] each.
  void decode(const uint8_t* slot, const int32_t* key_order, const int32_t* value_order, float* k, float* v) const;

  // q [head_dim] -> out [2 * head_dim] = [Pi_O q_O; Pi_R q_R; S_O q_O; S_R q_R], q_P the channels of part P.
  void project_query(const float* q, const int32_t* key_order, float* out) const;
  // The slot's key as project_query's partner, out [2 * head_dim]: their dot product is q . k~.
  void read_key(const uint8_t* slot, float* out) const;
  // The slot's value in the rotated domain, out [head_dim] = [||v_O|| c_O[idx]; ||v_R|| c_R[idx]].
  void read_value(const uint8_t* slot, float* out) const;
  // A sum of read_value rows [head_dim] -> the original channels, out [head_dim].
  void unrotate_value(const float* rotated, const int32_t* value_order, float* out) const;

 private:
  // fp32 copies of one instance's matrices, for attention.
  struct Part {
    int32_t begin = 0, dim = 0;     // its channels: positions [begin, begin + dim) of a channel order
    std::vector<float> rotation;    // [dim, dim] row-major
    std::vector<float> centroids;   // [2^bits]
    std::vector<float> projection;  // keys: S [dim, dim] row-major
  };
  static Part part_of(const TurboQuantMse& mse, int32_t begin);

  int32_t head_dim_;
  int32_t bits_;
  TurboQuantProd key_outlier_;
  TurboQuantProd key_regular_;
  TurboQuantSplit values_;
  TurboQuantSlotLayout layout_;
  // Byte offsets inside the key record.
  size_t outlier_signs_ = 0, regular_codes_ = 0, regular_signs_ = 0, key_norms_ = 0;
  Part keys_[2], values_parts_[2];  // [outliers, the rest]
};

}  // namespace se
