// CacheManager: owns the KV state of every running sequence for one method: representation, layout, the
// position map, allocation, writes, eviction and freeing. It is the model's AttentionRunner (it stores each
// layer's new K/V and builds the AttentionView attention reads) and it answers the scheduler's memory
// questions (MemoryOracle). Sequences are named by the engine's slot ids. Engine thread only.
//
// Lifecycle of a sequence: open() (prefix reuse) -> per step reserve(n) before the forward, the forward's
// attend() calls, on_computed() after it -> close(). Only reserve/on_computed/close mutate cache state.
#pragma once

#include <cstdint>
#include <span>

#include "base/status.h"
#include "kv/kv_layout.h"
#include "model/attention_runner.h"

namespace se {

class CacheManager : public AttentionRunner {
 public:
  const KvLayout& layout() const { return layout_; }

  // --- MemoryOracle answers ---
  // Pages the pool holds in all.
  virtual int64_t num_total_pages() const = 0;
  // Pages free in the pool right now.
  virtual int64_t num_free_pages() const = 0;
  // Pages available now: free in the pool plus what the prefix cache could give back.
  virtual int64_t num_available_pages() const = 0;
  // Pages a sequence must newly take to compute `num_new_tokens` more tokens this step.
  virtual int64_t pages_to_reserve(int32_t seq, int32_t num_new_tokens) const = 0;
  // The most pages a request of `num_prompt_tokens` + `max_new_tokens` can ever hold at once, including
  // any transient peak before compression: a request over num_total_pages() can never run.
  virtual int64_t peak_pages(int32_t num_prompt_tokens, int32_t max_new_tokens) const = 0;

  // --- lifecycle ---
  // Starts sequence `seq` on `prompt`; returns how many leading prompt tokens are already cached (reused, not
  // recomputed). The sequence then holds those tokens.
  virtual Result<int32_t> open(int32_t seq, std::span<const int32_t> prompt) = 0;
  // Makes room for `num_new_tokens` more tokens of `seq` (its next forward writes them). All or nothing:
  // kResourceExhausted leaves everything unchanged.
  virtual Status reserve(int32_t seq, int32_t num_new_tokens) = 0;
  // After a forward: `tokens` are the sequence's first `num_computed` token ids, now in the cache.
  virtual void on_computed(int32_t seq, std::span<const int32_t> tokens, int32_t num_computed) = 0;
  // Releases the sequence (what it computed may stay behind in the prefix cache).
  virtual void close(int32_t seq) = 0;

  // Metrics of the prefix cache: prompt tokens looked up and found.
  virtual int64_t num_prefix_query_tokens() const = 0;
  virtual int64_t num_prefix_hit_tokens() const = 0;

  // Ok, or the first broken invariant of the pool, tables and caches.
  virtual Status check_integrity() const = 0;

 protected:
  explicit CacheManager(const KvLayout& layout) : layout_(layout) {}

 private:
  KvLayout layout_;
};

}  // namespace se
