// The bytes of host tensors alive now (every Tensor::empty on the CPU allocator, until its storage is freed) and
// their peak since the last reset: what a load holds on the host at its worst, which the model loader's memory
// bound is tested by. Memory-mapped files and page-locked staging buffers are not host tensors and are not counted.
// Process-wide counters; thread-safe.
#pragma once

#include <cstddef>

namespace se {

size_t host_tensor_bytes();
size_t host_tensor_peak_bytes();
// Starts a new peak at the bytes alive now.
void reset_host_tensor_peak();

}  // namespace se
