#include "engine/sequence_generator.h"

#include <algorithm>
#include <optional>

#include "engine/sampler.h"
#include "engine/stop_checker.h"
#include "model/contiguous_kv_cache.h"
#include "tokenizer/detokenizer.h"

namespace se {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}
}  // namespace

Result<GenerationResult> SequenceGenerator::generate(const std::vector<int32_t>& prompt_ids,
                                                     const SamplingParams& params,
                                                     const std::function<void(std::string_view)>& on_text) const {
  SE_RETURN_IF_ERROR(params.validate());
  const ModelConfig& config = model_.config();
  const int num_prompt = static_cast<int>(prompt_ids.size());
  if (num_prompt == 0) return invalid_argument("the prompt is empty");
  if (num_prompt + params.max_tokens > config.max_position_embeddings)
    return out_of_range("prompt ({} tokens) plus max_tokens ({}) exceeds the model's context of {} tokens",
                        num_prompt, params.max_tokens, config.max_position_embeddings);
  for (int32_t id : prompt_ids)
    if (id < 0 || id >= config.vocab_size) return invalid_argument("prompt token id {} is out of range", id);
  if (tokenizer_ == nullptr && !params.stop.empty())
    return invalid_argument("stop strings need a tokenizer; this model has none");

  ContiguousKvCache cache(config, 1);
  ForwardWorkspace workspace = model_.make_workspace();
  RequestSampler sampler(params);
  StopChecker stop(params.stop);
  std::optional<IncrementalDetokenizer> detokenizer;
  if (tokenizer_ != nullptr) detokenizer.emplace(*tokenizer_, /*skip_special=*/true);
  GenerationResult result;
  result.num_prompt_tokens = num_prompt;
  auto emit = [&](const std::string& piece) {
    if (piece.empty()) return;
    result.text += piece;
    if (on_text) on_text(piece);
  };

  const Clock::time_point start = Clock::now();
  ForwardBatch batch;
  Tensor logits;
  for (int begin = 0; begin < num_prompt; begin += kPrefillChunk) {
    const int n = std::min(kPrefillChunk, num_prompt - begin);
    batch.token_ids.assign(prompt_ids.begin() + begin, prompt_ids.begin() + begin + n);
    batch.positions.resize(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) batch.positions[static_cast<size_t>(i)] = begin + i;
    batch.sequences = {{0, 0, n}};
    batch.logit_rows = {n - 1};
    logits = model_.forward(batch, cache, workspace);
  }

  Clock::time_point decode_start = start;
  int32_t position = num_prompt;
  while (true) {
    const SampleResult sample = sampler.sample({logits.data<float>(), static_cast<size_t>(config.vocab_size)});
    if (result.output_ids.empty()) {
      result.prefill_seconds = seconds_since(start);
      decode_start = Clock::now();
    }
    const int32_t token = sample.token_id;
    const bool is_stop_token =
        (!params.ignore_eos && tokenizer_ != nullptr && tokenizer_->is_eog(token)) ||
        std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), token) != params.stop_token_ids.end();
    if (is_stop_token) {
      result.finish_reason = FinishReason::kStop;
      break;
    }
    result.output_ids.push_back(token);
    if (detokenizer) {
      SE_ASSIGN_OR_RETURN(std::string piece, detokenizer->push(token));
      emit(stop.push(piece));
      if (stop.stopped()) {
        result.finish_reason = FinishReason::kStop;
        break;
      }
    }
    if (static_cast<int>(result.output_ids.size()) >= params.max_tokens) {
      result.finish_reason = FinishReason::kLength;
      break;
    }
    batch.token_ids = {token};
    batch.positions = {position++};
    batch.sequences = {{0, 0, 1}};
    batch.logit_rows = {0};
    logits = model_.forward(batch, cache, workspace);
  }
  if (detokenizer && !stop.stopped()) emit(stop.push(detokenizer->flush()) + stop.flush());
  result.decode_seconds = seconds_since(decode_start);
  return result;
}

}  // namespace se
