// CPU reference implementations of backend/ops.h (fp32 accumulation, OpenMP across rows/heads, OpenBLAS for
// GEMM). Same names and contracts as the public ops; callers go through ops.h, which checks shapes.
#pragma once

#include "backend/ops.h"

namespace se::cpu {

void embedding(TensorView out, TensorView table, TensorView ids);
void vocab_shard_embedding(TensorView out, TensorView table, TensorView ids, int64_t first_row);
void rms_norm(TensorView out, TensorView x, TensorView weight, float eps);
void add_rms_norm(TensorView out, TensorView residual, TensorView x, TensorView weight, float eps);
void linear(TensorView out, TensorView x, TensorView w, const TensorView* bias);
void linear_add(TensorView out, TensorView x, TensorView w);
void rope(TensorView x, TensorView positions, const RopeParams& params);
void split_qkv_rope(TensorView q, TensorView k, TensorView v, TensorView qkv, TensorView positions,
                    const RopeParams& rope, const QkNorm* qk_norm);
void gated_activation(TensorView out, TensorView gate_up, Activation act);
void add_inplace(TensorView x, TensorView y);
void scale_inplace(TensorView x, float s);
void softcap_inplace(TensorView x, float cap);
void convert(TensorView dst, TensorView src);
void scatter_rows_to_bf16(TensorView src, std::span<const RowDestination> rows, int64_t dest_offset);
void argmax_rows(TensorView ids, TensorView logprobs, TensorView x);
void sample_rows(TensorView ids, TensorView logprobs, TensorView x, std::span<const RowSampling> rows);
void mask_refused_tokens(TensorView out, TensorView x, TensorView allowed);
void token_logprobs(TensorView logprobs, TensorView x, TensorView ids);
void attention(TensorView out, TensorView q, TensorView k, TensorView v, TensorView q_positions,
               TensorView k_positions, const AttentionParams& params);

void write_kv(const AttentionView& view, TensorView k, TensorView v);
void fp8_kv_scales(TensorView k_scales, TensorView v_scales, TensorView k, TensorView v);
void write_kivi_window(const AttentionView& view, TensorView k, TensorView v);
void quantize_kivi_rows(const AttentionView& pool, const KiviFlushRows& rows);
void paged_attention(TensorView out, TensorView q, const AttentionView& view, const AttentionParams& params);
void paged_attention_fp8(TensorView out, TensorView q, const AttentionView& view, const AttentionParams& params);
void paged_attention_kivi(TensorView out, TensorView q, const AttentionView& view, const AttentionParams& params);
// TurboQuant slots (attention_view.h, kTurboQuant): MSE keys are scored in the rotated domain (each query head
// rotated once), values decoded row by row.
void paged_attention_turboquant(TensorView out, TensorView q, const AttentionView& view, const AttentionParams& params);
void rope_latent_heads(TensorView out, TensorView x, TensorView positions, const RopeParams& rope,
                       const TensorView* norm_weight, float eps);
void absorb_latent_queries(TensorView q_latent, TensorView q, TensorView kv_b);
void paged_latent_attention(TensorView out, TensorView q_latent, const AttentionView& view, TensorView kv_b,
                            const AttentionParams& params);
// Low-rank latents: per (sequence, KV head) the visible keys are rebuilt once, then each query of the head's group
// scores them and sums the value latents; up_v expands each head's sum.
void paged_low_rank_attention(TensorView out, TensorView q, const AttentionView& view, const RopeParams& rope,
                              const AttentionParams& params);
void attention_scores(TensorView out, TensorView q, const AttentionView& view, int32_t slice,
                      const AttentionParams& params, ScoreReduce reduce);
void compact_kv(const AttentionView& pool, std::span<const StreamCompaction> streams);
void move_kv_rows(const AttentionView& pool, std::span<const KvRowMove> moves);
void gather_keys(TensorView out, const AttentionView& view, int32_t slice, int32_t first_slot);
void bidirectional_window_scores(TensorView out, TensorView queries, TensorView keys);
void group_max_attention_importance(TensorView out, TensorView queries, TensorView keys);
void key_redundancy(TensorView out, TensorView keys, float threshold);
void redundancy_aware_scores(TensorView out, TensorView importance, TensorView redundancy, int32_t kernel,
                             float lambda);
void token_lists_with_tail(TensorView lists, TensorView counts, TensorView tokens, const AttentionView& view,
                           int32_t slice, int32_t tail_begin);
void update_page_key_bounds(TensorView bounds, const AttentionView& view, int32_t max_new_tokens);
void update_key_group_bounds(TensorView bounds, const AttentionView& view, std::span<const int32_t> first_groups);
void page_key_bound_scores(TensorView out, TensorView q, TensorView bounds, const AttentionView& view, int32_t slice);
void select_pages_by_key_bounds(TensorView selected, TensorView num_selected, TensorView q, TensorView bounds,
                                const AttentionView& view, int32_t page_budget, int32_t max_pages_per_stream,
                                GroupReduce reduce);
void attention_logits_max_over_heads(TensorView out, TensorView q, const AttentionView& view, int32_t slice,
                                     float scale);
void subset_attention_max_scores(TensorView out, TensorView q, const AttentionView& view, int32_t slice,
                                 int32_t num_sink, int32_t begin, const AttentionParams& params);

// Inverse frequencies of `params` (rotary_dim / 2 values), scaling applied; shared with the CUDA backend.
void rope_inv_freq(const RopeParams& params, float* inv_freq);

}  // namespace se::cpu
