#include "backend/staged_buffer.h"

#include <algorithm>

#include "backend/device_memory.h"
#include "base/check.h"

namespace se {

bool StagedBuffer::grow(Device device, size_t num_bytes) {
  if (device_.defined() && device_.device() == device && device_.nbytes() >= num_bytes) return false;
  const size_t grown = std::max({num_bytes, 2 * nbytes(), size_t{64}});
  device_ = Tensor();  // free first: nothing on the stream reads it between steps
  device_ = empty_on(device, DType::kU8, {static_cast<int64_t>(grown)});
  SE_CHECK(device_.raw() != nullptr, "no device memory for {} bytes of staged tables", grown);
  host_ = Tensor::empty(DType::kU8, {static_cast<int64_t>(grown)}, staging_allocator(device));
  SE_CHECK(host_.raw() != nullptr, "no host memory to stage {} bytes of tables", grown);
  return true;
}

void StagedBuffer::upload(size_t num_bytes) const {
  copy_bytes_async(device_.device(), device_.raw(), host_.raw(), num_bytes);
}

}  // namespace se
