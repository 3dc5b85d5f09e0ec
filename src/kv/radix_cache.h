// RadixCache: the prefix cache of methods that keep full history. A tree over FULL blocks of
// page_size tokens; a block's hash is xxh3 of its tokens seeded with its parent's hash (chained
// from the root), and each node holds, for its block, the page of every stream (layer, KV head),
// with one pool reference per page (see block_pool.h). Idle leaves are evicted in LRU order of
// their last access (a logical clock). Engine thread only.
//
// Host tier (optional, SGLang HiCache's idea): an evicted node moves its pages to a second pool in host memory
// (kv/page_table_transfer.h's copies) and stays in the tree, so a later match still finds its block and brings
// the pages back into the device pool (evicting other leaves if it must) before the request attaches them; an
// insert that passes a node on the host gives it the inserting sequence's own pages instead. A node goes to the
// host only when its children are all there (so the host nodes form the tree's outer part) and it is no pruned
// segment's nor a segment's child. The host keeps its own LRU of its leaves and drops the oldest when full. Pages
// a node shares with a sequence stay with that sequence: the node copies them and drops its own reference.
//
// Pruned segments (prefix_prune.h): an application may prune a run of idle blocks to the KV of a
// few kept positions. The segment's nodes keep their tokens and hashes, so it still matches by
// tokens; the kept KV is compacted into the pages of its first nodes (resident), the later nodes
// hold no page. A match or a lock takes a segment only as a whole (a request that stopped inside it
// would read kept KV from positions past its own prefix), no branch grows under an inner segment
// node, and eviction removes a segment as one unit.
//
// SAFETY: node ids and the page ids of a PrefixMatch are valid only while the matched nodes are
// locked. Lock the match (lock(match.last_node())) before any other call that can evict; unlock
// when the sequence stops using it.
//
// Invariants (check_integrity): every non-root node is reachable from the root and indexed by its
// chained hash; child counts are exact; a node's lock count is >= the sum of its children's; the
// LRU set holds exactly the unlocked device nodes whose children are all on the host, and the host LRU set the
// unlocked host leaves; a host node's children are on the host too and it is in no segment; every held page is in
// use in its pool (the host's for host nodes) and held by one node only; a pruned segment is a chain of nodes whose
// inner nodes have exactly one child and the lock count of that child, whose resident nodes come first, and whose
// members all name its first and last node.
#pragma once

#include <cstdint>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/status.h"
#include "kv/block_pool.h"
#include "kv/kv_layout.h"
#include "kv/page_table.h"

namespace se {

// Hash of one block of tokens chained with its parent block's hash.
uint64_t hash_block(uint64_t parent_hash, std::span<const int32_t> tokens);

class RadixCache final {
 public:
  using NodeId = int32_t;
  static constexpr NodeId kRootNode = 0;  // holds no block; never evicted; locking it is a no-op
  static constexpr uint64_t kRootHash = 0x5e5e5e5e5e5e5e5eULL;

  // Blocks [first_block, end_block) of a matched path.
  struct BlockRange {
    int32_t first_block = 0;
    int32_t end_block = 0;
  };

  struct PrefixMatch {
    int32_t num_cached_tokens = 0;  // logical: num_blocks() * page_size
    int32_t num_resident_blocks =
        0;                      // matched blocks that hold pages (all but the pruned-away ones)
    std::vector<NodeId> nodes;  // [num_blocks] root-to-deepest path, one node per matched block
    // [num_streams][num_resident_blocks], stream-major: PageTable::attach_prefix's order.
    std::vector<int32_t> pages;
    std::vector<BlockRange> pruned_segments;  // the pruned segments on the path, in order
    // The positions the resident pages hold, in page order (an attaching sequence's stream slot i
    // holds position [i]): every position of a whole block, a pruned segment's kept ones.
    std::vector<int32_t> resident_positions;
    // match_prefix: the last blocks, which came back from the host tier into device pages under new ids.
    int32_t num_retrieved_blocks = 0;

    int32_t num_blocks() const { return static_cast<int32_t>(nodes.size()); }
    NodeId last_node() const { return nodes.empty() ? kRootNode : nodes.back(); }
  };

  struct InsertResult {
    // Blocks added: the cache retained their pages.
    int32_t num_new_blocks = 0;
    // Blocks already cached: the cache kept its own pages; the caller's copies stay the caller's to
    // release (its page table does so when it frees).
    int32_t num_cached_blocks = 0;
    // Deepest node of the inserted path that a lock may name (never inside a pruned segment): lock
    // it to pin the new blocks while the request runs.
    NodeId last_node = kRootNode;
  };

