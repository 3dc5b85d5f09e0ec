// CUDA attention_scores (ops.h): the softmax of the sequence's last n query rows over each stream's
// stored keys, with paged_attention's visibility (physical causality, sliding window, selection),
// reduced over rows per query head by the two-pass kernels of attention_probs.cu. The tables are
// the host's; the result lands in host memory (the sparse methods read it there), at once or, with
// kAfterSynchronize, once the stream has run the copy.
#include "backend/cuda/attention_probs.h"
#include "backend/cuda/cuda_ops.h"

namespace se::cuda {

void attention_scores(TensorView out, TensorView q, const AttentionView& view, int32_t slice,
                      const AttentionParams& params, ScoreReduce reduce, ScoresReady ready) {
  AttentionProbsJob job;
  job.keys = ProbKeys::kStream;
  job.q = q;
  job.params = params;
  job.reduce = reduce;
  job.out = out.ptr<float>();
  job.out_cols = static_cast<int32_t>(out.shape[1]);
  job.ready = ready;
  run_attention_probs(job, view, slice);
}

}  // namespace se::cuda
