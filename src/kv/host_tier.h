// HostTier: sequences' KV spread over two page pools: the device pool attention reads, and the host tier's pool
// beside it (pinned host memory next to a GPU; plain host memory on the CPU backend, so the same code runs in CI).
// A sequence the tier holds is either resident (its PageTable over the device pool, each of its pages in a
// BucketedLru) or offloaded (its table over the host pool). Offload and retrieve copy the whole sequence
// (page_table_transfer.h) and free the source; make_room offloads resident sequences, the one holding the least
// recently used page first, until the device pool has the room asked for. Pages shared between sequences (radix
// blocks, snapshots) are refused for now: a page belongs to one sequence here. Both pools outlive the tier.
// Engine thread only.
//
// Invariants (check_integrity): both pools and every table are whole; the LRU holds exactly the pages the
// resident tables list (spares included), each naming its sequence as owner; no page is listed twice.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "base/status.h"
#include "kv/block_pool.h"
#include "kv/bucketed_lru.h"
#include "kv/page_table.h"

namespace se {

class HostTier final {
 public:
  HostTier(BlockPool* device_pool, BlockPool* host_pool);
  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  // Takes a resident sequence's table (over the device pool); its pages become the most recently used. kConflict
  // for a sequence the tier holds, kFailedPrecondition when one of its pages is another sequence's or shared (ref
  // count above 1); the table is left with the caller on error.
  Status add(int32_t seq, PageTable&& table);
  // Frees the sequence's pages wherever they are. kNotFound when the tier does not hold it.
  Status drop(int32_t seq);
  // Hands a resident sequence's table back to the caller (the tier forgets it). kNotFound, or
  // kFailedPrecondition while it is offloaded.
  Result<PageTable> take(int32_t seq);

  // A step read the resident sequence: its pages become the most recently used.
  Status touch(int32_t seq);
  // One step passes on the LRU's clock.
  void advance() { lru_.advance(); }

  // Moves a resident sequence to the host pool. kResourceExhausted when the host pool lacks room; nothing changes
  // on error.
  Status offload(int32_t seq);
  // Moves an offloaded sequence back into the device pool (under new page ids). kResourceExhausted when the device
  // pool lacks room (make_room first); nothing changes on error.
  Status retrieve(int32_t seq);
  // Offloads resident sequences, the owner of the least recently used page first, until the device pool has
  // `num_pages` free pages. Returns the sequences offloaded, in order. kResourceExhausted when the host pool cannot
  // take the next one or no resident sequence is left; the ones already offloaded stay so.
  Result<std::vector<int32_t>> make_room(int64_t num_pages);

  bool contains(int32_t seq) const { return seqs_.count(seq) != 0; }
  bool is_resident(int32_t seq) const;
  // Precondition: contains(seq).
  const PageTable& table(int32_t seq) const { return seqs_.at(seq).table; }
  const BucketedLru& lru() const { return lru_; }

  // Ok, or the first violated invariant.
  Status check_integrity() const;

 private:
  struct Entry {
    PageTable table;
    bool resident = true;
  };
  // Every page a table lists, spares included.
  static std::vector<int32_t> listed_pages(const PageTable& table);
  void track(int32_t seq, const PageTable& table);
  void untrack(const PageTable& table);

  BlockPool* device_pool_;
  BlockPool* host_pool_;
  BucketedLru lru_;             // over device page ids
  std::vector<int32_t> owner_;  // [device pages] the resident sequence listing each page, or -1
  std::map<int32_t, Entry> seqs_;
};

}  // namespace se
