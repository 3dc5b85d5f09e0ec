// Every sparse method's decisions on the GPU against the CPU's: what each (layer, KV head) stream keeps, what each
// layer's selection lets attention read, and the greedy continuations that follow, on the tiny random model and on
// SmolLM2 when its file is present. Both devices run the same bf16 weights, but the GPU's activations and pages
// are bf16, so its method scores differ from the CPU's by rounding, and where two candidates score within that
// rounding it may keep or select the other one. The tests tell such near-ties from bugs: a continuation may part
// from the CPU's only at a near-tie of the step's logits, or after a kept set or selection that parted where the
// method's own scores were within rounding of each other. docs/fidelity.md has the counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/ranges.h>

#include "../../backend/cuda/cuda_test_util.h"
#include "../../loader/test_models.h"
#include "backend/device_memory.h"
#include "backend/ops.h"
#include "engine/engine.h"
#include "engine/teacher_forcing.h"
#include "gpu_parity_support.h"
#include "model/hf_config.h"
#include "sparse/method_config.h"
#include "sparse/method_registry.h"
#include "sparse/method_traits.h"
#include "base/top_k.h"
#include "sparse/methods/kara_selection.h"
#include "sparse/methods/observation_window_scores.h"
#include "sparse/methods/rkv_scores.h"
#include "sparse/sparse_controller.h"

namespace se {
namespace {

using namespace gpu_parity;

constexpr int kPrefillChunk = 24;  // the engine tests' --max-num-batched-tokens
constexpr int kNumNew = 16;        // greedy tokens per prompt

// Each registered method with budgets small enough for the tiny model's 40-90-token prompts that it evicts or
// selects (32 tokens kept).
std::map<std::string, nlohmann::json> tiny_method_configs() {
  return {{"vanilla", nullptr},
          {"streamingllm", {{"budget", 32}}},
          {"snapkv", {{"budget", 32}, {"window", 8}}},
          {"pyramidkv", {{"budget", 32}, {"window", 8}}},
          {"adakv", {{"budget", 32}, {"window", 8}}},
          {"chunkkv", {{"budget", 32}, {"window", 8}}},
          {"h2o", {{"budget", 32}}},
          {"quest", {{"token_budget", 32}, {"dense_layers", 0}}},
          {"omnikv", {{"num_selected_tokens", 32}, {"filter_layers", {0}}}},
          {"kvzip", {{"ratio", 0.5}}},
          // Decode-time compression of the 16 generated tokens: R-KV at decode steps 12 and 16, Kara at 8 and 16.
          {"rkv", {{"budget", 8}, {"buffer", 4}, {"window", 2}, {"kernel", 3}}},
          {"kara", {{"window", 6}, {"buffer", 2}, {"candidates", 2}, {"budget", 3}, {"period", 4}}}};
}

// What one decode step's attention read in each layer for sequence 0 of its batch: per KV head the ascending
// page or token indices a selection left (none recorded: the layer read densely), and, where the run is on the
// CPU, Quest's page scores recomputed from the stored keys with their bf16 rounding bound.
struct LayerSelection {
  std::vector<std::vector<int32_t>> lists;      // [num_kv_heads][selected]
  std::vector<std::vector<double>> page_score;  // [num_kv_heads][pages]: mean over the query group of sum_d
                                                // max(q_d min_d, q_d max_d) over the page's stored keys
  std::vector<std::vector<double>> rounding;    // [num_kv_heads][pages]: 2^-8 sum_d |q_d| max(|min_d|, |max_d|)
};

// Records `attended`'s selection of sequence 0 (copying produced lists from the device), and on the CPU the page
// scores Quest ranks by (METHODS.md "Quest"), computed here from the keys and the query as an oracle.
LayerSelection record_selection(const LayerContext& ctx, const AttentionView& attended) {
  LayerSelection r;
  const SeqKvView& sv = attended.seqs[0];
  if (sv.selected == nullptr) return r;
  const int32_t num_heads = attended.num_kv_heads;
  std::vector<int32_t> counts(static_cast<size_t>(num_heads));
  std::vector<int32_t> lists(static_cast<size_t>(num_heads) * static_cast<size_t>(sv.selected_stride));
  const bool on_device = attended.selection_produced && attended.kv_device != Device::kCpu;
  if (on_device) {
    copy_bytes(attended.kv_device, counts.data(), sv.num_selected, counts.size() * sizeof(int32_t));
    copy_bytes(attended.kv_device, lists.data(), sv.selected, lists.size() * sizeof(int32_t));
  } else {
    std::copy(sv.num_selected, sv.num_selected + num_heads, counts.begin());
    std::copy(sv.selected, sv.selected + lists.size(), lists.begin());
  }
  for (int32_t h = 0; h < num_heads; ++h) {
    const int32_t* list = lists.data() + static_cast<size_t>(h) * static_cast<size_t>(sv.selected_stride);
    r.lists.emplace_back(list, list + counts[static_cast<size_t>(h)]);
  }
  if (attended.kv_device != Device::kCpu || attended.selection_unit != SelectionUnit::kPage) return r;
  const TensorView q = ctx.last_query_row(0);  // [H, D]
  const int32_t group = static_cast<int32_t>(q.shape[0]) / num_heads;
  const int32_t d = attended.head_dim, ps = attended.page_size;
  for (int32_t h = 0; h < num_heads; ++h) {
    const int32_t len = sv.num_tokens[h];
    std::vector<double> scores, rounding;
    for (int32_t page = 0; page * ps < len; ++page) {
      const int32_t page_id = sv.page_ids[static_cast<int64_t>(h) * sv.stride + page];
      std::vector<float> lo(static_cast<size_t>(d), INFINITY), hi(static_cast<size_t>(d), -INFINITY);
      for (int32_t t = 0; t < std::min(ps, len - page * ps); ++t) {
        const float* k = attended.element<float>(page_id, 0, t);
        for (int32_t i = 0; i < d; ++i) {
          lo[static_cast<size_t>(i)] = std::min(lo[static_cast<size_t>(i)], k[i]);
          hi[static_cast<size_t>(i)] = std::max(hi[static_cast<size_t>(i)], k[i]);
        }
      }
      double score = 0.0, bound = 0.0;
      for (int32_t g = 0; g < group; ++g) {
        const float* qh = q.ptr<float>() + static_cast<int64_t>(h * group + g) * d;
        for (int32_t i = 0; i < d; ++i) {
          const double a = static_cast<double>(qh[i]) * lo[static_cast<size_t>(i)];
          const double b = static_cast<double>(qh[i]) * hi[static_cast<size_t>(i)];
          score += std::max(a, b);
          bound += std::abs(static_cast<double>(qh[i])) *
                   std::max(std::abs(lo[static_cast<size_t>(i)]), std::abs(hi[static_cast<size_t>(i)]));
        }
      }
      scores.push_back(score / group);
      rounding.push_back(std::ldexp(bound / group, -8));
    }
    r.page_score.push_back(std::move(scores));
    r.rounding.push_back(std::move(rounding));
  }
  return r;
}

// The first layer and KV head whose selections differ, described with the CPU's page scores of the pages only one
// side read; empty when every layer matches. `near_tie` is cleared when two such pages' scores lie further apart
// than their rounding bounds together (the GPU then read another page for a reason rounding does not explain).
std::string describe_selection_difference(const std::vector<LayerSelection>& cpu,
                                          const std::vector<LayerSelection>& gpu, int step, bool& near_tie) {
  for (size_t l = 0; l < cpu.size() && l < gpu.size(); ++l) {
    if (cpu[l].lists == gpu[l].lists) continue;
    for (size_t h = 0; h < cpu[l].lists.size() && h < gpu[l].lists.size(); ++h) {
      const auto& a = cpu[l].lists[h];
      const auto& b = gpu[l].lists[h];
      if (a == b) continue;
      std::vector<int32_t> only_cpu, only_gpu;
      std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(only_cpu));
      std::set_difference(b.begin(), b.end(), a.begin(), a.end(), std::back_inserter(only_gpu));
      std::string text = fmt::format("selections part at step {} layer {} head {}: cpu only {}, gpu only {}", step, l,
                                     h, fmt::join(only_cpu, ","), fmt::join(only_gpu, ","));
      if (h < cpu[l].page_score.size()) {
        const auto& score = cpu[l].page_score[h];
        const auto& rounding = cpu[l].rounding[h];
        const auto describe = [&](const std::vector<int32_t>& pages) {
          std::string out;
          for (int32_t p : pages)
            out += fmt::format(" p{}={:.4f}(+-{:.4f})", p, score[static_cast<size_t>(p)],
                               rounding[static_cast<size_t>(p)]);
          return out;
        };
        text += fmt::format("; cpu scores:{} vs{}", describe(only_cpu), describe(only_gpu));
        for (int32_t a : only_cpu)
          for (int32_t b : only_gpu)
            near_tie &= std::abs(score[static_cast<size_t>(a)] - score[static_cast<size_t>(b)]) <=
                        rounding[static_cast<size_t>(a)] + rounding[static_cast<size_t>(b)];
      }
      return text;
    }
  }
  return {};
}

// The observation-window scores the SnapKV family ranks a prompt's tokens by (snapkv, pyramidkv, adakv), recomputed
// on one device from what that device's forward produced: the last `window` query rows of every layer and the keys
// it stored, through the same functions the methods call (attention_scores, reduce_window_scores). Fed the GPU's
// rows, it gives the scores the GPU's selection saw, so a kept set that parts from the CPU's can be told apart: a
// pair the GPU's own scores rank the other way (its forward's bf16 rounding moved them) from a selection that
// departs from its scores (a bug).
class WindowScoreRecorder {
 public:
  explicit WindowScoreRecorder(const MethodRuntime& method) {
    const nlohmann::ordered_json& resolved = method.config();
    auto reader = MethodConfig::parse(std::string(method.name()), resolved);
    SE_CHECK(reader.is_ok(), "{}", reader.status().to_string());
    ObservationWindowDefaults defaults;
    defaults.fractional_budget = resolved.contains("budget") && resolved["budget"].is_number_float();
    auto config = read_observation_window_config(*reader, std::string(method.name()), defaults);
    SE_CHECK(config.is_ok(), "{}", config.status().to_string());
    config_ = *config;
  }

