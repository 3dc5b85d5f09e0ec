#include "kv/radix_cache.h"

#include <xxhash.h>

#include <algorithm>

#include "base/check.h"
#include "kv/page_table_transfer.h"

namespace se {

uint64_t hash_block(uint64_t parent_hash, std::span<const int32_t> tokens) {
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), parent_hash);
}

RadixCache::RadixCache(BlockPool* pool, const KvLayout& layout, BlockPool* host_pool)
    : pool_(pool), host_pool_(host_pool), layout_(layout) {
  SE_CHECK(pool != nullptr, "radix cache: no pool");
  const Status valid = layout.validate();
  SE_CHECK(valid.is_ok(), "radix cache: {}", valid.message());
  Node root;
  root.live = true;
  root.hash = kRootHash;
  nodes_.push_back(root);
  tokens_.resize(static_cast<size_t>(layout_.page_size), 0);
  pages_.resize(static_cast<size_t>(layout_.num_streams()), -1);
}

RadixCache::~RadixCache() {
  for (NodeId id = 1; id < static_cast<NodeId>(nodes_.size()); ++id) {
    const Node& n = nodes_[static_cast<size_t>(id)];
    if (n.live && n.resident) (n.on_host ? host_pool_ : pool_)->release(node_pages(id));
  }
}

std::span<const int32_t> RadixCache::node_tokens(NodeId id) const {
  const auto n = static_cast<size_t>(layout_.page_size);
  return {tokens_.data() + static_cast<size_t>(id) * n, n};
}

std::span<const int32_t> RadixCache::node_pages(NodeId id) const {
  const auto n = static_cast<size_t>(layout_.num_streams());
  return {pages_.data() + static_cast<size_t>(id) * n, n};
}

RadixCache::NodeId RadixCache::find_child(NodeId parent, uint64_t hash,
                                          std::span<const int32_t> block) const {
  const auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  const NodeId id = it->second;
  if (nodes_[static_cast<size_t>(id)].parent != parent) return -1;
  const auto stored = node_tokens(id);
  if (!std::equal(stored.begin(), stored.end(), block.begin(), block.end())) return -1;
  return id;
}

int32_t RadixCache::node_page(NodeId id, int32_t stream) const {
  SE_CHECK(holds_device_pages(nodes_[static_cast<size_t>(id)]), "radix cache: node {} holds no device pages", id);
  return node_pages(id)[static_cast<size_t>(stream)];
}

bool RadixCache::is_inner_segment_node(NodeId id) const {
  const Node& n = nodes_[static_cast<size_t>(id)];
  return n.segment_first >= 0 && n.segment_last != id;
}

bool RadixCache::is_evictable(NodeId id) const {
  const Node& n = nodes_[static_cast<size_t>(id)];
  return id != kRootNode && n.live && !n.on_host && n.num_children == n.num_host_children && n.lock_ref == 0;
}

bool RadixCache::is_host_evictable(NodeId id) const {
  const Node& n = nodes_[static_cast<size_t>(id)];
  return n.live && n.on_host && n.num_children == 0 && n.lock_ref == 0;
}

void RadixCache::update_lru(NodeId id) {
  Node& n = nodes_[static_cast<size_t>(id)];
  const bool evictable = n.on_host ? is_host_evictable(id) : is_evictable(id);
  if (evictable == n.in_lru) return;
  auto& lru = n.on_host ? host_lru_ : lru_;
  if (evictable) {
    lru.emplace(n.last_access, id);
  } else {
    lru.erase({n.last_access, id});
  }
  n.in_lru = evictable;
}

void RadixCache::touch(NodeId id, uint64_t tick) {
  Node& n = nodes_[static_cast<size_t>(id)];
  if (n.in_lru) {
    auto& lru = n.on_host ? host_lru_ : lru_;
    lru.erase({n.last_access, id});
    lru.emplace(tick, id);
  }
  n.last_access = tick;
}

