// CUDA implementations of backend/ops.h (sm_90): same names and contracts as se::cpu, enqueued on
// CudaContext::current()'s stream and asynchronous to the host. Callers go through ops.h, which
// checks shapes and dtypes. All tensors live on the device. Activations are F32 or BF16 (each
// tensor may differ; math is fp32); linear takes BF16 x and w (F32 or BF16 out, fp32 accumulation)
// or all-F32; KV pages are BF16 (FP8 codes too where write_kv and paged_attention say so).
// AttentionView pointers (q_indptr, seqs and the page lists, counts and selections they point to)
// are device pointers, and every sequence of a view has at least one query row, except for the
// sparse methods' scoring ops at the end. Plain C++ header (no CUDA includes): ops.cpp includes it.
#pragma once

#include "backend/ops.h"

namespace se::cuda {

void embedding(TensorView out, TensorView table, TensorView ids);
void vocab_shard_embedding(TensorView out, TensorView table, TensorView ids, int64_t first_row);
void rms_norm(TensorView out, TensorView x, TensorView weight, float eps);
void add_rms_norm(TensorView out, TensorView residual, TensorView x, TensorView weight, float eps);
// cuBLASLt; plans (descriptors + algorithm) cached per shape, dtypes and alignment; one shared
// workspace.
void linear(TensorView out, TensorView x, TensorView w, const TensorView* bias);
void linear_add(TensorView out, TensorView x, TensorView w);
// One warp per (token, head), the head in registers: rope is split_qkv_rope's kernel run in place.
void rope(TensorView x, TensorView positions, const RopeParams& params);
void split_qkv_rope(TensorView q, TensorView k, TensorView v, TensorView qkv, TensorView positions,
                    const RopeParams& rope, const QkNorm* qk_norm);
void gated_activation(TensorView out, TensorView gate_up, Activation act);
void add_inplace(TensorView x, TensorView y);
void scale_inplace(TensorView x, float s);
void softcap_inplace(TensorView x, float cap);
void convert(TensorView dst, TensorView src);
// One block per row, the destinations staged from host memory; enqueued only.
void scatter_rows_to_bf16(TensorView src, TensorView rows, int64_t dest_offset);
// Two passes (chunks of each row, then one block per row merging the chunks: an online max and exp-sum);
// ties go to the lowest index, as on the CPU. The chunk states live in the context scratch.
void argmax_rows(TensorView ids, TensorView logprobs, TensorView x);
// A segmented radix sort of each row (stable, so ties keep the lower id first, as on the CPU), then one block
// per row walks the sorted prefix in fp64.
void sample_rows(TensorView ids, TensorView logprobs, TensorView x, std::span<const RowSampling> rows);
void mask_refused_tokens(TensorView out, TensorView x, TensorView allowed);
void token_logprobs(TensorView logprobs, TensorView x, TensorView ids);

// Explicit bf16 pages, or FP8 codes (the view's device scales).
void write_kv(const AttentionView& view, TensorView k, TensorView v);
// The KIVI store's writes (device tables): one block per batch row puts its K/V rows into each stream's bf16 window;
// a flush runs one block per key group (a thread per channel) and one per value row (a thread per value group), the
// job lists staged from host memory.
void write_kivi_window(const AttentionView& view, TensorView k, TensorView v);
void quantize_kivi_rows(const AttentionView& pool, const KiviFlushRows& rows);
// One block per (KV head, K or V) reduces the head's magnitudes over the batch's rows.
void fp8_kv_scales(TensorView k_scales, TensorView v_scales, TensorView k, TensorView v);
// Tensor-core (mma.sync bf16) tiled kernels: a decode kernel (query rows of one sequence x its GQA
// group per CTA, keys split across warps) and a prefill kernel (64 query vectors per CTA), split-KV
// with a combine pass when the batch alone cannot fill the GPU. head_dim 64, 128 or 256. With a
// selection (token or page unit) a CTA gathers only the selected keys it can see and splits those.
// Over FP8 pages (the view's device scales) and KIVI streams (group codes and a bf16 window) each tile is decoded to
// bf16 as it is gathered.
void paged_attention(TensorView out, TensorView q, const AttentionView& view,
                     const AttentionParams& params);
// The plain fp32 kernel (one warp per query row and KV head, keys one by one): slow, kept as the
// exact cross-check of the tiled kernels and as the benchmark's baseline. head_dim 64, 128 or 256.
void paged_attention_simple(TensorView out, TensorView q, const AttentionView& view,
                            const AttentionParams& params);

// Low-rank latents (attention_view.h, kLowRankLatent), device tables: one CTA per (query row, KV head), the group's
// query heads one warp each; each visible key is rebuilt (up_k, bias, k_norm, RoPE at its slot) once in shared
// memory for the warps, scored with an online softmax, and its value latent summed; up_v expands each warp's sum.
// fp32 math over bf16 pages. head_dim and both ranks up to 256.
void paged_low_rank_attention(TensorView out, TensorView q, const AttentionView& view, const RopeParams& rope,
                              const AttentionParams& params);

// Multi-head latent attention (latent_projections.cu, paged_latent_attention.cu). rope_latent_heads: one block
// per (token, head). absorb_latent_queries: a per-head GEMM with W_uk (bf16 kv_b, fp32 accumulation).
// paged_latent_attention over bf16 latent pages with device tables: CTAs of 16 query vectors of one sequence read
// each page once for all of them, split-KV with a combine pass, then a per-head GEMM with W_uv. Rows of at most
// 1024 values, a latent of at most 512.
void rope_latent_heads(TensorView out, TensorView x, TensorView positions, const RopeParams& rope,
                       const TensorView* norm_weight, float eps);
void absorb_latent_queries(TensorView q_latent, TensorView q, TensorView kv_b);
void paged_latent_attention(TensorView out, TensorView q_latent, const AttentionView& view, TensorView kv_b,
                            const AttentionParams& params);

// --- the sparse methods' ops: host tables over the device pool ---
// The methods run on the host and pass the cache's host view: q_indptr, seqs and the page lists,
// counts and selections they point to are HOST memory, while kv_base is the device bf16 pool. Each
// op packs the one sequence's tables it needs into the context's scratch (one copy, no allocation
// once the scratch has grown), then launches. q and bounds are device tensors; score outputs are
// HOST f32 memory, written before the call returns (it waits for the stream).

// Two passes over the keys (softmax max and sum per row and head, then the probabilities reduced
// over rows), fp32 throughout. head_dim 64, 128 or 256.
void attention_scores(TensorView out, TensorView q, const AttentionView& view, int32_t slice,
                      const AttentionParams& params, ScoreReduce reduce, ScoresReady ready);
// Gathers the moved rows of every stream into scratch, then scatters them to their slots (an in-place
// parallel move would race); bit-exact. Enqueued only: the call does not wait.
void compact_kv(const AttentionView& pool, std::span<const StreamCompaction> streams);
// One thread per 16-byte piece of every moved row; enqueued only.
void move_kv_rows(const AttentionView& pool, std::span<const KvRowMove> moves);
void subset_attention_max_scores(TensorView out, TensorView q, const AttentionView& view, int32_t slice,
                                 int32_t num_sink, int32_t begin, const AttentionParams& params);
void update_page_key_bounds(TensorView bounds, const AttentionView& view, int32_t max_new_tokens);
void page_key_bound_scores(TensorView out, TensorView q, TensorView bounds, const AttentionView& view, int32_t slice);
// The group-reduced bound scores of every sequence go to scratch; one block per (KV head, sequence) then
// radix-selects its top pages there.
void select_pages_by_key_bounds(TensorView selected, TensorView num_selected, TensorView q, TensorView bounds,
                                const AttentionView& view, int32_t page_budget, int32_t max_pages_per_stream,
                                GroupReduce reduce);
// head_dim 64, 128 or 256.
void attention_logits_max_over_heads(TensorView out, TensorView q, const AttentionView& view, int32_t slice,
                                     float scale);
// The logits stay on the device; one block radix-selects the k largest into out_tokens (device memory).
void top_keys_by_logits_max_over_heads(TensorView out_tokens, TensorView q, const AttentionView& view, int32_t slice,
                                       int32_t num_keys, float scale);
// The cache's host tables over the device pool (the page ids of the slots staged per KV head); out on the device.
void gather_keys(TensorView out, const AttentionView& view, int32_t slice, int32_t first_slot);
// Decode-time compression scores over device queries and keys, into device out: one block per softmax row (its
// max and sum), then one thread per (KV head, key) sums the row's probabilities; double accumulation.
void bidirectional_window_scores(TensorView out, TensorView queries, TensorView keys);
void group_max_attention_importance(TensorView out, TensorView queries, TensorView keys);
// Unit keys, then one block per row of S (its newest near-duplicate), one thread per (KV head, column) for the
// column sums, one block per KV head for the softmax.
void key_redundancy(TensorView out, TensorView keys, float threshold);
// One thread per (KV head, token).
void redundancy_aware_scores(TensorView out, TensorView importance, TensorView redundancy, int32_t kernel,
                             float lambda);
// One block per KV head; the stream lengths travel as kernel arguments.
void token_lists_with_tail(TensorView lists, TensorView counts, TensorView tokens, const AttentionView& view,
                           int32_t slice, int32_t tail_begin);

}  // namespace se::cuda