  // The attention observer's call: keeps the window's rows and scores each layer once the prompt is in.
  void observe(const LayerContext& ctx) {
    const SequenceSlice& slice = ctx.batch.sequences[0];
    if (slice.is_decode(ctx.batch.positions)) return;
    const auto layer = static_cast<size_t>(ctx.layer);
    if (layer >= rows_.size()) {
      rows_.resize(layer + 1);
      scores_.resize(layer + 1);
    }
    const int64_t row_size = ctx.q.shape[1] * ctx.q.shape[2];
    std::vector<float>& rows = rows_[layer];
    const size_t first = rows.size();
    rows.resize(first + static_cast<size_t>(slice.num_tokens * row_size));
    copy_bytes(ctx.q.device, rows.data() + first, ctx.q.ptr<float>() + slice.token_begin * row_size,
               static_cast<size_t>(slice.num_tokens * row_size) * sizeof(float));
    if (!slice.completes_prefill(ctx.batch.positions)) return;
    const int32_t num_tokens = ctx.view.seqs[0].num_tokens[0];
    const int32_t window = config_.window;
    if (num_tokens <= config_.budget) return;
    const auto num_heads = static_cast<int32_t>(ctx.q.shape[1]);
    const TensorView host_q{rows.data() + (static_cast<int64_t>(rows.size()) / row_size - window) * row_size,
                            DType::kF32,
                            {window, num_heads, ctx.q.shape[2]},
                            Device::kCpu};  // [w, H, D]
    Tensor device_q;
    TensorView q = host_q;
    if (ctx.q.device != Device::kCpu) {
      device_q = empty_on(ctx.q.device, DType::kF32, host_q.shape);
      copy_bytes(ctx.q.device, device_q.raw(), host_q.data, host_q.nbytes());
      q = device_q.view();
    }
    std::vector<float> probs(static_cast<size_t>(num_heads) * static_cast<size_t>(num_tokens));
    attention_scores(TensorView{probs.data(), DType::kF32, {num_heads, num_tokens}, Device::kCpu}, q, ctx.view, 0,
                     ctx.params, ScoreReduce::kSum);
    scores_[layer] =
        reduce_window_scores(probs.data(), num_tokens, num_heads, ctx.view.num_kv_heads, num_tokens, config_);
  }

