// StagedBuffer: a device buffer and a staging twin of the same size in host memory the device copies fastest from
// (staging_allocator), for tables the host writes every step and the device reads: the host fills the staging, and
// the copy is enqueued on the stream. Both stay put unless grow() needs more room, so a captured CUDA graph finds
// them where it did. Engine thread only.
#pragma once

#include <cstddef>

#include "tensor/tensor.h"

namespace se {

class StagedBuffer {
 public:
  // Room for `num_bytes` on `device` (geometric growth, so steady decoding stops allocating); true when the buffers
  // moved, which forgets their contents. The old device buffer is freed at once: call it between steps, when the
  // stream no longer reads it.
  bool grow(Device device, size_t num_bytes);
  bool defined() const { return device_.defined(); }
  size_t nbytes() const { return device_.defined() ? device_.nbytes() : 0; }
  void* host() const { return host_.raw(); }
  void* device() const { return device_.raw(); }
  // Enqueues the copy of the staging's first `num_bytes` to the device buffer (copy_bytes_async): the staging must
  // stay untouched until the stream has run it.
  void upload(size_t num_bytes) const;

 private:
  Tensor host_;
  Tensor device_;
};

}  // namespace se
