#include "kv/radix_cache.h"

#include <xxhash.h>

#include <algorithm>

#include "base/check.h"

namespace se {

uint64_t hash_block(uint64_t parent_hash, std::span<const int32_t> tokens) {
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), parent_hash);
}

RadixCache::RadixCache(BlockPool* pool, const KvLayout& layout) : pool_(pool), layout_(layout) {
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
    if (nodes_[static_cast<size_t>(id)].live) pool_->release(node_pages(id));
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

bool RadixCache::is_evictable(NodeId id) const {
  const Node& n = nodes_[static_cast<size_t>(id)];
  return id != kRootNode && n.live && n.num_children == 0 && n.lock_ref == 0;
}

void RadixCache::update_lru(NodeId id) {
  Node& n = nodes_[static_cast<size_t>(id)];
  const bool evictable = is_evictable(id);
  if (evictable == n.in_lru) return;
  if (evictable) {
    lru_.emplace(n.last_access, id);
  } else {
    lru_.erase({n.last_access, id});
  }
  n.in_lru = evictable;
}

void RadixCache::touch(NodeId id, uint64_t tick) {
  Node& n = nodes_[static_cast<size_t>(id)];
  if (n.in_lru) {
    lru_.erase({n.last_access, id});
    lru_.emplace(tick, id);
  }
  n.last_access = tick;
}

RadixCache::PrefixMatch RadixCache::match_prefix(std::span<const int32_t> tokens) {
  PrefixMatch match;
  const auto page_size = static_cast<size_t>(layout_.page_size);
  // At least one token must stay uncached so the step computes logits for it.
  const size_t max_blocks = tokens.empty() ? 0 : (tokens.size() - 1) / page_size;
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
  const uint64_t tick = ++clock_;
  for (NodeId id : match.nodes) touch(id, tick);

  const auto num_blocks = match.nodes.size();
  const auto num_streams = static_cast<size_t>(layout_.num_streams());
  match.pages.resize(num_streams * num_blocks);
  for (size_t b = 0; b < num_blocks; ++b) {
    const auto pages = node_pages(match.nodes[b]);
    for (size_t s = 0; s < num_streams; ++s) match.pages[s * num_blocks + b] = pages[s];
  }
  match.num_cached_tokens = static_cast<int32_t>(num_blocks * page_size);
  num_query_tokens_ += static_cast<int64_t>(tokens.size());
  num_hit_tokens_ += match.num_cached_tokens;
  return match;
}

void RadixCache::lock(NodeId node) {
  SE_CHECK(node >= 0 && node < static_cast<NodeId>(nodes_.size()) &&
               nodes_[static_cast<size_t>(node)].live,
           "radix cache: lock of dead node {}", node);
  for (NodeId id = node; id != kRootNode; id = nodes_[static_cast<size_t>(id)].parent) {
    if (nodes_[static_cast<size_t>(id)].lock_ref++ == 0) {
      ++num_locked_nodes_;
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
  ++nodes_[static_cast<size_t>(parent)].num_children;
  update_lru(parent);
  return id;
}

Result<RadixCache::InsertResult> RadixCache::insert(std::span<const int32_t> tokens,
                                                    const PageTableView& view) {
  const auto page_size = static_cast<size_t>(layout_.page_size);
  const auto num_blocks = static_cast<int32_t>(tokens.size() / page_size);
  const int32_t num_streams = layout_.num_streams();
  if (view.num_streams != num_streams || view.page_size != layout_.page_size) {
    return invalid_argument(
        "radix cache: page table has {} streams of {}-token pages, cache has {} of {}",
        view.num_streams, view.page_size, num_streams, layout_.page_size);
  }
  for (int32_t s = 0; s < num_streams; ++s) {
    if (view.num_tokens[s] < num_blocks * layout_.page_size) {
      return invalid_argument("radix cache: stream {} holds {} tokens, {} full blocks need {}", s,
                              view.num_tokens[s], num_blocks, num_blocks * layout_.page_size);
    }
    for (int32_t b = 0; b < num_blocks; ++b) {
      const int32_t id = view.page_ids[static_cast<int64_t>(s) * view.stride + b];
      if (!pool_->is_valid_id(id) || pool_->ref_count(id) == 0) {
        return invalid_argument("radix cache: stream {} block {} page {} is not in use", s, b, id);
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
    } else {
      if (by_hash_.contains(hash)) break;  // collision with another block: leave the rest uncached
      child = new_node(parent, hash, block);
      int32_t* pages =
          pages_.data() + static_cast<size_t>(child) * static_cast<size_t>(num_streams);
      for (int32_t s = 0; s < num_streams; ++s) {
        pages[s] = view.page_ids[static_cast<int64_t>(s) * view.stride + b];
        pool_->retain(pages[s]);
      }
      ++result.num_new_blocks;
    }
    touch(child, tick);
    update_lru(child);
    parent = child;
  }
  result.last_node = parent;
  return result;
}

void RadixCache::remove_leaf(NodeId id, int32_t* num_freed) {
  Node& n = nodes_[static_cast<size_t>(id)];
  if (n.in_lru) lru_.erase({n.last_access, id});
  *num_freed += pool_->release(node_pages(id));
  by_hash_.erase(n.hash);
  const NodeId parent = n.parent;
  n = Node{};
  free_node_ids_.push_back(id);
  --nodes_[static_cast<size_t>(parent)].num_children;
  update_lru(parent);
}

int32_t RadixCache::evict(int32_t num_pages_needed) {
  int32_t num_freed = 0;
  while (num_freed < num_pages_needed && !lru_.empty()) {
    remove_leaf(lru_.begin()->second, &num_freed);
  }
  return num_freed;
}

Status RadixCache::check_integrity() const {
  const auto num_slots = nodes_.size();
  if (!nodes_[0].live || nodes_[0].parent != -1 || nodes_[0].lock_ref != 0) {
    return internal_error("radix cache: root node is damaged");
  }
  std::vector<int32_t> num_children(num_slots, 0);
  std::vector<int64_t> child_locks(num_slots, 0);
  std::vector<int32_t> held_pages;
  int32_t num_live = 0;
  int32_t num_locked = 0;
  int32_t num_in_lru = 0;
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
    child_locks[static_cast<size_t>(n.parent)] += n.lock_ref;
    if (n.hash != hash_block(nodes_[static_cast<size_t>(n.parent)].hash, node_tokens(id))) {
      return internal_error("radix cache: node {} hash does not match its tokens and parent", id);
    }
    const auto it = by_hash_.find(n.hash);
    if (it == by_hash_.end() || it->second != id) {
      return internal_error("radix cache: node {} missing from the hash index", id);
    }
    if (n.lock_ref < 0) return internal_error("radix cache: node {} lock count {}", id, n.lock_ref);
    if (n.lock_ref > 0) ++num_locked;
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
    if (n.in_lru != is_evictable(id)) {
      return internal_error("radix cache: node {} LRU membership is wrong", id);
    }
    if (n.in_lru) {
      ++num_in_lru;
      if (!lru_.contains({n.last_access, id})) {
        return internal_error("radix cache: node {} not in LRU set", id);
      }
    }
  }
  if (num_in_lru != static_cast<int32_t>(lru_.size())) {
    return internal_error("radix cache: LRU set has {} entries for {} evictable leaves",
                          lru_.size(), num_in_lru);
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
  std::sort(held_pages.begin(), held_pages.end());
  const auto dup = std::adjacent_find(held_pages.begin(), held_pages.end());
  if (dup != held_pages.end()) {
    return internal_error("radix cache: page {} held by two nodes or streams", *dup);
  }
  return Status::ok();
}

}  // namespace se
