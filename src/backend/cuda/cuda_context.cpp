#include "backend/cuda/cuda_context.h"

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/step_graph.h"

namespace se::cuda {

namespace {
thread_local CudaContext* tls_current = nullptr;
}  // namespace

CudaContext::CudaContext(int device) : device_(device) {
  SE_CUDA_CHECK(cudaSetDevice(device_));
  SE_CUDA_CHECK(cudaGetDeviceProperties(&props_, device_));
  const Status runs = kernels_run_on(props_, device_);
  SE_CHECK(runs.is_ok(), "{} Use --device cpu.", runs.message());
  // A blocking stream: work a caller puts on the legacy default stream (plain cudaMemcpy) stays
  // ordered with ours.
  SE_CUDA_CHECK(cudaStreamCreate(&stream_));
  SE_CUBLAS_CHECK(cublasLtCreate(&lt_));
  SE_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
}

CudaContext::~CudaContext() {
  // Destructors must not abort: errors here are ignored (the process is tearing down or the device
  // is gone).
  cudaStreamSynchronize(stream_);
  if (transfer_stream_ != nullptr) {
    cudaStreamSynchronize(transfer_stream_);
    cudaStreamDestroy(transfer_stream_);
    cudaEventDestroy(compute_mark_);
  }
  destroy_linear_plans(linear_plans_);
  cudaFree(scratch_);
  cudaFreeHost(host_staging_);
  cudaFree(workspace_);
  cublasLtDestroy(lt_);
  cudaStreamDestroy(stream_);
}

CudaContext& CudaContext::current() {
  if (tls_current != nullptr) return *tls_current;
  static CudaContext default_context(0);
  return default_context;
}

void* CudaContext::scratch(size_t nbytes) {
  if (nbytes <= scratch_bytes_) return scratch_;
  // Grow geometrically so a slowly rising demand does not reallocate on every step.
  const size_t grown = std::max(nbytes, size_t{2} * scratch_bytes_);
  SE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  SE_CUDA_CHECK(cudaFree(scratch_));
  scratch_ = nullptr;
  scratch_bytes_ = 0;
  SE_CUDA_CHECK(cudaMalloc(&scratch_, grown));
  scratch_bytes_ = grown;
  StepGraph::note_buffers_moved();  // graphs captured over the old buffer are stale
  return scratch_;
}

void* CudaContext::host_staging(size_t nbytes) {
  constexpr size_t kMinRingBytes = size_t{16} << 20;
  nbytes = (nbytes + 255) / 256 * 256;
  if (host_staging_used_ + nbytes > host_staging_bytes_) {
    SE_CUDA_CHECK(cudaStreamSynchronize(stream_));  // every copy out of the ring has run
    host_staging_used_ = 0;
    if (nbytes > host_staging_bytes_) {
      SE_CUDA_CHECK(cudaFreeHost(host_staging_));
      host_staging_ = nullptr;
      host_staging_bytes_ = std::max({nbytes, kMinRingBytes, size_t{2} * host_staging_bytes_});
      SE_CUDA_CHECK(cudaMallocHost(&host_staging_, host_staging_bytes_));
    }
  }
  void* slot = static_cast<char*>(host_staging_) + host_staging_used_;
  host_staging_used_ += nbytes;
  return slot;
}

void CudaContext::synchronize() const { SE_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

cudaStream_t CudaContext::transfer_stream() {
  if (transfer_stream_ == nullptr) {
    SE_CUDA_CHECK(cudaStreamCreateWithFlags(&transfer_stream_, cudaStreamNonBlocking));
    SE_CUDA_CHECK(cudaEventCreateWithFlags(&compute_mark_, cudaEventDisableTiming));
  }
  SE_CUDA_CHECK(cudaEventRecord(compute_mark_, stream_));
  SE_CUDA_CHECK(cudaStreamWaitEvent(transfer_stream_, compute_mark_, 0));
  return transfer_stream_;
}

ScopedCudaContext::ScopedCudaContext(CudaContext& context) : previous_(tls_current) {
  tls_current = &context;
  SE_CUDA_CHECK(cudaSetDevice(context.device()));
}

ScopedCudaContext::~ScopedCudaContext() { tls_current = previous_; }

}  // namespace se::cuda
