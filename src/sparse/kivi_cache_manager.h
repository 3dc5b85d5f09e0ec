// KiviCacheManager: the KV of the KIVI stores (--kv-cache-dtype kivi2 | kivi4; jy-yuan/KIVI) in one BlockPool
// whose page is a quantized page of one key group (kv_layout.h). Each stream (layer, KV head) of a sequence lists
// its quantized pages (one per group of quantized keys; their value rows fill as values leave the window) and its
// residual pages (the explicit rows of tokens [quantized values, length), from `first_slot` of the first one), and
// keeps a KiviResidualWindow of its own that says what each step flushes: streams start equal and differ in length
// only once a method evicts (a per-head or per-layer budget).
// The views are kQuantized / kKivi (attention_view.h).
//
// A step, as KIVI's model runs it: reserve(n) takes the residual pages of the n new tokens and the quantized pages
// the step's flush fills; the forward writes the new rows into the window (write_kv over the view) and attends over
// what was quantized before the step plus every newer token at full precision (a prefill attends at full precision,
// a decode token before its flush); on_computed then flushes: keys of whole R-token blocks and values older than
// the last R tokens are quantized from their window rows into their pages (quantize_kivi_rows), and the window's
// pages it slid past return to the pool. No dequantized copy of the cache is ever stored. The pool lives where the
// model runs: f32 rows on the CPU, bf16 rows on CUDA, where the writes, the flush's quantization and eviction's row
// moves run on the device and only the page lists and counts stay on the host. No radix prefix cache runs over these
// pages (a window's rows flush into groups of its own stream's tokens, so no page is shared); the Chain Cache keeps a
// sequence between turns as snapshot() takes it, its groups, their scales and minima and its window rows as they are,
// and restore() resumes it there: the next turn's tokens append to the window as decode tokens would.
//
// Eviction under KIVI (`hold_prompts`, for a compress-after method): a sequence's prompt (the tokens
// open() is given) is held at full precision in the window, however long, until on_computed reports all of it
// computed, so the method scores the prompt's exact keys and evict_streams drops tokens that were never quantized;
// the kept tokens then flush in order, their groups formed from kept tokens only, and decode continues as KIVI.
// Any token of a stream nothing has quantized can be evicted (can_evict_streams). Once a stream has quantized
// tokens, evict_streams drops only whole sealed groups (sealed_groups: a group whose keys and values have all left
// the window), for a method that evicts by position as decode runs: the group's page goes back to the pool and
// leaves the stream's list, and the counts of its window move down by a group, so no byte moves and every later
// flush quantizes the tokens it would have. evict_slots, one token at a time, is refused.
// Owns one reference to each page it lists; snapshots own theirs and must not outlive the manager. Engine thread
// only.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "backend/ops.h"
#include "backend/quant/quantized_kv_layout.h"
#include "kv/block_pool.h"
#include "kv/kivi_residual_window.h"
#include "sparse/cache_manager.h"

namespace se {

class KiviCacheManager final : public CacheManager {
 public:
  // A pool of `num_pages` pages of `layout` (a valid KIVI layout whose rows are kv_page_dtype of the allocator's
  // device) from `allocator`; `hold_prompts`:
  // every prompt stays full precision until it is computed (see above).
  static Result<std::unique_ptr<KiviCacheManager>> create(const KvLayout& layout, int32_t num_pages,
                                                          Allocator* allocator, bool hold_prompts = false);

  int64_t num_total_pages() const override { return pool_.num_total_pages(); }
  int64_t num_free_pages() const override { return pool_.num_free_pages(); }
  int64_t num_available_pages() const override { return pool_.num_free_pages(); }
  int64_t num_used_pages() const override { return pool_.num_used_pages(); }
  int64_t pages_to_reserve(int32_t seq, int32_t num_new_tokens) const override;
  int64_t num_held_pages(int32_t seq) const override;

  Result<int32_t> open(int32_t seq, std::span<const int32_t> prompt) override;
  Status reserve(int32_t seq, int32_t num_new_tokens) override;
  void on_computed(int32_t seq, std::span<const int32_t> tokens, int32_t num_computed) override;
  void close(int32_t seq) override;
  std::unique_ptr<SequenceSnapshot> snapshot(int32_t seq) override;
  Status restore(int32_t seq, std::unique_ptr<SequenceSnapshot> snapshot) override;

  AttentionView build_view(int layer, const ForwardBatch& batch) override;
  AttentionView build_sequence_view(int32_t seq, int layer) override;
  // Covers the quantized group lists, which otherwise only gain pages at their ends; the window's lists change at
  // both ends as it slides, and a device mirror sends them with every forward.
  uint64_t table_epoch(int32_t seq) const override { return sequence(seq).epoch; }
  int32_t num_logical_tokens(int32_t seq) const override;
  std::span<const int32_t> slot_positions(int32_t seq, int layer, int kv_head) const override;
  Status evict_streams(int32_t seq, std::span<const StreamEviction> streams) override;
  bool can_evict_streams(int32_t seq) const override;
  SealedGroups sealed_groups(int32_t seq, int layer, int kv_head) const override;
  Status evict_slots(int32_t seq, std::span<const SlotEviction> streams) override;

  Status check_integrity() const override;

