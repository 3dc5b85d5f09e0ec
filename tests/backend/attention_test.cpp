#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/ops.h"
#include "op_test_util.h"

namespace se {
namespace {

// Float64 reference of causal, optionally windowed and soft-capped GQA attention.
std::vector<double> reference_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const std::vector<int32_t>& qpos, const std::vector<int32_t>& kpos,
                                        const AttentionParams& p) {
  const int64_t T = q.dim(0), H = q.dim(1), D = q.dim(2), S = k.dim(0), Hkv = k.dim(1);
  std::vector<double> out(static_cast<size_t>(T * H * D), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hkv);
      std::vector<double> s(static_cast<size_t>(S), -std::numeric_limits<double>::infinity());
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < S; ++j) {
        if (kpos[j] > qpos[t]) continue;
        if (p.sliding_window > 0 && qpos[t] - kpos[j] >= p.sliding_window) continue;
        double dot = 0;
        for (int64_t d = 0; d < D; ++d)
          dot += static_cast<double>(q.data<float>()[(t * H + h) * D + d]) * k.data<float>()[(j * Hkv + g) * D + d];
        dot *= p.scale;
        if (p.logit_softcap > 0) dot = p.logit_softcap * std::tanh(dot / p.logit_softcap);
        s[j] = dot;
        mx = std::max(mx, dot);
      }
      double den = 0;
      for (int64_t j = 0; j < S; ++j) den += std::exp(s[j] - mx);
      for (int64_t j = 0; j < S; ++j) {
        const double w = std::exp(s[j] - mx) / den;
        for (int64_t d = 0; d < D; ++d) out[(t * H + h) * D + d] += w * v.data<float>()[(j * Hkv + g) * D + d];
      }
    }
  return out;
}

struct AttentionCase {
  int T, S, H, Hkv, D, window;
  float softcap;
};

TEST(AttentionTest, MatchesFloat64ReferenceAcrossShapes) {
  const AttentionCase cases[] = {{1, 37, 8, 2, 64, 0, 0.0f},  {16, 16, 4, 4, 32, 0, 0.0f},
                                 {5, 300, 9, 3, 64, 0, 0.0f}, {7, 200, 4, 1, 256, 64, 0.0f},
                                 {3, 50, 8, 8, 16, 0, 30.0f}};
  uint64_t seed = 1;
  for (const AttentionCase& c : cases) {
    Tensor q = test::random_tensor({c.T, c.H, c.D}, seed++);
    Tensor k = test::random_tensor({c.S, c.Hkv, c.D}, seed++);
    Tensor v = test::random_tensor({c.S, c.Hkv, c.D}, seed++);
    // The queries are the last T of S positions (a chunk against its cached prefix).
    std::vector<int32_t> kpos(c.S), qpos(c.T);
    for (int i = 0; i < c.S; ++i) kpos[i] = i;
    for (int i = 0; i < c.T; ++i) qpos[i] = c.S - c.T + i;
    AttentionParams p;
    p.scale = 1.0f / std::sqrt(static_cast<float>(c.D));
    p.sliding_window = c.window;
    p.logit_softcap = c.softcap;
    Tensor out = Tensor::empty(DType::kF32, {c.T, c.H, c.D});
    std::fill(out.data<float>(), out.data<float>() + out.numel(), std::numeric_limits<float>::quiet_NaN());
    attention(out.view(), q.view(), k.view(), v.view(), TensorView{qpos.data(), DType::kI32, {c.T}},
              TensorView{kpos.data(), DType::kI32, {c.S}}, p);
    auto ref = reference_attention(q, k, v, qpos, kpos, p);
    EXPECT_LT(test::relative_error(out.data<float>(), ref.data(), out.numel()), 1e-5)
        << "T=" << c.T << " S=" << c.S << " H=" << c.H << " window=" << c.window;
  }
}

}  // namespace
}  // namespace se
