#include "engine/model_runner.h"

#include <algorithm>
#include <utility>

#include "backend/device_memory.h"
#include "sparse/step_driver.h"

namespace se {

namespace {
// Without logprobs a request needs only its token and that token's logprob, which the device computes (top-N
// alternatives still come from the host sampler). A grammar's matcher lives on the host: it writes the allowed
// tokens as bits, which the device applies to a copy of the logits before sampling.
bool samples_on_device(const Request& request) { return request.params.logprobs < 0; }
}  // namespace

std::vector<SampleResult> ModelRunner::sample(const Tensor& logits, const std::vector<Request*>& requests) {
  const auto num_rows = static_cast<int64_t>(requests.size());
  const int64_t vocab = logits.numel() / std::max<int64_t>(num_rows, 1);
  std::vector<SampleResult> results(requests.size());
  if (requests.empty()) return results;
  const Device device = logits.device();
  if (device != Device::kCpu && std::all_of(requests.begin(), requests.end(), [](const Request* r) {
        return samples_on_device(*r);
      })) {
    if (!device_ids_.defined() || device_ids_.numel() < num_rows) {
      device_ids_ = empty_on(device, DType::kI32, {num_rows});
      device_logprobs_ = empty_on(device, DType::kF32, {num_rows});
    }
    TensorView ids = device_ids_.view();
    TensorView logprobs = device_logprobs_.view();
    ids.shape = logprobs.shape = {num_rows};
    const bool constrained =
        std::any_of(requests.begin(), requests.end(), [](const Request* r) { return r->sampler.constrained(); });
    const TensorView rows = constrained ? mask_refused_tokens_of(logits, requests) : logits.view();
    const bool all_greedy =
        std::all_of(requests.begin(), requests.end(), [](const Request* r) { return r->params.greedy(); });
    if (all_greedy) {
      argmax_rows(ids, logprobs, rows);
    } else {
      // A greedy row samples from its top-1 token: the argmax, lowest id on a tie.
      row_sampling_.clear();
      for (Request* r : requests)
        row_sampling_.push_back(r->params.greedy() ? RowSampling{1.0f, 1, 1.0f, 0.0f, 0.0} : r->sampler.row_sampling());
      sample_rows(ids, logprobs, rows, row_sampling_);
    }
    // The masked rows' logprobs are the masked distribution's; the model's are asked of the rows themselves.
    if (constrained) token_logprobs(logprobs, logits.view(), ids);
    host_ids_.resize(static_cast<size_t>(num_rows));
    host_logprobs_.resize(static_cast<size_t>(num_rows));
    copy_bytes(device, host_ids_.data(), ids.data, ids.nbytes());
    copy_bytes(device, host_logprobs_.data(), logprobs.data, logprobs.nbytes());
    results_at_ = std::chrono::steady_clock::now();
    for (size_t i = 0; i < results.size(); ++i) {
      results[i] = {host_ids_[i], host_logprobs_[i], {}};
      if (requests[i]->sampler.constrained()) requests[i]->sampler.accept(host_ids_[i]);
    }
    return results;
  }
  float* rows = logits.data<float>();
  if (device != Device::kCpu) {
    host_logits_.resize(static_cast<size_t>(logits.numel()));
    copy_bytes(device, host_logits_.data(), logits.raw(), logits.nbytes());
    results_at_ = std::chrono::steady_clock::now();
    rows = host_logits_.data();
  }
  for (size_t i = 0; i < results.size(); ++i)
    results[i] = requests[i]->sampler.sample(
        std::span<float>(rows + static_cast<int64_t>(i) * vocab, static_cast<size_t>(vocab)));
  return results;
}

TensorView ModelRunner::mask_refused_tokens_of(const Tensor& logits, const std::vector<Request*>& requests) {
  const auto num_rows = static_cast<int64_t>(requests.size());
  const int64_t width = logits.numel() / num_rows;
  const int64_t words = (width + 63) / 64;
  host_allowed_.assign(static_cast<size_t>(num_rows * words), ~uint64_t{0});
  for (int64_t r = 0; r < num_rows; ++r)
    if (requests[static_cast<size_t>(r)]->sampler.constrained())
      requests[static_cast<size_t>(r)]->sampler.write_next_tokens(
          std::span<uint64_t>(host_allowed_.data() + r * words, static_cast<size_t>(words)));
  const Device device = logits.device();
  if (!masked_logits_.defined() || masked_logits_.numel() < logits.numel() || masked_logits_.dtype() != logits.dtype())
    masked_logits_ = empty_on(device, logits.dtype(), {logits.numel()});
  if (!device_allowed_.defined() || device_allowed_.numel() < num_rows * words)
    device_allowed_ = empty_on(device, DType::kI64, {num_rows * words});
  TensorView allowed = device_allowed_.view();
  allowed.shape = {num_rows, words};
  copy_bytes(device, allowed.data, host_allowed_.data(), allowed.nbytes());
  TensorView masked = masked_logits_.view();
  masked.shape = logits.view().shape;
  mask_refused_tokens(masked, logits.view(), allowed);
  return masked;
}

Tensor ModelRunner::run_forward() {
  const std::optional<std::chrono::steady_clock::time_point> results_at = std::exchange(results_at_, std::nullopt);
  const int32_t num_rows = batch_.num_tokens();
  // Every row a decode token: a prompt's one-token last chunk has the same shape but runs the method's prefill
  // hooks (an observation-window method scores there), which a replay would skip.
  const bool decode_only = static_cast<int32_t>(batch_.logit_rows.size()) == num_rows &&
                           std::all_of(batch_.sequences.begin(), batch_.sequences.end(), [this](const SequenceSlice& s) {
                             return s.num_tokens == 1 && s.is_decode(batch_.positions);
                           });
  if (!use_cuda_graphs_ || !decode_only || !controller_.decode_forward_is_static())
    return model_.forward(batch_, controller_, workspace_);
  model_.prepare_forward(batch_, controller_, workspace_);
  DecodeGraph& g = decode_graphs_[num_rows];
  const uint64_t stamp = StepGraph::buffers_generation();
  if (g.graph.captured() && g.captured == stamp) {
    if (results_at)
      host_gap_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - *results_at).count();
    g.graph.replay();
    controller_.count_replayed_forward(batch_);
    ++num_graph_replays_;
    return workspace_.logits(num_rows);
  }
  if (g.warm && g.warmed == stamp) {
    // Capturing enqueues nothing, so the step then runs as the first replay; its attend calls did count.
    Tensor logits;
    g.graph.capture([&] { logits = model_.launch_forward(batch_, controller_, workspace_); });
    g.captured = stamp;
    g.graph.replay();
    return logits;
  }
  Tensor logits = model_.launch_forward(batch_, controller_, workspace_);
  g.warm = true;
  g.warmed = StepGraph::buffers_generation();  // the eager run may have grown the attention scratch
  return logits;
}

