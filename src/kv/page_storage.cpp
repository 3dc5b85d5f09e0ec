#include "kv/page_storage.h"

#include <limits>

namespace se {

Result<std::unique_ptr<ArenaPageStorage>> ArenaPageStorage::create(Allocator* allocator,
                                                                   int32_t num_pages,
                                                                   size_t page_bytes) {
  if (allocator == nullptr) return invalid_argument("page storage: no allocator given");
  if (num_pages <= 0) {
    return invalid_argument("page storage: num_pages must be positive, got {}", num_pages);
  }
  if (page_bytes == 0) return invalid_argument("page storage: page_bytes must be positive");
  if (page_bytes > std::numeric_limits<size_t>::max() / static_cast<size_t>(num_pages)) {
    return invalid_argument("page storage: {} pages of {} bytes overflow the address space",
                            num_pages, page_bytes);
  }
  void* base = allocator->allocate(static_cast<size_t>(num_pages) * page_bytes);
  if (base == nullptr) {
    return resource_exhausted("page storage: allocating {} pages of {} bytes failed", num_pages,
                              page_bytes);
  }
  return std::unique_ptr<ArenaPageStorage>(
      new ArenaPageStorage(allocator, base, num_pages, page_bytes));
}

ArenaPageStorage::~ArenaPageStorage() {
  allocator_->deallocate(base_, static_cast<size_t>(num_pages_) * page_bytes_);
}

}  // namespace se
