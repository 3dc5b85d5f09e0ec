// The CPU reference of sample_rows: with u swept evenly over [0, 1) the picks reproduce the filtered,
// temperature-scaled distribution exactly (inverse-CDF sampling in the sorted order), and the filters keep the
// tokens vLLM keeps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <vector>

#include "backend/ops.h"

namespace se {
namespace {

struct Pick {
  int32_t token;
  float logprob;
};

Pick sample_one(std::vector<float> logits, const RowSampling& s) {
  Pick pick{-1, 0.0f};
  const auto vocab = static_cast<int64_t>(logits.size());
  sample_rows(TensorView{&pick.token, DType::kI32, {1}}, TensorView{&pick.logprob, DType::kF32, {1}},
              TensorView{logits.data(), DType::kF32, {1, vocab}}, std::span<const RowSampling>(&s, 1));
  return pick;
}

// Share of each token over u = (j + 0.5) / draws.
std::map<int32_t, double> swept_shares(const std::vector<float>& logits, RowSampling s, int draws) {
  std::map<int32_t, double> shares;
  for (int j = 0; j < draws; ++j) {
    s.u = (j + 0.5) / draws;
    shares[sample_one(logits, s).token] += 1.0 / draws;
  }
  return shares;
}

// The distribution an independent reading of vLLM's rules gives: p ∝ exp(logit / T) over the kept tokens.
std::map<int32_t, double> expected_shares(const std::vector<float>& logits, const RowSampling& s) {
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  std::vector<double> p;
  for (int32_t id : order) p.push_back(std::exp((logits[id] - logits[order[0]]) / s.temperature));
  size_t keep = order.size();
  if (s.min_p > 0.0f)
    keep = static_cast<size_t>(std::count_if(p.begin(), p.end(), [&](double q) { return q >= s.min_p; }));
  if (s.top_k > 0) keep = std::min(keep, static_cast<size_t>(s.top_k));
  const double total = std::accumulate(p.begin(), p.begin() + static_cast<int64_t>(keep), 0.0);
  double cumulative = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    cumulative += p[i];
    if (cumulative >= s.top_p * total) {
      keep = i + 1;
      break;
    }
  }
  const double kept = std::accumulate(p.begin(), p.begin() + static_cast<int64_t>(keep), 0.0);
  std::map<int32_t, double> shares;
  for (size_t i = 0; i < keep; ++i) shares[order[i]] = p[i] / kept;
  return shares;
}

const std::vector<float> kLogits = {0.3f, 2.0f, -1.0f, 1.2f, 2.0f, 0.9f, -3.0f, 1.7f};

TEST(SampleRowsTest, SweptDrawsReproduceTheFilteredDistribution) {
  constexpr int kDraws = 20000;
  for (const RowSampling& s : {RowSampling{1.0f, 0, 1.0f, 0.0f, 0.0}, RowSampling{0.5f, 0, 1.0f, 0.0f, 0.0},
                               RowSampling{1.5f, 3, 1.0f, 0.0f, 0.0}, RowSampling{1.0f, 0, 0.8f, 0.0f, 0.0},
                               RowSampling{0.8f, 0, 1.0f, 0.3f, 0.0}, RowSampling{1.2f, 5, 0.9f, 0.1f, 0.0}}) {
    const std::map<int32_t, double> got = swept_shares(kLogits, s, kDraws);
    const std::map<int32_t, double> want = expected_shares(kLogits, s);
    // Every pick is a kept token, and each kept token's share is its probability to within two draws (a token
    // rarer than one draw in kDraws may not be picked at all).
    for (const auto& [token, share] : got)
      EXPECT_TRUE(want.count(token)) << "token " << token << " is filtered out, yet picked, with T "
                                     << s.temperature << " top_k " << s.top_k << " top_p " << s.top_p << " min_p "
                                     << s.min_p;
    for (const auto& [token, share] : want)
      EXPECT_NEAR(got.count(token) ? got.at(token) : 0.0, share, 2.0 / kDraws) << "token " << token;
  }
}

TEST(SampleRowsTest, TopOneIsTheArgmaxWithTheLowerIdOnATie) {
  for (double u : {0.0, 0.5, 0.999}) EXPECT_EQ(sample_one(kLogits, {1.0f, 1, 1.0f, 0.0f, u}).token, 1);
  // The smallest draw takes the first token of the sorted order: the tie between ids 1 and 4 goes to 1.
  EXPECT_EQ(sample_one(kLogits, {1.0f, 0, 1.0f, 0.0f, 0.0}).token, 1);
}

TEST(SampleRowsTest, LogprobIsUnderTheUnscaledDistribution) {
  double log_sum = 0.0;
  for (float x : kLogits) log_sum += std::exp(static_cast<double>(x) - 2.0);
  const Pick pick = sample_one(kLogits, {0.3f, 0, 1.0f, 0.0f, 0.7});
  EXPECT_NEAR(pick.logprob, kLogits[static_cast<size_t>(pick.token)] - 2.0 - std::log(log_sum), 1e-6);
}

TEST(SampleRowsTest, InvalidSettingsAreRefused) {
  EXPECT_DEATH(sample_one(kLogits, {0.0f, 0, 1.0f, 0.0f, 0.5}), "invalid settings");
  EXPECT_DEATH(sample_one(kLogits, {1.0f, 0, 1.0f, 0.0f, 1.0}), "invalid settings");
}

}  // namespace
}  // namespace se
