#include "tensor/tensor.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "base/check.h"
#include "tensor/host_memory.h"

namespace se {

namespace {

std::atomic<size_t> live_host_bytes{0};
std::atomic<size_t> peak_host_bytes{0};

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    size_t rounded = (nbytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    SE_CHECK(p != nullptr, "host allocation of {} bytes failed", nbytes);
    const size_t live = live_host_bytes.fetch_add(nbytes, std::memory_order_relaxed) + nbytes;
    size_t peak = peak_host_bytes.load(std::memory_order_relaxed);
    while (live > peak && !peak_host_bytes.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
    }
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    std::free(ptr);
    live_host_bytes.fetch_sub(nbytes, std::memory_order_relaxed);
  }
  Device device() const override { return Device::kCpu; }
};

}  // namespace

size_t host_tensor_bytes() { return live_host_bytes.load(std::memory_order_relaxed); }
size_t host_tensor_peak_bytes() { return peak_host_bytes.load(std::memory_order_relaxed); }
void reset_host_tensor_peak() { peak_host_bytes.store(host_tensor_bytes(), std::memory_order_relaxed); }

Allocator* cpu_allocator() {
  static CpuAllocator allocator;
  return &allocator;
}

Tensor Tensor::empty(DType dtype, Shape shape, Allocator* allocator) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.device_ = allocator->device();
  const size_t nbytes = t.nbytes();
  void* p = allocator->allocate(nbytes);
  t.storage_ = std::shared_ptr<void>(p, [allocator, nbytes](void* q) { allocator->deallocate(q, nbytes); });
  t.data_ = p;
  return t;
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor t = empty(dtype, shape);
  std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::wrap(void* data, DType dtype, Shape shape, std::shared_ptr<void> owner, Device device) {
  Tensor t;
  t.storage_ = owner ? std::move(owner) : std::shared_ptr<void>(data, [](void*) {});
  t.data_ = data;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.device_ = device;
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  SE_CHECK(shape.numel() == numel(), "reshape {} -> {}", shape_.to_string(), shape.to_string());
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  SE_CHECK(rank() >= 1 && begin >= 0 && begin <= end && end <= shape_[0], "slice_rows [{}, {}) of {}",
           begin, end, shape_.to_string());
  const int64_t row = shape_[0] == 0 ? 0 : numel() / shape_[0];
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.data_ = static_cast<char*>(data_) + begin * row * static_cast<int64_t>(dtype_size(dtype_));
  return t;
}

Tensor Tensor::clone() const {
  SE_CHECK(device_ == Device::kCpu, "clone of a device tensor");
  Tensor t = empty(dtype_, shape_);
  std::memcpy(t.data_, data_, nbytes());
  return t;
}

Tensor Tensor::to_f32() const {
  SE_CHECK(device_ == Device::kCpu, "to_f32 of a device tensor");
  Tensor t = empty(DType::kF32, shape_);
  convert_to_f32(data_, dtype_, t.data<float>(), static_cast<size_t>(numel()));
  return t;
}

std::string Tensor::describe() const {
  return std::string(dtype_name(dtype_)) + shape_.to_string();
}

}  // namespace se
