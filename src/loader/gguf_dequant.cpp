// Block decoders after ggml-quants.c (dequantize_row_*). Each mirrors gguf-py's numpy order of
// operations exactly: products and sums are separate fp32 operations (this file is built with
// -ffp-contract=off) so the output matches the Python reference bit for bit.
#include "loader/gguf_dequant.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "tensor/dtype.h"

namespace se {

namespace {

constexpr int kQK = 256;

// All 65536 half values as fp32, built once.
const float* f16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t i = 0; i < 65536; ++i) t[i] = f16_to_f32(static_cast<uint16_t>(i));
    return t;
  }();
  return table.data();
}

inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_table()[h];
}

void dequant_q8_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

void dequant_q4_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0x0f) - 8);
    y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

void dequant_q4_1(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0x0f) + m;
    y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

// Q5_0/Q5_1: the 5th bit of element j is bit j of the little-endian u32 `qh`.
void dequant_q5_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(lo - 16);
    y[j + 16] = d * static_cast<float>(hi - 16);
  }
}

void dequant_q5_1(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(lo) + m;
    y[j + 16] = d * static_cast<float>(hi) + m;
  }
}

// The 8 six-bit scales and mins of a Q4_K/Q5_K super-block, packed in 12 bytes.
void k_scale_min(const uint8_t* s, std::array<uint8_t, 8>& sc, std::array<uint8_t, 8>& mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 0x3f;
    mn[j] = s[j + 4] & 0x3f;
    sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 2) & 0x30);
    mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
  }
}

void dequant_q4_k(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float dmin = load_f16(b + 2);
  std::array<uint8_t, 8> sc, mn;
  k_scale_min(b + 4, sc, mn);
  const uint8_t* qs = b + 16;
  // Sub-blocks 2k and 2k+1 take the low and high nibbles of qs[32k .. 32k+31].
  for (int i = 0; i < 8; ++i) {
    const float dl = d * static_cast<float>(sc[i]);
    const float ml = dmin * static_cast<float>(mn[i]);
    const uint8_t* q = qs + 32 * (i / 2);
    const int shift = 4 * (i % 2);
    for (int l = 0; l < 32; ++l)
      y[32 * i + l] = dl * static_cast<float>((q[l] >> shift) & 0x0f) - ml;
  }
}

void dequant_q5_k(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float dmin = load_f16(b + 2);
  std::array<uint8_t, 8> sc, mn;
  k_scale_min(b + 4, sc, mn);
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  // Sub-block i takes bit i of qh[l] as the 5th bit of its element l.
  for (int i = 0; i < 8; ++i) {
    const float dl = d * static_cast<float>(sc[i]);
    const float ml = dmin * static_cast<float>(mn[i]);
    const uint8_t* q = qs + 32 * (i / 2);
    const int shift = 4 * (i % 2);
    for (int l = 0; l < 32; ++l) {
      const int v = ((q[l] >> shift) & 0x0f) | (((qh[l] >> i) & 1) << 4);
      y[32 * i + l] = dl * static_cast<float>(v) - ml;
    }
  }
}

void dequant_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + kQK / 2;
  const auto* scales = reinterpret_cast<const int8_t*>(b + kQK / 2 + kQK / 4);
  const float d = load_f16(b + kQK / 2 + kQK / 4 + kQK / 16);
  // Two halves of 128; in half h, chunk c (of 32) takes nibble c/2 of ql[64h + 32(c%2) + l] and
  // bits 2c..2c+1 of qh[32h + l]; element e uses scale e/16.
  for (int h = 0; h < 2; ++h) {
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const int lo = (ql[64 * h + 32 * (c % 2) + l] >> (4 * (c / 2))) & 0x0f;
        const int hi = (qh[32 * h + l] >> (2 * c)) & 0x03;
        const int e = 128 * h + 32 * c + l;
        const float dl = d * static_cast<float>(scales[e / 16]);
        y[e] = dl * static_cast<float>((lo | (hi << 4)) - 32);
      }
    }
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn block_fn(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0:
      return dequant_q8_0;
    case GgmlType::kQ4_0:
      return dequant_q4_0;
    case GgmlType::kQ4_1:
      return dequant_q4_1;
    case GgmlType::kQ5_0:
      return dequant_q5_0;
    case GgmlType::kQ5_1:
      return dequant_q5_1;
    case GgmlType::kQ4_K:
      return dequant_q4_k;
    case GgmlType::kQ5_K:
      return dequant_q5_k;
    case GgmlType::kQ6_K:
      return dequant_q6_k;
    default:
      return nullptr;
  }
}

}  // namespace

bool can_dequantize(GgmlType type) {
  return type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16 ||
         block_fn(type) != nullptr;
}

void dequantize_blocks(GgmlType type, const uint8_t* src, float* dst, int64_t num_blocks) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(num_blocks) * 4);
      return;
    case GgmlType::kF16:
      for (int64_t i = 0; i < num_blocks; ++i) dst[i] = load_f16(src + 2 * i);
      return;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < num_blocks; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      return;
    default:
      break;
  }
  const BlockFn fn = block_fn(type);
  SE_CHECK(fn != nullptr, "dequantize_blocks: unsupported type {}", ggml_type_name(type));
  const GgmlTypeTraits traits = *ggml_type_traits(static_cast<uint32_t>(type));
  for (int64_t i = 0; i < num_blocks; ++i)
    fn(src + i * traits.type_size, dst + i * traits.block_size);
}

Result<Tensor> dequantize_tensor(const GgufTensorInfo& info) {
  if (!can_dequantize(info.type)) {
    return unimplemented(
        "tensor '{}' has type {}, which cannot be dequantized (supported: F32, F16, BF16, "
        "Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)",
        info.name, ggml_type_name(info.type));
  }
  if (info.dims.size() > static_cast<size_t>(Shape::kMaxDims)) {
    return unimplemented("tensor '{}' has {} dims", info.name, info.dims.size());
  }
  Shape shape(info.dims.rbegin(), info.dims.rend());
  Tensor out = Tensor::empty(DType::kF32, shape);
  const GgmlTypeTraits traits = *ggml_type_traits(static_cast<uint32_t>(info.type));
  const int64_t num_blocks = info.numel() / traits.block_size;
  // Chunks of blocks, so each thread writes whole blocks.
  constexpr int64_t kChunk = 4096;
  const int64_t num_chunks = (num_blocks + kChunk - 1) / kChunk;
  float* dst = out.data<float>();
#pragma omp parallel for schedule(static) if (num_chunks > 1)
  for (int64_t c = 0; c < num_chunks; ++c) {
    const int64_t begin = c * kChunk;
    const int64_t n = std::min(kChunk, num_blocks - begin);
    dequantize_blocks(info.type, info.data + begin * traits.type_size,
                      dst + begin * traits.block_size, n);
  }
  return out;
}

}  // namespace se
