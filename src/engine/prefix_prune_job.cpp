#include "engine/prefix_prune_job.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/check.h"
#include "engine/prune_scoring.h"

namespace se {

Status validate_prune_request(const PruneRequest& r) {
  const bool bounded = !r.token_ids.empty() || r.chain_id.empty();
  const auto num_tokens = bounded ? static_cast<int32_t>(r.token_ids.size()) : INT32_MAX;
  if (num_tokens == 0) return invalid_argument("the token sequence is empty");
  if (r.ranges.empty()) return invalid_argument("no range to prune");
  if (r.window < 1) return invalid_argument("window must be at least 1, got {}", r.window);
  for (size_t i = 0; i < r.ranges.size(); ++i) {
    const TokenRange& range = r.ranges[i];
    if (range.start < 0 || range.start >= range.end || range.end > num_tokens)
      return invalid_argument("range [{}, {}) must satisfy 0 <= start < end <= {} (the tokens)", range.start,
                              range.end, num_tokens);
    if (i > 0 && range.start < r.ranges[i - 1].end)
      return invalid_argument("ranges must ascend without overlap: [{}, {}) follows [{}, {})", range.start,
                              range.end, r.ranges[i - 1].start, r.ranges[i - 1].end);
    if (r.keep_tokens < 0 || r.keep_tokens > range.end - range.start)
      return invalid_argument("keep_tokens {} must lie in [0, {}] (the size of range [{}, {}))", r.keep_tokens,
                              range.end - range.start, range.start, range.end);
  }
  return Status::ok();
}

std::string_view prune_state_name(PruneState state) {
  switch (state) {
    case PruneState::kQueued: return "queued";
    case PruneState::kCompleted: return "completed";
    case PruneState::kBlocked: return "blocked";
    case PruneState::kFailed: return "failed";
  }
  return "failed";
}

namespace {

PruneStatus ended(PruneState state, const Status& why) {
  PruneStatus status;
  status.state = state;
  status.reason = why.message();
  return status;
}

}  // namespace

PruneStatus run_prune(const PruneRequest& request, CacheManager& cache, MethodRuntime& method, const Model& model,
                      const MethodEnvironment& environment) {
  const Status valid = validate_prune_request(request);
  if (!valid.is_ok()) return ended(PruneState::kFailed, valid);
  Result<RadixCache::PrefixMatch> cached = cache.inspect_prefix(request.token_ids);
  if (!cached.is_ok()) return ended(PruneState::kFailed, cached.status());
  const int32_t page_size = cache.layout().page_size;

  // Every range is checked before anything changes: one in use blocks the whole prune.
  PruneStatus status;
  for (const TokenRange& range : request.ranges) {
    PrunedRange& pruned = status.ranges.emplace_back();
    pruned.requested = range;
    pruned.blocks = blocks_inside(range, page_size, cached->num_blocks());
    pruned.effective = {pruned.blocks.first_block * page_size, pruned.blocks.end_block * page_size};
    if (pruned.blocks.first_block == pruned.blocks.end_block) continue;
    const Status prunable = cache.check_prunable(request.token_ids, pruned.blocks);
    if (prunable.code() == StatusCode::kUnavailable) return ended(PruneState::kBlocked, prunable);
    if (!prunable.is_ok()) return ended(PruneState::kFailed, prunable);
  }

  const bool prunes_something = std::any_of(status.ranges.begin(), status.ranges.end(), [](const PrunedRange& r) {
    return r.blocks.first_block < r.blocks.end_block;
  });
  if (!prunes_something) {  // no whole cached block in any range: nothing to score
    status.state = PruneState::kCompleted;
    return status;
  }
  PruneScoringOptions scoring;
  scoring.policy = request.policy;
  scoring.window = request.window;
  scoring.page_size = page_size;
  scoring.environment = environment;
  scoring.cache = &cache;
  Result<std::vector<float>> scores = score_positions(model, request.token_ids, scoring);
  if (!scores.is_ok()) return ended(PruneState::kFailed, scores.status());

  const auto pages_rewritten = [&method](int layer, const AttentionView& view) {
    method.on_pages_rewritten(layer, view);
  };
  for (PrunedRange& pruned : status.ranges) {
    const int32_t num_blocks = pruned.blocks.end_block - pruned.blocks.first_block;
    if (num_blocks == 0) continue;
    const int32_t num_kept = num_kept_blocks(request.keep_tokens, num_blocks, page_size);
    pruned.kept_positions = kept_positions(*scores, pruned.effective, num_kept * page_size);
    if (num_kept == num_blocks) continue;  // every block stays whole: nothing to drop
    Result<int32_t> freed = cache.prune_prefix(request.token_ids, pruned.blocks, pruned.kept_positions,
                                               pages_rewritten);
    if (!freed.is_ok()) return ended(PruneState::kFailed, freed.status());
    pruned.num_freed_pages = *freed;
    status.num_freed_pages += *freed;
  }
  status.state = PruneState::kCompleted;
  return status;
}

namespace {

// The slot a pruned chain's state is opened under (requests use slots >= 0, prune scoring -1).
constexpr int32_t kChainPruneSeq = -2;

// The slots of one stream (holding `positions`) that stay when `range` keeps `kept` (ascending positions): on a
// full-attention layer every slot outside the range and the range's kept ones; on a sliding-window layer of
// `window` tokens, a tail: the slots at positions >= min(range end, the oldest the next query sees).
std::vector<int32_t> surviving_slots(std::span<const int32_t> positions, TokenRange range,
                                     std::span<const int32_t> kept, int32_t window, int32_t num_logical_tokens) {
  std::vector<int32_t> slots;
  slots.reserve(positions.size());
  const int32_t tail_start = std::min(range.end, num_logical_tokens - (window - 1));
  for (size_t slot = 0; slot < positions.size(); ++slot) {
    const int32_t p = positions[slot];
    const bool stays = window > 0 ? p >= tail_start
                                  : p < range.start || p >= range.end || std::binary_search(kept.begin(), kept.end(), p);
    if (stays) slots.push_back(static_cast<int32_t>(slot));
  }
  return slots;
}

// Drops what `range` does not keep from every stream of the open sequence kChainPruneSeq; returns the pages
// freed.
int64_t prune_chain_range(SparseController& controller, const ModelConfig& model, TokenRange range,
                          std::span<const int32_t> kept) {
  CacheManager& cache = controller.cache();
  const int64_t num_held = cache.num_held_pages(kChainPruneSeq);
  const int32_t num_logical = cache.num_logical_tokens(kChainPruneSeq);
  // Every stream's surviving slots (moving a list keeps its buffer, so the evictions' spans stay valid).
  std::vector<std::vector<int32_t>> slots;
  std::vector<CacheManager::StreamEviction> evictions;
  for (int layer = 0; layer < model.num_layers; ++layer) {
    const int32_t window = model.layers[static_cast<size_t>(layer)].sliding ? model.sliding_window : 0;
    for (int head = 0; head < model.num_kv_heads; ++head) {
      const std::span<const int32_t> positions = cache.slot_positions(kChainPruneSeq, layer, head);
      std::vector<int32_t>& surviving =
          slots.emplace_back(surviving_slots(positions, range, kept, window, num_logical));
      if (surviving.size() == positions.size()) continue;
      evictions.push_back({layer, head, surviving});
    }
  }
  const Status evicted = cache.evict_streams(kChainPruneSeq, evictions);
  SE_CHECK(evicted.is_ok(), "chain prune: {}", evicted.to_string());
  for (const CacheManager::StreamEviction& e : evictions)
    controller.method().on_stream_compacted(kChainPruneSeq, e.layer, e.kv_head, e.kept);
  return num_held - cache.num_held_pages(kChainPruneSeq);
}

}  // namespace

PruneStatus run_chain_prune(const PruneRequest& request, ChainCacheIndex& chains, SparseController& controller,
                            const Model& model, const MethodEnvironment& environment) {
  // Refused before the chain is taken out, which would make it the most recently used.
  if (controller.cache().runs_on_host_tier())
    return ended(PruneState::kFailed,
                 failed_precondition("chain '{}' runs under Spin's partitions (--kv-partitions), which keep every "
                                     "token of a sequence: its prefix cannot be pruned; it was left as it was",
                                     request.chain_id));
  // The prefix is read and the state given back at once: the scoring pass runs with the chain idle, so a turn may
  // still begin meanwhile (the prune is then blocked below). Turns end only on this thread, so a state taken
  // again after scoring is the one scored.
  Result<ChainCacheIndex::IdleState> idle = chains.take_idle(request.chain_id);
  if (!idle.is_ok())
    return ended(idle.status().code() == StatusCode::kConflict ? PruneState::kBlocked : PruneState::kFailed,
                 idle.status());
  const int32_t num_logical = idle->state->num_logical_tokens();
  const std::vector<int32_t> stored = std::move(idle->tokens);  // may hold one more, uncomputed token
  chains.cancel_turn(request.chain_id, std::move(idle->state));

  const std::span<const int32_t> prefix(stored.data(), static_cast<size_t>(num_logical));
  if (request.token_ids.size() > stored.size() ||
      !std::equal(request.token_ids.begin(), request.token_ids.end(), stored.begin()))
    return ended(PruneState::kFailed,
                 invalid_argument("the tokens ({}) are not the start of chain '{}''s {} tokens",
                                  request.token_ids.size(), request.chain_id, stored.size()));
  PruneRequest checked = request;  // ranges inside the computed prefix
  checked.token_ids.assign(prefix.begin(), prefix.end());
  if (Status valid = validate_prune_request(checked); !valid.is_ok()) return ended(PruneState::kFailed, valid);
  PruneScoringOptions scoring;
  scoring.policy = request.policy;
  scoring.window = request.window;
  scoring.page_size = controller.cache().layout().page_size;
  scoring.environment = environment;
  Result<std::vector<float>> scores = score_positions(model, prefix, scoring);
  if (!scores.is_ok()) return ended(PruneState::kFailed, scores.status());

  idle = chains.take_idle(request.chain_id);
  if (!idle.is_ok())
    return ended(idle.status().code() == StatusCode::kConflict ? PruneState::kBlocked : PruneState::kFailed,
                 idle.status());
  // A state on the host tier is pruned in device pages (other idle chains yield theirs); without room for them the
  // chain stays as it was.
  const int64_t num_to_restore = idle->state->num_pages_to_restore();
  if (num_to_restore > controller.cache().num_available_pages())
    chains.reclaim(num_to_restore - controller.cache().num_available_pages());
  if (num_to_restore > controller.cache().num_available_pages()) {
    chains.cancel_turn(request.chain_id, std::move(idle->state));
    return ended(PruneState::kBlocked,
                 resource_exhausted("chain '{}' is on the host tier and the {} device pages to bring it back are "
                                    "in use",
                                    request.chain_id, num_to_restore));
  }
  // Pinned from here on: every path below gives the state back or drops the chain.
  const Result<int32_t> resumed = controller.resume(kChainPruneSeq, std::move(idle->state));
  if (!resumed.is_ok()) {  // the state was destroyed with the failure
    chains.drop(request.chain_id);
    return ended(PruneState::kFailed, resumed.status());
  }
  if (!controller.cache().can_evict_streams(kChainPruneSeq)) {
    chains.cancel_turn(request.chain_id, controller.retain(kChainPruneSeq));
    return ended(PruneState::kFailed,
                 failed_precondition("chain '{}' holds tokens the {} KV store has quantized into groups, which cannot "
                                     "drop single tokens; it was left as it was",
                                     request.chain_id, kv_store_kind_name(controller.cache().layout().store)));
  }
  PruneStatus status;
  for (const TokenRange& range : request.ranges) {
    PrunedRange& pruned = status.ranges.emplace_back();
    pruned.requested = range;
    pruned.effective = range;
    pruned.kept_positions = kept_positions(*scores, range, request.keep_tokens);
    pruned.num_freed_pages =
        static_cast<int32_t>(prune_chain_range(controller, model.config(), range, pruned.kept_positions));
    status.num_freed_pages += pruned.num_freed_pages;
  }
  chains.cancel_turn(request.chain_id, controller.retain(kChainPruneSeq));
  status.state = PruneState::kCompleted;
  return status;
}

std::string PruneStatusBoard::add_queued() {
  std::lock_guard<std::mutex> lock(mutex_);
  PruneStatus status;
  status.prune_id = fmt::format("prune-{}", ++next_id_);
  const std::string id = status.prune_id;
  by_id_.emplace(id, std::move(status));
  order_.push_back(id);
  if (order_.size() > kCapacity) {
    by_id_.erase(order_.front());
    order_.pop_front();
  }
  return id;
}

void PruneStatusBoard::set(PruneStatus status) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = by_id_.find(status.prune_id);
  if (it != by_id_.end()) it->second = std::move(status);
}

std::optional<PruneStatus> PruneStatusBoard::find(const std::string& prune_id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = by_id_.find(prune_id);
  if (it == by_id_.end()) return std::nullopt;
  return it->second;
}

}  // namespace se
