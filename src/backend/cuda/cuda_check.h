// Error checks for CUDA runtime and cuBLASLt calls: a failing call is an engine bug or a dead
// device, so it becomes an SE_CHECK failure that names the call, the error and where it happened.
// Header-only, stateless.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "base/check.h"

#define SE_CUDA_CHECK(call)                                                     \
  do {                                                                          \
    const cudaError_t se_cuda_err_ = (call);                                    \
    SE_CHECK(se_cuda_err_ == cudaSuccess, "{} failed: {} ({})", #call,          \
             cudaGetErrorName(se_cuda_err_), cudaGetErrorString(se_cuda_err_)); \
  } while (0)

// After every kernel launch: catches bad launch configurations at once (execution errors surface at
// the next synchronizing call).
#define SE_CUDA_CHECK_LAUNCH(kernel_name)                                              \
  do {                                                                                 \
    const cudaError_t se_cuda_err_ = cudaGetLastError();                               \
    SE_CHECK(se_cuda_err_ == cudaSuccess, "launch of {} failed: {} ({})", kernel_name, \
             cudaGetErrorName(se_cuda_err_), cudaGetErrorString(se_cuda_err_));        \
  } while (0)

#define SE_CUBLAS_CHECK(call)                                                    \
  do {                                                                           \
    const cublasStatus_t se_cublas_status_ = (call);                             \
    SE_CHECK(se_cublas_status_ == CUBLAS_STATUS_SUCCESS, "{} failed: {}", #call, \
             cublasLtGetStatusString(se_cublas_status_));                        \
  } while (0)