bool RadixCache::move_pages(NodeId id, BlockPool* from, BlockPool* to, int32_t* num_freed_in_from) {
  const int32_t num_streams = layout_.num_streams();
  Result<std::vector<int32_t>> copies = to->allocate(num_streams);
  if (!copies.is_ok()) return false;
  int32_t* pages = pages_.data() + static_cast<size_t>(id) * static_cast<size_t>(num_streams);
  // Id-only pools (scheduling tests) have no bytes to move.
  if (from->storage() != nullptr && to->storage() != nullptr) {
    copy_storage_pages(*from->storage(), *to->storage(),
                       std::span<const int32_t>(pages, static_cast<size_t>(num_streams)), *copies);
  }
  *num_freed_in_from += from->release(std::span<const int32_t>(pages, static_cast<size_t>(num_streams)));
  std::copy(copies->begin(), copies->end(), pages);
  return true;
}

bool RadixCache::offload(NodeId id, int32_t* num_freed) {
  const Node& n = nodes_[static_cast<size_t>(id)];
  const int32_t needed = layout_.num_streams();
  if (host_pool_ == nullptr || host_pool_->num_total_pages() < needed || !n.resident || n.segment_first >= 0 ||
      nodes_[static_cast<size_t>(n.parent)].segment_first >= 0)
    return false;
  while (host_pool_->num_free_pages() < needed && !host_lru_.empty()) {
    int32_t num_freed_on_host = 0;
    remove_leaf(host_lru_.begin()->second, &num_freed_on_host);
  }
  if (host_pool_->num_free_pages() < needed) return false;
  Node& node = nodes_[static_cast<size_t>(id)];
  lru_.erase({node.last_access, id});
  node.in_lru = false;
  SE_CHECK(move_pages(id, pool_, host_pool_, num_freed), "radix cache: the host tier's free pages vanished");
  node.on_host = true;
  --num_resident_nodes_;
  ++num_host_nodes_;
  ++nodes_[static_cast<size_t>(node.parent)].num_host_children;
  update_lru(id);
  update_lru(node.parent);
  return true;
}

void RadixCache::mark_on_device(NodeId id) {
  Node& n = nodes_[static_cast<size_t>(id)];
  if (n.in_lru) host_lru_.erase({n.last_access, id});
  n.in_lru = false;
  n.on_host = false;
  --num_host_nodes_;
  ++num_resident_nodes_;
  if (n.lock_ref > 0) ++num_locked_resident_nodes_;
  --nodes_[static_cast<size_t>(n.parent)].num_host_children;
  update_lru(id);
  update_lru(n.parent);
}

bool RadixCache::retrieve(NodeId id) {
  const int32_t needed = layout_.num_streams();
  if (pool_->num_free_pages() < needed) evict(needed - pool_->num_free_pages());
  int32_t num_freed_on_host = 0;
  if (!move_pages(id, host_pool_, pool_, &num_freed_on_host)) return false;
  mark_on_device(id);
  return true;
}

int32_t RadixCache::retrieve_path(std::vector<NodeId>& nodes) {
  const auto first_on_host =
      std::find_if(nodes.begin(), nodes.end(), [&](NodeId id) { return nodes_[static_cast<size_t>(id)].on_host; });
  if (first_on_host == nodes.end()) return 0;
  // Pinned while pages move: the path's device nodes against eviction, its host nodes against the host's.
  const NodeId last = nodes.back();
  lock(last);
  auto retrieved_end = first_on_host;
  while (retrieved_end != nodes.end() && retrieve(*retrieved_end)) ++retrieved_end;
  unlock(last);
  const auto num_retrieved = static_cast<int32_t>(retrieved_end - first_on_host);
  nodes.erase(retrieved_end, nodes.end());
  return num_retrieved;
}

void RadixCache::drop_host_children(NodeId id) {
  for (NodeId child = 1; child < static_cast<NodeId>(nodes_.size()); ++child) {
    if (nodes_[static_cast<size_t>(id)].num_host_children == 0) return;
    const Node& n = nodes_[static_cast<size_t>(child)];
    if (n.live && n.parent == id) {
      int32_t num_freed_on_device = 0;  // host nodes free none
      remove_leaf(child, &num_freed_on_device);
    }
  }
}