  // Precondition: pool != nullptr and layout.validate() is ok. `host_pool` (null: no host tier) holds evicted
  // blocks, pages of the pool's size. The pools must outlive the cache.
  RadixCache(BlockPool* pool, const KvLayout& layout, BlockPool* host_pool = nullptr);
  // Releases every page the cache holds.
  ~RadixCache();
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  // The longest cached prefix of `tokens` in whole blocks, leaving at least one token to compute (a
  // prompt is never matched entirely). Blocks on the host tier come back into the device pool first; the match
  // ends before the first one that finds no room there. Marks the matched nodes as accessed and counts
  // query/hit tokens.
  PrefixMatch match_prefix(std::span<const int32_t> tokens);
  // The longest cached prefix of `tokens` in whole blocks (all of them may match), with the
  // positions its resident pages hold, without touching the LRU order or the metrics: what
  // inspection reports. Blocks on the host tier count as cached; their pages are the host's.
  PrefixMatch peek_prefix(std::span<const int32_t> tokens) const;
  // Pins `node` and its ancestors against eviction; calls nest. Precondition: `node` is a live
  // node and not inside a pruned segment (a match's or an insert's last node).
  void lock(NodeId node);
  // Undoes one lock(node). Precondition: `node` is locked.
  void unlock(NodeId node);
  // Caches the whole blocks of `tokens` (tokens.size() / page_size of them) with the pages of
  // `pages` (a PageTable view): block b lives in page b - num_unresident_blocks of every stream,
  // where num_unresident_blocks counts the pruned-away blocks of the prefix the sequence attached
  // (its blocks before that are cached already). Blocks already cached are kept as they are. A hash
  // collision (same chained hash, other tokens) or a block that would branch off inside a pruned
  // segment stops the insert early without error.
  Result<InsertResult> insert(std::span<const int32_t> tokens, const PageTableView& pages,
                              int32_t num_unresident_blocks = 0);
  // Removes least recently used unlocked leaves until `num_pages_needed` pages went back to the
  // pool or none is left; returns the number freed. With a host tier a leaf moves there instead when it can
  // (above). A node whose pages others still hold frees fewer pages.
  int32_t evict(int32_t num_pages_needed);

  // --- pruning (prefix_prune.h applies it; these check and commit) ---
  // The nodes of blocks [first_block, end_block) of `tokens` if they may become one pruned segment.
  // kFailedPrecondition: not all cached, overlapping a pruned segment, or an inner block with other
  // continuations cached; kUnavailable: a block is in use (locked, or a page held elsewhere) or on the host tier.
  Result<std::vector<NodeId>> prunable_nodes(std::span<const int32_t> tokens, int32_t first_block,
                                             int32_t end_block) const;
  // The page of stream `stream` of a resident node.
  int32_t node_page(NodeId id, int32_t stream) const;
  // Makes `nodes` (from prunable_nodes, nothing changed since) one pruned segment that keeps the KV
  // of `kept_offsets` (ascending token offsets from the segment's start, a whole number of pages):
  // the first blocks keep their pages (the caller compacted the kept KV into them, in this order),
  // the others release theirs. Returns the pages that went back to the pool.
  int32_t commit_prune(std::span<const NodeId> nodes, std::span<const int32_t> kept_offsets);

  int32_t num_nodes() const { return static_cast<int32_t>(by_hash_.size()); }  // cached blocks
  int64_t num_cached_pages() const { return int64_t{num_resident_nodes_} * layout_.num_streams(); }
  // Host tier pages the cache holds.
  int64_t num_host_pages() const { return int64_t{num_host_nodes_} * layout_.num_streams(); }
  // Pages held by unlocked nodes: what evict() could give back when no one else holds them.
  int64_t num_evictable_pages() const {
    return int64_t{num_resident_nodes_ - num_locked_resident_nodes_} * layout_.num_streams();
  }
  // Metrics: tokens passed to match_prefix and tokens it found cached.
  int64_t num_query_tokens() const { return num_query_tokens_; }
  int64_t num_hit_tokens() const { return num_hit_tokens_; }

  // Ok, or the first violated invariant.
  Status check_integrity() const;

