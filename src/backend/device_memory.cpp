#include "backend/device_memory.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"

#if SE_WITH_CUDA
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_allocator.h"
#include "backend/cuda/cuda_context.h"
#endif

namespace se {

namespace {
void require_built(Device device) {
  SE_CHECK(device_built(device), "a {} tensor, but this build has no CUDA backend (configure with -DSE_CUDA=ON)",
           device_name(device));
}
}  // namespace

std::string_view device_name(Device device) { return device == Device::kCuda ? "cuda" : "cpu"; }

Result<Device> parse_device(std::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  return invalid_argument("unknown device '{}' (expected cpu or cuda)", name);
}

bool device_built(Device device) {
#if SE_WITH_CUDA
  return true;
#else
  return device == Device::kCpu;
#endif
}

Status cuda_device_status() {
#if SE_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
    return unavailable("no CUDA device is visible on this machine");
  cudaDeviceProp props{};
  if (cudaGetDeviceProperties(&props, 0) != cudaSuccess)
    return unavailable("the properties of CUDA device 0 cannot be read");
  return cuda::kernels_run_on(props, 0);
#else
  return unavailable("this build has no CUDA backend (configure with -DSE_CUDA=ON)");
#endif
}

Device default_device() { return cuda_device_status().is_ok() ? Device::kCuda : Device::kCpu; }

Allocator* device_allocator(Device device) {
  if (device == Device::kCpu) return cpu_allocator();
  require_built(device);
#if SE_WITH_CUDA
  return cuda::cuda_allocator();
#else
  return nullptr;
#endif
}

Allocator* staging_allocator(Device device) {
  if (device == Device::kCpu) return cpu_allocator();
  require_built(device);
#if SE_WITH_CUDA
  return cuda::pinned_host_allocator();
#else
  return nullptr;
#endif
}

Tensor empty_on(Device device, DType dtype, Shape shape) {
  Tensor t = Tensor::empty(dtype, shape, device_allocator(device));
  SE_CHECK(t.raw() != nullptr || t.nbytes() == 0, "out of {} memory for {}", device_name(device), t.describe());
  return t;
}

TensorView scratch_view(Tensor& buffer, Device device, DType dtype, Shape shape) {
  const size_t nbytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  if (!buffer.defined() || buffer.device() != device || buffer.nbytes() < nbytes) {
    const size_t grown = buffer.defined() && buffer.device() == device ? std::max(nbytes, 2 * buffer.nbytes()) : nbytes;
    buffer = Tensor();
    buffer = empty_on(device, DType::kU8, {static_cast<int64_t>(grown)});
  }
  return TensorView{buffer.raw(), dtype, shape, device};
}

Tensor to_device(const Tensor& host, Device device) {
  SE_CHECK(host.device() == Device::kCpu, "to_device: {} is not a host tensor", host.describe());
  if (device == Device::kCpu) return host;
  Tensor t = empty_on(device, host.dtype(), host.shape());
  copy(t.view(), host.view());
  return t;
}

void copy(TensorView dst, TensorView src) {
  SE_CHECK(dst.dtype == src.dtype && dst.numel() == src.numel(), "copy: {} {} <- {} {}", dtype_name(dst.dtype),
           dst.shape.to_string(), dtype_name(src.dtype), src.shape.to_string());
  if (dst.device == Device::kCpu && src.device == Device::kCpu) {
    std::memcpy(dst.data, src.data, dst.nbytes());
    return;
  }
  require_built(Device::kCuda);
#if SE_WITH_CUDA
  cuda::copy(dst, src);
#endif
}

void copy_bytes(Device device, void* dst, const void* src, size_t nbytes) {
  if (nbytes == 0) return;  // an empty tensor may have no storage: memcpy takes no null pointer, even for 0 bytes
  if (device == Device::kCpu) {
    std::memcpy(dst, src, nbytes);
    return;
  }
  require_built(device);
#if SE_WITH_CUDA
  cuda::copy_bytes(dst, src, nbytes);
#endif
}

void copy_bytes_async(Device device, void* dst, const void* src, size_t nbytes) {
  if (device == Device::kCpu) {
    std::memcpy(dst, src, nbytes);
    return;
  }
  require_built(device);
#if SE_WITH_CUDA
  cuda::copy_bytes_async(dst, src, nbytes);
#endif
}

void copy_rows_async(Device device, void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                     size_t rows) {
  if (device == Device::kCpu) {
    for (size_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, width);
    return;
  }
  require_built(device);
#if SE_WITH_CUDA
  cuda::copy_rows_async(dst, dst_pitch, src, src_pitch, width, rows);
#endif
}

void fill_zero(TensorView t) {
  if (t.device == Device::kCpu) {
    std::memset(t.data, 0, t.nbytes());
    return;
  }
  require_built(t.device);
#if SE_WITH_CUDA
  cuda::fill_zero(t.data, t.nbytes());
#endif
}

void copy_pages(Device device, std::span<const PageCopy> copies, size_t nbytes) {
  if (device == Device::kCpu) {
    for (const PageCopy& c : copies) std::memcpy(c.dst, c.src, nbytes);
    return;
  }
  require_built(device);
#if SE_WITH_CUDA
  cuda::copy_pages(copies, nbytes);
#endif
}

void synchronize(Device device) {
  if (device == Device::kCpu) return;
  require_built(device);
#if SE_WITH_CUDA
  cuda::CudaContext::current().synchronize();
#endif
}

void set_profiler_capture(Device device, bool on) {
  if (device == Device::kCpu) return;
  require_built(device);
#if SE_WITH_CUDA
  // An error here only means no profiler listens; clear it so no later check of this thread reports it.
  if ((on ? cudaProfilerStart() : cudaProfilerStop()) != cudaSuccess) (void)cudaGetLastError();
#endif
}

DeviceMemoryInfo cuda_memory_info() {
  require_built(Device::kCuda);
  DeviceMemoryInfo info;
#if SE_WITH_CUDA
  cuda::memory_info(&info.free_bytes, &info.total_bytes);
#endif
  return info;
}

}  // namespace se