  // Pages over all streams of a prompt of `num_tokens` tokens held at full precision (`hold_prompts`) at its
  // fullest: every token's window rows plus the key groups reserved for its flush.
  static int64_t held_prompt_pages(const KvLayout& layout, int64_t num_tokens);
  // Pages over all streams of a sequence of `num_tokens` tokens whose streams drop sealed groups so that each holds
  // at most `max_kept` tokens once a step is done, at a one-token step's peak: the key groups of at most
  // max_kept + 1 tokens (and never more than the sequence would have quantized keeping every token) and a window at
  // its fullest.
  static int64_t sealed_group_eviction_pages(const KvLayout& layout, int64_t num_tokens, int64_t max_kept);

  // The quantized page layout of this store's pages.
  const KiviPageLayout& page_layout() const { return page_layout_; }

 private:
  // One stream (layer, KV head) of a sequence.
  struct Stream {
    KiviResidualWindow window;  // counts once the last reserved step has flushed (a held prompt: none yet)
    // Quantized now (what views show); below the window's counts while a reserved step has not flushed yet.
    int32_t stored_keys = 0;
    int32_t stored_values = 0;
    int32_t first_slot = 0;               // slot of token stored_values in the first residual page
    std::vector<int32_t> quantized = {};  // page ids, group order (flush targets included)
    std::vector<int32_t> residual = {};   // page ids of the window, token order
    std::vector<int32_t> positions = {};  // slot -> position (slots are positions until an eviction)
  };
  // One layer's group lists as its views show them: [num_kv_heads][capacity] page ids, whose first listed[h]
  // entries of row h equal head h's list while `epoch` is the sequence's. A view then copies only the groups added
  // since the last one, not every list of a long context each layer and step.
  struct GroupTable {
    std::vector<int32_t> ids;
    int32_t capacity = 0;
    uint64_t epoch = 0;
    std::vector<int32_t> listed;  // [num_kv_heads]
  };
  struct Sequence {
    std::vector<Stream> streams;  // [num_streams]
    int32_t num_logical = 0;      // tokens reserved so far, evicted ones included
    int32_t held_prompt = 0;      // prompt tokens held at full precision until computed; 0 once released
    uint64_t epoch = 0;           // table_epoch
    mutable std::vector<GroupTable> group_tables = {};  // [num_layers], brought up to date by make_view
  };
  // Pages one stream takes for `num_new_tokens` more tokens once the pending flush has run.
  struct StepPages {
    int64_t residual = 0;
    int64_t quantized = 0;
  };

  class Snapshot;  // a sequence taken out, owning its pages

  KiviCacheManager(const KvLayout& layout, std::unique_ptr<PageStorage> storage, bool hold_prompts);
  Sequence& sequence(int32_t seq);
  const Sequence& sequence(int32_t seq) const;
  Sequence new_sequence(int32_t held_prompt) const;
  StepPages step_pages(const Stream& stream, int32_t num_new_tokens) const;
  // Key groups a stream's window has quantized or will once its held tokens flush.
  int64_t planned_key_groups(const KiviResidualWindow& window) const;
  // Unless the prompt is held: quantizes what the last reserved step flushes and returns the window's pages it slid
  // past to the pool.
  void flush(Sequence& s);
  // The same for one stream.
  void flush(Stream& stream);
  // Whether the stream has quantized tokens, or will once its reserved step flushes.
  static bool has_quantized(const Stream& stream);
  // Pages a stream of `num_tokens` tokens holds for its window at its fullest: KvLayout::pages_per_stream less its
  // key groups.
  static int64_t window_pages(const KvLayout& layout, int64_t num_tokens);
  // Checks one eviction of `s` against the stream it names (nothing changes).
  Status check_eviction(const Sequence& s, const StreamEviction& e) const;
  // Drops the sealed groups `kept` leaves out of a flushed stream (check_eviction passed).
  void drop_sealed_groups(Stream& stream, std::span<const int32_t> kept);
  static void release_pages(BlockPool& pool, Sequence& s);
  static int64_t pages_of(const Sequence& s);
  // Layer `layer` of `sequences`: their group tables, and the window lists and counts in the scratch tables, with
  // q_indptr_ for their new rows.
  AttentionView make_view(int layer, const std::vector<const Sequence*>& sequences);
  // s.group_tables[layer], brought up to date with the streams' lists.
  const GroupTable& group_table(const Sequence& s, int layer) const;
  // The pool and its geometry as a KIVI view of no sequences (what the flush's quantization reads).
  AttentionView pool_view() const;

  BlockPool pool_;
  KiviPageLayout page_layout_;
  int32_t residual_page_tokens_;
  bool hold_prompts_;
  std::unordered_map<int32_t, Sequence> sequences_;
  // Scratch of make_view: the window lists and counts its view points into, rebuilt by each call.
  std::vector<int32_t> q_indptr_;
  std::vector<int32_t> tables_;
  std::vector<SeqKvView> seq_views_;
  std::vector<KiviSeqView> kivi_views_;
  std::vector<const Sequence*> view_sequences_;
  // Scratch of flush: the window rows a sequence's streams quantize, as quantize_kivi_rows lists them.
  struct FlushRows {
    std::vector<int32_t> key_pages, value_pages, value_slots;
    std::vector<int64_t> key_rows, value_rows;
    void clear() { key_pages.clear(), value_pages.clear(), value_slots.clear(), key_rows.clear(), value_rows.clear(); }
    KiviFlushRows rows() const { return {key_pages, key_rows, value_pages, value_slots, value_rows}; }
  };
  FlushRows flush_rows_;
  std::vector<uint8_t> listed_;                // scratch of evict_streams: which streams an eviction names
  std::vector<StreamCompaction> compactions_;  // scratch of evict_streams: the kept rows each window moves down
};

}  // namespace se