 private:
  // The pruned-segment part of check_integrity.
  Status check_segments() const;
  struct Node {
    NodeId parent = -1;
    int32_t num_children = 0;
    int32_t lock_ref = 0;  // locks of this node plus locks of its descendants
    bool live = false;
    bool in_lru = false;
    bool resident = true;       // holds one page per stream (false: pruned away, its pages are -1)
    bool on_host = false;       // a resident node whose pages are the host pool's
    int32_t num_host_children = 0;
    NodeId segment_first = -1;  // the pruned segment this node belongs to, or -1
    NodeId segment_last = -1;
    uint64_t hash = 0;
    uint64_t last_access = 0;
  };

  std::span<const int32_t> node_tokens(NodeId id) const;
  std::span<const int32_t> node_pages(NodeId id) const;
  // True for a node of a pruned segment other than its last: a match or lock must not end there.
  bool is_inner_segment_node(NodeId id) const;
  // The matched path of `tokens` over at most `max_blocks` blocks; with `whole_segments`, cut
  // before a segment it would end in (what a request may use), else as far as the tokens match.
  PrefixMatch walk(std::span<const int32_t> tokens, size_t max_blocks, bool whole_segments) const;
  // The child of `parent` for `block` (whose chained hash is `hash`), or -1.
  NodeId find_child(NodeId parent, uint64_t hash, std::span<const int32_t> block) const;
  NodeId new_node(NodeId parent, uint64_t hash, std::span<const int32_t> block);
  // The positions whose KV the resident pages of `match` hold (PrefixMatch::resident_positions).
  std::vector<int32_t> resident_positions(const PrefixMatch& match) const;
  // Removes a leaf; a pruned segment's last node takes the whole segment with it.
  void remove_leaf(NodeId id, int32_t* num_freed);
  void touch(NodeId id, uint64_t tick);
  // Puts `id` in the LRU set of its tier iff it may be evicted from there.
  void update_lru(NodeId id);
  // An unlocked device node whose children are all on the host / an unlocked host leaf.
  bool is_evictable(NodeId id) const;
  bool is_host_evictable(NodeId id) const;
  bool holds_device_pages(const Node& n) const { return n.resident && !n.on_host; }
  // Moves an evictable node's pages to the host tier (dropping the host's oldest leaves for room); false, with
  // nothing changed, when it may not go there or the tier cannot make room. Adds the device pages freed.
  bool offload(NodeId id, int32_t* num_freed);
  // Copies the node's pages into `to` (all or nothing) and releases them from `from`; the node then lists the
  // copies. False when `to` lacks free pages.
  bool move_pages(NodeId id, BlockPool* from, BlockPool* to, int32_t* num_freed_in_from);
  // Moves a host node (whose parent is on the device) back into the device pool, evicting for room. False when
  // there is none.
  bool retrieve(NodeId id);
  // The node now lists device pages again (after retrieve or an insert): counters and LRU sets follow.
  void mark_on_device(NodeId id);
  // Brings the host nodes at the end of a matched path back (they are its tail) and cuts the path before the
  // first that finds no room. Returns how many it brought back (the path's last ones once cut).
  int32_t retrieve_path(std::vector<NodeId>& nodes);
  // Removes every host node under `id` (a device node about to be removed).
  void drop_host_children(NodeId id);

  BlockPool* pool_;
  BlockPool* host_pool_;  // null without a host tier
  KvLayout layout_;
  std::vector<Node> nodes_;                       // [node capacity]; index 0 is the root
  std::vector<int32_t> tokens_;                   // [node capacity][page_size]
  std::vector<int32_t> pages_;                    // [node capacity][num_streams]
  std::vector<NodeId> free_node_ids_;             // dead slots to reuse
  std::unordered_map<uint64_t, NodeId> by_hash_;  // chained hash -> node, every live non-root node
  std::set<std::pair<uint64_t, NodeId>> lru_;     // (last_access, node) of every is_evictable node
  std::set<std::pair<uint64_t, NodeId>> host_lru_;  // (last_access, node) of every is_host_evictable node
  // Per pruned segment (by its first node): the kept token offsets from its start, ascending.
  std::unordered_map<NodeId, std::vector<int32_t>> segment_kept_offsets_;
  int32_t num_locked_nodes_ = 0;
  int32_t num_resident_nodes_ = 0;         // live non-root nodes that hold device pages
  int32_t num_host_nodes_ = 0;             // live nodes that hold host pages
  int32_t num_locked_resident_nodes_ = 0;  // of those, the locked ones
  uint64_t clock_ = 0;
  int64_t num_query_tokens_ = 0;
  int64_t num_hit_tokens_ = 0;
};

}  // namespace se