  // Layer `layer`'s score of the prompt token at `position` in KV head `kv_head` (a scored, pre-window token).
  double score(int layer, int32_t kv_head, int32_t position) const {
    const WindowScores& s = scores_.at(static_cast<size_t>(layer));
    SE_CHECK(position < s.num_prefix, "position {} is not scored (prefix of {})", position, s.num_prefix);
    return s.head(kv_head)[position];
  }

 private:
  ObservationWindowConfig config_;
  std::vector<std::vector<float>> rows_;  // [layer]: every prompt query row so far, [rows, H, D]
  std::vector<WindowScores> scores_;      // [layer]
};

// The (kv_head, position) pairs of layer `layer` that only `a` keeps, then those only `b` keeps.
using HeadPositions = std::vector<std::pair<int32_t, int32_t>>;
std::pair<HeadPositions, HeadPositions> kept_difference(const CacheManager& a, const CacheManager& b, int layer) {
  HeadPositions only_a, only_b;
  for (int32_t h = 0; h < a.layout().num_kv_heads; ++h) {
    const auto sorted = [&](const CacheManager& c) {
      const auto span = c.slot_positions(TeacherForcedSequence::kSeq, layer, h);
      std::vector<int32_t> v(span.begin(), span.end());
      std::sort(v.begin(), v.end());
      return v;
    };
    const std::vector<int32_t> x = sorted(a), y = sorted(b);
    std::vector<int32_t> ox, oy;
    std::set_difference(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(ox));
    std::set_difference(y.begin(), y.end(), x.begin(), x.end(), std::back_inserter(oy));
    for (int32_t p : ox) only_a.emplace_back(h, p);
    for (int32_t p : oy) only_b.emplace_back(h, p);
  }
  return {only_a, only_b};
}

// KVzip keeps every (layer, KV head, context token) whose reconstruction score exceeds one threshold over them all.
// A pair kept on one device only must sit on the other side of that device's own threshold (its debug_state: the
// scores of the compression and the threshold), else the GPU's selection departs from its scores. Returns the
// first such pair's scores on both devices, or "" when the kept sets are the same.
std::string judge_kvzip_difference(const TeacherForcedSequence& cpu, const TeacherForcedSequence& gpu, int num_layers,
                                   const std::string& what) {
  const nlohmann::json cpu_state = cpu.method().debug_state(TeacherForcedSequence::kSeq);
  const nlohmann::json gpu_state = gpu.method().debug_state(TeacherForcedSequence::kSeq);
  if (cpu_state.is_null() || gpu_state.is_null()) return {};
  const int32_t num_sink = cpu.method().config().at("n_sink").get<int32_t>();
  const double cpu_threshold = cpu_state.at("threshold").get<double>();
  const double gpu_threshold = gpu_state.at("threshold").get<double>();
  std::string first;
  for (int l = 0; l < num_layers; ++l) {
    const auto [only_cpu, only_gpu] = kept_difference(cpu.cache(), gpu.cache(), l);
    for (const auto& [pairs, kept_on_cpu] : {std::pair{only_cpu, true}, std::pair{only_gpu, false}}) {
      for (const auto& [h, position] : pairs) {
        const auto j = static_cast<size_t>(position - num_sink);
        const double c = cpu_state.at("scores").at(l).at(h).at(j).get<double>();
        const double g = gpu_state.at("scores").at(l).at(h).at(j).get<double>();
        // Kept means above the device's own threshold.
        EXPECT_EQ(g > gpu_threshold, !kept_on_cpu) << what << " layer " << l << " head " << h << " position "
                                                   << position << ": the GPU's selection departs from its scores";
        if (first.empty())
          first = fmt::format(
              "layer {} h{}:{} kept on the {} only: cpu score {:.6f} vs threshold {:.6f} ({:.2e} relative), gpu "
              "score {:.6f} vs threshold {:.6f}",
              l, h, position, kept_on_cpu ? "cpu" : "gpu", c, cpu_threshold, (c - cpu_threshold) / cpu_threshold, g,
              gpu_threshold);
      }
    }
  }
  return first;
}

// One device's score of the token at `position` in layer `layer`, KV head `kv_head`; nullopt where it has none.
using TokenScore = std::function<std::optional<double>(int layer, int32_t kv_head, int32_t position)>;

// Judges the first kept sets that part by both devices' scores: every token only the CPU keeps must have a partner
// only the GPU keeps (in the same KV head, or where `across_heads` in another head of the layer when none there
// does) that the CPU's scores rank no higher and the GPU's own scores no lower: the GPU kept what its scores said.
// Fails the test otherwise; returns the first pair's scores.
std::string judge_swaps(const CacheManager& cpu, const CacheManager& gpu, int num_layers, const TokenScore& cpu_score,
                        const TokenScore& gpu_score, bool across_heads, const std::string& what) {
  std::string first;
  for (int l = 0; l < num_layers; ++l) {
    const auto [only_cpu, only_gpu] = kept_difference(cpu, gpu, l);
    for (const auto& [h, a] : only_cpu) {
      const std::optional<double> ca = cpu_score(l, h, a), ga = gpu_score(l, h, a);
      const auto explains = [&](const std::pair<int32_t, int32_t>& other) {
        const std::optional<double> cb = cpu_score(l, other.first, other.second);
        const std::optional<double> gb = gpu_score(l, other.first, other.second);
        return ca && ga && cb && gb && *ca >= *cb && *gb >= *ga;
      };
      auto it =
          std::find_if(only_gpu.begin(), only_gpu.end(), [&](const auto& o) { return o.first == h && explains(o); });
      if (it == only_gpu.end() && across_heads) it = std::find_if(only_gpu.begin(), only_gpu.end(), explains);
      EXPECT_NE(it, only_gpu.end()) << what << " layer " << l << " head " << h << ": the GPU dropped position " << a
                                    << " against its own scores";
      if (it == only_gpu.end() || !first.empty()) continue;
      const auto [h2, b] = *it;
      const double cb = *cpu_score(l, h2, b), gb = *gpu_score(l, h2, b);
      first = fmt::format(
          "layer {}: cpu keeps h{}:{} ({:.6f}, gpu {:.6f}) over h{}:{} ({:.6f}, gpu {:.6f}), cpu gap {:.2e} relative, "
          "gpu deviation {:.2e} relative",
          l, h, a, *ca, *ga, h2, b, cb, gb, (*ca - cb) / (*ca + cb),
          std::max(std::abs(*ga - *ca) / *ca, std::abs(gb - cb) / cb));
    }
  }
  return first;
}

// H2O's accumulated attention (acc) of the token at `position` of a stream after a step: the stream's where it
// still holds the token, else the one the step's eviction dropped it with (debug_state "dropped"); nullopt for a
// token the stream had already lost.
std::optional<double> h2o_score(const nlohmann::json& state, const CacheManager& cache, int layer, int32_t kv_head,
                                int32_t position) {
  const auto positions = cache.slot_positions(TeacherForcedSequence::kSeq, layer, kv_head);
  const auto slot = std::find(positions.begin(), positions.end(), position);
  if (slot != positions.end())
    return state.at("acc").at(layer).at(kv_head).at(static_cast<size_t>(slot - positions.begin())).get<double>();
  for (const nlohmann::json& dropped : state.at("dropped").at(layer).at(kv_head))
    if (dropped.at(0).get<int32_t>() == position) return dropped.at(1).get<double>();
  return std::nullopt;
}

// R-KV and Kara (decode_compression_method.h) at the first compression whose kept sets part: both devices held the
// same region, so their debug_state's region-relative kept indices and scores line up. Each device must keep what
// the method's selection picks from its own scores; R-KV ranks by score alone, so every index only the CPU keeps
// must have a partner only the GPU keeps that the CPU's scores rank no higher and the GPU's no lower. Kara's
// Token2Chunk turns a swapped candidate into other chunks, so there the candidates (its top scores) are held to
// that. Returns the first pair's scores, with the largest deviation of the GPU's scores from the CPU's.
std::string judge_decode_compression(const MethodRuntime& cpu_method, const MethodRuntime& gpu_method, int num_layers,
                                     const std::string& what) {
  const nlohmann::json cpu_state = cpu_method.debug_state(TeacherForcedSequence::kSeq);
  const nlohmann::json gpu_state = gpu_method.debug_state(TeacherForcedSequence::kSeq);
  if (cpu_state.is_null() || gpu_state.is_null()) return {};
  const nlohmann::ordered_json& config = cpu_method.config();
  const bool rkv = cpu_method.name() == "rkv";
  RkvParams rkv_params;
  KaraParams kara_params;
  if (rkv) {
    rkv_params.budget = config.at("budget");
    rkv_params.window = config.at("window");
  } else {
    kara_params.budget = config.at("budget");
    kara_params.candidates = config.at("candidates");
    kara_params.length_exponent = config.at("length_exponent").get<float>();
  }
  std::string first;
  double deviation = 0.0;
  for (int l = 0; l < num_layers; ++l) {
    const nlohmann::json& cpu_scores = cpu_state.at("last_scores").at(l);
    for (size_t h = 0; h < cpu_scores.size(); ++h) {
      const std::vector<float> c = cpu_scores.at(h), g = gpu_state.at("last_scores").at(l).at(h);
      const std::vector<int32_t> cpu_kept = cpu_state.at("last_kept").at(l).at(h);
      const std::vector<int32_t> gpu_kept = gpu_state.at("last_kept").at(l).at(h);
      if (c.empty() || cpu_kept == gpu_kept) continue;
      if (c.size() != g.size()) {
        ADD_FAILURE() << what << " layer " << l << " head " << h << ": " << c.size() << " cpu and " << g.size()
                      << " gpu scores";
        continue;
      }
      const auto n = static_cast<int32_t>(rkv ? c.size() + static_cast<size_t>(rkv_params.window) : c.size());
      const auto pick = [&](const std::vector<float>& scores) {
        return rkv ? rkv_keep(scores.data(), n, rkv_params) : kara_select_tokens(scores.data(), n, kara_params).kept;
      };
      EXPECT_EQ(pick(c), cpu_kept) << what << " layer " << l << " head " << h << ": the CPU kept against its scores";
      EXPECT_EQ(pick(g), gpu_kept) << what << " layer " << l << " head " << h << ": the GPU kept against its scores";
      for (size_t j = 0; j < c.size(); ++j)
        deviation = std::max(deviation, std::abs(static_cast<double>(g[j]) - c[j]) / (std::abs(c[j]) + 1e-12));
      // The ranked sets: R-KV's kept (less its window), Kara's candidates.
      std::vector<int32_t> cpu_ranked = cpu_kept, gpu_ranked = gpu_kept;
      if (rkv) {
        std::erase_if(cpu_ranked, [&](int32_t i) { return i >= static_cast<int32_t>(c.size()); });
        std::erase_if(gpu_ranked, [&](int32_t i) { return i >= static_cast<int32_t>(c.size()); });
      } else {
        const int32_t k = std::min(kara_params.candidates, std::min(kara_params.budget, n));
        top_k_ascending(c.data(), n, k, cpu_ranked);
        top_k_ascending(g.data(), n, k, gpu_ranked);
      }
      std::vector<int32_t> only_cpu, only_gpu;
      std::set_difference(cpu_ranked.begin(), cpu_ranked.end(), gpu_ranked.begin(), gpu_ranked.end(),
                          std::back_inserter(only_cpu));
      std::set_difference(gpu_ranked.begin(), gpu_ranked.end(), cpu_ranked.begin(), cpu_ranked.end(),
                          std::back_inserter(only_gpu));
      for (const int32_t a : only_cpu) {
        const auto a_ = static_cast<size_t>(a);
        const auto it = std::find_if(only_gpu.begin(), only_gpu.end(), [&](int32_t b) {
          const auto b_ = static_cast<size_t>(b);
          return c[a_] >= c[b_] && g[b_] >= g[a_];
        });
        EXPECT_NE(it, only_gpu.end()) << what << " layer " << l << " head " << h << ": the GPU ranked region index "
                                      << a << " lower against its own scores";
        if (it == only_gpu.end() || !first.empty()) continue;
        const auto b_ = static_cast<size_t>(*it);
        first = fmt::format("layer {} h{}: cpu ranks region index {} ({:.6f}, gpu {:.6f}) over {} ({:.6f}, gpu {:.6f})",
                            l, h, a, c[a_], g[a_], *it, c[b_], g[b_]);
      }
    }
  }
  if (first.empty()) first = "the same candidates";
  return fmt::format("{}; gpu scores deviate up to {:.2e} relative", first, deviation);
}

// Where one prompt's GPU run first parts from the CPU's with the token stream held fixed.
struct DecisionReport {
  int first_affected = -1;  // the first greedy token a kept set or selection that parted can change; -1: none did
  int confident_pick = -1;  // the first step whose GPU pick differs at a confident CPU margin; -1: none
  double noise = 0.0;       // the largest |GPU - CPU| logit over the steps
  std::string line;         // what parted where, with the method's scores of the tokens in question
};

// Teacher forces `prompt` and `num_new` greedy tokens of the CPU through `method` on both devices (prefill chunks
// of kPrefillChunk, as the engine tests' steps), comparing after every prefill chunk and decode step the positions
// each (layer, KV head) stream keeps and, for each decode step, what each layer's selection let attention read.
// The first kept set that parts is judged by both devices' scores of the tokens in question (the SnapKV family's
// window scores, H2O's, KVzip's, R-KV's and Kara's from debug_state); the first selection that parts must do so where
// the pages' scores lie within their bf16 rounding; and a GPU pick that differs at a CPU margin above `pick_bound`
// (dense attention's noise; < 0: twice the step's own logits deviation) must follow a decision that parted. Both
// devices keep `store` (a KIVI store's window `kivi_residual` tokens).
DecisionReport compare_decisions(const DeviceBundles& bundles, const std::string& method, const nlohmann::json& config,
                                 const std::vector<int32_t>& prompt, int num_new, double pick_bound,
                                 const std::string& what, KvStoreKind store = KvStoreKind::kExplicit,
                                 int32_t kivi_residual = 128) {
  const int num_layers = bundles.cpu.model->config().num_layers;
  TeacherForcingOptions o;
  o.method = method;
  o.config = config;
  o.store = store;
  o.kivi_residual = kivi_residual;
  o.prefill_chunk = kPrefillChunk;
  o.max_tokens = static_cast<int32_t>(prompt.size()) + num_new + 1;
  auto cpu = TeacherForcedSequence::create(*bundles.cpu.model, o);
  auto gpu = TeacherForcedSequence::create(*bundles.gpu.model, o);
  SE_CHECK(cpu.is_ok() && gpu.is_ok(), "{}", what);
  DecisionReport report;
  std::string kept_diff, selection_diff, pick_diff;
  std::vector<LayerSelection> cpu_layers, gpu_layers;  // the running step's selections, by layer
  const bool window_method = method == "snapkv" || method == "pyramidkv" || method == "adakv";
  std::optional<WindowScoreRecorder> cpu_scores, gpu_scores;
  if (window_method) {
    cpu_scores.emplace((*cpu)->method());
    gpu_scores.emplace((*gpu)->method());
  }
  (*cpu)->set_attention_observer([&](const LayerContext& ctx, const AttentionView& attended) {
    cpu_layers.push_back(record_selection(ctx, attended));
    if (cpu_scores) cpu_scores->observe(ctx);
  });
  (*gpu)->set_attention_observer([&](const LayerContext& ctx, const AttentionView& attended) {
    gpu_layers.push_back(record_selection(ctx, attended));
    if (gpu_scores) gpu_scores->observe(ctx);
  });
  const auto parted = [&](int token) {
    report.first_affected = report.first_affected < 0 ? token : std::min(report.first_affected, token);
  };
  // After a step: the first kept sets that part, judged, as parting before the greedy token `affected`.
  const auto compare_kept = [&](int affected, const std::string& when) {
    if (!kept_diff.empty()) return;
    for (int l = 0; l < num_layers && kept_diff.empty(); ++l) {
      const auto [only_cpu, only_gpu] = kept_difference((*cpu)->cache(), (*gpu)->cache(), l);
      if (only_cpu.empty() && only_gpu.empty()) continue;
      const auto describe = [](const HeadPositions& pairs) {
        std::string out;
        for (const auto& [h, position] : pairs) out += fmt::format("{}h{}:{}", out.empty() ? "" : ",", h, position);
        return out;
      };
      kept_diff = fmt::format("kept sets part {} layer {}: cpu only {}, gpu only {}", when, l, describe(only_cpu),
                              describe(only_gpu));
    }
    if (kept_diff.empty()) return;
    parted(affected);
    std::string note;
    if (window_method) {
      // The SnapKV family ranks by window scores (AdaKV trades tokens across the heads of a layer).
      note = judge_swaps((*cpu)->cache(), (*gpu)->cache(), num_layers,
                         [&](int l, int32_t h, int32_t p) { return std::optional<double>(cpu_scores->score(l, h, p)); },
                         [&](int l, int32_t h, int32_t p) { return std::optional<double>(gpu_scores->score(l, h, p)); },
                         /*across_heads=*/true, what);
    } else if (method == "kvzip") {
      note = judge_kvzip_difference(**cpu, **gpu, num_layers, what);
    } else if (method == "rkv" || method == "kara") {
      note = judge_decode_compression((*cpu)->method(), (*gpu)->method(), num_layers, what);
    } else if (method == "h2o") {
      // At the first step whose kept sets part both devices held the same tokens before it, so the tokens in
      // question were candidates on both, scored by accumulated attention (what the eviction dropped included).
      const nlohmann::json cpu_state = (*cpu)->method().debug_state(TeacherForcedSequence::kSeq);
      const nlohmann::json gpu_state = (*gpu)->method().debug_state(TeacherForcedSequence::kSeq);
      note = judge_swaps((*cpu)->cache(), (*gpu)->cache(), num_layers,
                         [&](int l, int32_t h, int32_t p) { return h2o_score(cpu_state, (*cpu)->cache(), l, h, p); },
                         [&](int l, int32_t h, int32_t p) { return h2o_score(gpu_state, (*gpu)->cache(), l, h, p); },
                         /*across_heads=*/false, what);
    }
    if (!note.empty()) kept_diff += "; " + note;
  };
  const auto pick = [&](int step, const Tensor& want_logits, const Tensor& got_logits) {
    const std::vector<float> want(want_logits.data<float>(), want_logits.data<float>() + want_logits.numel());
    const std::vector<float> got(got_logits.data<float>(), got_logits.data<float>() + got_logits.numel());
    const int32_t w = argmax(want), g = argmax(got);
    const double noise = max_abs_diff(got, want);
    report.noise = std::max(report.noise, noise);
    const double margin = want[static_cast<size_t>(w)] - want[static_cast<size_t>(g)];
    const double bound = pick_bound < 0.0 ? 2.0 * noise : pick_bound;
    if (w != g && margin > bound && report.confident_pick < 0) {
      report.confident_pick = step;
      pick_diff = fmt::format("gpu picks {} over {} at step {} (cpu margin {:.4f}, logits deviation {:.4f})", g, w,
                              step, margin, noise);
      EXPECT_TRUE(report.first_affected >= 0 && report.first_affected <= step)
          << what << ": " << pick_diff << ", yet every kept set and selection so far was the CPU's";
    }
    return w;
  };
  SE_CHECK((*cpu)->start_prefill(prompt).is_ok() && (*gpu)->start_prefill(prompt).is_ok(), "{}", what);
  Result<Tensor> want = Tensor(), got = Tensor();
  for (int chunk = 0; !(*cpu)->prefill_done(); ++chunk) {
    want = (*cpu)->prefill_chunk();
    got = (*gpu)->prefill_chunk();
    SE_CHECK(want.is_ok() && got.is_ok(), "{}", what);
    // A chunk's eviction changes what the later chunks attend to, so the prompt's own logits too.
    const bool last = (*cpu)->prefill_done();
    compare_kept(last ? 1 : 0, last ? "after the prompt" : fmt::format("after prefill chunk {}", chunk));
  }
  int32_t token = pick(0, *want, *got);
  for (int step = 1; step <= num_new; ++step) {
    cpu_layers.clear();
    gpu_layers.clear();
    want = (*cpu)->decode(token);
    got = (*gpu)->decode(token);
    SE_CHECK(want.is_ok() && got.is_ok(), "{}", what);
    if (selection_diff.empty()) {
      bool near_tie = true;
      selection_diff = describe_selection_difference(cpu_layers, gpu_layers, step, near_tie);
      EXPECT_TRUE(near_tie) << what << ": " << selection_diff;
      if (!selection_diff.empty()) parted(step);
    }
    compare_kept(step + 1, fmt::format("at decode step {}", step));
    token = pick(step, *want, *got);
  }
  report.line = fmt::format("{}; {}; {}", kept_diff.empty() ? "kept sets identical" : kept_diff,
                            selection_diff.empty() ? "selections identical" : selection_diff,
                            pick_diff.empty() ? "no confident pick differs" : pick_diff);
  return report;
}

// Twice the largest |GPU - CPU| logit dense attention (vanilla) shows over `prompts`: a pick that differs at a
// larger CPU margin is confident. Vanilla's own picks must part only at near-ties of their step.
double confident_margin(const DeviceBundles& bundles, const std::vector<std::vector<int32_t>>& prompts,
                        const std::string& model_name) {
  double noise = 0.0;
  for (size_t p = 0; p < prompts.size(); ++p)
    noise = std::max(noise, compare_decisions(bundles, "vanilla", nullptr, prompts[p], kNumNew, -1.0,
                                              fmt::format("{} vanilla request {}", model_name, p))
                                .noise);
  return 2.0 * noise;
}

// Every method's kept sets, selections and picks under teacher forcing (`bound`: confident_margin), one KEPTSET
// line per prompt and a count of the prompts with a confident pick that differs.
void expect_kept_sets_under_teacher_forcing(const DeviceBundles& bundles,
                                            const std::vector<std::vector<int32_t>>& prompts, double bound,
                                            const std::string& model_name) {
  for (const auto& [method, config] : tiny_method_configs()) {
    int num_parted = 0, num_confident = 0;
    for (size_t p = 0; p < prompts.size(); ++p) {
      const DecisionReport r = compare_decisions(bundles, method, config, prompts[p], kNumNew, bound,
                                                 fmt::format("{} {} request {}", model_name, method, p));
      num_parted += r.first_affected >= 0;
      num_confident += r.confident_pick >= 0;
      std::printf("KEPTSET %-6s %-12s request %zu: %s\n", model_name.c_str(), method.c_str(), p, r.line.c_str());
    }
    std::printf(
        "KEPTSET %-6s %-12s %d of %zu requests with a decision that parts, %d with a confident pick that "
        "differs (bound %.4f)\n",
        model_name.c_str(), method.c_str(), num_parted, prompts.size(), num_confident, bound);
  }
}

// Whether the GPU's greedy continuation `got` is the CPU's `want`. One that parts at a CPU margin above `bound` is
// replayed under teacher forcing up to that step (compare_decisions): a kept set or selection must have parted, at a
// near-tie of the method's scores, before the token. Prints where and why it parted under `label`.
bool judge_continuation(const DeviceBundles& bundles, const std::string& method, const nlohmann::json& config,
                        const std::vector<int32_t>& prompt, const EngineTrace& want, const EngineTrace& got,
                        double bound, const std::string& label, KvStoreKind store = KvStoreKind::kExplicit,
                        int32_t kivi_residual = 128) {
  const auto& w = want.tokens;
  const auto& g = got.tokens;
  const auto step = static_cast<int>(std::mismatch(w.begin(), w.end(), g.begin()).first - w.begin());
  if (step == static_cast<int>(w.size())) return true;
  const float margin = want.margins[static_cast<size_t>(step)];
  std::string why = "a near-tie of the step's logits";
  if (margin > bound) {
    const DecisionReport r = compare_decisions(bundles, method, config, prompt, step, bound,
                                               fmt::format("{} (replayed)", label), store, kivi_residual);
    EXPECT_TRUE(r.first_affected >= 0 && r.first_affected <= step)
        << label << " parts at step " << step << " (cpu margin " << margin
        << ") with every decision before it the CPU's";
    why = r.line;
  }
  std::printf("PARITY %s diverges at step %d (cpu margin %.4f): %s\n", label.c_str(), step, margin, why.c_str());
  return false;
}

// Every registered method through the engine on both devices, greedy. Methods whose ops have no CUDA kernels are
// refused by the GPU engine at startup, naming the method. The others run one sequence at a time, so each
// request's steps are the ones teacher forcing replays (prefill chunks of kPrefillChunk, then eager decode steps:
// CudaGraphDecodeMatchesEager holds the graphs to those). A continuation that parts from the CPU's at a confident CPU
// margin is replayed under teacher forcing up to that step (compare_decisions): a kept set or selection must have
// parted, at a near-tie of the method's scores, before the token (`bound`: confident_margin). Prints each method's
// count of identical continuations.
void expect_methods_run_like_on_the_cpu(const DeviceBundles& bundles, const std::vector<std::vector<int32_t>>& prompts,
                                        double bound, const std::string& model_name) {
  const std::map<std::string, nlohmann::json> configs = tiny_method_configs();
  for (const MethodInfo& info : registered_methods()) {
    if (!check_runs_on(Device::kCuda, (*create_method(info.name, nullptr))->traits(), info.name).is_ok()) {
      EngineConfig config;
      config.device = Device::kCuda;
      config.sparse_method = info.name;
      config.gpu_memory_utilization = 0.05;
      auto engine = Engine::create(bundles.gpu, config);
      ASSERT_FALSE(engine.is_ok()) << info.name << " started on CUDA";
      EXPECT_EQ(engine.status().code(), StatusCode::kUnimplemented) << engine.status().to_string();
      EXPECT_NE(engine.status().message().find(info.name), std::string::npos) << engine.status().to_string();
      std::printf("PARITY %-6s method %-12s refused on CUDA: %s\n", model_name.c_str(), info.name.c_str(),
                  engine.status().message().c_str());
      continue;
    }
    auto it = configs.find(info.name);
    ASSERT_NE(it, configs.end()) << info.name << " has no test configuration here";
    const auto want = engine_traces(bundles.cpu, Device::kCpu, info.name, it->second, prompts, kNumNew, true, 1);
    const auto got = engine_traces(bundles.gpu, Device::kCuda, info.name, it->second, prompts, kNumNew, true, 1);
    int identical = 0;
    for (size_t i = 0; i < prompts.size(); ++i)
      identical += judge_continuation(bundles, info.name, it->second, prompts[i], want[i], got[i], bound,
                                      fmt::format("{:<6} method {:<12} request {}", model_name, info.name, i));
    std::printf("PARITY %-6s method %-12s %d of %zu continuations identical to the CPU\n", model_name.c_str(),
                info.name.c_str(), identical, prompts.size());
  }
}

// A quantized store on the GPU against the same store on the CPU, for `methods`: greedy continuations through the
// engine, each prompt in an engine of its own so that its first prefill chunk sets an FP8 store's scales, as in a
// teacher-forced replay. Both devices quantize their own K/V rows, which differ by rounding, so a value near a step
// between two codes may take the other one. The judge is EveryMethodRunsLikeOnTheCpu's with the bound twice
// vanilla's largest logits deviation over the store. The GPU's decode steps replay CUDA graphs; with eager steps they
// pick the same tokens.
void expect_store_runs_like_on_the_cpu(const DeviceBundles& bundles, KvStoreKind store, int32_t kivi_residual,
                                       const std::vector<std::string>& methods) {
  const auto prompts = random_prompts(8, 96, 40, 90, 12);
  const std::string name(kv_store_kind_name(store));
  double noise = 0.0;
  for (size_t p = 0; p < prompts.size(); ++p)
    noise = std::max(noise, compare_decisions(bundles, "vanilla", nullptr, prompts[p], kNumNew, -1.0,
                                              fmt::format("{} vanilla request {}", name, p), store, kivi_residual)
                                .noise);
  const double bound = 2.0 * noise;
  const std::map<std::string, nlohmann::json> configs = tiny_method_configs();
  for (const std::string& method : methods) {
    const nlohmann::json& config = configs.at(method);
    int identical = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const std::vector<std::vector<int32_t>> one = {prompts[i]};
      const auto want =
          engine_traces(bundles.cpu, Device::kCpu, method, config, one, kNumNew, true, 1, name, kivi_residual);
      const auto got =
          engine_traces(bundles.gpu, Device::kCuda, method, config, one, kNumNew, false, 1, name, kivi_residual);
      const auto eager =
          engine_traces(bundles.gpu, Device::kCuda, method, config, one, kNumNew, true, 1, name, kivi_residual);
      EXPECT_EQ(got[0].tokens, eager[0].tokens) << name << " " << method << " request " << i << ": CUDA graph decode";
      identical +=
          judge_continuation(bundles, method, config, prompts[i], want[0], got[0], bound,
                             fmt::format("tiny   {} {:<12} request {}", name, method, i), store, kivi_residual);
    }
    std::printf("PARITY tiny   %s %-12s %d of %zu continuations identical to the CPU (bound %.4f)\n", name.c_str(),
                method.c_str(), identical, prompts.size(), bound);
  }
}

