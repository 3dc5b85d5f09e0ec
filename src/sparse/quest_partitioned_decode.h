// QuestPartitionedDecode: Spin's partitions (arXiv 2604.26837 §4.1) for Quest's page selection over KV that lives
// partly on the host tier (kv/host_tier.h). One decode step of a sequence runs, layer by layer:
//   Index      the key bounds (elementwise min and max of the keys) of every page of the sequence, host pages too,
//              kept where the pool lives and keyed by the page's place (stream, page index), so page moves leave
//              them be; the page that takes the step's token has its bounds refreshed.
//   Select     Quest's top pages from those bounds (select_pages_by_key_bounds, as the resident method ranks).
//   Retrieve   only the selected pages not resident are copied in (HostTier::retrieve), into the request's buffer.
//   Offload    when they would overflow the buffer, its least recently used pages go out first: never the layer's
//              selection, which was touched just before.
//   Attention  paged attention over the selected pages, all resident now, through the tier's device rows (the
//              entries of host pages read -1 there, and no selection points at them).
// A selection over the same bounds, the same kernels and the same bytes: the output is the resident Quest's, bit for
// bit. The buffer (pages resident per request) is elastic, buffer_factor times the step's mandatory pages (Spin's
// default 5x), so it follows the request's selection as its streams grow, or fixed, the same number of pages
// whatever the selection (what Spin compares against). Under `two_level` the index keeps group summaries beside the
// page bounds and Select ranks the groups first (an approximation: docs/fidelity.md; with every group kept it is the
// resident choice again). Every layer selects (Quest's dense leading layers would pin whole streams resident).
//
// Ownership: borrows the tier (and its pools); holds each sequence's index. Its views carry host tables: on the CPU
// backend the ops read them as they are (a GPU run would mirror them, as the sparse controller does). Engine thread
// only.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "backend/ops.h"
#include "kv/host_tier.h"
#include "sparse/quest_two_level_index.h"
#include "tensor/tensor.h"

namespace se {

enum class PartitionBuffer : uint8_t { kElastic, kFixed };

struct PartitionConfig {
  int32_t token_budget = 2048;  // tokens a KV head reads per step, last page included (Quest's)
  GroupReduce gqa_agg = GroupReduce::kMean;
  PartitionBuffer buffer = PartitionBuffer::kElastic;
  int32_t buffer_factor = 5;       // kElastic: resident pages per mandatory page
  int64_t fixed_buffer_pages = 0;  // kFixed: resident pages per request
  // Set: Select ranks page groups by their summaries first, then the pages of the kept groups
  // (quest_two_level_index.h), on the host.
  std::optional<TwoLevelConfig> two_level;
};

// Pages of one sequence moved in one step, over its layers.
struct PartitionStepCounts {
  int64_t num_selected_pages = 0;   // the selections' pages (Attention's reads)
  int64_t num_retrieved_pages = 0;  // copied in: selected and not resident (Retrieve)
  int64_t num_offloaded_pages = 0;  // copied out of a full buffer (Offload)
  // Pages whose own bounds Select ranked: every candidate of a stream longer than the budget, but those of the kept
  // groups under two_level.
  int64_t num_ranked_pages = 0;
};

class QuestPartitionedDecode final {
 public:
  // `tier` holds the sequences; its device pool's pages are of `layout`.
  QuestPartitionedDecode(HostTier* tier, const KvLayout& layout, PartitionConfig config);

  // Indexes a sequence the tier holds wholly resident (after its prefill): the bounds of every page. Its streams
  // may grow to `max_num_tokens` tokens. kNotFound, kFailedPrecondition when some of its pages are on the host or a
  // fixed buffer cannot hold one layer's selection, kConflict when already indexed.
  Status add(int32_t seq, int32_t max_num_tokens);
  // Forgets a sequence's index (the caller drops it from the tier).
  void remove(int32_t seq) { seqs_.erase(seq); }

  // Opens a decode step of `seq`: every stream takes one slot (new pages on the device, making room there by the
  // tier's LRU; a slot in a partly filled page on the host waits for its layer to bring the page back), and the
  // LRU's clock ticks. kOutOfRange past max_num_tokens; the tier's errors when there is no room.
  Status begin_step(int32_t seq);
  // Layer `layer` of the step: writes the token's k, v [1, Hkv, D] into its slots, then Index, Select, Retrieve
  // (and Offload), Attention: out [1, H, D] from q [1, H, D].
  Status attend(int32_t seq, int32_t layer, TensorView q, TensorView k, TensorView v, TensorView out,
                const AttentionParams& params);

  // What the sequence's step moved so far (reset by begin_step).
  const PartitionStepCounts& step_counts(int32_t seq) const { return seqs_.at(seq).counts; }
  // Pages the sequence may keep resident now.
  int64_t buffer_pages(int32_t seq) const;

 private:
  struct Index {
    int32_t stride = 0;  // index entries per stream: pages of max_num_tokens
    // [num_streams * stride, 2, D]: where the pool lives, or on the host under two_level (the fine bounds).
    Tensor bounds;
    std::vector<int32_t> entries;  // [num_streams][stride] entry ids (s * stride + p): the ranking's page lists
    std::vector<float> groups;     // two_level: [num_streams][ceil(stride / group_size)][2][D] group summaries
    PartitionStepCounts counts;
  };

  int32_t page_budget() const { return std::max(1, config_.token_budget / layout_.page_size); }
  // two_level: group summaries per stream of the index.
  int32_t groups_per_stream(const Index& index) const {
    return (index.stride + config_.two_level->group_size - 1) / config_.two_level->group_size;
  }
  // A one-sequence view of layer `layer` with `num_rows` query rows whose page lists are `rows` ([num_streams]
  // [stride]). NOTE: it points at seq_view_ and q_indptr_, so it holds until the next call.
  AttentionView layer_view(const int32_t* rows, int32_t stride, const TieredPageTable& table, int32_t layer,
                           int32_t num_rows);
  // Copies the pool-indexed bounds of the listed pages (all resident) into the sequence's index.
  void store_bounds(const Index& index, const TieredPageTable& table, std::span<const StreamPage> pages);
  // two_level: refreshes the summary of the group holding candidate page `page_idx` of stream `stream` (a stream's
  // candidates are its pages but the last).
  void summarize_group(Index& index, const TieredPageTable& table, int32_t stream, int32_t page_idx) const;
  // Select of layer `layer` into host_lists_ / host_counts_: the page ranking op over the index, or the two-level
  // ranking over its groups and pages.
  void select(Index& index, const TieredPageTable& table, int32_t layer, TensorView q);
  // Brings the listed pages in, offloading the sequence's oldest pages first when the buffer would overflow and
  // making room in the device pool by the tier's LRU.
  Status retrieve(int32_t seq, Index& index, std::span<const StreamPage> pages);

  HostTier* tier_;
  KvLayout layout_;
  PartitionConfig config_;
  Device device_;
  BlockPool* device_pool_;
  Tensor pool_bounds_;  // [device pool pages, 2, D]: update_page_key_bounds writes here, by device page id
  std::map<int32_t, Index> seqs_;
  // Scratch, reused: the layer's page lists [Hkv][budget] and counts [Hkv] where the pool lives and on the host.
  Tensor lists_, counts_, host_lists_, host_counts_;
  std::vector<int32_t> q_indptr_ = {0, 1};
  SeqKvView seq_view_;
};

}  // namespace se
