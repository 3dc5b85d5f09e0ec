// PageTable: one sequence's map from tokens to KV pages, kept per stream (layer, KV head) so
// head-wise eviction can shrink one head without touching the others. Each stream has an ordered
// page list and a physical length (tokens stored); the sequence also has a logical length (tokens
// ever appended = the absolute position of the next token), which eviction does not reduce. Owns
// one reference to every page it lists (see block_pool.h) and releases them on free_all() or
// destruction; the pool must outlive the table. Engine thread only.
//
// Representation: one flat int32 buffer [num_streams][stride] (stride = page capacity per stream,
// grown geometrically or set by reserve()) plus one length and one spare per stream. No per-token or
// per-page allocation; metadata per sequence is 4 * num_streams * (stride + 2) bytes. Example: 128K
// tokens, 32 layers x 8 KV heads, 16-token pages: 8192 pages per stream -> 8 MiB (up to 1.5x that
// when grown without reserve()).
//
// A stream may also hold one spare page past its end: the page its last slot emptied (drop_last_slot), listed where
// its next page goes and taken back by its next append. An eviction that drops one slot per decode step at a page
// boundary (the ring of a sliding-window eviction) would otherwise return a page and take one again every step, and the
// return would change the epoch, sending every page list to the device again.
//
// Invariants (check_integrity): stream s lists exactly ceil(num_tokens(s) / page_size) pages, each
// in use in the pool, and at most one spare after them; no page appears twice in the table; every
// physical length <= the logical length.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "kv/block_pool.h"
#include "kv/kv_layout.h"

namespace se {

// Where token `token_idx` of one stream lives: element offset layout.element_offset(kv, offset) of
// page_id.
struct PageSlot {
  int32_t page_id = -1;
  int32_t offset = 0;  // token index inside the page, < page_size
};

// Plain non-owning view of a PageTable for attention kernels; valid until the table is next
// mutated.
struct PageTableView {
  // [num_streams][stride]: row s lists stream s's pages in token order.
  const int32_t* page_ids = nullptr;
  const int32_t* num_tokens = nullptr;  // [num_streams]: physical tokens of each stream
  int32_t stride = 0;                   // row pitch of page_ids, in entries
  int32_t num_streams = 0;
  int32_t num_kv_heads = 0;
  int32_t page_size = 0;

  int32_t stream(int32_t layer, int32_t head) const { return layer * num_kv_heads + head; }
  // [num_pages(layer, head)] page ids of one (layer, KV head).
  const int32_t* pages(int32_t layer, int32_t head) const {
    return page_ids + static_cast<int64_t>(stream(layer, head)) * stride;
  }
  int32_t length(int32_t layer, int32_t head) const { return num_tokens[stream(layer, head)]; }
  int32_t num_pages(int32_t layer, int32_t head) const {
    return (length(layer, head) + page_size - 1) / page_size;
  }
};

class PageTable final {
 public:
  // Precondition: pool != nullptr and layout.validate() is ok.
  PageTable(BlockPool* pool, const KvLayout& layout);
  ~PageTable();
  PageTable(PageTable&& other) noexcept;
  PageTable& operator=(PageTable&& other) noexcept;
  PageTable(const PageTable&) = delete;
  PageTable& operator=(const PageTable&) = delete;

  const KvLayout& layout() const { return layout_; }
  // Tokens ever appended (minus truncations): the absolute position of the next token.
  int32_t num_logical_tokens() const { return num_logical_tokens_; }
  // Physical tokens of one stream.
  int32_t num_tokens(int32_t layer, int32_t head) const {
    return num_tokens_[stream_idx(layer, head)];
  }
  int32_t num_pages(int32_t layer, int32_t head) const;
  std::span<const int32_t> pages(int32_t layer, int32_t head) const;
  // The stream's spare page (see drop_last_slot), or -1.
  int32_t spare_page(int32_t layer, int32_t head) const { return spare_[stream_idx(layer, head)]; }
  // Pages held over all streams (spares included).
  int64_t num_held_pages() const;
  // Bytes of page-table metadata this sequence holds (the flat buffer and lengths).
  size_t metadata_bytes() const;
  // Changes whenever a page id already listed may have changed (everything but appends, which only add pages
  // at the ends of the streams); unique across tables, so a copy of the lists can tell whether its prefix of
  // each stream still holds.
  uint64_t epoch() const { return epoch_; }