// The FP8 store: codes written and scales computed on the device, the tiled kernels' FP8 variant reading the codes,
// attention_scores decoding them, eviction moving them as bytes; a code may land one e4m3 step apart.
TEST(GpuEngineTest, Fp8StoreRunsLikeOnTheCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  expect_store_runs_like_on_the_cpu(tiny_cpu_and_gpu_bundles(), KvStoreKind::kFp8E4M3, 128,
                                    {"vanilla", "streamingllm", "snapkv", "h2o"});
}

// The KIVI stores: the window written and its groups quantized on the device, the tiled kernels' KIVI variant reading
// codes and window, SnapKV scoring its held prompt's window and evicting on the device, StreamingLLM dropping sealed
// groups' pages. R = 32, so that the 40- to 90-token prompts flush key groups during prefill and decode; a code one
// step apart is a quarter (2-bit) or a fifteenth (4-bit) of its group's range.
TEST(GpuEngineTest, KiviStoresRunLikeOnTheCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  const DeviceBundles bundles = tiny_cpu_and_gpu_bundles();
  for (const KvStoreKind store : {KvStoreKind::kKivi2, KvStoreKind::kKivi4})
    expect_store_runs_like_on_the_cpu(bundles, store, 32, {"vanilla", "snapkv", "streamingllm"});
}

