// Page pools over real storage for the KV tests: host memory, so a test can write and read every page's bytes.
#pragma once

#include <cstdint>
#include <utility>

#include "base/check.h"
#include "kv/block_pool.h"
#include "kv/kv_layout.h"
#include "kv/page_storage.h"

namespace se::test {

// A pool of `num_pages` pages of `layout`'s size (ArenaPageStorage on the CPU allocator).
inline BlockPool pool_with_storage(const KvLayout& layout, int32_t num_pages) {
  auto storage = ArenaPageStorage::create(cpu_allocator(), num_pages, layout.page_bytes());
  SE_CHECK(storage.is_ok(), "{}", storage.status().to_string());
  return BlockPool(std::move(storage).value());
}

}  // namespace se::test
