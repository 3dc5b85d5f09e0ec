// ModelRunner: executes a StepPlan. It packs the scheduled tokens of every request into one ForwardBatch
// (prefill chunks and decode tokens together), runs the model with the sparse controller as its hooks
// (prepare_step, the forward, sampling, finish_step), and samples the next token of every request whose known
// tokens are now all computed. On CUDA a step whose sampled requests want no logprobs picks its tokens on the
// device (argmax_rows when all are greedy, else sample_rows with each request's next uniform draw) and copies
// back only the ids and their logprobs; a step with a logprobs request copies the sampled logit rows to the host
// for the CPU sampler. With CUDA graphs on, a decode-only step (one row per sequence) of a
// method whose decode forward is static replays the graph captured for its batch size: the first step of a
// size runs eagerly (its buffers grow to their size), the second captures, later ones replay while the
// workspace, the device page tables and the attention scratch stay where they were. Engine thread only.
#pragma once

#include <chrono>
#include <optional>
#include <unordered_map>
#include <vector>

#include "backend/step_graph.h"
#include "engine/scheduler.h"
#include "model/model.h"
#include "sparse/sparse_controller.h"

namespace se {

struct SampledToken {
  Request* request = nullptr;
  SampleResult sample;
};

class ModelRunner {
 public:
  // Runs the model's forwards in `workspace`; also lets the controller run the model for methods' transient
  // passes.
  ModelRunner(const Model& model, SparseController& controller, ForwardWorkspace workspace,
              bool use_cuda_graphs = false)
      : model_(model), controller_(controller), workspace_(std::move(workspace)), use_cuda_graphs_(use_cuda_graphs) {
    controller_.set_pass_forward(
        [this](const ForwardBatch& batch) { (void)model_.forward(batch, controller_, workspace_); });
  }
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // Runs the forward of `plan` and returns the sampled tokens (the requests' states are not changed).
  std::vector<SampledToken> execute(const StepPlan& plan);
  // Runs the forward of `plan` as a tensor-parallel rank other than 0 does: the same batch, hooks and collectives
  // as rank 0's execute, without sampling (rank 0 samples for every rank). Reads the plan's requests only, so
  // ranks may run it concurrently with rank 0's execute.
  void follow(const StepPlan& plan);
  // Forwards that replayed a CUDA graph so far.
  int64_t num_graph_replays() const { return num_graph_replays_; }
  // Host time from a step's sampled tokens reaching the host to the launch of the next step that replays a graph,
  // summed: the device has only the inputs' copies queued meanwhile, so this is decode time it spends waiting for
  // the host (scheduling, the methods' step hooks, the tables and inputs of the next step).
  double host_gap_seconds() const { return host_gap_seconds_; }
  // Bytes of expert weights the steps' mixture-of-experts layers read, summed: per step and MoE layer, each expert
  // some row of the batch chose, once (what the grouped expert GEMMs read; 0 for dense models).
  int64_t expert_weight_bytes() const { return expert_weight_bytes_; }

 private:
  // A graph replays only while the buffers its step reads are where they were at capture
  // (StepGraph::buffers_generation).
  struct DecodeGraph {
    StepGraph graph;
    uint64_t captured = 0;  // the buffers' generation at capture; valid when graph.captured()
    uint64_t warmed = 0;    // after the last eager run of this size
    bool warm = false;
  };
  // The forward of batch_, replayed or captured when the step allows, else eager.
  Tensor run_forward();
  // Fills batch_ with the plan's tokens and returns the requests that sample this step, in logit row order.
  std::vector<Request*> build_batch(const StepPlan& plan);

  // One result per row of `logits` [requests.size(), vocab] (on the model's device), in order.
  std::vector<SampleResult> sample(const Tensor& logits, const std::vector<Request*>& requests);
  // A device copy of `logits` with each constrained request's refused tokens at -inf (other rows as they are).
  TensorView mask_refused_tokens_of(const Tensor& logits, const std::vector<Request*>& requests);
  // Adds the step's expert reads to expert_weight_bytes_, from the expert offsets the forward left in the
  // workspace (one small copy to the host, after the step's results came back).
  void count_expert_reads();

  const Model& model_;
  SparseController& controller_;
  ForwardWorkspace workspace_;
  ForwardBatch batch_;  // reused across steps
  bool use_cuda_graphs_;
  std::unordered_map<int32_t, DecodeGraph> decode_graphs_;  // by batch size
  int64_t num_graph_replays_ = 0;
  std::optional<std::chrono::steady_clock::time_point> results_at_;  // when the last device step's tokens arrived
  double host_gap_seconds_ = 0.0;
  Tensor device_ids_;       // [capacity] I32 on the device: greedy tokens
  Tensor device_logprobs_;  // [capacity] F32 on the device: their logprobs
  std::vector<int32_t> host_ids_;
  std::vector<float> host_logprobs_;
  std::vector<RowSampling> row_sampling_;  // [rows] settings of a device-sampled step with random rows
  std::vector<uint64_t> host_allowed_;     // [rows, words] the grammars' allowed tokens of a constrained step
  Tensor device_allowed_;                  // the same, on the device
  Tensor masked_logits_;                   // [rows, width] on the device: the logits with refused tokens at -inf
  std::vector<float> host_logits_;  // [rows, vocab] when the CPU sampler runs on device logits
  std::vector<int32_t> host_expert_offsets_;  // [num_layers, num_experts + 1]: the step's grouping, MoE models
  int64_t expert_weight_bytes_ = 0;
};

}  // namespace se