RadixCache::PrefixMatch RadixCache::walk(std::span<const int32_t> tokens, size_t max_blocks,
                                         bool whole_segments) const {
  PrefixMatch match;
  const auto page_size = static_cast<size_t>(layout_.page_size);
  NodeId parent = kRootNode;
  uint64_t hash = kRootHash;
  for (size_t b = 0; b < max_blocks; ++b) {
    const auto block = tokens.subspan(b * page_size, page_size);
    hash = hash_block(hash, block);
    const NodeId child = find_child(parent, hash, block);
    if (child < 0) break;
    match.nodes.push_back(child);
    parent = child;
  }
  // A match ending inside a pruned segment stops before it: the segment's kept KV comes from
  // positions the request's own prefix may not reach.
  if (whole_segments && !match.nodes.empty() && is_inner_segment_node(match.nodes.back())) {
    const NodeId first = nodes_[static_cast<size_t>(match.nodes.back())].segment_first;
    while (match.nodes.back() != first) match.nodes.pop_back();
    match.nodes.pop_back();
  }
  const auto num_blocks = match.nodes.size();
  std::vector<NodeId> resident;
  for (size_t b = 0; b < num_blocks; ++b) {
    const NodeId id = match.nodes[b];
    const Node& n = nodes_[static_cast<size_t>(id)];
    if (n.resident) resident.push_back(id);
    if (n.segment_first >= 0 && n.segment_last == id) {
      const auto first = std::find(match.nodes.begin(), match.nodes.end(), n.segment_first);
      match.pruned_segments.push_back(
          {static_cast<int32_t>(first - match.nodes.begin()), static_cast<int32_t>(b) + 1});
    }
  }
  const auto num_streams = static_cast<size_t>(layout_.num_streams());
  const size_t num_resident = resident.size();
  match.pages.resize(num_streams * num_resident);
  for (size_t b = 0; b < num_resident; ++b) {
    const auto pages = node_pages(resident[b]);
    for (size_t s = 0; s < num_streams; ++s) match.pages[s * num_resident + b] = pages[s];
  }
  match.num_resident_blocks = static_cast<int32_t>(num_resident);
  match.num_cached_tokens = static_cast<int32_t>(num_blocks * page_size);
  return match;
}

RadixCache::PrefixMatch RadixCache::match_prefix(std::span<const int32_t> tokens) {
  // At least one token must stay uncached so the step computes logits for it.
  const size_t max_blocks =
      tokens.empty() ? 0 : (tokens.size() - 1) / static_cast<size_t>(layout_.page_size);
  PrefixMatch match = walk(tokens, max_blocks, /*whole_segments=*/true);
  // The path's host nodes are its tail and none is in a segment: the walk over the blocks brought back ends at
  // a plain node, and lists device pages now.
  const size_t num_matched = match.nodes.size();
  const int32_t num_retrieved = retrieve_path(match.nodes);
  if (num_retrieved > 0 || match.nodes.size() < num_matched)
    match = walk(tokens, match.nodes.size(), /*whole_segments=*/true);
  match.num_retrieved_blocks = num_retrieved;
  match.resident_positions = resident_positions(match);
  const uint64_t tick = ++clock_;
  for (NodeId id : match.nodes) touch(id, tick);
  num_query_tokens_ += static_cast<int64_t>(tokens.size());
  num_hit_tokens_ += match.num_cached_tokens;
  return match;
}

RadixCache::PrefixMatch RadixCache::peek_prefix(std::span<const int32_t> tokens) const {
  PrefixMatch match =
      walk(tokens, tokens.size() / static_cast<size_t>(layout_.page_size), /*whole_segments=*/true);
  match.resident_positions = resident_positions(match);
  return match;
}

void RadixCache::lock(NodeId node) {
  SE_CHECK(node >= 0 && node < static_cast<NodeId>(nodes_.size()) &&
               nodes_[static_cast<size_t>(node)].live,
           "radix cache: lock of dead node {}", node);
  SE_CHECK(!is_inner_segment_node(node), "radix cache: lock of node {} inside a pruned segment",
           node);
  for (NodeId id = node; id != kRootNode; id = nodes_[static_cast<size_t>(id)].parent) {
    Node& n = nodes_[static_cast<size_t>(id)];
    if (n.lock_ref++ == 0) {
      ++num_locked_nodes_;
      if (holds_device_pages(n)) ++num_locked_resident_nodes_;
      update_lru(id);
    }
  }
}

