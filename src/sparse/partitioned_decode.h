// PartitionedDecode: Spin's partitions (arXiv 2604.26837 §4.1) for page selection by key bounds (or a token
// selection at filter layers, TokenFilters, or the method's own tokens, MethodTokens) over KV that lives partly on the
// host tier (kv/host_tier.h). One decode step of a sequence runs, layer by layer:
//   Index      the key bounds (elementwise min and max of the keys) of every page of the sequence, host pages too,
//              kept where the pool lives and keyed by the page's place (stream, page index), so page moves leave
//              them be; the page that takes the step's token has its bounds refreshed.
//   Select     the top pages from those bounds (select_pages_by_key_bounds, as the resident method ranks).
//   Retrieve   only the selected pages not resident are copied in (HostTier::retrieve), into the request's buffer.
//   Offload    when they would overflow the buffer, its least recently used pages go out first: never the layer's
//              selection, which was touched just before.
//   Attention  paged attention over the selected pages, all resident now, through the tier's device rows (the
//              entries of host pages read -1 there, and no selection points at them).
// A selection over the same bounds, the same kernels and the same bytes: the output is the resident method's, bit for
// bit. The buffer (pages resident per request) is elastic, buffer_factor times the step's mandatory pages (Spin's
// default 5x), so it follows the request's selection as its streams grow, or fixed, the same number of pages
// whatever the selection (what Spin compares against). Under `two_level` the index keeps group summaries beside the
// page bounds and Select ranks the groups first (an approximation: docs/fidelity.md; with every group kept it is the
// resident choice again). A prefill chunk, and a decode step's dense layers (the leading `dense_layers`,
// sliding-window layers), read every page of the layer's streams: Retrieve brings the missing ones in, in pieces of
// what the two pools have free, so a layer fits whenever the device pool holds it whole. The index grows with the
// sequence (doubling its entries per stream).
//
// Ownership: borrows the tier (and its pools); holds each sequence's index, which take hands out while the sequence
// is idle (and offload_index parks in host pages) and put takes back. Its views carry host tables: on the CPU
// backend the ops read them as they are (a GPU run would mirror them, as the sparse controller does). Engine thread
// only.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "backend/ops.h"
#include "kv/host_tier.h"
#include "sparse/partition_config.h"
#include "sparse/quest_two_level_index.h"
#include "tensor/tensor.h"

namespace se {

// What a step computes: a decode token (Select runs) or a prefill chunk (read densely).
enum class PartitionStep : uint8_t { kDecode, kPrefill };

// Pages of one sequence moved in one step, over its layers.
struct PartitionStepCounts {
  int64_t num_selected_pages = 0;   // the selections' pages (Attention's reads)
  int64_t num_retrieved_pages = 0;  // copied in: selected and not resident (Retrieve)
  int64_t num_offloaded_pages = 0;  // copied out of a full buffer (Offload)
  // Pages whose own bounds Select ranked: every candidate of a stream longer than the budget, but those of the kept
  // groups under two_level.
  int64_t num_ranked_pages = 0;
  int64_t num_read_tokens = 0;  // KV tokens the step's last query row attended, over layers and KV heads
};

class PartitionedDecode final {
 public:
  // `tier` holds the sequences; its device pool's pages are of `layout`.
  PartitionedDecode(HostTier* tier, const KvLayout& layout, PartitionConfig config);

  // Indexes a sequence the tier holds wholly resident (after its prefill, or empty before it): the bounds of every
  // page, in an index sized for `max_num_tokens` tokens at first. kNotFound, kFailedPrecondition when some of its
  // pages are on the host or a fixed buffer cannot hold one layer's selection, kConflict when already indexed.
  Status add(int32_t seq, int32_t max_num_tokens);
  // Forgets a sequence's index (the caller drops it from the tier).
  void remove(int32_t seq) { seqs_.erase(seq); }

  // Opens a step of `num_tokens` tokens of `seq` (a decode step's one, or a prefill chunk): every stream takes the
  // slots (new pages on the device, making room there by the tier's LRU; a slot in a partly filled page on the
  // host waits for its layer to bring the page back), the index grows when the streams outgrow it, and the LRU's
  // clock ticks. The tier's errors when there is no room.
  Status begin_step(int32_t seq, int32_t num_tokens = 1);
  // Layer `layer` of the step: writes the step's k, v [n, Hkv, D] into its slots, then Index, Select, Retrieve
  // (and Offload), Attention: out [n, H, D] from q [n, H, D]. A decode step has one row; a prefill chunk, and a
  // decode step's dense layers, skip Select and read every page of the layer's streams. Under method_tokens a
  // decode step's `tokens` are the method's selection, per KV head its ascending tokens (Select is the method's);
  // none: the layer reads whole. kInvalidArgument, nothing written, for tokens out of order or past the streams.
  Status attend(int32_t seq, int32_t layer, TensorView q, TensorView k, TensorView v, TensorView out,
                const AttentionParams& params, PartitionStep step = PartitionStep::kDecode,
                std::span<const std::span<const int32_t>> tokens = {});

