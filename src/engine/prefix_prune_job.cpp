#include "engine/prefix_prune_job.h"

#include <fmt/format.h>

#include <algorithm>

#include "engine/prune_scoring.h"

namespace se {

Status validate_prune_request(const PruneRequest& r) {
  const auto num_tokens = static_cast<int32_t>(r.token_ids.size());
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
    pruned.kept_positions = kept_positions(*scores, pruned.blocks, num_kept, page_size);
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