  // Where token `token_idx` of one stream lives. Precondition: 0 <= token_idx < num_tokens(layer,
  // head).
  PageSlot slot(int32_t layer, int32_t head, int32_t token_idx) const;

  // Pages append(num_new_tokens) would take from the pool (what the MemoryOracle asks); a spare serves first.
  int64_t num_pages_for_append(int32_t num_new_tokens) const;
  // Adds `num_new_tokens` slots at the end of every stream, allocating pages as needed. All or
  // nothing: on kResourceExhausted nothing changed. kFailedPrecondition if a stream would write
  // into a partially filled page that others also hold.
  Status append(int32_t num_new_tokens);
  // Starts an empty table on a cached prefix: `pages` is [num_streams][num_blocks] (stream-major,
  // as RadixCache::PrefixMatch lays it out) of full pages; the table retains each. Afterwards every
  // stream holds num_blocks * page_size tokens and the logical length is that plus
  // `num_pruned_tokens` (a pruned prefix: positions whose KV was dropped). The pages must be in use
  // (e.g. locked radix nodes).
  Status attach_prefix(std::span<const int32_t> pages, int32_t num_blocks,
                       int32_t num_pruned_tokens = 0);
  // Rolls the sequence back to `num_tokens` logical tokens: every stream keeps min(its length,
  // num_tokens) tokens and releases the pages past them. Exact for never-compacted sequences
  // (rollback, re-running a suffix). kFailedPrecondition (nothing changed) if the cut would leave a
  // shared page partially filled.
  Status truncate(int32_t num_tokens);
  // Drops the slots of one stream past its first `num_tokens` (<= its length), releasing the pages no longer
  // needed; the logical length is unchanged. The epoch changes only when a page goes.
  Status shrink_stream(int32_t layer, int32_t head, int32_t num_tokens);
  // Drops one stream's last slot. A page it leaves empty stays as the stream's spare (unless the page is shared or
  // the stream already has one), so the epoch holds: the lists' entries are unchanged and the next append puts the
  // same page back where it was.
  Status drop_last_slot(int32_t layer, int32_t head);
  // Releases every page and resets both lengths to 0 (capacity is kept).
  void free_all();
  // A second table over the same pages and lengths, retaining each page once more: a snapshot that stays
  // valid while this table changes. Shared pages are read-only to both (append refuses a shared partial page).
  PageTable clone() const;
  // A table over `pool` with these lengths whose stream s lists row s of `page_ids` ([num_streams][stride], the
  // first ceil(num_tokens[s] / page_size) entries of each row: pages in use in `pool`), retaining each page: how a
  // holder that kept the lists itself (the host tier) hands a sequence back.
  static PageTable from_rows(BlockPool* pool, const KvLayout& layout, int32_t num_logical_tokens,
                             std::span<const int32_t> num_tokens, std::span<const int32_t> page_ids, int32_t stride);
  // Grows capacity so appends up to `num_tokens` physical tokens per stream do not reallocate
  // metadata.
  void reserve(int32_t num_tokens);

  PageTableView view() const;

  // Ok, or the first violated invariant.
  Status check_integrity() const;

 private:
  // kInvalidArgument unless (layer, head) names one of the table's streams.
  Status check_stream(int32_t layer, int32_t head) const;
  size_t stream_idx(int32_t layer, int32_t head) const;
  int32_t* row(size_t stream) { return page_ids_.data() + stream * static_cast<size_t>(stride_); }
  const int32_t* row(size_t stream) const {
    return page_ids_.data() + stream * static_cast<size_t>(stride_);
  }
  int32_t pages_for(int32_t num_tokens) const {
    return static_cast<int32_t>(layout_.pages_per_stream(num_tokens));
  }
  // Makes every row hold at least `num_pages` entries, keeping contents.
  void ensure_stride(int32_t num_pages);
  // True when a stream of `num_tokens` tokens ends inside a page that another holder also
  // references.
  bool partial_page_shared(size_t stream, int32_t num_tokens) const;
  // Returns a stream's spare to the pool; the caller changes the epoch (its entry may be listed again as another
  // page).
  void release_spare(size_t stream);

  BlockPool* pool_;
  KvLayout layout_;
  int32_t num_logical_tokens_ = 0;
  int32_t stride_ = 0;
  std::vector<int32_t> page_ids_;    // [num_streams][stride_]
  std::vector<int32_t> num_tokens_;  // [num_streams]
  std::vector<int32_t> spare_;       // [num_streams] the spare page, or -1
  uint64_t epoch_;
};

}  // namespace se
