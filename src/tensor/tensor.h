// Tensor: an owning, contiguous, row-major n-d array on one device; TensorView: a non-owning view of one.
// Tensors share their storage when copied (shared_ptr); clone() makes a deep copy. Storage comes from an
// Allocator: the CPU one here, device allocators are registered by backends. Not internally synchronized.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "tensor/dtype.h"
#include "tensor/shape.h"

namespace se {

enum class Device : uint8_t { kCpu, kCuda };

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual Device device() const = 0;
};

// 64-byte aligned host memory.
Allocator* cpu_allocator();

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;
  Device device = Device::kCpu;

  int64_t numel() const { return shape.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

class Tensor {
 public:
  Tensor() = default;

  // Uninitialized storage of `shape` elements.
  static Tensor empty(DType dtype, Shape shape, Allocator* allocator = cpu_allocator());
  static Tensor zeros(DType dtype, Shape shape);  // CPU only
  // Wraps memory owned by someone else (e.g. an mmap); `owner` keeps it alive.
  static Tensor wrap(void* data, DType dtype, Shape shape, std::shared_ptr<void> owner,
                     Device device = Device::kCpu);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i]; }
  int rank() const { return shape_.rank(); }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  Device device() const { return device_; }

  void* raw() const { return data_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_);
  }

  TensorView view() const { return TensorView{data_, dtype_, shape_, device_}; }
  // Same storage, new shape with the same number of elements.
  Tensor reshape(Shape shape) const;
  // Rows [begin, end) of the first dimension, sharing storage.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // A deep copy on the CPU (CPU tensors only).
  Tensor clone() const;
  // A CPU fp32 copy of a CPU tensor of F32/F16/BF16.
  Tensor to_f32() const;

  std::string describe() const;  // "f32[2, 3]"

 private:
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Shape shape_;
  Device device_ = Device::kCpu;
};

}  // namespace se