std::vector<Request*> ModelRunner::build_batch(const StepPlan& plan) {
  clear_batch(batch_);
  std::vector<Request*> sampling;
  for (const ScheduledRequest& s : plan.scheduled) {
    Request& r = *s.request;
    const int32_t begin = r.num_computed_tokens;
    // All known tokens computed: sample the next one.
    const bool samples = begin + s.num_tokens == r.num_tokens();
    append_sequence(batch_, r.seq,
                    std::span<const int32_t>(r.token_ids).subspan(static_cast<size_t>(begin),
                                                                  static_cast<size_t>(s.num_tokens)),
                    begin, r.num_prefill_tokens, samples);
    if (samples) sampling.push_back(&r);
  }
  return sampling;
}

std::vector<SampledToken> ModelRunner::execute(const StepPlan& plan) {
  const std::vector<Request*> sampling = build_batch(plan);
  std::vector<SampledToken> sampled;
  if (batch_.token_ids.empty()) return sampled;
  run_step(controller_, batch_, [this] { return run_forward(); }, [&](const Tensor& logits) {
    std::vector<SampleResult> samples = sample(logits, sampling);
    for (size_t i = 0; i < sampling.size(); ++i) sampled.push_back({sampling[i], std::move(samples[i])});
    count_expert_reads();
  });
  return sampled;
}

void ModelRunner::follow(const StepPlan& plan) {
  build_batch(plan);
  if (batch_.token_ids.empty()) return;
  run_step(controller_, batch_, [this] { return run_forward(); }, [this](const Tensor&) { count_expert_reads(); });
}

void ModelRunner::count_expert_reads() {
  const ModelConfig& c = model_.config();
  if (c.num_experts == 0) return;
  const TensorView offsets = workspace_.all_expert_offsets();
  host_expert_offsets_.resize(static_cast<size_t>(offsets.numel()));
  copy_bytes(workspace_.device(), host_expert_offsets_.data(), offsets.data, offsets.nbytes());
  const size_t width = static_cast<size_t>(c.num_experts) + 1;
  for (int layer = 0; layer < c.num_layers; ++layer) {
    if (!c.layers[static_cast<size_t>(layer)].moe) continue;
    const int32_t* begin = host_expert_offsets_.data() + static_cast<size_t>(layer) * width;
    int64_t chosen = 0;
    for (int e = 0; e < c.num_experts; ++e) chosen += begin[e + 1] > begin[e];
    const LayerWeights& w = model_.weights().layers[static_cast<size_t>(layer)];
    // FP8 experts: one byte per weight, plus the block scales.
    size_t bytes = 0;
    for (const Tensor* t : {&w.experts_gate_up, &w.experts_down, &w.experts_gate_up_scale, &w.experts_down_scale})
      if (t->defined()) bytes += t->nbytes();
    expert_weight_bytes_ += chosen * static_cast<int64_t>(bytes) / c.num_experts;
  }
}

}  // namespace se
