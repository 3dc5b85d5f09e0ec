// TurboQuant (Zandieh et al., arXiv 2504.19874) vector codecs for one KV head vector of `dim` channels.
//
// TurboQuantMse (b bits per coordinate, the key path vLLM builds): the norm n = ||x|| is kept as fp16; the unit
// vector is rotated, y = Pi x / n (Pi a seeded Haar rotation), and each coordinate stores the index of its
// Lloyd-Max cell for N(0, 1/dim) (the number of cell boundaries strictly below y_j, torch.bucketize's rule),
// packed as a bit stream. Decoding is n * Pi^T c[idx]. A zero vector stores n = 0 and decodes to zeros.
//
// TurboQuantProd (b bits, unbiased inner products): TurboQuantMse at b - 1 bits, then the residual
// r = x - decode_mse(x) keeps the signs of S r (S a seeded dim x dim Gaussian matrix; sign(0) = +1) as a 1-bit
// stream and gamma = ||r|| as fp16; decoding adds sqrt(pi/2) / dim * gamma * S^T sign(S r), whose expectation
// over S is r, so <y, decode(x)> is an unbiased estimate of <y, x> (up to gamma's fp16 rounding).
//
// TurboQuantSplit (fractional effective bits, the paper's section 4.3): the outlier channels and the others are
// coded by two independent TurboQuantMse instances, the outliers at b + 1 bits. The paper does not say how
// outlier channels are chosen; here each call is given a channel order (outlier_channel_order: the outliers
// ascending, then the other channels ascending), so one split serves streams whose outliers differ, and
// select_outlier_channels picks the ones with the largest energy (sum of squares) over some tokens, e.g. a
// stream's first prefill chunk. Half the channels as outliers gives b + 0.5 bits per coordinate (2.5 from b = 2,
// 3.5 from b = 3).
//
// The rotation uses stream `seed`, the QJL matrix stream `seed + kQjlSeedOffset`, and the split's regular
// instance stream `seed + kSplitSeedOffset`. Encoding and decoding are const and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/quant/lloyd_max.h"

namespace se {

inline constexpr uint64_t kQjlSeedOffset = 0x51a7c0de;
inline constexpr uint64_t kSplitSeedOffset = 0x0ddba11;

class TurboQuantMse {
 public:
  TurboQuantMse(int32_t dim, int32_t bits, uint64_t seed);

  int32_t dim() const { return dim_; }
  int32_t bits() const { return bits_; }
  size_t code_bytes() const;  // packed codes of one vector
  const std::vector<double>& rotation() const { return rotation_; }  // [dim, dim] row-major
  const LloydMaxCodebook& codebook() const { return codebook_; }

  // x [dim] -> codes [code_bytes()], norm (fp16 bits).
  void encode(const float* x, uint8_t* codes, uint16_t* norm) const;
  // -> out [dim]
  void decode(const uint8_t* codes, uint16_t norm, float* out) const;

 private:
  int32_t dim_;
  int32_t bits_;
  std::vector<double> rotation_;
  LloydMaxCodebook codebook_;
};

// The 1-bit QJL code of a residual vector.
class QjlResidual {
 public:
  QjlResidual(int32_t dim, uint64_t seed);

  size_t sign_bytes() const;
  // r [dim] -> signs [sign_bytes()] (bit i set: (S r)_i >= 0), norm = fp16(||r||).
  void encode(const float* r, uint8_t* signs, uint16_t* norm) const;
  // out[i] += sqrt(pi/2) / dim * norm * (S^T sign)_i
  void add_decoded(const uint8_t* signs, uint16_t norm, float* out) const;
  const std::vector<double>& projection() const { return projection_; }

 private:
  int32_t dim_;
  std::vector<double> projection_;  // S [dim, dim] row-major
};

class TurboQuantProd {
 public:
  // bits >= 2: b - 1 of them go to the MSE stage.
  TurboQuantProd(int32_t dim, int32_t bits, uint64_t seed);

  const TurboQuantMse& mse() const { return mse_; }
  const QjlResidual& qjl() const { return qjl_; }

  void encode(const float* x, uint8_t* codes, uint16_t* norm, uint8_t* signs, uint16_t* residual_norm) const;
  void decode(const uint8_t* codes, uint16_t norm, const uint8_t* signs, uint16_t residual_norm, float* out) const;

 private:
  TurboQuantMse mse_;
  QjlResidual qjl_;
};

class TurboQuantSplit {
 public:
  // 0 < num_outliers < dim.
  TurboQuantSplit(int32_t dim, int32_t num_outliers, int32_t bits, uint64_t seed);

  double effective_bits() const;
  size_t code_bytes() const;  // outlier codes, then regular codes
  const TurboQuantMse& outlier_codec() const { return outlier_; }
  const TurboQuantMse& regular_codec() const { return regular_; }

  // order [dim]: the outlier channels, then the others (outlier_channel_order). norms[0]: the outlier part's,
  // norms[1]: the regular part's.
  void encode(const float* x, const int32_t* order, uint8_t* codes, uint16_t norms[2]) const;
  void decode(const uint8_t* codes, const uint16_t norms[2], const int32_t* order, float* out) const;

 private:
  int32_t dim_;
  TurboQuantMse outlier_;
  TurboQuantMse regular_;
};

// The `count` channels with the largest sum of squares over x [tokens, dim], ascending (ties to the lower).
std::vector<int32_t> select_outlier_channels(const float* x, int64_t tokens, int32_t dim, int32_t count);
// [dim]: `outliers` (ascending channel indices, 0 < size < dim), then the other channels ascending.
std::vector<int32_t> outlier_channel_order(const std::vector<int32_t>& outliers, int32_t dim);

}  // namespace se
