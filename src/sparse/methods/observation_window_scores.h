// Observation-window scoring, shared by the SnapKV family (snapkv, pyramidkv, adakv, chunkkv; METHODS.md
// "SnapKV"): how much the last `window` prompt queries attend to each older prompt token, smoothed along the
// tokens and reduced to KV-head granularity. Plain functions and data; no state, thread-compatible.
//
// For a prompt of T tokens and w = window, per layer:
//   1. probs[h, j] = sum over the window rows r of softmax_r(q_r . k_j * scale)[j]: the softmax runs in fp32
//      over all keys, causal inside the window (backend attention_scores, ScoreReduce::kSum). We divide by w
//      (kvpress and AdaKV take the mean; SnapKV/KVCache-Factory the sum: the ranking is the same).
//   2. Only the prefix j < T - w is scored (the window itself is always kept).
//   3. Pool along j with `kernel` (stride 1, pad kernel / 2): avgpool divides by kernel with zero padding
//      (count_include_pad), maxpool pads with -inf.
//   4. Reduce each KV head's query group with gqa_agg (mean / max / sum), after pooling (kvpress, SnapKVPress:
//      pool, then mean over the group) or before it (KVCache-Factory kv_head mode, AdaKV gqa_support). With
//      avgpool and mean/sum the order does not matter.
// Ties in every top-k of the family break towards the lower index (torch.topk leaves them unspecified).
// NOTE: the references cast the softmax to the model dtype before summing; this sums in fp32 (identical for
// fp32 models, a rounding-level difference for bf16 ones).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sparse/group_reduce.h"
#include "sparse/method_config.h"

namespace se {

enum class WindowPooling : uint8_t { kAvg, kMax };
enum class GroupOrder : uint8_t { kPoolThenReduce, kReduceThenPool };

// The hyperparameters every method of the family reads.
struct ObservationWindowConfig {
  int32_t budget = 2048;  // tokens kept per (layer, KV head), the window included ("capacity")
  // The budget as configured: equal to `budget` unless the method accepts a fractional budget (then budget =
  // floor(real_budget), so `T <= budget` still means `T <= real_budget` for a whole number of tokens T).
  double real_budget = 2048;
  int32_t window = 64;    // observation window: the last prompt queries that score, and the tokens always kept
  int32_t kernel = 5;     // pooling kernel (odd)
  WindowPooling pooling = WindowPooling::kAvg;
  GroupReduce gqa_agg = GroupReduce::kMean;
  GroupOrder gqa_order = GroupOrder::kPoolThenReduce;
};

// Defaults a method reads the shared keys with (each method states which reference they follow).
struct ObservationWindowDefaults {
  int32_t budget = 2048;
  int32_t window = 64;
  int32_t kernel = 5;
  const char* pooling = "avgpool";           // avgpool | maxpool
  const char* gqa_order = "pool_then_reduce";  // pool_then_reduce | reduce_then_pool
  bool fractional_budget = false;  // read `budget` as a real number (a method whose budget rule is real-valued)
};

// Reads budget, window, kernel, pooling, gqa_agg (default mean) and gqa_order through `reader`. Errors name
// the key: out of range, a fractional budget where the defaults do not allow one, an even kernel, or
// budget <= window (nothing left to select).
Result<ObservationWindowConfig> read_observation_window_config(MethodConfig& reader, const std::string& method,
                                                               const ObservationWindowDefaults& defaults);

// Scores of one layer's prompt prefix, per KV head.
struct WindowScores {
  int32_t num_kv_heads = 0;
  int32_t num_tokens = 0;  // T: prompt tokens in the stream (the window included)
  int32_t num_prefix = 0;  // T - w: the scored tokens
  std::vector<float> values;  // [num_kv_heads, num_prefix]

  const float* head(int32_t kv_head) const { return values.data() + static_cast<int64_t>(kv_head) * num_prefix; }
};

// Steps 2-4 from the window's summed probabilities. probs [num_heads, row_stride] F32 (row_stride >= T), as
// attention_scores(kSum) writes them; num_heads a multiple of num_kv_heads (head h reads KV head h / G).
WindowScores reduce_window_scores(const float* probs, int64_t row_stride, int32_t num_heads, int32_t num_kv_heads,
                                  int32_t num_tokens, const ObservationWindowConfig& config);

// Step 3 along one row: out[j] = pool of in[j - kernel/2 .. j + kernel/2] (n entries each; kernel odd). out must
// not overlap in.
void pool_scores(const float* in, float* out, int32_t n, int32_t kernel, WindowPooling pooling);

}  // namespace se
