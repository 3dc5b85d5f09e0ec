// Device memory for Tensors and the copies between host and device. cuda_allocator() hands out
// cudaMalloc memory on the current context's device (Tensor::empty(dtype, shape, cuda_allocator())
// gives a CUDA tensor); it returns nullptr when the device is out of memory, so arena owners can
// report it. Copies run on the current context's stream: a copy that touches host memory returns
// once the host side may be reused or read; a device-to-device copy is only enqueued.
// Thread-safety: as CudaContext (one driving thread per context).
#pragma once

#include <cstddef>
#include <span>

#include "backend/page_copy.h"
#include "tensor/tensor.h"

namespace se::cuda {

Allocator* cuda_allocator();
// Page-locked host memory (cudaMallocHost): the fastest source and destination of host <-> device copies.
Allocator* pinned_host_allocator();

// dst = src: same dtype and element count, any mix of host and CUDA tensors.
void copy(TensorView dst, TensorView src);
// A CUDA copy of a host tensor, and a host copy of a CUDA tensor.
Tensor to_device(const Tensor& host);
Tensor to_host(const Tensor& device);

// Raw byte copies between host and device memory (either direction is inferred from the pointers).
void copy_bytes(void* dst, const void* src, size_t nbytes);
// The same, enqueued without waiting for the stream: host memory must be pinned and left alone until it ran.
void copy_bytes_async(void* dst, const void* src, size_t nbytes);

// A strided copy of `rows` rows of `width` bytes, enqueued without waiting (cudaMemcpy2DAsync); host memory as
// for copy_bytes_async.
void copy_rows_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows);

// Zeros `nbytes` of device memory, enqueued on the stream.
void fill_zero(void* dst, size_t nbytes);

// Page copies between two page pools (`nbytes` each, either direction), on the context's transfer stream after
// the forward's work so far; returns once they have run. Host pages should be pinned for the copies to overlap.
void copy_pages(std::span<const PageCopy> copies, size_t nbytes);

// Free and total bytes of the current context's device (cudaMemGetInfo).
void memory_info(size_t* free_bytes, size_t* total_bytes);

}  // namespace se::cuda
