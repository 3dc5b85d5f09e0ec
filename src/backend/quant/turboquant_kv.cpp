#include "backend/quant/turboquant_kv.h"

#include <algorithm>

#include "backend/quant/fp8_kv.h"
#include "base/check.h"

namespace se {

void turboquant_encode_value(const float* v, int32_t dim, int32_t bits, uint8_t* record) {
  const float minimum = *std::min_element(v, v + dim), maximum = *std::max_element(v, v + dim);
  const auto top = static_cast<float>((1 << bits) - 1);
  float scale = (maximum - minimum) / top;
  if (!(scale > kTurboQuantMinValueScale)) scale = kTurboQuantMinValueScale;
  std::fill(record, record + bit_stream_bytes(dim, bits), uint8_t{0});
  for (int32_t j = 0; j < dim; ++j) {
    // Truncation toward zero of a value >= 0.5 is the floor: round half up, as vLLM's store kernel does.
    const float q = std::trunc((v[j] - minimum) / scale + 0.5f);
    write_bit_stream_code(record, j, bits, static_cast<uint32_t>(std::clamp(q, 0.0f, top)));
  }
  uint8_t* params = record + bit_stream_bytes(dim, bits);
  write_u16(f32_to_f16(scale), params);
  write_u16(f32_to_f16(minimum), params + 2);
}

TurboQuantKvCodec::TurboQuantKvCodec(int32_t head_dim, TurboQuantKvFormat format, uint64_t seed)
    : head_dim_(head_dim), format_(format), layout_(turboquant_slot_layout(head_dim, format)) {
  SE_CHECK(head_dim > 0, "TurboQuant KV: head_dim {}", head_dim);
  SE_CHECK(!format.outlier_split, "TurboQuant KV: the outlier-split store has its own codec (turboquant_prod_kv.h)");
  SE_CHECK(format.key_fp8() || (format.key_bits >= 2 && format.key_bits <= 4),
           "TurboQuant KV: keys take 2..4 bits or 8 (e4m3), not {}", format.key_bits);
  SE_CHECK(format.value_bits >= 2 && format.value_bits <= 8, "TurboQuant KV: values take 2..8 bits, not {}",
           format.value_bits);
  if (format.key_fp8()) return;
  keys_.emplace(head_dim, format.key_bits, seed);
  rotation_.assign(keys_->rotation().begin(), keys_->rotation().end());
  centroids_.assign(keys_->codebook().centroids.begin(), keys_->codebook().centroids.end());
}

void TurboQuantKvCodec::encode(const float* k, const float* v, uint8_t* slot) const {
  if (keys_) {
    uint16_t norm = 0;
    keys_->encode(k, slot, &norm);
    write_u16(norm, slot + keys_->code_bytes());
  } else {
    fp8_quantize(k, static_cast<size_t>(head_dim_), 1.0f, Fp8Format::kE4M3, slot);
  }
  turboquant_encode_value(v, head_dim_, format_.value_bits, slot + layout_.key_bytes);
}

void TurboQuantKvCodec::decode(const uint8_t* slot, float* k, float* v) const {
  const auto dim = static_cast<size_t>(head_dim_);
  if (keys_) {
    std::vector<float> rotated(dim);
    turboquant_decode_rotated_key(slot, head_dim_, format_.key_bits, centroids_.data(), format_.norm_correction,
                                  rotated.data());
    for (size_t j = 0; j < dim; ++j) {  // Pi^T y
      double sum = 0.0;
      for (size_t i = 0; i < dim; ++i) sum += keys_->rotation()[i * dim + j] * rotated[i];
      k[j] = static_cast<float>(sum);
    }
  } else {
    fp8_dequantize(slot, dim, 1.0f, Fp8Format::kE4M3, k);
  }
  turboquant_decode_value(slot + layout_.key_bytes, head_dim_, format_.value_bits, v);
}

}  // namespace se
