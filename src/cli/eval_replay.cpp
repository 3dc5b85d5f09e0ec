#include "cli/eval_replay.h"

#include "cli/eval_tasks.h"
#include "engine/sampler.h"

namespace se::cli {

namespace {

std::vector<float> log_probs_of(const Tensor& logits) {
  std::vector<float> row(logits.data<float>(), logits.data<float>() + logits.numel());
  log_softmax_in_place(row);
  return row;
}

}  // namespace

Result<WrittenContinuation> write_continuation(TeacherForcedSequence& run, std::span<const int32_t> prompt,
                                               int num_tokens, const SamplingParams& sampling) {
  if (num_tokens < 1) return invalid_argument("a written continuation needs at least one token, got {}", num_tokens);
  SamplingParams params = sampling;
  params.ignore_eos = true;
  params.logprobs = -1;
  SE_RETURN_IF_ERROR(params.validate());
  RequestSampler sampler(params);
  SE_ASSIGN_OR_RETURN(Tensor logits, run.prefill(prompt));
  WrittenContinuation written;
  std::vector<float> scratch;
  for (int i = 0; i < num_tokens; ++i) {
    scratch.assign(logits.data<float>(), logits.data<float>() + logits.numel());
    const int32_t token = sampler.sample(scratch).token_id;
    SE_ASSIGN_OR_RETURN(logits, run.decode(token));
    written.tokens.push_back(token);
    written.log_probs.push_back(log_probs_of(logits));
  }
  return written;
}

Result<StepLogProbs> forced_log_probs(TeacherForcedSequence& run, std::span<const int32_t> prompt,
                                      std::span<const int32_t> continuation) {
  SE_RETURN_IF_ERROR(run.prefill(prompt).status());
  StepLogProbs steps;
  for (int32_t token : continuation) {
    SE_ASSIGN_OR_RETURN(Tensor logits, run.decode(token));
    steps.push_back(log_probs_of(logits));
  }
  return steps;
}

Result<ReplayScore> replay_against(TeacherForcedSequence& run, std::span<const int32_t> prompt,
                                   std::span<const int32_t> continuation, const StepLogProbs& reference) {
  if (reference.size() != continuation.size())
    return invalid_argument("the reference has {} steps for a continuation of {} tokens", reference.size(),
                            continuation.size());
  SE_RETURN_IF_ERROR(run.prefill(prompt).status());
  ReplayScore score;
  double kl = 0.0;
  for (size_t i = 0; i < continuation.size(); ++i) {
    SE_ASSIGN_OR_RETURN(Tensor logits, run.decode(continuation[i]));
    const StepComparison step = compare_step(reference[i], {logits.data<float>(), static_cast<size_t>(logits.numel())});
    score.agree += step.top1_agrees ? 1 : 0;
    kl += step.kl;
  }
  score.steps = static_cast<int64_t>(continuation.size());
  score.mean_kl = score.steps == 0 ? 0.0 : kl / static_cast<double>(score.steps);
  return score;
}

}  // namespace se::cli
