// What the files that dispatch backend ops to their CPU or CUDA twin (ops.cpp, moe_ops.cpp) share: whether this
// build has the CUDA backend, and the check that sends an op there. Internal to backend/; thread-safe.
#pragma once

#include "backend/device_memory.h"
#include "base/check.h"
#include "tensor/tensor.h"

namespace se {

#if SE_WITH_CUDA
inline constexpr bool kCudaBuilt = true;
#else
inline constexpr bool kCudaBuilt = false;  // callers' se::cuda calls sit in discarded branches and are never linked
#endif

// True when the op runs on the GPU (its output lives there); then the build must have the CUDA backend.
inline bool on_cuda(const TensorView& out, const char* what) {
  if (out.device != Device::kCuda) return false;
  SE_CHECK(kCudaBuilt, "{}: a CUDA tensor, but this build has no CUDA backend (configure with -DSE_CUDA=ON)", what);
  return true;
}

}  // namespace se