void RadixCache::unlock(NodeId node) {
  SE_CHECK(node >= 0 && node < static_cast<NodeId>(nodes_.size()) &&
               nodes_[static_cast<size_t>(node)].live,
           "radix cache: unlock of dead node {}", node);
  for (NodeId id = node; id != kRootNode; id = nodes_[static_cast<size_t>(id)].parent) {
    Node& n = nodes_[static_cast<size_t>(id)];
    SE_CHECK(n.lock_ref > 0, "radix cache: unlock of node {} which is not locked", id);
    if (--n.lock_ref == 0) {
      --num_locked_nodes_;
      if (holds_device_pages(n)) --num_locked_resident_nodes_;
      update_lru(id);
    }
  }
}

RadixCache::NodeId RadixCache::new_node(NodeId parent, uint64_t hash,
                                        std::span<const int32_t> block) {
  NodeId id;
  if (!free_node_ids_.empty()) {
    id = free_node_ids_.back();
    free_node_ids_.pop_back();
  } else {
    id = static_cast<NodeId>(nodes_.size());
    nodes_.emplace_back();
    tokens_.resize(tokens_.size() + block.size());
    pages_.resize(pages_.size() + static_cast<size_t>(layout_.num_streams()));
  }
  Node& n = nodes_[static_cast<size_t>(id)];
  n = Node{};
  n.parent = parent;
  n.live = true;
  n.hash = hash;
  std::copy(block.begin(), block.end(),
            tokens_.begin() + static_cast<ptrdiff_t>(id) * layout_.page_size);
  by_hash_.emplace(hash, id);
  ++num_resident_nodes_;
  ++nodes_[static_cast<size_t>(parent)].num_children;
  update_lru(parent);
  return id;
}

Result<RadixCache::InsertResult> RadixCache::insert(std::span<const int32_t> tokens,
                                                    const PageTableView& view,
                                                    int32_t num_unresident_blocks) {
  const auto page_size = static_cast<size_t>(layout_.page_size);
  const auto num_blocks = static_cast<int32_t>(tokens.size() / page_size);
  const int32_t num_streams = layout_.num_streams();
  if (view.num_streams != num_streams || view.page_size != layout_.page_size) {
    return invalid_argument(
        "radix cache: page table has {} streams of {}-token pages, cache has {} of {}",
        view.num_streams, view.page_size, num_streams, layout_.page_size);
  }
  if (num_unresident_blocks < 0 || num_unresident_blocks > num_blocks) {
    return invalid_argument("radix cache: {} unresident blocks for {} blocks",
                            num_unresident_blocks, num_blocks);
  }
  const int32_t num_pages = num_blocks - num_unresident_blocks;  // per stream
  for (int32_t s = 0; s < num_streams; ++s) {
    if (view.num_tokens[s] < num_pages * layout_.page_size) {
      return invalid_argument("radix cache: stream {} holds {} tokens, {} full pages need {}", s,
                              view.num_tokens[s], num_pages, num_pages * layout_.page_size);
    }
    for (int32_t p = 0; p < num_pages; ++p) {
      const int32_t id = view.page_ids[static_cast<int64_t>(s) * view.stride + p];
      if (!pool_->is_valid_id(id) || pool_->ref_count(id) == 0) {
        return invalid_argument("radix cache: stream {} page {} (id {}) is not in use", s, p, id);
      }
    }
  }
  InsertResult result;
  const uint64_t tick = ++clock_;
  NodeId parent = kRootNode;
  uint64_t hash = kRootHash;
  for (int32_t b = 0; b < num_blocks; ++b) {
    const auto block = tokens.subspan(static_cast<size_t>(b) * page_size, page_size);
    hash = hash_block(hash, block);
    NodeId child = find_child(parent, hash, block);
    if (child >= 0) {
      ++result.num_cached_blocks;
      if (nodes_[static_cast<size_t>(child)].on_host && b >= num_unresident_blocks) {
        // The sequence holds this block's KV on the device: the node takes its pages instead of the host's.
        host_pool_->release(node_pages(child));
        int32_t* pages = pages_.data() + static_cast<size_t>(child) * static_cast<size_t>(num_streams);
        for (int32_t s = 0; s < num_streams; ++s) {
          pages[s] = view.page_ids[static_cast<int64_t>(s) * view.stride + b - num_unresident_blocks];
          pool_->retain(pages[s]);
        }
        mark_on_device(child);
      }
    } else {
      if (by_hash_.contains(hash)) break;  // collision with another block: leave the rest uncached
      // An inner segment node keeps its one child; the blocks of a prefix the sequence attached are
      // cached (it holds them locked), so a missing one has no page of its own to give.
      if (is_inner_segment_node(parent) || b < num_unresident_blocks) break;
      child = new_node(parent, hash, block);
      int32_t* pages =
          pages_.data() + static_cast<size_t>(child) * static_cast<size_t>(num_streams);
      for (int32_t s = 0; s < num_streams; ++s) {
        pages[s] = view.page_ids[static_cast<int64_t>(s) * view.stride + b - num_unresident_blocks];
        pool_->retain(pages[s]);
      }
      ++result.num_new_blocks;
    }
    touch(child, tick);
    update_lru(child);
    parent = child;
  }
  // The sequence may stop inside a segment; it uses its own pages there, so the lock stops before
  // it.
  if (is_inner_segment_node(parent)) {
    parent = nodes_[static_cast<size_t>(nodes_[static_cast<size_t>(parent)].segment_first)].parent;
  }
  result.last_node = parent;
  return result;
}

