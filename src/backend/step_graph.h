// StepGraph: the work one forward enqueues on the current CUDA context's stream, captured once as a CUDA graph and
// replayed as one launch. It serves the decode step of one batch size, whose launches are the same every step:
// the inputs and page tables change in place, in buffers that stay put. A replay is valid only while every
// buffer its kernels read is where it was at capture, so the owner keys each graph on buffers_generation() and
// captures again when it changed.
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

  // Captured work holds buffer addresses and launch sizes. Whatever owns a buffer a captured step reads (the
  // forward workspace, the device page tables, a method's device buffers, the CUDA context's scratch) calls
  // note_buffers_moved when that buffer moves or a launch size a capture fixes changes; graphs captured at an
  // older buffers_generation() are stale. One count for the process: a move anywhere costs at most a recapture.
  static void note_buffers_moved();
  static uint64_t buffers_generation();

 private:
  void reset();

  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
};

}  // namespace se
