#include "backend/cuda/cuda_allocator.h"

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"

namespace se::cuda {

namespace {
class CudaAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    CudaContext& context = CudaContext::current();
    SE_CUDA_CHECK(cudaSetDevice(context.device()));
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, nbytes == 0 ? 1 : nbytes);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the (non-sticky) error so the next check does not report it
      return nullptr;
    }
    SE_CUDA_CHECK(err);
    return p;
  }
  // cudaFree waits for the device, so no kernel still reads the block when it is reused.
  void deallocate(void* ptr, size_t) override { cudaFree(ptr); }
  Device device() const override { return Device::kCuda; }
};

void copy_on_stream(void* dst, const void* src, size_t nbytes, bool touches_host) {
  if (nbytes == 0) return;
  cudaStream_t stream = CudaContext::current().stream();
  SE_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream));
  if (touches_host) SE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

bool is_host(const void* p) {
  cudaPointerAttributes attr{};
  SE_CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
  return attr.type == cudaMemoryTypeUnregistered || attr.type == cudaMemoryTypeHost;
}
}  // namespace

Allocator* cuda_allocator() {
  static CudaAllocator allocator;
  return &allocator;
}

namespace {
// Page-locked host memory: the device reads it by DMA at full link speed (pageable memory is staged first).
class PinnedHostAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    void* p = nullptr;
    return cudaMallocHost(&p, nbytes == 0 ? 1 : nbytes) == cudaSuccess ? p : nullptr;
  }
  void deallocate(void* ptr, size_t) override { cudaFreeHost(ptr); }
  Device device() const override { return Device::kCpu; }
};
}  // namespace

Allocator* pinned_host_allocator() {
  static PinnedHostAllocator allocator;
  return &allocator;
}

void copy(TensorView dst, TensorView src) {
  SE_CHECK(dst.dtype == src.dtype && dst.numel() == src.numel(), "cuda::copy: {} {} <- {} {}",
           dtype_name(dst.dtype), dst.shape.to_string(), dtype_name(src.dtype),
           src.shape.to_string());
  copy_on_stream(dst.data, src.data, dst.nbytes(),
                 dst.device == Device::kCpu || src.device == Device::kCpu);
}

Tensor to_device(const Tensor& host) {
  SE_CHECK(host.device() == Device::kCpu, "to_device of a {} tensor already on the device",
           host.describe());
  Tensor t = Tensor::empty(host.dtype(), host.shape(), cuda_allocator());
  SE_CHECK(t.raw() != nullptr || host.nbytes() == 0, "to_device: out of device memory for {}",
           host.describe());
  copy(t.view(), host.view());
  return t;
}

Tensor to_host(const Tensor& device) {
  SE_CHECK(device.device() == Device::kCuda, "to_host of host tensor {}", device.describe());
  Tensor t = Tensor::empty(device.dtype(), device.shape());
  copy(t.view(), device.view());
  return t;
}

void copy_bytes(void* dst, const void* src, size_t nbytes) {
  copy_on_stream(dst, src, nbytes, is_host(dst) || is_host(src));
}

void copy_bytes_async(void* dst, const void* src, size_t nbytes) { copy_on_stream(dst, src, nbytes, false); }

void copy_rows_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows) {
  if (width == 0 || rows == 0) return;
  SE_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDefault,
                                  CudaContext::current().stream()));
}

void fill_zero(void* dst, size_t nbytes) {
  SE_CUDA_CHECK(cudaMemsetAsync(dst, 0, nbytes, CudaContext::current().stream()));
}

void copy_pages(std::span<const PageCopy> copies, size_t nbytes) {
  if (copies.empty() || nbytes == 0) return;
  cudaStream_t transfer = CudaContext::current().transfer_stream();
  for (const PageCopy& c : copies) SE_CUDA_CHECK(cudaMemcpyAsync(c.dst, c.src, nbytes, cudaMemcpyDefault, transfer));
  SE_CUDA_CHECK(cudaStreamSynchronize(transfer));
}

void memory_info(size_t* free_bytes, size_t* total_bytes) {
  SE_CUDA_CHECK(cudaSetDevice(CudaContext::current().device()));
  SE_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

}  // namespace se::cuda