void RadixCache::remove_leaf(NodeId id, int32_t* num_freed) {
  if (nodes_[static_cast<size_t>(id)].num_host_children > 0) drop_host_children(id);
  Node& n = nodes_[static_cast<size_t>(id)];
  if (n.in_lru) (n.on_host ? host_lru_ : lru_).erase({n.last_access, id});
  if (n.on_host) {
    host_pool_->release(node_pages(id));
    --num_host_nodes_;
    --nodes_[static_cast<size_t>(n.parent)].num_host_children;
  } else if (n.resident) {
    *num_freed += pool_->release(node_pages(id));
    --num_resident_nodes_;
  }
  by_hash_.erase(n.hash);
  const NodeId parent = n.parent;
  const bool takes_parent = n.segment_first >= 0 && n.segment_first != id;
  if (n.segment_first == id) segment_kept_offsets_.erase(id);
  n = Node{};
  free_node_ids_.push_back(id);
  --nodes_[static_cast<size_t>(parent)].num_children;
  update_lru(parent);
  // The segment goes as one unit: its inner nodes are unlocked (they share the last node's locks).
  if (takes_parent) remove_leaf(parent, num_freed);
}

int32_t RadixCache::evict(int32_t num_pages_needed) {
  int32_t num_freed = 0;
  while (num_freed < num_pages_needed && !lru_.empty()) {
    const NodeId id = lru_.begin()->second;
    if (!offload(id, &num_freed)) remove_leaf(id, &num_freed);
  }
  return num_freed;
}

Result<std::vector<RadixCache::NodeId>> RadixCache::prunable_nodes(std::span<const int32_t> tokens,
                                                                   int32_t first_block,
                                                                   int32_t end_block) const {
  if (first_block < 0 || first_block >= end_block ||
      static_cast<size_t>(end_block) * static_cast<size_t>(layout_.page_size) > tokens.size()) {
    return invalid_argument("radix cache: blocks [{}, {}) of {} tokens", first_block, end_block,
                            tokens.size());
  }
  const PrefixMatch path = walk(tokens, static_cast<size_t>(end_block), /*whole_segments=*/false);
  if (path.num_blocks() < end_block) {
    return failed_precondition(
        "blocks [{}, {}) are not all cached: the cache holds {} leading blocks", first_block,
        end_block, path.num_blocks());
  }
  std::vector<NodeId> nodes(path.nodes.begin() + first_block, path.nodes.end());
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes_[static_cast<size_t>(nodes[i])];
    const auto block = first_block + static_cast<int32_t>(i);
    if (n.segment_first >= 0) {
      return failed_precondition("blocks [{}, {}) overlap a pruned segment at block {}",
                                 first_block, end_block, block);
    }
    if (i + 1 < nodes.size() && n.num_children != 1) {
      return failed_precondition(
          "block {} has {} cached continuations; a pruned segment may only end at a branch", block,
          n.num_children);
    }
    if (n.lock_ref > 0) {
      return unavailable("block {} is in use by {} running request(s)", block, n.lock_ref);
    }
    if (n.on_host) return unavailable("block {} is on the host tier", block);
    for (int32_t page : node_pages(nodes[i])) {
      if (pool_->ref_count(page) != 1) {
        return unavailable("block {} page {} is also held outside the prefix cache", block, page);
      }
    }
  }
  return nodes;
}

