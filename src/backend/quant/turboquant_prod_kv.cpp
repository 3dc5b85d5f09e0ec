#include "backend/quant/turboquant_prod_kv.h"

#include <cmath>

#include "backend/quant/bit_stream.h"
#include "base/check.h"
#include "tensor/dtype.h"

namespace se {
namespace {

int32_t checked_outliers(int32_t head_dim, int32_t bits) {
  SE_CHECK(bits == 2 || bits == 3, "TurboQuant prod KV: 2 or 3 bits (2.5 or 3.5 effective), not {}", bits);
  SE_CHECK(head_dim >= 4 && head_dim % 2 == 0, "TurboQuant prod KV: head_dim {} is not even and at least 4", head_dim);
  return turboquant_num_outliers(head_dim);
}

// out[i] = sum_j m[i][j] x[j] for a [dim, dim] row-major m.
void multiply(const std::vector<float>& m, const float* x, int32_t dim, float* out) {
  for (int32_t i = 0; i < dim; ++i) {
    float sum = 0.0f;
    const float* row = m.data() + static_cast<size_t>(i) * dim;
    for (int32_t j = 0; j < dim; ++j) sum += row[j] * x[j];
    out[i] = sum;
  }
}

}  // namespace

TurboQuantProdKvCodec::Part TurboQuantProdKvCodec::part_of(const TurboQuantMse& mse, int32_t begin) {
  Part p;
  p.begin = begin;
  p.dim = mse.dim();
  p.rotation.assign(mse.rotation().begin(), mse.rotation().end());
  p.centroids.assign(mse.codebook().centroids.begin(), mse.codebook().centroids.end());
  return p;
}

TurboQuantProdKvCodec::TurboQuantProdKvCodec(int32_t head_dim, int32_t bits, uint64_t seed)
    : head_dim_(head_dim),
      bits_(bits),
      key_outlier_(checked_outliers(head_dim, bits), bits + 1, seed),
      key_regular_(head_dim - turboquant_num_outliers(head_dim), bits, seed + kSplitSeedOffset),
      values_(head_dim, turboquant_num_outliers(head_dim), bits, seed + kTurboQuantValueSeedOffset),
      layout_(turboquant_slot_layout(head_dim, TurboQuantKvFormat{bits, bits, false, true})) {
  outlier_signs_ = key_outlier_.mse().code_bytes();
  regular_codes_ = outlier_signs_ + key_outlier_.qjl().sign_bytes();
  regular_signs_ = regular_codes_ + key_regular_.mse().code_bytes();
  key_norms_ = regular_signs_ + key_regular_.qjl().sign_bytes();
  SE_CHECK(key_norms_ + 8 == layout_.key_bytes && values_.code_bytes() + 4 == layout_.value_bytes,
           "TurboQuant prod KV: the records' bytes disagree with turboquant_slot_layout");
  const TurboQuantProd* key_codecs[2] = {&key_outlier_, &key_regular_};
  for (int p = 0; p < 2; ++p) {
    keys_[p] = part_of(key_codecs[p]->mse(), p == 0 ? 0 : num_outliers());
    keys_[p].projection.assign(key_codecs[p]->qjl().projection().begin(), key_codecs[p]->qjl().projection().end());
  }
  values_parts_[0] = part_of(values_.outlier_codec(), 0);
  values_parts_[1] = part_of(values_.regular_codec(), num_outliers());
}

void TurboQuantProdKvCodec::encode(const float* k, const float* v, const int32_t* key_order, const int32_t* value_order,
                                   uint8_t* slot) const {
  std::vector<float> ordered(static_cast<size_t>(head_dim_));
  for (int32_t i = 0; i < head_dim_; ++i) ordered[i] = k[key_order[i]];
  uint16_t norms[4];
  key_outlier_.encode(ordered.data(), slot, &norms[0], slot + outlier_signs_, &norms[1]);
  key_regular_.encode(ordered.data() + num_outliers(), slot + regular_codes_, &norms[2], slot + regular_signs_,
                      &norms[3]);
  for (int i = 0; i < 4; ++i) write_u16(norms[i], slot + key_norms_ + 2 * i);
  uint8_t* value = slot + layout_.key_bytes;
  uint16_t value_norms[2];
  values_.encode(v, value_order, value, value_norms);
  for (int i = 0; i < 2; ++i) write_u16(value_norms[i], value + values_.code_bytes() + 2 * i);
}

void TurboQuantProdKvCodec::decode(const uint8_t* slot, const int32_t* key_order, const int32_t* value_order, float* k,
                                   float* v) const {
  std::vector<float> ordered(static_cast<size_t>(head_dim_));
  const uint8_t* norms = slot + key_norms_;
  key_outlier_.decode(slot, read_u16(norms), slot + outlier_signs_, read_u16(norms + 2), ordered.data());
  key_regular_.decode(slot + regular_codes_, read_u16(norms + 4), slot + regular_signs_, read_u16(norms + 6),
                      ordered.data() + num_outliers());
  for (int32_t i = 0; i < head_dim_; ++i) k[key_order[i]] = ordered[i];
  const uint8_t* value = slot + layout_.key_bytes;
  const uint16_t value_norms[2] = {read_u16(value + values_.code_bytes()), read_u16(value + values_.code_bytes() + 2)};
  values_.decode(value, value_norms, value_order, v);
}

void TurboQuantProdKvCodec::project_query(const float* q, const int32_t* key_order, float* out) const {
  std::vector<float> ordered(static_cast<size_t>(head_dim_));
  for (int32_t i = 0; i < head_dim_; ++i) ordered[i] = q[key_order[i]];
  for (const Part& p : keys_) {
    multiply(p.rotation, ordered.data() + p.begin, p.dim, out + p.begin);
    multiply(p.projection, ordered.data() + p.begin, p.dim, out + head_dim_ + p.begin);
  }
}

void TurboQuantProdKvCodec::read_key(const uint8_t* slot, float* out) const {
  const size_t codes[2] = {0, regular_codes_}, signs[2] = {outlier_signs_, regular_signs_};
  const int32_t code_bits[2] = {bits_, bits_ - 1};
  for (int p = 0; p < 2; ++p) {
    const Part& part = keys_[p];
    const float norm = f16_to_f32(read_u16(slot + key_norms_ + 4 * p));
    const float gain =
        static_cast<float>(std::sqrt(M_PI / 2.0) / part.dim) * f16_to_f32(read_u16(slot + key_norms_ + 4 * p + 2));
    for (int32_t i = 0; i < part.dim; ++i) {
      out[part.begin + i] = norm * part.centroids[unpack_bit_stream(slot + codes[p], i, code_bits[p])];
      out[head_dim_ + part.begin + i] = unpack_bit_stream(slot + signs[p], i, 1) ? gain : -gain;
    }
  }
}

void TurboQuantProdKvCodec::read_value(const uint8_t* slot, float* out) const {
  const uint8_t* value = slot + layout_.key_bytes;
  const size_t codes[2] = {0, values_.outlier_codec().code_bytes()};
  const int32_t code_bits[2] = {bits_ + 1, bits_};
  for (int p = 0; p < 2; ++p) {
    const Part& part = values_parts_[p];
    const float norm = f16_to_f32(read_u16(value + values_.code_bytes() + 2 * p));
    for (int32_t i = 0; i < part.dim; ++i)
      out[part.begin + i] = norm * part.centroids[unpack_bit_stream(value + codes[p], i, code_bits[p])];
  }
}

void TurboQuantProdKvCodec::unrotate_value(const float* rotated, const int32_t* value_order, float* out) const {
  for (const Part& p : values_parts_)
    for (int32_t j = 0; j < p.dim; ++j) {  // (Pi_P^T y_P)_j
      float sum = 0.0f;
      for (int32_t i = 0; i < p.dim; ++i) sum += p.rotation[static_cast<size_t>(i) * p.dim + j] * rotated[p.begin + i];
      out[value_order[p.begin + j]] = sum;
    }
}

}  // namespace se
