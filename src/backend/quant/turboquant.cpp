#include "backend/quant/turboquant.h"

#include <algorithm>
#include <cmath>

#include "backend/quant/bit_stream.h"
#include "backend/quant/seeded_gaussian.h"
#include "base/check.h"
#include "base/top_k.h"
#include "tensor/dtype.h"

namespace se {
namespace {

double l2_norm(const float* x, int32_t n) {
  double s = 0.0;
  for (int32_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return std::sqrt(s);
}

// fp16 of a double through fp32, the way a float tensor's norm is stored as half.
uint16_t to_f16(double v) { return f32_to_f16(static_cast<float>(v)); }

int32_t checked_outlier_count(int32_t dim, int32_t num_outliers) {
  SE_CHECK(num_outliers > 0 && num_outliers < dim, "TurboQuant split needs between 1 and {} outlier channels, got {}",
           dim - 1, num_outliers);
  return num_outliers;
}

}  // namespace

TurboQuantMse::TurboQuantMse(int32_t dim, int32_t bits, uint64_t seed)
    : dim_(dim), bits_(bits), rotation_(haar_rotation(dim, seed)), codebook_(solve_lloyd_max(dim, bits)) {
  SE_CHECK(bits >= 1 && bits <= 8, "TurboQuant codes have 1..8 bits, not {}", bits);
}

size_t TurboQuantMse::code_bytes() const { return bit_stream_bytes(dim_, bits_); }

void TurboQuantMse::encode(const float* x, uint8_t* codes, uint16_t* norm) const {
  const double n = l2_norm(x, dim_);
  *norm = to_f16(n);
  const std::vector<double>& bounds = codebook_.boundaries;
  std::fill(codes, codes + code_bytes(), uint8_t{0});
  for (int32_t i = 0; i < dim_; ++i) {
    double y = 0.0;
    if (n > 0.0) {
      const double* row = rotation_.data() + static_cast<size_t>(i) * dim_;
      for (int32_t j = 0; j < dim_; ++j) y += row[j] * (x[j] / n);
    }
    uint32_t k = 0;
    while (k < bounds.size() && bounds[k] < y) ++k;
    write_bit_stream_code(codes, i, bits_, k);
  }
}

void TurboQuantMse::decode(const uint8_t* codes, uint16_t norm, float* out) const {
  const double n = f16_to_f32(norm);
  std::vector<double> acc(dim_, 0.0);
  for (int32_t i = 0; i < dim_; ++i) {
    const double c = codebook_.centroids[unpack_bit_stream(codes, i, bits_)];
    const double* row = rotation_.data() + static_cast<size_t>(i) * dim_;
    for (int32_t j = 0; j < dim_; ++j) acc[j] += row[j] * c;  // Pi^T c
  }
  for (int32_t j = 0; j < dim_; ++j) out[j] = static_cast<float>(n * acc[j]);
}

QjlResidual::QjlResidual(int32_t dim, uint64_t seed) : dim_(dim), projection_(gaussian_matrix(dim, seed)) {}

size_t QjlResidual::sign_bytes() const { return bit_stream_bytes(dim_, 1); }

void QjlResidual::encode(const float* r, uint8_t* signs, uint16_t* norm) const {
  *norm = to_f16(l2_norm(r, dim_));
  std::fill(signs, signs + sign_bytes(), uint8_t{0});
  for (int32_t i = 0; i < dim_; ++i) {
    const double* row = projection_.data() + static_cast<size_t>(i) * dim_;
    double s = 0.0;
    for (int32_t j = 0; j < dim_; ++j) s += row[j] * r[j];
    write_bit_stream_code(signs, i, 1, s >= 0.0 ? 1 : 0);
  }
}

void QjlResidual::add_decoded(const uint8_t* signs, uint16_t norm, float* out) const {
  const double gain = std::sqrt(M_PI / 2.0) / dim_ * f16_to_f32(norm);
  std::vector<double> acc(dim_, 0.0);
  for (int32_t i = 0; i < dim_; ++i) {
    const double sign = unpack_bit_stream(signs, i, 1) ? 1.0 : -1.0;
    const double* row = projection_.data() + static_cast<size_t>(i) * dim_;
    for (int32_t j = 0; j < dim_; ++j) acc[j] += sign * row[j];
  }
  for (int32_t j = 0; j < dim_; ++j) out[j] = static_cast<float>(out[j] + gain * acc[j]);
}

TurboQuantProd::TurboQuantProd(int32_t dim, int32_t bits, uint64_t seed)
    : mse_(dim, bits - 1, seed), qjl_(dim, seed + kQjlSeedOffset) {
  SE_CHECK(bits >= 2, "TurboQuant prod needs at least 2 bits (1 MSE + 1 QJL), not {}", bits);
}

void TurboQuantProd::encode(const float* x, uint8_t* codes, uint16_t* norm, uint8_t* signs,
                            uint16_t* residual_norm) const {
  mse_.encode(x, codes, norm);
  std::vector<float> r(mse_.dim());
  mse_.decode(codes, *norm, r.data());
  for (int32_t j = 0; j < mse_.dim(); ++j) r[j] = x[j] - r[j];
  qjl_.encode(r.data(), signs, residual_norm);
}

void TurboQuantProd::decode(const uint8_t* codes, uint16_t norm, const uint8_t* signs, uint16_t residual_norm,
                            float* out) const {
  mse_.decode(codes, norm, out);
  qjl_.add_decoded(signs, residual_norm, out);
}

TurboQuantSplit::TurboQuantSplit(int32_t dim, int32_t num_outliers, int32_t bits, uint64_t seed)
    : dim_(dim),
      outlier_(checked_outlier_count(dim, num_outliers), bits + 1, seed),
      regular_(dim - num_outliers, bits, seed + kSplitSeedOffset) {}

double TurboQuantSplit::effective_bits() const {
  return static_cast<double>(outlier_.dim() * outlier_.bits() + regular_.dim() * regular_.bits()) / dim_;
}

size_t TurboQuantSplit::code_bytes() const { return outlier_.code_bytes() + regular_.code_bytes(); }

void TurboQuantSplit::encode(const float* x, const int32_t* order, uint8_t* codes, uint16_t norms[2]) const {
  std::vector<float> ordered(dim_);
  for (int32_t i = 0; i < dim_; ++i) ordered[i] = x[order[i]];
  outlier_.encode(ordered.data(), codes, &norms[0]);
  regular_.encode(ordered.data() + outlier_.dim(), codes + outlier_.code_bytes(), &norms[1]);
}

void TurboQuantSplit::decode(const uint8_t* codes, const uint16_t norms[2], const int32_t* order, float* out) const {
  std::vector<float> ordered(dim_);
  outlier_.decode(codes, norms[0], ordered.data());
  regular_.decode(codes + outlier_.code_bytes(), norms[1], ordered.data() + outlier_.dim());
  for (int32_t i = 0; i < dim_; ++i) out[order[i]] = ordered[i];
}

std::vector<int32_t> select_outlier_channels(const float* x, int64_t tokens, int32_t dim, int32_t count) {
  std::vector<float> energy(dim, 0.0f);
  for (int64_t t = 0; t < tokens; ++t)
    for (int32_t c = 0; c < dim; ++c) energy[c] += x[t * dim + c] * x[t * dim + c];
  return top_k_ascending(energy.data(), dim, count);
}

std::vector<int32_t> outlier_channel_order(const std::vector<int32_t>& outliers, int32_t dim) {
  SE_CHECK(!outliers.empty() && static_cast<int32_t>(outliers.size()) < dim,
           "TurboQuant split needs between 1 and {} outlier channels, got {}", dim - 1, outliers.size());
  std::vector<int32_t> order = outliers;
  size_t k = 0;
  for (int32_t c = 0; c < dim; ++c) {
    SE_CHECK(k == outliers.size() || (outliers[k] >= c && outliers[k] < dim),
             "TurboQuant outlier channels must be ascending channel indices below {}", dim);
    if (k < outliers.size() && outliers[k] == c)
      ++k;
    else
      order.push_back(c);
  }
  SE_CHECK(k == outliers.size(), "TurboQuant outlier channels must be ascending channel indices below {}", dim);
  return order;
}

}  // namespace se
