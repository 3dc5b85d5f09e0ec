// Internal to the CUDA scoring ops (attention_scores, subset_attention_max_scores): the softmax
// probabilities of a sequence's last n query rows against its paged keys, reduced over rows, in two
// passes over the keys. Pass 1 takes each (row, head)'s softmax max and sum over the keys it sees
// (split over key chunks, then merged); pass 2 recomputes every logit, turns it into
// exp(logit - max) / sum and reduces it over rows (and, for the subset op, over the query group).
// The caller passes the sequence's host tables; run_attention_probs packs them into device scratch
// in one copy, launches and copies the result to host memory; it waits for the stream unless the
// job's results may arrive later.
// Not thread-safe (uses CudaContext::current()'s stream and scratch).
#pragma once

#include <cstdint>

#include "backend/ops.h"

namespace se::cuda {

enum class ProbKeys : uint8_t {
  kStream,  // attention_scores: every stored key of the stream, visibility as paged_attention
  kSubset,  // subset_attention_max_scores: [0, num_sink), [begin, begin + num_range), the last n
};

struct AttentionProbsJob {
  ProbKeys keys = ProbKeys::kStream;
  TensorView q;  // [n, H, D] on the device, F32 or BF16
  AttentionParams params;
  ScoreReduce reduce = ScoreReduce::kSum;  // over rows (kSubset: always max, over rows and heads)
  int32_t num_sink = 0, begin = 0, num_range = 0;  // kSubset
  float* out = nullptr;  // host memory: [H, out_cols] (kStream) or [Hkv, num_range] (kSubset)
  // kAfterSynchronize: `out` is pinned memory and the copy into it is only enqueued.
  ScoresReady ready = ScoresReady::kOnReturn;
  int32_t out_cols = 0;  // kStream: the longest stream of the sequence
};

// Runs `job` for sequence `slice` of `view` (host tables, device bf16 pool); with kOnReturn, returns
// when `out` holds the result.
void run_attention_probs(const AttentionProbsJob& job, const AttentionView& view, int32_t slice);

}  // namespace se::cuda