  // A sequence's index: its pages' bounds and what its step left. take hands it out while the sequence is idle (a
  // finished Chain Cache turn, a preempted request), put gives it back when the sequence resumes.
  struct Index {
    int32_t stride = 0;  // index entries per stream: stride_for the longest length so far
    // [num_streams * stride, 2, D]: where the pool lives, or on the host under two_level (the fine bounds).
    Tensor bounds;
    std::vector<int32_t> entries;  // [num_streams][stride] entry ids (s * stride + p): the ranking's page lists
    std::vector<float> groups;     // two_level: [num_streams][ceil(stride / group_size)][2][D] group summaries
    PartitionStepCounts counts;
    int32_t step_tokens = 1;         // the open step's new tokens per stream
    int32_t num_prefill_tokens = 0;  // what its prefill steps computed
    // token_filters: the last filter layer's choice this step: the kept prompt tokens [kept], and per KV head those
    // tokens then the decode tail [Hkv][width] with counts [Hkv]; none when the filter kept the whole prompt.
    // method_tokens: the layer's tokens per KV head as the method gave them, in token_lists and token_counts.
    Tensor kept_tokens, token_lists, token_counts;
    bool keeps_whole_prompt = false;
    // While parked (offload_index): the host pages holding the part kept where the pool lives, which is then
    // released; empty otherwise.
    std::vector<int32_t> host_pages;
  };

  // Takes the sequence's index out; the caller takes its table out of the tier too. kNotFound when not indexed.
  Result<Index> take(int32_t seq);
  // Indexes `seq`, held by the tier again, with an index take handed out (and retrieve_index brought back, if
  // parked). kNotFound, kConflict when already indexed, kFailedPrecondition for a parked index.
  Status put(int32_t seq, Index index);
  // Parks the part of an index kept where the pool lives (the key bounds, or under two_level the group
  // summaries) in pages of `host_pool`, releasing it, / brings it back and gives the pages back: an idle
  // sequence's index then takes host pages instead of device memory. kResourceExhausted, nothing changed, when
  // the host pool lacks index_pages(index) free pages; kFailedPrecondition when already parked / not parked.
  Status offload_index(Index& index, BlockPool& host_pool) const;
  Status retrieve_index(Index& index, BlockPool& host_pool) const;
  // Pages of `page_bytes` bytes the index's part kept where the pool lives takes.
  int64_t index_pages(const Index& index, size_t page_bytes) const;

  // Bytes of the sequence's index where the pool lives (under two_level its group summaries; the fine bounds are
  // on the host): now, and for any sequence once its streams hold `num_tokens` tokens.
  int64_t index_bytes(int32_t seq) const { return index_bytes_at(seqs_.at(seq).stride); }
  int64_t index_bytes_for(int32_t num_tokens) const { return index_bytes_at(stride_for(num_tokens)); }
  // Pages a layer's selection reads: one per KV head and page of the budget.
  int64_t selection_pages() const { return int64_t{layout_.num_kv_heads} * page_budget(); }

  const PartitionConfig& config() const { return config_; }
  // What the sequence's step moved so far (reset by begin_step).
  const PartitionStepCounts& step_counts(int32_t seq) const { return seqs_.at(seq).counts; }
  // Pages the sequence may keep resident now.
  int64_t buffer_pages(int32_t seq) const;

 private:
  int32_t page_budget() const { return std::max(1, config_.token_budget / layout_.page_size); }
  // The index's entries per stream once its streams hold `num_tokens` tokens: a power of two, so it grows by
  // doubling and its size follows from the length alone.
  int32_t stride_for(int32_t num_tokens) const;
  // Bytes of an index of `stride` entries per stream.
  int64_t index_bytes_at(int32_t stride) const;
  // Widens the index to `stride` entries per stream, keeping every stream's bounds and summaries.
  void grow(Index& index, int32_t stride) const;
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
  // Brings the listed pages in, offloading the sequence's oldest pages first when they would overflow a buffer of
  // `buffer_pages` and making room in the device pool by the tier's LRU, in pieces of what the two pools have free.
  Status retrieve(int32_t seq, Index& index, std::span<const StreamPage> pages, int64_t buffer_pages);
  // Every page of the layer's streams; a dense layer's reads.
  std::vector<StreamPage> layer_pages(const TieredPageTable& table, int32_t layer) const;
  // token_filters: a filter layer's choice over `view` (the layer whole, one query row q [1, H, D]) into the index.
  void filter_tokens(Index& index, const TieredPageTable& table, int32_t layer, const AttentionView& view,
                     TensorView q);
  // Retrieve the pages of the index's token lists (a filter's tokens, or the method's), then attend over the tokens.
  Status attend_tokens(int32_t seq, Index& index, int32_t layer, TensorView q, TensorView out,
                       const AttentionParams& params);
  // method_tokens: whether `tokens` fit layer `layer` of the sequence (one ascending list per KV head within its
  // stream), / copies them into the index's token lists.
  Status check_method_tokens(int32_t seq, int32_t layer, std::span<const std::span<const int32_t>> tokens) const;
  void set_method_tokens(Index& index, std::span<const std::span<const int32_t>> tokens) const;
  // Whether the index keeps page bounds (the key-bound ranking); a token selection keeps none.
  bool keeps_bounds() const { return !config_.token_filters && !config_.method_tokens; }

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
