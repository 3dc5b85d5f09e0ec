// HostTier: sequences' KV spread over two page pools, page by page (Spin's hierarchy): the device pool attention
// reads, and the host tier's pool beside it (pinned host memory next to a GPU; plain host memory on the CPU backend,
// so the same code runs in CI). Each page of a held sequence is resident (on the device, in a BucketedLru) or
// offloaded (on the host); its TieredPageTable says which. Pages move one by one or a sequence at a time
// (tiered_page_table.h copies them); make_room offloads the least recently used resident pages, whichever
// sequence's, until the device pool has the room asked for, so a sequence whose old pages went out keeps its
// recent ones. Pages shared between sequences (radix blocks, snapshots) are refused for now: a page belongs to one
// sequence here. Both pools outlive the tier. Engine thread only.
//
// Invariants (check_integrity): both pools and every table are whole; the LRU holds exactly the device pages the
// tables list, each naming its sequence and place as owner.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "base/status.h"
#include "kv/block_pool.h"
#include "kv/bucketed_lru.h"
#include "kv/page_table.h"
#include "kv/tiered_page_table.h"

namespace se {

class HostTier final {
 public:
  HostTier(BlockPool* device_pool, BlockPool* host_pool);
  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  // Takes a resident sequence's table (over the device pool); its pages become the most recently used, and a
  // stream's spare page goes back to the pool. kConflict for a sequence the tier holds, kFailedPrecondition when
  // one of its pages is another sequence's or shared (ref count above 1); the table is left with the caller on
  // error.
  Status add(int32_t seq, PageTable&& table);
  // Frees the sequence's pages wherever they are. kNotFound when the tier does not hold it.
  Status drop(int32_t seq);
  // Hands a wholly resident sequence's table back to the caller (the tier forgets it). kNotFound, or
  // kFailedPrecondition while some of its pages are on the host.
  Result<PageTable> take(int32_t seq);

  // Hands a sequence's table out as it is, its pages wherever they are: the tier forgets the sequence and its
  // resident pages leave the LRU, so make_room no longer moves them (an idle sequence's state). kNotFound.
  Result<TieredPageTable> detach(int32_t seq);
  // Takes back a table detach handed out (over the tier's two pools): its resident pages become the most recently
  // used. kConflict for a sequence the tier holds.
  Status attach(int32_t seq, TieredPageTable&& table);

  // A step read the sequence's resident pages (all of them, or the listed ones): they become the most recently
  // used. kNotFound; kInvalidArgument for a listed page outside the table or on the host.
  Status touch(int32_t seq);
  Status touch(int32_t seq, std::span<const StreamPage> pages);
  // One step passes on the LRU's clock.
  void advance() { lru_.advance(); }

  // Moves the listed resident pages of a sequence to the host pool, or its listed offloaded pages back into the
  // device pool under new ids (they become the most recently used). Errors as TieredPageTable::offload / retrieve
  // (kResourceExhausted when the other pool lacks room: make_room first), kNotFound for a sequence not held;
  // nothing changes on error.
  Status offload(int32_t seq, std::span<const StreamPage> pages);
  Status retrieve(int32_t seq, std::span<const StreamPage> pages);
  // The same for every resident (offload) or offloaded (retrieve) page of the sequence.
  Status offload(int32_t seq);
  Status retrieve(int32_t seq);
  // Offloads up to `num_pages` of the sequence's own least recently used resident pages (its buffer shrinking).
  // Returns how many moved. kResourceExhausted, nothing moved, when the host pool lacks room.
  Result<int64_t> offload_oldest(int32_t seq, int64_t num_pages);
  // Adds `num_new_tokens` slots to every stream of a sequence (TieredPageTable::append: a slot landing in a
  // partly filled page on the host is written once that page is retrieved); the new pages are the most recently
  // used.
  Status append(int32_t seq, int32_t num_new_tokens);
  // Offloads the least recently used resident pages, whichever sequence's, until the device pool has `num_pages`
  // free pages. Returns how many pages moved. kResourceExhausted, nothing moved, when the resident pages or the host
  // pool's free pages are too few.
  Result<int64_t> make_room(int64_t num_pages);

  bool contains(int32_t seq) const { return seqs_.count(seq) != 0; }
  // Held with every page on the device.
  bool is_resident(int32_t seq) const;
  // Precondition: contains(seq).
  const TieredPageTable& table(int32_t seq) const { return seqs_.at(seq); }
  const BucketedLru& lru() const { return lru_; }
  BlockPool* device_pool() const { return device_pool_; }
  BlockPool* host_pool() const { return host_pool_; }

  // Ok, or the first violated invariant.
  Status check_integrity() const;

 private:
  // The sequence and place of a resident page.
  struct Owner {
    int32_t seq = -1;
    StreamPage page;
  };
  void track(int32_t seq, const TieredPageTable& table, std::span<const StreamPage> pages);
  void untrack(std::span<const int32_t> device_pages);

  BlockPool* device_pool_;
  BlockPool* host_pool_;
  BucketedLru lru_;           // over device page ids
  std::vector<Owner> owner_;  // [device pages] who lists each resident page; seq -1 when none
  std::map<int32_t, TieredPageTable> seqs_;
};

}  // namespace se
