#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace se::cpu {

namespace {

// YaRN (Peng et al. 2023, as transformers computes it): dimensions that turn more than beta_fast times over the
// trained context keep their frequency, those that turn fewer than beta_slow times are interpolated (divided by
// `factor`), and a linear ramp over the dimension index blends the two in between.
struct YarnBand {
  double low = 0.0;
  double high = 0.0;
  explicit YarnBand(const RopeParams& p) {
    const double dim = p.rotary_dim;
    // The dimension whose wavelength fits `rotations` times into the trained context.
    const auto dimension_of = [&](double rotations) {
      return dim * std::log(p.original_max_position / (rotations * 2.0 * std::numbers::pi)) /
             (2.0 * std::log(static_cast<double>(p.theta)));
    };
    low = dimension_of(p.beta_fast);
    high = dimension_of(p.beta_slow);
    if (p.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1.0);
    if (low == high) high += 0.001;
  }
  // Dimension i's frequency: `freq` divided by `factor` in the share the ramp gives it.
  double frequency(int i, double freq, double factor) const {
    const double interpolated_share = std::clamp((i - low) / (high - low), 0.0, 1.0);
    return freq / factor * interpolated_share + freq * (1.0 - interpolated_share);
  }
};

}  // namespace

void rope_inv_freq(const RopeParams& p, float* inv_freq) {
  const int half = p.rotary_dim / 2;
  const YarnBand yarn(p);
  for (int i = 0; i < half; ++i) {
    // Computed in double and rounded once, as HF computes `1 / base ** (arange(0, d, 2) / d)` in fp32 from
    // an int64 arange: the fp32 result matches to the last bit in practice.
    double freq = 1.0 / std::pow(static_cast<double>(p.theta), (2.0 * i) / p.rotary_dim);
    if (p.scaling == RopeScaling::kLinear) {
      freq /= p.factor;
    } else if (p.scaling == RopeScaling::kLlama3) {
      // Llama 3.1 frequency-dependent scaling: long wavelengths scaled by `factor`, short ones kept,
      // a smooth interpolation between the two bands.
      const double low_freq_wavelen = p.original_max_position / p.low_freq_factor;
      const double high_freq_wavelen = p.original_max_position / p.high_freq_factor;
      const double wavelen = 2.0 * std::numbers::pi / freq;
      if (wavelen > low_freq_wavelen) {
        freq /= p.factor;
      } else if (wavelen >= high_freq_wavelen) {
        const double smooth = (p.original_max_position / wavelen - p.low_freq_factor) /
                              (p.high_freq_factor - p.low_freq_factor);
        freq = (1.0 - smooth) * freq / p.factor + smooth * freq;
      }
    } else if (p.scaling == RopeScaling::kYarn) {
      freq = yarn.frequency(i, freq, p.factor);
    }
    inv_freq[i] = static_cast<float>(freq);
  }
}

void rope(TensorView x, TensorView positions, const RopeParams& p) {
  const int64_t num_tokens = x.shape[0];
  const int64_t heads = x.shape[1];
  const int64_t head_dim = x.shape[2];
  const int half = p.rotary_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  rope_inv_freq(p, inv_freq.data());
  const int32_t* pos = positions.ptr<int32_t>();
#pragma omp parallel for if (num_tokens > 4)
  for (int64_t t = 0; t < num_tokens; ++t) {
    std::vector<float> cos_v(static_cast<size_t>(half)), sin_v(static_cast<size_t>(half));
    for (int i = 0; i < half; ++i) {
      // fp32 angle, as HF computes `position * inv_freq` in fp32 before cos/sin.
      const float angle = static_cast<float>(pos[t]) * inv_freq[static_cast<size_t>(i)];
      cos_v[static_cast<size_t>(i)] = std::cos(angle) * p.attention_factor;
      sin_v[static_cast<size_t>(i)] = std::sin(angle) * p.attention_factor;
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x.ptr<float>() + (t * heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const float a = v[i];
        const float b = v[i + half];
        v[i] = a * cos_v[static_cast<size_t>(i)] - b * sin_v[static_cast<size_t>(i)];
        v[i + half] = b * cos_v[static_cast<size_t>(i)] + a * sin_v[static_cast<size_t>(i)];
      }
    }
  }
}

void split_qkv_rope(TensorView q, TensorView k, TensorView v, TensorView qkv, TensorView positions,
                    const RopeParams& rope_params, const QkNorm* qk_norm) {
  const int64_t rows = qkv.shape[0];
  const int64_t width = qkv.shape[1];
  const TensorView outs[] = {q, k, v};
#pragma omp parallel for if (rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = qkv.ptr<float>() + r * width;
    for (const TensorView& out : outs) {
      const int64_t n = out.numel() / rows;
      std::copy_n(src, n, out.ptr<float>() + r * n);
      src += n;
    }
  }
  if (qk_norm != nullptr) {
    cpu::rms_norm(q, q, qk_norm->q_weight, qk_norm->eps);
    cpu::rms_norm(k, k, qk_norm->k_weight, qk_norm->eps);
  }
  cpu::rope(q, positions, rope_params);
  cpu::rope(k, positions, rope_params);
}

}  // namespace se::cpu
