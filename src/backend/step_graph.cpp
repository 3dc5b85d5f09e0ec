#include "backend/step_graph.h"

#include <atomic>
#include <utility>

#include "base/check.h"

#if SE_WITH_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#endif

namespace se {

namespace {
std::atomic<uint64_t> buffers_moved{0};
}  // namespace

void StepGraph::note_buffers_moved() { buffers_moved.fetch_add(1, std::memory_order_relaxed); }

uint64_t StepGraph::buffers_generation() { return buffers_moved.load(std::memory_order_relaxed); }

StepGraph::~StepGraph() { reset(); }

StepGraph::StepGraph(StepGraph&& other) noexcept
    : graph_(std::exchange(other.graph_, nullptr)), exec_(std::exchange(other.exec_, nullptr)) {}

StepGraph& StepGraph::operator=(StepGraph&& other) noexcept {
  if (this != &other) {
    reset();
    graph_ = std::exchange(other.graph_, nullptr);
    exec_ = std::exchange(other.exec_, nullptr);
  }
  return *this;
}

#if SE_WITH_CUDA

void StepGraph::reset() {
  if (exec_ != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_ != nullptr) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  exec_ = graph_ = nullptr;
}

void StepGraph::capture(const std::function<void()>& launch) {
  reset();
  cudaStream_t stream = cuda::CudaContext::current().stream();
  // Relaxed: host-side calls the ops make while enqueueing (cuBLASLt plan lookups) stay legal during capture.
  SE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  launch();
  cudaGraph_t graph = nullptr;
  SE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  graph_ = graph;
  cudaGraphExec_t exec = nullptr;
  SE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  exec_ = exec;
}

void StepGraph::replay() const {
  SE_CHECK(captured(), "StepGraph::replay before capture");
  SE_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), cuda::CudaContext::current().stream()));
}

#else

void StepGraph::reset() {}

void StepGraph::capture(const std::function<void()>& /*launch*/) {
  SE_CHECK(false, "CUDA graphs need the CUDA backend (configure with -DSE_CUDA=ON)");
}

void StepGraph::replay() const { SE_CHECK(false, "CUDA graphs need the CUDA backend (configure with -DSE_CUDA=ON)"); }

#endif

}  // namespace se