int32_t RadixCache::commit_prune(std::span<const NodeId> nodes,
                                 std::span<const int32_t> kept_offsets) {
  const auto num_kept = static_cast<int32_t>(kept_offsets.size());
  const int32_t num_kept_blocks = num_kept / layout_.page_size;
  SE_CHECK(!nodes.empty() && num_kept % layout_.page_size == 0 &&
               num_kept_blocks <= static_cast<int32_t>(nodes.size()),
           "radix cache: prune of {} nodes keeping {} tokens", nodes.size(), num_kept);
  segment_kept_offsets_[nodes.front()].assign(kept_offsets.begin(), kept_offsets.end());
  int32_t num_freed = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    Node& n = nodes_[static_cast<size_t>(nodes[i])];
    SE_CHECK(n.live && n.lock_ref == 0 && n.segment_first < 0 && holds_device_pages(n),
             "radix cache: node {} cannot be pruned", nodes[i]);
    n.segment_first = nodes.front();
    n.segment_last = nodes.back();
    if (static_cast<int32_t>(i) < num_kept_blocks) continue;
    num_freed += pool_->release(node_pages(nodes[i]));
    int32_t* pages = pages_.data() + static_cast<size_t>(nodes[i]) * layout_.num_streams();
    std::fill_n(pages, layout_.num_streams(), -1);
    n.resident = false;
    --num_resident_nodes_;
  }
  return num_freed;
}

std::vector<int32_t> RadixCache::resident_positions(const PrefixMatch& match) const {
  std::vector<int32_t> positions;
  const int32_t page_size = layout_.page_size;
  for (size_t b = 0; b < match.nodes.size(); ++b) {
    const NodeId id = match.nodes[b];
    const Node& n = nodes_[static_cast<size_t>(id)];
    const auto first_token = static_cast<int32_t>(b) * page_size;
    if (n.segment_first < 0) {
      for (int32_t i = 0; i < page_size; ++i) positions.push_back(first_token + i);
    } else if (n.segment_first == id) {
      for (int32_t offset : segment_kept_offsets_.at(id)) positions.push_back(first_token + offset);
    }
  }
  return positions;
}

Status RadixCache::check_segments() const {
  const auto num_slots = nodes_.size();
  std::unordered_map<NodeId, int32_t> num_members;  // segment first node -> nodes naming it
  for (NodeId id = 1; id < static_cast<NodeId>(num_slots); ++id) {
    const Node& n = nodes_[static_cast<size_t>(id)];
    if (n.live && n.segment_first >= 0) ++num_members[n.segment_first];
  }
  for (const auto& [first, count] : num_members) {
    if (first <= 0 || first >= static_cast<NodeId>(num_slots) ||
        !nodes_[static_cast<size_t>(first)].live) {
      return internal_error("radix cache: {} nodes name dead segment start {}", count, first);
    }
    const NodeId last = nodes_[static_cast<size_t>(first)].segment_last;
    if (last <= 0 || last >= static_cast<NodeId>(num_slots) ||
        !nodes_[static_cast<size_t>(last)].live) {
      return internal_error("radix cache: segment from node {} ends at dead node {}", first, last);
    }
    // Walk up from the last node: every member names this segment; inner nodes have one child and
    // its locks; resident nodes precede the pruned-away ones.
    int32_t length = 0;
    NodeId child = -1;
    for (NodeId id = last;; id = nodes_[static_cast<size_t>(id)].parent) {
      const Node& n = nodes_[static_cast<size_t>(id)];
      if (id == kRootNode || length > count || n.segment_first != first || n.segment_last != last) {
        return internal_error("radix cache: segment [{}, {}] is not a chain of its members", first,
                              last);
      }
      ++length;
      if (child >= 0 &&
          (n.num_children != 1 || n.lock_ref != nodes_[static_cast<size_t>(child)].lock_ref)) {
        return internal_error("radix cache: inner segment node {} has {} children, lock count {}",
                              id, n.num_children, n.lock_ref);
      }
      if (!n.resident && child >= 0 && nodes_[static_cast<size_t>(child)].resident) {
        return internal_error(
            "radix cache: segment [{}, {}] has a resident node after a pruned one", first, last);
      }
      if (id == first) break;
      child = id;
    }
    if (length != count) {
      return internal_error("radix cache: segment [{}, {}] has {} nodes, {} name it", first, last,
                            length, count);
    }
    const auto kept = segment_kept_offsets_.find(first);
    int32_t num_resident = 0;
    for (NodeId id = last;; id = nodes_[static_cast<size_t>(id)].parent) {
      num_resident += nodes_[static_cast<size_t>(id)].resident ? 1 : 0;
      if (id == first) break;
    }
    if (kept == segment_kept_offsets_.end() ||
        static_cast<int32_t>(kept->second.size()) != num_resident * layout_.page_size ||
        !std::is_sorted(kept->second.begin(), kept->second.end()) ||
        std::adjacent_find(kept->second.begin(), kept->second.end()) != kept->second.end() ||
        (!kept->second.empty() &&
         (kept->second.front() < 0 || kept->second.back() >= length * layout_.page_size))) {
      return internal_error(
          "radix cache: segment [{}, {}] kept offsets do not fit its {} resident pages", first,
          last, num_resident);
    }
  }
  if (segment_kept_offsets_.size() != num_members.size()) {
    return internal_error("radix cache: {} kept-offset lists for {} segments",
                          segment_kept_offsets_.size(), num_members.size());
  }
  return Status::ok();
}

