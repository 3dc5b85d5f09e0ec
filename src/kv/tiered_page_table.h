// TieredPageTable: one sequence's KV pages split over two pools, page by page: the device pool attention reads and
// the host tier's pool beside it. Each page of a stream lives in exactly one of them, and two rows per stream say
// where: the device row holds the page's device id or -1, the host row its host id or -1. Two rows rather than one
// tagged id: the device rows are a page list attention reads as they are (PageTableView; a selection points only
// at resident entries), and the host rows are what a retrieve copies from. Lengths start as those of the PageTable
// the sequence came from; appends add slots (new pages on the device). Owns one reference to every page it lists, in
// that page's pool; both pools (with page storage) outlive it. Engine thread only.
//
// Invariants (check_integrity): every page of every stream is listed in exactly one row and is in use in that row's
// pool; no page is listed twice.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "kv/block_pool.h"
#include "kv/page_table.h"

namespace se {

// Page `page_idx` of stream `stream` (layer * num_kv_heads + KV head) of one sequence.
struct StreamPage {
  int32_t stream = 0;
  int32_t page_idx = 0;
};

class TieredPageTable final {
 public:
  // Takes over the pages `table` lists (all on `device_pool`), retaining each; a stream's spare page stays with
  // `table`, which the caller then frees.
  TieredPageTable(const PageTable& table, BlockPool* device_pool, BlockPool* host_pool);
  ~TieredPageTable();
  TieredPageTable(TieredPageTable&& other) noexcept;
  TieredPageTable& operator=(TieredPageTable&&) = delete;
  TieredPageTable(const TieredPageTable&) = delete;
  TieredPageTable& operator=(const TieredPageTable&) = delete;

  const KvLayout& layout() const { return layout_; }
  int32_t num_logical_tokens() const { return num_logical_tokens_; }
  int32_t num_tokens(int32_t stream) const { return num_tokens_[static_cast<size_t>(stream)]; }
  int32_t num_pages(int32_t stream) const;
  // The page's device id, or -1 while it is on the host.
  int32_t device_page(StreamPage page) const { return device_ids_[entry(page)]; }
  // The page's host id, or -1 while it is resident.
  int32_t host_page(StreamPage page) const { return host_ids_[entry(page)]; }
  int64_t num_device_pages() const { return num_device_pages_; }
  int64_t num_host_pages() const { return num_host_pages_; }

  // Every page now on the device (`on_device`) or on the host.
  std::vector<StreamPage> pages_where(bool on_device) const;

  // Moves the listed pages, each on the device, into host pages (offload) or back, each on the host, into device
  // pages under new ids (retrieve), copying their bytes (page_table_transfer.h: copy_storage_pages). Returns the ids
  // the pages had in the pool they left, in order (now released). All or nothing: kInvalidArgument for a page
  // outside the table or listed twice, kFailedPrecondition for one not in the source pool, kResourceExhausted when
  // the destination pool lacks room.
  Result<std::vector<int32_t>> offload(std::span<const StreamPage> pages);
  Result<std::vector<int32_t>> retrieve(std::span<const StreamPage> pages);

  // Adds `num_new_tokens` slots at the end of every stream, taking new pages from the device pool, and returns the
  // new pages. A slot may land in a partly filled last page on the host: its writer retrieves that page first, so a
  // layer-by-layer step needs only the layer it writes resident. All or nothing: kResourceExhausted when the device
  // pool lacks room.
  Result<std::vector<StreamPage>> append(int32_t num_new_tokens);

  // The device rows as a page list view: entries of pages on the host read -1.
  PageTableView device_view() const;
  // A PageTable over the device pool listing the same pages (each retained once more). Precondition:
  // num_host_pages() == 0.
  PageTable to_page_table() const;

  // Ok, or the first violated invariant.
  Status check_integrity() const;

 private:
  size_t entry(StreamPage page) const {
    return static_cast<size_t>(page.stream) * static_cast<size_t>(stride_) + static_cast<size_t>(page.page_idx);
  }
  Result<std::vector<int32_t>> move(std::span<const StreamPage> pages, bool to_host);
  // Releases every page to its pool.
  void release_all();
  // Widens every row to `stride` entries, keeping them.
  void grow_rows(int32_t stride);

  BlockPool* device_pool_;
  BlockPool* host_pool_;
  KvLayout layout_;
  int32_t num_logical_tokens_ = 0;
  int32_t stride_ = 0;               // entries per row: the longest stream's pages
  std::vector<int32_t> num_tokens_;  // [num_streams]
  std::vector<int32_t> device_ids_;  // [num_streams][stride_] device page id or -1
  std::vector<int32_t> host_ids_;    // [num_streams][stride_] host page id or -1
  int64_t num_device_pages_ = 0;
  int64_t num_host_pages_ = 0;
};

}  // namespace se
