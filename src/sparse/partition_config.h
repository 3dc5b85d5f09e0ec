// PartitionConfig: how Spin's partitions (partitioned_decode.h) run a method's decode over KV on the host tier: its
// selection (pages ranked by key bounds, with a budget and group reduction, token filters, or the method's own
// tokens) and the buffer each request keeps resident. A method offers its part (MethodRuntime::partition_config); the
// engine adds the buffer.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "backend/ops.h"
#include "sparse/quest_two_level_index.h"

namespace se {

enum class PartitionBuffer : uint8_t { kElastic, kFixed };

// A token selection at filter layers (a method in sparse/methods/ offers it): at a decode step a filter layer reads its
// layer whole and keeps the prompt tokens its last query row scores highest over every query head
// (top_keys_by_logits_max_over_heads); the sparse layers after it read those tokens and the decode tail
// (token_lists_with_tail), so Retrieve brings in only the pages they lie in. The prompt is what the sequence's
// prefill steps computed.
struct TokenFilters {
  std::vector<uint8_t> is_filter;  // [num_layers]
  std::vector<int32_t> sources;    // [num_layers] the filter layer whose tokens a sparse layer reads; -1 for others
  int32_t num_kept_tokens = 0;     // prompt tokens a filter keeps (the whole prompt when it is no longer)
};

// A token selection the method makes itself (chunks chosen over a sketch it keeps): at a decode step the method names
// each KV head's tokens (its build_decode_selection over the sequence's resident view; the tokens are known before a
// page is read) and the partitions retrieve only the pages they lie in, then attend over those tokens; a layer the
// method leaves unselected reads whole. After each prefill chunk the method sees the sequence's layer whole and
// resident (its on_attention_end, over that one sequence), so it may sketch the prompt there and rewrite its pages.
// The method keeps what it selects with (its sketch) itself, beside the pool, and no page bounds are kept.
struct MethodTokens {
  // A KV head's prompt tokens a step reads are at most max_chunks chunks of chunk_size tokens, each starting at a
  // multiple of chunk_size; the decode tail comes on top.
  int32_t chunk_size = 1;
  int32_t max_chunks = 0;

  // The pages of `page_size` tokens those chunks lie in at most.
  int32_t max_prompt_pages(int32_t page_size) const {
    const int32_t per_chunk = page_size % chunk_size == 0   ? 1
                              : chunk_size % page_size == 0 ? chunk_size / page_size
                                                            : (chunk_size + page_size - 2) / page_size + 1;
    return max_chunks * per_chunk;
  }
};

struct PartitionConfig {
  int32_t token_budget = 2048;  // tokens a KV head reads per step, last page included
  GroupReduce gqa_agg = GroupReduce::kMean;
  PartitionBuffer buffer = PartitionBuffer::kElastic;
  int32_t buffer_factor = 5;       // kElastic: resident pages per mandatory page
  int64_t fixed_buffer_pages = 0;  // kFixed: resident pages per request
  // Set: Select ranks page groups by their summaries first, then the pages of the kept groups
  // (quest_two_level_index.h), on the host.
  std::optional<TwoLevelConfig> two_level;
  int32_t dense_layers = 0;  // leading layers a decode step reads whole
  // Set: the token selection in place of ranked pages (token_budget then bounds the pages its kept tokens lie
  // in, one per token at most).
  std::optional<TokenFilters> token_filters;
  // Set: the method's own token selection (token_budget then bounds the pages its chunks lie in, max_prompt_pages).
  std::optional<MethodTokens> method_tokens;
  // What the method keeps beside the pool per page of a sequence (MethodRuntime::state_bytes_per_page): the device
  // holds pages' worth of it for every running sequence, as it does for the index.
  int64_t state_bytes_per_page = 0;
};

}  // namespace se
