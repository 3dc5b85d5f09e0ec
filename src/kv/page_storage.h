// PageStorage: where the bytes of the pages live. The BlockPool manages page ids only; a storage
// maps id p to the `page_bytes()` bytes at base() + p * page_bytes(). ArenaPageStorage carves one
// arena from an Allocator (host memory now, a device allocator later) and owns it. Immutable after
// construction; safe to read from any thread, but page contents are written only by the engine
// thread's kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "base/status.h"
#include "tensor/tensor.h"

namespace se {

class PageStorage {
 public:
  virtual ~PageStorage() = default;

  virtual void* base() const = 0;
  virtual size_t page_bytes() const = 0;
  virtual int32_t num_pages() const = 0;
  virtual Device device() const = 0;

  // Start of page `page_id` (0 <= page_id < num_pages()).
  void* page(int32_t page_id) const {
    return static_cast<char*>(base()) + static_cast<size_t>(page_id) * page_bytes();
  }
};

class ArenaPageStorage final : public PageStorage {
 public:
  // One arena of num_pages * page_bytes bytes from `allocator`; errors on non-positive sizes or
  // overflow.
  static Result<std::unique_ptr<ArenaPageStorage>> create(Allocator* allocator, int32_t num_pages,
                                                          size_t page_bytes);
  ~ArenaPageStorage() override;
  ArenaPageStorage(const ArenaPageStorage&) = delete;
  ArenaPageStorage& operator=(const ArenaPageStorage&) = delete;

  void* base() const override { return base_; }
  size_t page_bytes() const override { return page_bytes_; }
  int32_t num_pages() const override { return num_pages_; }
  Device device() const override { return allocator_->device(); }

 private:
  ArenaPageStorage(Allocator* allocator, void* base, int32_t num_pages, size_t page_bytes)
      : allocator_(allocator), base_(base), num_pages_(num_pages), page_bytes_(page_bytes) {}

  Allocator* allocator_;
  void* base_;
  int32_t num_pages_;
  size_t page_bytes_;
};

}  // namespace se
