// CUDA subset_attention_max_scores (ops.h, the context-reconstruction score): each row's
// softmax over the key subset [sinks; range; new tokens up to its own], the range's probabilities
// reduced by max over rows and the KV head's query group, by the two-pass kernels of
// attention_probs.cu. The tables are the host's; the result lands in host memory.
#include "backend/cuda/attention_probs.h"
#include "backend/cuda/cuda_ops.h"

namespace se::cuda {

void subset_attention_max_scores(TensorView out, TensorView q, const AttentionView& view, int32_t slice,
                                 int32_t num_sink, int32_t begin, const AttentionParams& params) {
  AttentionProbsJob job;
  job.keys = ProbKeys::kSubset;
  job.q = q;
  job.params = params;
  job.params.sliding_window = 0;  // the subset op has no window (ops.h)
  job.reduce = ScoreReduce::kMax;
  job.num_sink = num_sink;
  job.begin = begin;
  job.num_range = static_cast<int32_t>(out.shape[1]);
  job.out = out.ptr<float>();
  run_attention_probs(job, view, slice);
}

}  // namespace se::cuda
