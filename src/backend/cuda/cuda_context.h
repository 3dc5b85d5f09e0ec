// CudaContext: what the CUDA ops of one engine share — one stream (every op is enqueued on it, in
// call order), the cuBLASLt handle with its workspace and cached matmul plans, a scratch buffer
// for split-KV partials and staged tables, and a pinned ring the staged tables travel through. Ops run on CudaContext::current(): the context a ScopedCudaContext made
// current on this thread, else a process-wide default on device 0. Not thread-safe: one thread
// drives one context.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "base/status.h"

namespace se::cuda {

struct LinearPlanCache;  // defined in linear.cu
void destroy_linear_plans(LinearPlanCache* cache);

// Ok when the kernels can run on CUDA device `device` (its properties `props`): they are built for
// Hopper's sm_90a (compute capability 9.0), whose warpgroup MMAs the prefill attention uses.
inline Status kernels_run_on(const cudaDeviceProp& props, int device) {
  if (props.major == 9 && props.minor == 0) return Status::ok();
  return failed_precondition(
      "CUDA device {} ({}) has compute capability {}.{}; SparseEngine's CUDA kernels are built for Hopper (sm_90a)",
      device, props.name, props.major, props.minor);
}

class CudaContext final {
 public:
  explicit CudaContext(int device = 0);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  // This thread's current context (created on device 0 at first use when none was made current).
  static CudaContext& current();

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cublasLtHandle_t lt() const { return lt_; }
  const cudaDeviceProp& props() const { return props_; }
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return kWorkspaceBytes; }

  // Device scratch of at least `nbytes`, valid until the next call; growing it waits for the stream
  // first, since earlier ops may still read the old buffer.
  void* scratch(size_t nbytes);
  // Pinned host memory for one staged host-to-device copy of `nbytes`, from a ring: a copy enqueued from it
  // may run later, so the ring waits for the stream only when it wraps (or grows).
  void* host_staging(size_t nbytes);
  // Blocks until everything enqueued on the stream has finished; checks for execution errors.
  void synchronize() const;
  // The stream the host tier's page copies run on, apart from the forward's (made at first use), ordered after
  // everything enqueued on the forward's stream so far: a copy starts once the kernels writing its source are done.
  cudaStream_t transfer_stream();

  // Matmul plans keyed by shape and dtypes (owned here, built by linear.cu).
  LinearPlanCache*& linear_plans() { return linear_plans_; }

 private:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  int device_;
  cudaDeviceProp props_{};
  cudaStream_t stream_ = nullptr;
  cudaStream_t transfer_stream_ = nullptr;
  cudaEvent_t compute_mark_ = nullptr;  // recorded on stream_, waited for by transfer_stream_
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  void* host_staging_ = nullptr;
  size_t host_staging_bytes_ = 0;
  size_t host_staging_used_ = 0;
  LinearPlanCache* linear_plans_ = nullptr;
};

// Makes `context` current on this thread for the scope's lifetime (restores the previous one
// after).
class ScopedCudaContext final {
 public:
  explicit ScopedCudaContext(CudaContext& context);
  ~ScopedCudaContext();
  ScopedCudaContext(const ScopedCudaContext&) = delete;
  ScopedCudaContext& operator=(const ScopedCudaContext&) = delete;

 private:
  CudaContext* previous_;
};

}  // namespace se::cuda
