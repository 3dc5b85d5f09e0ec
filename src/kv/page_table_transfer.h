// Moving a sequence's KV between page pools (the device pool and the host tier's pool): a copy of a PageTable into
// another pool, page by page, with the same streams, physical lengths, logical length and page contents. The
// caller then frees the source table: the ownership rule of block_pool.h holds (the copy owns its own pages, the
// source keeps its). Engine thread only.
#pragma once

#include <cstdint>
#include <span>

#include "base/status.h"
#include "kv/block_pool.h"
#include "kv/page_table.h"

namespace se {

// Copies page from_pages[i] of `from` into page to_pages[i] of `to` for every i (pages of one size); between device
// and host memory on the device's transfer stream (device_memory.h: copy_pages). Returns once they are copied.
void copy_storage_pages(const PageStorage& from, const PageStorage& to, std::span<const int32_t> from_pages,
                        std::span<const int32_t> to_pages);

// Pages copy_page_table takes from the destination pool while it copies `table`: its longest stream's pages in
// every stream (the table is grown in lockstep, then each stream cut to its length), so a compacted sequence with
// uneven streams briefly needs more than it ends up holding.
int64_t pages_to_copy_page_table(const PageTable& table);

// A table over `dst_pool` holding what `src` (over `src_pool`) holds. All or nothing: kResourceExhausted when
// dst_pool lacks pages_to_copy_page_table(src) free pages, kInvalidArgument when the pools' page sizes differ or a
// pool has no storage; nothing changes on error. A stream's spare page is not copied. Between device and host
// memory the pages move on the device's transfer stream (device_memory.h: copy_pages), and the call returns once
// they have.
Result<PageTable> copy_page_table(const PageTable& src, const BlockPool& src_pool, BlockPool* dst_pool);

}  // namespace se
