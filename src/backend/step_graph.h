// StepGraph: the work one forward enqueues on the current CUDA context's stream, captured once as a CUDA graph and
// replayed as one launch. It serves the decode step of one batch size, whose launches are the same every step:
// the inputs and page tables change in place, in buffers that stay put. A replay is valid only while every
// buffer its kernels read is where it was at capture, so the owner keys each graph on those buffers'
// generations (ForwardWorkspace, AttentionViewMirror, memory_generation below) and captures again when one moves.
// CUDA only (device_built(Device::kCuda)); engine thread only.
#pragma once

#include <cstdint>
#include <functional>

namespace se {

class StepGraph final {
 public:
  StepGraph() = default;
  ~StepGraph();
  StepGraph(StepGraph&& other) noexcept;
  StepGraph& operator=(StepGraph&& other) noexcept;
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Records what `launch` enqueues (nothing runs yet), replacing an earlier capture. `launch` must not
  // synchronize or allocate: run it once uncaptured first, so buffers it grows on first use already exist.
  void capture(const std::function<void()>& launch);
  // Enqueues the captured work on the stream.
  void replay() const;
  bool captured() const { return exec_ != nullptr; }

  // Changes whenever the current CUDA context moves a buffer its kernels keep (the split-KV scratch).
  static uint64_t memory_generation();

 private:
  void reset();

  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
};

}  // namespace se