// SmolLM2's prompts long enough for the 32-token budgets: six of the short texts run together, each set starting
// at another text.
std::vector<std::vector<int32_t>> long_prompts(const ModelBundle& bundle) {
  const std::vector<std::string>& texts = prompt_texts();
  std::vector<std::vector<int32_t>> prompts;
  for (size_t first = 0; first < 8; ++first) {
    std::string text;
    for (size_t k = 0; k < 6; ++k) text += (k == 0 ? "" : " ") + texts[(first + k) % texts.size()];
    prompts.push_back(bundle.tokenizer->encode(text, /*add_special=*/true, /*parse_special=*/false));
  }
  return prompts;
}

TEST(GpuEngineTest, EveryMethodRunsLikeOnTheCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  const DeviceBundles bundles = tiny_cpu_and_gpu_bundles();
  const auto prompts = random_prompts(8, 96, 40, 90, 12);
  expect_methods_run_like_on_the_cpu(bundles, prompts, confident_margin(bundles, prompts, "tiny"), "tiny");
}

// A latent-attention model (the tiny random DeepSeek-V2) through the engine on the GPU: vanilla and StreamingLLM keep
// its shared latent there and run as on the CPU, decode steps replayed from CUDA graphs picking what eager steps pick;
// a continuation may part from the CPU's only at a CPU margin (logprob of its pick over the runner-up) within
// kLatentNearTie, a near-tie for bf16 activations (the tiny MoE's router may also flip where two experts score within
// rounding), while a wrong kernel parts at confident margins. Every other method is refused at startup, naming
// itself.
TEST(GpuEngineTest, LatentAttentionMethodsRunLikeOnTheCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  constexpr double kLatentNearTie = 0.3;
  auto normalized = normalize_hf_config(tiny_config("deepseek_v2"), "tiny-deepseek-v2");
  ASSERT_TRUE(normalized.is_ok()) << normalized.status().to_string();
  const auto weights = bf16_dummy_weights(*normalized, 10.0f);
  DeviceBundles bundles;
  bundles.cpu.name = bundles.gpu.name = "tiny-deepseek-v2";
  bundles.cpu.model = std::make_unique<Model>(create_model(*normalized, weights, Device::kCpu));
  bundles.gpu.model = std::make_unique<Model>(create_model(*normalized, weights, Device::kCuda));
  const auto prompts = random_prompts(6, 96, 40, 90, 13);
  const std::map<std::string, nlohmann::json> configs = tiny_method_configs();
  for (const MethodInfo& info : registered_methods()) {
    const MethodTraits traits = (*create_method(info.name, nullptr))->traits();
    if (!check_runs_on(Device::kCuda, traits, info.name).is_ok() ||
        !check_latent_attention_runs_on(Device::kCuda, traits, info.name).is_ok()) {
      EngineConfig config;
      config.device = Device::kCuda;
      config.sparse_method = info.name;
      config.gpu_memory_utilization = 0.05;
      auto engine = Engine::create(bundles.gpu, config);
      ASSERT_FALSE(engine.is_ok()) << info.name << " started on CUDA over a latent-attention model";
      EXPECT_EQ(engine.status().code(), StatusCode::kUnimplemented) << engine.status().to_string();
      EXPECT_NE(engine.status().message().find(info.name), std::string::npos) << engine.status().to_string();
      continue;
    }
    const nlohmann::json& config = configs.at(info.name);
    const auto want = engine_traces(bundles.cpu, Device::kCpu, info.name, config, prompts, kNumNew, true, 1);
    const auto got = engine_traces(bundles.gpu, Device::kCuda, info.name, config, prompts, kNumNew, false, 1);
    const auto eager = engine_traces(bundles.gpu, Device::kCuda, info.name, config, prompts, kNumNew, true, 1);
    int identical = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(got[i].tokens, eager[i].tokens) << info.name << " request " << i << ": CUDA graph decode";
      const auto& w = want[i].tokens;
      const auto& g = got[i].tokens;
      const auto step = static_cast<int>(std::mismatch(w.begin(), w.end(), g.begin()).first - w.begin());
      if (step == static_cast<int>(w.size())) {
        ++identical;
        continue;
      }
      const float margin = want[i].margins[static_cast<size_t>(step)];
      EXPECT_LE(margin, kLatentNearTie) << info.name << " request " << i << " parts at step " << step;
      std::printf("PARITY mla    method %-12s request %zu diverges at step %d (cpu margin %.4f)\n", info.name.c_str(),
                  i, step, margin);
    }
    std::printf("PARITY mla    method %-12s %d of %zu continuations identical to the CPU\n", info.name.c_str(),
                identical, prompts.size());
  }
}

TEST(GpuEngineTest, KeptSetsUnderTeacherForcing) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  const DeviceBundles bundles = tiny_cpu_and_gpu_bundles();
  const auto prompts = random_prompts(8, 96, 40, 90, 12);
  expect_kept_sets_under_teacher_forcing(bundles, prompts, confident_margin(bundles, prompts, "tiny"), "tiny");
}

TEST(GpuEngineTest, SmolLM2MethodsRunLikeOnTheCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  std::optional<RealModel> m = load_real("SE_TEST_SMOLLM2", testing::smollm2_path());
  if (!m) GTEST_SKIP() << "SmolLM2 is not available (set SE_TEST_SMOLLM2)";
  const auto prompts = long_prompts(m->bundles.cpu);
  const double bound = confident_margin(m->bundles, prompts, "smollm");
  std::printf("PARITY smollm prompts of %zu to %zu tokens\n", prompts.front().size(), prompts.back().size());
  expect_methods_run_like_on_the_cpu(m->bundles, prompts, bound, "smollm");
  expect_kept_sets_under_teacher_forcing(m->bundles, prompts, bound, "smollm");
}

}  // namespace
}  // namespace se