Status RadixCache::check_integrity() const {
  const auto num_slots = nodes_.size();
  if (!nodes_[0].live || nodes_[0].parent != -1 || nodes_[0].lock_ref != 0) {
    return internal_error("radix cache: root node is damaged");
  }
  std::vector<int32_t> num_children(num_slots, 0);
  std::vector<int32_t> num_host_children(num_slots, 0);
  std::vector<int64_t> child_locks(num_slots, 0);
  std::vector<int32_t> held_pages;
  std::vector<int32_t> held_host_pages;
  int32_t num_live = 0;
  int32_t num_locked = 0;
  int32_t num_in_lru = 0;
  int32_t num_in_host_lru = 0;
  int32_t num_resident = 0;
  int32_t num_on_host = 0;
  int32_t num_locked_resident = 0;
  for (NodeId id = 1; id < static_cast<NodeId>(num_slots); ++id) {
    const Node& n = nodes_[static_cast<size_t>(id)];
    if (!n.live) continue;
    ++num_live;
    if (n.parent < 0 || n.parent >= static_cast<NodeId>(num_slots) ||
        !nodes_[static_cast<size_t>(n.parent)].live) {
      return internal_error("radix cache: node {} has dead parent {}", id, n.parent);
    }
    // Walking up must reach the root within num_slots steps, or the parent links form a cycle.
    NodeId up = id;
    for (size_t steps = 0; up != kRootNode && steps <= num_slots; ++steps) {
      up = nodes_[static_cast<size_t>(up)].parent;
    }
    if (up != kRootNode) {
      return internal_error("radix cache: node {} does not lead to the root", id);
    }
    ++num_children[static_cast<size_t>(n.parent)];
    num_host_children[static_cast<size_t>(n.parent)] += n.on_host ? 1 : 0;
    child_locks[static_cast<size_t>(n.parent)] += n.lock_ref;
    if (nodes_[static_cast<size_t>(n.parent)].on_host && !n.on_host)
      return internal_error("radix cache: node {} is on the device under host node {}", id, n.parent);
    if (n.hash != hash_block(nodes_[static_cast<size_t>(n.parent)].hash, node_tokens(id))) {
      return internal_error("radix cache: node {} hash does not match its tokens and parent", id);
    }
    const auto it = by_hash_.find(n.hash);
    if (it == by_hash_.end() || it->second != id) {
      return internal_error("radix cache: node {} missing from the hash index", id);
    }
    if (n.lock_ref < 0) return internal_error("radix cache: node {} lock count {}", id, n.lock_ref);
    if (n.lock_ref > 0) ++num_locked;
    if (!n.resident) {
      for (int32_t page : node_pages(id)) {
        if (page != -1)
          return internal_error("radix cache: pruned node {} lists page {}", id, page);
      }
      continue;
    }
    if (n.on_host) {
      if (host_pool_ == nullptr || n.segment_first >= 0)
        return internal_error("radix cache: node {} is on a host tier it may not be on", id);
      ++num_on_host;
      for (int32_t page : node_pages(id)) {
        if (!host_pool_->is_valid_id(page) || host_pool_->ref_count(page) == 0)
          return internal_error("radix cache: host node {} holds page {} which is not in use", id, page);
        held_host_pages.push_back(page);
      }
      continue;
    }
    ++num_resident;
    if (n.lock_ref > 0) ++num_locked_resident;
    for (int32_t page : node_pages(id)) {
      if (!pool_->is_valid_id(page) || pool_->ref_count(page) == 0) {
        return internal_error("radix cache: node {} holds page {} which is not in use", id, page);
      }
      held_pages.push_back(page);
    }
  }
  for (NodeId id = 0; id < static_cast<NodeId>(num_slots); ++id) {
    const Node& n = nodes_[static_cast<size_t>(id)];
    if (!n.live) continue;
    if (n.num_children != num_children[static_cast<size_t>(id)]) {
      return internal_error("radix cache: node {} counts {} children, has {}", id, n.num_children,
                            num_children[static_cast<size_t>(id)]);
    }
    if (id != kRootNode && n.lock_ref < child_locks[static_cast<size_t>(id)]) {
      return internal_error("radix cache: node {} lock count {} below its children's {}", id,
                            n.lock_ref, child_locks[static_cast<size_t>(id)]);
    }
    if (n.num_host_children != num_host_children[static_cast<size_t>(id)]) {
      return internal_error("radix cache: node {} counts {} children on the host, has {}", id, n.num_host_children,
                            num_host_children[static_cast<size_t>(id)]);
    }
    if (n.in_lru != (n.on_host ? is_host_evictable(id) : is_evictable(id))) {
      return internal_error("radix cache: node {} LRU membership is wrong", id);
    }
    if (n.in_lru) {
      ++(n.on_host ? num_in_host_lru : num_in_lru);
      if (!(n.on_host ? host_lru_ : lru_).contains({n.last_access, id})) {
        return internal_error("radix cache: node {} not in its tier's LRU set", id);
      }
    }
  }
  SE_RETURN_IF_ERROR(check_segments());
  if (num_resident != num_resident_nodes_ || num_locked_resident != num_locked_resident_nodes_) {
    return internal_error("radix cache: {} resident ({} locked) nodes, counters say {} ({})",
                          num_resident, num_locked_resident, num_resident_nodes_,
                          num_locked_resident_nodes_);
  }
  if (num_in_lru != static_cast<int32_t>(lru_.size()) || num_in_host_lru != static_cast<int32_t>(host_lru_.size())) {
    return internal_error("radix cache: LRU sets have {} and {} entries for {} and {} evictable nodes", lru_.size(),
                          host_lru_.size(), num_in_lru, num_in_host_lru);
  }
  if (num_on_host != num_host_nodes_) {
    return internal_error("radix cache: {} nodes on the host, counter says {}", num_on_host, num_host_nodes_);
  }
  if (num_live != static_cast<int32_t>(by_hash_.size())) {
    return internal_error("radix cache: {} live nodes, hash index has {}", num_live,
                          by_hash_.size());
  }
  if (num_locked != num_locked_nodes_) {
    return internal_error("radix cache: {} locked nodes, counter says {}", num_locked,
                          num_locked_nodes_);
  }
  if (num_live + 1 + static_cast<int32_t>(free_node_ids_.size()) !=
      static_cast<int32_t>(num_slots)) {
    return internal_error("radix cache: root + {} live + {} free node slots != {} slots", num_live,
                          free_node_ids_.size(), num_slots);
  }
  for (std::vector<int32_t>* held : {&held_pages, &held_host_pages}) {
    std::sort(held->begin(), held->end());
    const auto dup = std::adjacent_find(held->begin(), held->end());
    if (dup != held->end()) {
      return internal_error("radix cache: {} page {} held by two nodes or streams",
                            held == &held_pages ? "device" : "host", *dup);
    }
  }
  return Status::ok();
}

}  // namespace se
