// The op set the model and (later) the sparse methods are written against. Every op takes non-owning
// TensorViews, checks shapes, and dispatches on the device of its output: the CPU reference lives in
// backend/cpu/ (fp32 accumulation), the CUDA twin in backend/cuda/ with the same signature.
// Ops never allocate their outputs; callers own every buffer. Thread-safety: ops on distinct outputs may run
// concurrently; the CPU ops parallelize internally with OpenMP.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "backend/attention_view.h"
#include "backend/op_id.h"
#include "tensor/tensor.h"

namespace se {

enum class RopeScaling : uint8_t { kNone, kLinear, kLlama3, kYarn };

// Rotary embedding parameters of one attention layer (NeoX / HF `rotate_half` layout: dim i pairs with
// i + rotary_dim/2).
struct RopeParams {
  float theta = 10000.0f;
  int rotary_dim = 0;  // <= head_dim; the rest of the head passes through unrotated
  RopeScaling scaling = RopeScaling::kNone;
  float factor = 1.0f;                  // linear, llama3 and yarn
  float low_freq_factor = 1.0f;         // llama3
  float high_freq_factor = 4.0f;        // llama3
  int original_max_position = 8192;     // llama3 and yarn: the context the model was trained at
  float beta_fast = 32.0f;              // yarn: rotations per context above which a frequency is kept
  float beta_slow = 1.0f;               // yarn: rotations below which it is divided by `factor`
  bool truncate = true;                 // yarn: the band between them rounded outward to whole dimensions
  float attention_factor = 1.0f;        // yarn: cos and sin scaled by it (so q . k by its square)
};

enum class Activation : uint8_t { kSilu, kGeluTanh };

// out[t] = table[ids[t]]; table [vocab, dim] of F32/F16/BF16, out [T, dim] F32, ids [T] I32.
void embedding(TensorView out, TensorView table, TensorView ids);
// The lookup into one rank's part of a vocabulary split over tensor-parallel ranks: table [rows, dim] holds
// vocabulary rows [first_row, first_row + rows); out[t] = table[ids[t] - first_row] for ids in that range, zeros
// for the others (another rank's rows), so the sum over ranks is the whole table's lookup. Types as embedding.
void vocab_shard_embedding(TensorView out, TensorView table, TensorView ids, int64_t first_row);

// out = x * rsqrt(mean(x^2) + eps) * weight, per row; x, out [rows, dim] F32, weight [dim]. out may alias x.
void rms_norm(TensorView out, TensorView x, TensorView weight, float eps);

// residual += x, then out = rms_norm(residual); the fused pre-norm step of a decoder block.
void add_rms_norm(TensorView out, TensorView residual, TensorView x, TensorView weight, float eps);

// out[M, N] = x[M, K] @ w[N, K]^T (+ bias[N]); w F32 (CPU). The linear layer of every projection.
void linear(TensorView out, TensorView x, TensorView w, const TensorView* bias = nullptr);
// out[M, N] += x[M, K] @ w[N, K]^T: a projection whose result joins the residual stream (o_proj, down_proj), with
// the addition in the GEMM (cuBLASLt's beta = 1) instead of a pass of its own. out F32.
void linear_add(TensorView out, TensorView x, TensorView w);

// x [T, heads, head_dim] rotated in place at positions[T] (I32).
void rope(TensorView x, TensorView positions, const RopeParams& params);

// The per-head RMS norm some models apply to q and k before RoPE (Qwen3, Gemma 3): weights of head_dim elements.
struct QkNorm {
  TensorView q_weight;
  TensorView k_weight;
  float eps = 1e-6f;
};

// The attention inputs from the fused projection qkv [T, (Hq + 2 Hk) * head_dim] (columns q | k | v): q [T, Hq,
// head_dim], k and v [T, Hk, head_dim] take their columns, then q and k are RMS-normed per head (when `qk_norm` is
// given) and rotated at positions[T]. What a split, two norms and rope would do in turn, in one pass (one launch on
// the GPU). q, k, v and qkv share a dtype.
void split_qkv_rope(TensorView q, TensorView k, TensorView v, TensorView qkv, TensorView positions,
                    const RopeParams& rope, const QkNorm* qk_norm = nullptr);

// out[T, F] = act(gate) * up, where gate_up is [T, 2F] with the gate in the first F columns.
void gated_activation(TensorView out, TensorView gate_up, Activation act);

// x += y (same shape, F32).
void add_inplace(TensorView x, TensorView y);
// x *= s.
void scale_inplace(TensorView x, float s);
// x = cap * tanh(x / cap).
void softcap_inplace(TensorView x, float cap);

// dst = src element by element in dst's dtype: F32 and BF16 either way (to BF16 rounded to nearest-even as
// f32_to_bf16 rounds: the same bits on both backends for every value but NaN, whose payload each backend picks), the
// same number of elements on one device.
void convert(TensorView dst, TensorView src);

// Where scatter_rows_to_bf16 puts one row: row `source_row` of the source goes to `dest`, room for a row of BF16
// values in memory of the source's device.
struct RowDestination {
  int64_t source_row = 0;
  void* dest = nullptr;
};
static_assert(sizeof(RowDestination) == 2 * sizeof(int64_t), "a RowDestination is one row of an [n, 2] I64 table");

// Copies rows of src [rows, ...] F32 (a row: the elements of one index of its first dimension) to their
// destinations, rounded to bf16 as convert rounds: any number of rows into any buffers of src's device in one call.
// `rows` [n, 2] I64 holds n RowDestination entries where src lives, and each row goes to its entry's dest plus
// `dest_offset` bf16 elements. On CUDA one launch reads the table on the device, so a step captured as a CUDA graph
// replays over whatever the table holds at the replay (only the CPU twin can check the entries). No two
// destinations overlap, nor does one overlap src.
void scatter_rows_to_bf16(TensorView src, TensorView rows, int64_t dest_offset);

// Greedy sampling without bringing the logits to the host: ids[r] = the index of the largest element of row r
// of x (the lowest such index on a tie) and logprobs[r] = its log-softmax, -log(sum_i exp(x[r, i] - max)).
// x [rows, width] F32 (BF16 too on CUDA); ids [rows] I32; logprobs [rows] F32.
void argmax_rows(TensorView ids, TensorView logprobs, TensorView x);

// Constrained decoding on the device. mask_refused_tokens: out[r, i] = x[r, i] where bit i % 64 of
// allowed[r, i / 64] is set, else -inf. token_logprobs: logprobs[r] = the log-softmax of row r of x at ids[r],
// x[r, ids[r]] - log(sum_i exp(x[r, i])), so a token sampled from a masked row reports the model's logprob.
// x, out [rows, width] F32 (BF16 too on CUDA, out as x); allowed [rows, ceil(width / 64)] I64; ids [rows] I32
// (each in [0, width)); logprobs [rows] F32.
void mask_refused_tokens(TensorView out, TensorView x, TensorView allowed);
void token_logprobs(TensorView logprobs, TensorView x, TensorView ids);

// One row's sampling settings for sample_rows, applied in vLLM's order: temperature > 0 scales the logits, min-p
// and top-k keep a prefix of the tokens sorted by logit (descending, the lower id first on a tie), top-p keeps the
// smallest prefix of that whose renormalized mass reaches top_p. `u` in [0, 1) is the row's uniform draw: the
// sampled token is the first of the kept prefix whose cumulative mass exceeds u times the kept mass, so the same
// draw picks the same token on every backend.
struct RowSampling {
  float temperature = 1.0f;
  int32_t top_k = 0;  // <= 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  double u = 0.0;
};

// Random sampling without bringing the logits to the host: ids[r] = the token row r of x samples under rows[r],
// logprobs[r] = its log-softmax under the unscaled logits. x [rows, width] F32 (BF16 too on CUDA); ids [rows]
// I32; logprobs [rows] F32; rows.size() == x's rows, each validated (temperature > 0, top_p in (0, 1], min_p in
// [0, 1], u in [0, 1)).
void sample_rows(TensorView ids, TensorView logprobs, TensorView x, std::span<const RowSampling> rows);

struct AttentionParams {
  float scale = 1.0f;           // multiplies q.k
  float logit_softcap = 0.0f;   // 0 = off
  int sliding_window = 0;       // 0 = full; else a key at position p is visible to query q iff q - p < window
};

// Causal attention of T new queries against a contiguous cache of S keys.
// q [T, H, D]; k, v [S, Hkv, D]; q_positions [T] I32 and k_positions [S] I32 are absolute positions
// (a key is visible iff its position <= the query's); out [T, H, D]. GQA: head h reads KV head h / (H/Hkv).
void attention(TensorView out, TensorView q, TensorView k, TensorView v, TensorView q_positions,
               TensorView k_positions, const AttentionParams& params);

// Writes the batch's new keys and values into the pages of `view`: for each sequence s with n query rows, row r
// goes to physical slot num_tokens[h] - n + r of every KV head h (the slots the cache appended for this step).
// k, v [T, Hkv, D] F32. A kSharedLatent or kLowRankLatent view takes the latent rows as k and has no V half: v is
// not read (on CUDA the shared latent's rows only, into bf16 pages). An FP8 view stores each element as
// fp8_quantize does, the same bytes on both backends (on CUDA the scales are device memory, k and v F32 or BF16). A
// KIVI view (attention_view.h, kKivi) takes the rows into each stream's full-precision window: row r at window slot
// residual.num_tokens[h] - n + r, counted from residual_first_slot[h] of the stream's residual page list (the new
// tokens are the last of its window).
void write_kv(const AttentionView& view, TensorView k, TensorView v);

// What one KIVI flush quantizes (KiviCacheManager): rows of the residual window, numbered page * page_size + slot over
// the pool's residual pages, into the quantized pages of attention_view.h's kKivi layout.
struct KiviFlushRows {
  // Key group g: the K rows key_rows[g * group_size + t] (t < group_size, token order), one code per channel under
  // each channel's scale and minimum over the group, into quantized page key_pages[g].
  std::span<const int32_t> key_pages;
  std::span<const int64_t> key_rows;
  // Value i: the V row value_rows[i], groups of value_group_size channels, into token slot value_slots[i] of quantized
  // page value_pages[i].
  std::span<const int32_t> value_pages;
  std::span<const int32_t> value_slots;
  std::span<const int64_t> value_rows;
};

// Quantizes `rows` as kivi_quantize_row does (backend/quant/kivi_quant.h): the same codes, scales and minima on both
// backends for the same row values. `pool` is a KIVI view of the pool (its residual geometry and `quantized`
// fields; its sequences are not read): f32 rows on the CPU, bf16 rows on CUDA, where the job lists travel from host
// memory and the call only enqueues.
void quantize_kivi_rows(const AttentionView& pool, const KiviFlushRows& rows);

// The FP8 store's scales from a batch's new rows, per KV head as vLLM's calculate_kv_scales computes them over a
// layer: k_scales[h] = max|K[:, h, :]| / 200 and v_scales[h] = max|V[:, h, :]| / 100, 1.0 where the maximum is 0
// (fp8_kv.h). k, v [T, Hkv, D], T > 0; k_scales, v_scales [Hkv] F32 where k lives. On the CPU k and v are F32; on
// CUDA F32 or BF16, reduced on the device (bit-identical scales: a maximum is exact, the division IEEE).
void fp8_kv_scales(TensorView k_scales, TensorView v_scales, TensorView k, TensorView v);

// Causal attention of every sequence's new queries against its paged KV (see attention_view.h), narrowed to
// the view's selection when it has one. q, out [T, H, D] F32; GQA: head h reads KV head h / (H / Hkv).
// Explicit pages, and quantized ones (kQuantized: FP8 e4m3, KIVI or TurboQuant, decoded row by row as they are read;
// a selection over FP8 and KIVI pages on the CPU, a KIVI page being a key group: selection_page_tokens). The
// quantized variants are the ops "paged_attention over fp8 pages", "... over kivi pages" and "... over turboquant
// pages" for cuda_implements: FP8 and KIVI pages are read on CUDA too (device tables, an FP8 view's scales on the
// device, bf16 or f32 q and out, as for explicit pages); TurboQuant's are CPU only, so a CUDA tensor or pool gets a
// "not implemented" error.
void paged_attention(TensorView out, TensorView q, const AttentionView& view, const AttentionParams& params);

// Multi-head latent attention (MLA) with the weights absorbed, as FlashMLA computes it. W_uk[h] and W_uv[h] are head
// h's k_nope rows [qk_nope, rank] and v rows [v_head, rank] of kv_b [heads * (qk_nope + v_head), rank], as the
// checkpoint stores it.
// rope_latent_heads readies the layer's projections: each head of x [T, H, P + R] as a DeepSeek checkpoint's
// projections give it (P values, then a RoPE part of R values whose pairs are interleaved: (x0, x1), (x2, x3), ...)
// goes to out [T, H, P + R] as the P values, RMS-normed by norm_weight [P] when it is given (the KV latent), then the
// RoPE part moved to the rotate-half layout rope() turns (pair i is (i, i + R / 2): the same pairs at the same
// frequencies, so q . k is unchanged) and rotated at positions[T] (I32) by `rope` (rotary_dim = R). The queries
// [q_nope ; q_rope] and the store's rows [c ; k_rope] both come out of it. out may alias x. x, out F32 (out BF16
// too on CUDA).
void rope_latent_heads(TensorView out, TensorView x, TensorView positions, const RopeParams& rope,
                       const TensorView* norm_weight = nullptr, float eps = 0.0f);
// absorb_latent_queries takes each head's query q[t, h] = [q_nope ; q_rope] (rope_latent_heads' output, q_rope
// rotated) into latent space: q_latent[t, h] = [W_uk[h]^T q_nope ; q_rope], so that q_latent . [c_j ; k_rope_j] is
// the logit q . k_j of the expanded key k_j = [W_uk[h] c_j ; k_rope_j] (unscaled). These are the queries a method
// scores the latent store with. q [T, H, qk_nope + qk_rope], q_latent [T, H, rank + qk_rope] F32 (CUDA: kv_b as the
// weights are stored, bf16).
void absorb_latent_queries(TensorView q_latent, TensorView q, TensorView kv_b);
// paged_latent_attention attends over a kSharedLatent store (attention_view.h) with those queries: the logits are
// scale * q_latent . [c_j ; k_rope_j], the softmax-weighted latents sum to o = sum_j p_j c_j, and out[h] =
// W_uv[h] o. Equal to attention over the expanded keys and values W_uv[h] c_j, which it never materializes.
// Causality, sliding window and selection as paged_attention. q_latent [T, H, view.head_dim], out [T, H, v_head]
// F32 on the CPU; on CUDA bf16 pages and device tables, q_latent and out F32 or BF16, kv_b bf16.
void paged_latent_attention(TensorView out, TensorView q_latent, const AttentionView& view, TensorView kv_b,
                            const AttentionParams& params);

// Attention over a kLowRankLatent store (attention_view.h) in one pass: each visible key of KV head i of
// group g is rebuilt from its latent (up_k, k_bias, k_norm), rotated by `rope` at its slot, which is its position,
// and scored as scale * q . k (soft-capped when set); the softmax weights sum the value latents, and each head's
// output is up_v applied to that sum plus v_bias. Causality and the sliding window as paged_attention; no
// selection. q, out [T, H, D] F32 (D = view.latent.kv_head_dim, H a multiple of the KV heads); pool, tables and
// factors where q lives (the CUDA twin: host tables are not read, bf16 pages).
void paged_low_rank_attention(TensorView out, TensorView q, const AttentionView& view, const RopeParams& rope,
                              const AttentionParams& params);

// --- what the sparse methods read and change (sparse/methods/) ---
// The methods run on the host and pass the cache's host view: q_indptr, seqs and the tables they point to are host
// memory on both backends, and view.kv_device says where the pool is. With a CUDA pool (bf16 pages; FP8 codes for
// attention_scores, compact_kv and move_kv_rows, as on the CPU; a KIVI view for attention_scores while the scored
// sequence's tokens are all in its window) the scoring and compaction ops run on the GPU: q (and page key bounds) are
// device tensors, and the scores' `out` stays host F32 memory, filled when the call returns.

enum class ScoreReduce : uint8_t { kSum, kMax };
enum class ScoresReady : uint8_t { kOnReturn, kAfterSynchronize };

// Attention probabilities of the last n = q.shape[0] query positions of sequence `slice` of `view` against its
// stored keys, reduced over those rows: out[h, j] = reduce_r softmax_r(q[r, h] . k_j * scale)[j]. Row r sees the
// keys paged_attention would show it (key j <= len - n + r, sliding window, selection); keys a row does not see
// add 0 (over TurboQuant pages, on the CPU, q . k_j is the logit paged_attention reads there: turboquant_rows.h).
// The softmax runs in fp32 over each row's visible keys. q [n, H, D]; out [H, max_len] F32, where
// max_len = the longest KV head of the sequence; columns past a head's own length are 0. `out` is host memory;
// with kAfterSynchronize it must be staging memory (staging_allocator of the pool's device) and holds the result
// once synchronize(device) returns: the call only enqueues, so a method that reads every layer's scores once per
// step waits once, not once per layer.
void attention_scores(TensorView out, TensorView q, const AttentionView& view, int32_t slice,
                      const AttentionParams& params, ScoreReduce reduce, ScoresReady ready = ScoresReady::kOnReturn);

// One stream of a compaction: its page list and the strictly ascending indices of the tokens it keeps.
struct StreamCompaction {
  const int32_t* pages = nullptr;
  std::span<const int32_t> kept;
};

// Physical eviction in place, over any number of streams of one pool in one call: token kept[i] of each stream
// moves to its slot i (strictly ascending, so no token is overwritten before it moves). `pool` gives the pool and
// its page geometry (its sequences are not read); the streams share no page. The caller then shortens each
// stream to its kept.size() tokens.
void compact_kv(const AttentionView& pool, std::span<const StreamCompaction> streams);

// One K/V row copied inside a pool: the token in slot `source_offset` of page `source_page` overwrites slot
// `dest_offset` of page `dest_page`.
struct KvRowMove {
  int32_t source_page = 0;
  int32_t source_offset = 0;
  int32_t dest_page = 0;
  int32_t dest_offset = 0;
};

// Copies the K and V row of every move, any number of them in one call. No two moves share a destination and no
// destination is another move's source, so the copies may run in any order. What eviction that refills the
// evicted slot with a stream's last token uses: one row per stream, where compact_kv moves every later slot.
void move_kv_rows(const AttentionView& pool, std::span<const KvRowMove> moves);

// Copies the keys of slots [first_slot, first_slot + n) of every KV head of sequence `slice` of `view` into
// out [n, num_kv_heads, head_dim] F32 where the pool lives, in slot order: what the decode-time compression scores
// read (key similarity, attention among the window's own tokens). Host tables over an f32 pool on the host or a
// bf16 pool on the device.
void gather_keys(TensorView out, const AttentionView& view, int32_t slice, int32_t first_slot);

// Decode-time compression scores over gathered keys (gather_keys' layout). queries [R, H, D] F32: R query rows,
// post-RoPE; keys [n, Hkv, D] F32 (H = G * Hkv); out [Hkv, n] F32; all three on one device. Logits are
// q . k / sqrt(D), accumulated in double; no mask, no softcap. The CUDA twins differ from the CPU only in
// summation order.
// Mask-free window scoring: out[h, j] = mean over the R rows and the G query heads of KV head h of
// softmax over j < n (each row and query head its own).
void bidirectional_window_scores(TensorView out, TensorView queries, TensorView keys);
// Attention importance with the group's logits pooled before the softmax: out[h, j] = mean over the R rows of
// softmax over j < n of max over the G query heads of KV head h of the logit.
void group_max_attention_importance(TensorView out, TensorView queries, TensorView keys);
// Key-similarity redundancy of T keys per KV head: S = cosine similarities of the unit keys k / (|k| + 1e-8),
// diagonal 0; in each row i the largest j with S[i, j] > threshold (j = 0 when there is none) is set to 0;
// out[h, j] = softmax over j of the mean over i of S[i, j]. keys [T, Hkv, D] F32; out [Hkv, T] F32.
void key_redundancy(TensorView out, TensorView keys, float threshold);
// R-KV's final scores from the two above: out[h, j] = lambda * max over i in [j - kernel / 2, j + kernel / 2] of
// importance[h, i] (i < m only: -inf padding) - (1 - lambda) * redundancy[h, j], j < m. importance [Hkv, m] and
// redundancy [Hkv, T] (m <= T: the redundancy of the m oldest keys) F32, out [Hkv, m] F32, one device; kernel odd.
// Float arithmetic: the twins differ at most where a compiler fuses the multiply and the subtraction.
void redundancy_aware_scores(TensorView out, TensorView importance, TensorView redundancy, int32_t kernel,
                             float lambda);

// Page key bounds (query-aware page selection): bounds [num_pool_pages, 2, D], of the pool's dtype (so exact), holds
// per page the elementwise min (row 0) and max (row 1) of the keys it stores. Over FP8 pages (CPU only) the bounds are
// F32 and bound the keys as attention decodes them (code x the KV head's scale). Recomputes them for every page that
// received one of the batch's new tokens (the last n slots of each sequence's streams), n <= max_new_tokens. The view's
// tables may live on the host or where the pool lives (the CUDA twin then reads them as they are; max_new_tokens sizes
// its launch).
void update_page_key_bounds(TensorView bounds, const AttentionView& view, int32_t max_new_tokens);
// The same op over a KIVI view (CPU, host tables, f32 bounds): a KIVI stream's page is its key group, and the bounds
// of each quantized group g in [first_groups[s * num_kv_heads + h], num_quantized_keys[h] / group_size) of sequence s,
// KV head h are written at its quantized page's id, per channel the decoded smallest and largest code the group holds
// (equal to the bounds of its decoded keys). A group's codes never change once written, so each is bounded once;
// the window's keys are bounded from their rows where the pages are scored (page_key_bound_scores).
void update_key_group_bounds(TensorView bounds, const AttentionView& view, std::span<const int32_t> first_groups);

// Upper bounds of q . k over each page of sequence `slice` (page selection): out[h, p] = sum_d max(q[h,d] * min[p,d],
// q[h,d] * max[p,d]) for query head h and page p of h's KV head (selection_page_tokens per page; over KIVI the
// window's pages are bounded from their full-precision rows here). q [H, D] (one query row); out [H, max_pages]
// F32, where max_pages = the most pages of any KV head of the sequence; entries past a head's pages are -inf.
// Host tables.
void page_key_bound_scores(TensorView out, TensorView q, TensorView bounds, const AttentionView& view, int32_t slice);

// How a KV head reduces its query group's per-head scores: mean, max or sum over the group.
enum class GroupReduce : uint8_t { kMean, kMax, kSum };

// The key-bound page choice for every sequence of `view` from its last query row, without a round trip to the host:
// per sequence s and KV head h, the pages of h's stream but the last are ranked by page_key_bound_scores reduced
// over h's query group (`reduce`); the best (page_budget - 1) of them (the lower page first on a tie) and the
// last page go to selected[s, h] in ascending order, with num_selected[s, h] = page_budget. A stream of at most
// page_budget pages lists all its pages; a sequence without query rows gets empty lists. q [T, H, D] holds the
// batch's query rows; selected [num_seqs, num_kv_heads, >= page_budget] and num_selected [num_seqs, num_kv_heads]
// I32 live where the pool lives (the device on CUDA), as do the bounds. max_pages_per_stream must cover every
// stream whose lists the caller reads (longer ones are ranked only up to it): it is the stride of the ranking's
// scratch, which a caller that replays the step (a CUDA graph) keeps fixed. The tables may live on the host or
// where the pool lives, as for update_page_key_bounds.
void select_pages_by_key_bounds(TensorView selected, TensorView num_selected, TensorView q, TensorView bounds,
                                const AttentionView& view, int32_t page_budget, int32_t max_pages_per_stream,
                                GroupReduce reduce);

// Raw attention logits of one query row against a sequence's leading keys, reduced by max over every query head
// (a filter layer's "last" token filter): out[j] = max_h scale * q[h] . k_j, where k_j is token j of head h's KV head
// stream. No softmax, no softcap, no causal mask or selection: the caller names the keys, the first
// num_keys = out.shape[0] stored tokens, which every KV head of the sequence must hold. q [H, D]; out [num_keys] F32.
void attention_logits_max_over_heads(TensorView out, TensorView q, const AttentionView& view, int32_t slice,
                                     float scale);

// The k = out_tokens.shape[0] tokens of the first num_keys of sequence `slice` with the largest
// attention_logits_max_over_heads, as ascending token indices, ties going to the lower index (top_k_ascending,
// base/top_k.h): the filter layers' token index, ranked where the pool lives and left there (out_tokens I32 on the
// pool's device), so the step never waits for it. k <= num_keys; host tables.
void top_keys_by_logits_max_over_heads(TensorView out_tokens, TensorView q, const AttentionView& view, int32_t slice,
                                       int32_t num_keys, float scale);

// Selection lists that share one token index and add each stream's tail (the layers after a filter layer): for every KV
// head h of sequence `slice`, lists[h] = the k = tokens.shape[0] ascending `tokens` (all below tail_begin), then
// tail_begin, tail_begin + 1, ... up to the stream's length; counts[h] their number. tokens I32 [k], lists I32
// [num_kv_heads, stride >= k + the longest tail], counts I32 [num_kv_heads], all where the pool lives; host tables.
void token_lists_with_tail(TensorView lists, TensorView counts, TensorView tokens, const AttentionView& view,
                           int32_t slice, int32_t tail_begin);

// Attention probabilities of the last n = q.shape[0] query rows of sequence `slice` over a subset of its keys,
// reduced by max over each KV head's query group and the rows (context-reconstruction scoring). Row r of query
// head h takes its softmax over only these keys of its KV head's stream: the stored tokens [0, num_sink) and
// [begin, begin + m) and the n new tokens up to its own (the last n of the stream; causal). Then
// out[kvh, j] = max over the group's heads and the rows of the probability of token begin + j. Logits are
// scale * q.k (softcapped if set); no sliding window, no selection. Every KV head must hold >= begin + m + n
// tokens, num_sink <= begin. q [n, H, D]; out [Hkv, m] F32.
void subset_attention_max_scores(TensorView out, TensorView q, const AttentionView& view, int32_t slice,
                                 int32_t num_sink, int32_t begin, const AttentionParams& params);

}  // namespace se
