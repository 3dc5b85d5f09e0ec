// Device-neutral memory for code that runs on either backend (the model, the engine, the cache): the allocator
// of a device, copies between any two devices, and the device's free memory. Host-only builds serve
// Device::kCpu and refuse Device::kCuda with an error naming the missing backend. Copies go on the current CUDA
// context's stream (cuda_allocator.h): one that touches host memory returns once the host side may be reused.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

#include "backend/page_copy.h"
#include "base/status.h"
#include "tensor/tensor.h"

namespace se {

// "cpu" / "cuda"; parse_device fails on anything else.
std::string_view device_name(Device device);
Result<Device> parse_device(std::string_view name);

// True when this build has the backend of `device`.
bool device_built(Device device);
// Ok when this build has CUDA and device 0 is one its kernels run on (Hopper, sm_90a); else why not.
Status cuda_device_status();
// Where work goes when nobody says: CUDA when cuda_device_status() is ok, else the CPU (what vLLM does on a GPU
// machine).
Device default_device();

Allocator* device_allocator(Device device);
// Host memory that copies to and from `device` are fastest with (page-locked for CUDA; plain on the CPU), for
// buffers staged to the device every step.
Allocator* staging_allocator(Device device);

// An uninitialized tensor on `device`.
Tensor empty_on(Device device, DType dtype, Shape shape);
// A view of `shape` at the start of `buffer`, reallocated (uninitialized, geometrically grown) on `device` when it is
// elsewhere or too small: scratch reused across calls without an allocation in a steady state. Freeing the old
// buffer waits for the device's work that may still read it.
TensorView scratch_view(Tensor& buffer, Device device, DType dtype, Shape shape);
// A copy of host tensor `host` on `device` (shares `host` when device is the CPU).
Tensor to_device(const Tensor& host, Device device);

// dst = src: same dtype and element count; any mix of devices.
void copy(TensorView dst, TensorView src);
// Raw bytes between host and `device` (either direction).
void copy_bytes(Device device, void* dst, const void* src, size_t nbytes);
// The same copy enqueued without waiting (the CPU copies at once): host memory it reads or writes must be
// staging memory (staging_allocator) that stays untouched until the stream has run the copy.
void copy_bytes_async(Device device, void* dst, const void* src, size_t nbytes);

// `rows` rows of `width` bytes, row r from src + r * src_pitch to dst + r * dst_pitch, between host and `device` or
// within `device`, enqueued as one copy without waiting; host memory as for copy_bytes_async.
void copy_rows_async(Device device, void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                     size_t rows);

// t = 0 bytewise, on any device (on CUDA enqueued on the current stream).
void fill_zero(TensorView t);

// Copies `nbytes` for each of `copies` between host memory and `device` (either direction, or host to host). On
// CUDA they run on a transfer stream of their own, after what the forward's stream enqueued so far (which may
// still write the sources), and the call returns once they have run; the CPU copies at once.
void copy_pages(Device device, std::span<const PageCopy> copies, size_t nbytes);

// Waits for everything enqueued on `device` (a no-op on the CPU).
void synchronize(Device device);

// Opens or closes an attached profiler's capture (cudaProfilerStart / cudaProfilerStop), so a profiler started
// with capture off (`ncu --profile-from-start off`) records only the kernels in between. Without a profiler, and
// on the CPU, it does nothing.
void set_profiler_capture(Device device, bool on);

// Free and total bytes of the current CUDA device.
struct DeviceMemoryInfo {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};
DeviceMemoryInfo cuda_memory_info();

}  // namespace se
