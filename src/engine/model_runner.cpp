#include "engine/model_runner.h"

namespace se {

std::vector<SampledToken> ModelRunner::execute(const StepPlan& plan) {
  batch_.token_ids.clear();
  batch_.positions.clear();
  batch_.sequences.clear();
  batch_.logit_rows.clear();
  std::vector<Request*> sampling;  // requests of batch_.logit_rows, in order
  for (const ScheduledRequest& s : plan.scheduled) {
    Request& r = *s.request;
    const int32_t begin = r.num_computed_tokens;
    const int32_t row = batch_.num_tokens();
    batch_.sequences.push_back({r.seq, row, s.num_tokens, r.num_prefill_tokens});
    for (int32_t i = 0; i < s.num_tokens; ++i) {
      batch_.token_ids.push_back(r.token_ids[static_cast<size_t>(begin + i)]);
      batch_.positions.push_back(begin + i);
    }
    if (begin + s.num_tokens == r.num_tokens()) {  // all known tokens computed: sample the next one
      batch_.logit_rows.push_back(row + s.num_tokens - 1);
      sampling.push_back(&r);
    }
  }
  std::vector<SampledToken> sampled;
  if (batch_.token_ids.empty()) return sampled;
  controller_.prepare_step(batch_);
  Tensor logits = model_.forward(batch_, controller_);
  const size_t vocab = static_cast<size_t>(model_.config().vocab_size);
  for (size_t i = 0; i < sampling.size(); ++i) {
    std::span<float> row(logits.data<float>() + i * vocab, vocab);
    sampled.push_back({sampling[i], sampling[i]->sampler.sample(row)});
  }
  controller_.finish_step(batch_);
  return sampled;
}

}  // namespace se
