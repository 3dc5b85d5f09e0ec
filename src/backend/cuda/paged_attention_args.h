// Internal to the CUDA paged-attention files: the by-value argument block of the tiled kernels and
// their launcher. A launch covers the sequences whose query-row count n satisfies min_rows < n <=
// max_rows, in tiles of rows_per_tile rows x the KV head's query group; grid = (tile bound,
// num_kv_heads * q_blocks, num_splits). With a selection (select_unit > 0) a tile walks the
// "logical" keys of its stream, the selected tokens in order (entry i of a page selection stands
// for select_unit = page_size logical keys); splits divide that logical range.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/attention_view.h"
#include "backend/quant/quantized_kv_layout.h"
#include "tensor/dtype.h"

namespace se::cuda {

// What a K/V page holds: bf16 rows, which the kernels copy into their tiles as they are, e4m3 codes (the FP8
// store), which the tiled kernel reads into registers and decodes into its bf16 tile with the KV head's scales, or a
// KIVI stream's group codes and bf16 window rows (kivi_kv_tile.cuh).
enum class KvPageCodes : uint8_t { kBf16, kFp8E4M3, kKivi };

// kKivi: the quantized pages' geometry and the view's per-sequence tables (device); kv_base, page_bytes and
// page_size then describe the window's explicit rows, and the SeqKvViews list the quantized pages.
struct KiviTileArgs {
  const char* quantized_base;
  KiviPageLayout layout;
  int32_t bits;
  int32_t group_size;
  int32_t value_group_size;
  const KiviSeqView* seqs;
};

struct PagedAttentionArgs {
  const void* q;  // [T, H, D]
  DType q_dtype;
  void* out;  // [T, H, D], written when num_splits == 1
  DType out_dtype;
  float* part_o;    // [num_splits, T, H, D] unnormalized partial outputs (num_splits > 1)
  float2* part_ml;  // [num_splits, T, H] (running max in log2 units, softmax denominator)
  int32_t num_splits;

  const char* kv_base;
  KvPageCodes codes;
  const float* k_scales;  // kFp8E4M3: [num_kv_heads] (device)
  const float* v_scales;
  KiviTileArgs kivi;
  size_t page_bytes;
  int32_t page_size;
  int32_t num_kv_heads;
  int32_t group;  // query heads per KV head
  int32_t num_heads;
  int32_t num_rows;  // T
  int32_t num_seqs;
  const int32_t* q_indptr;
  const SeqKvView* seqs;

  // 0: the view has no selection; else tokens per selected entry (1, or page_size for pages)
  int32_t select_unit;
  ProducedSelection produced;  // the batch-wide selected lists, when the view carries them

  float scale;
  float softcap;   // 0 = off
  int32_t window;  // 0 = full

  int32_t rows_per_tile;
  int32_t q_blocks;  // CTAs per (tile, KV head) when the group exceeds one CTA's query vectors
  int32_t min_rows;  // exclusive
  int32_t max_rows;  // inclusive
};

// The tiled kernel's query vectors per CTA: 16 for the decode shape, 128 for the prefill shape (64
// at head_dim 256).
int tiled_query_vectors(int head_dim, bool prefill);
// Enqueues the tiled kernel for head_dim in {64, 128, 256}; grid_x bounds the number of tiles. The
// selection variant runs when args.select_unit > 0 (bf16 pages only); FP8 pages and KIVI streams run
// variants of their own.
void launch_paged_attention_tiled(const PagedAttentionArgs& args, int head_dim, bool prefill,
                                  int grid_x);
// Resident CTAs per SM of that kernel (for split planning).
int tiled_blocks_per_sm(int head_dim, bool prefill, bool selection, KvPageCodes codes);

// The kernel of the prefill launch at head_dim 128 over bf16 pages without a selection, chosen once from the
// environment: SE_PREFILL_KERNEL = hopper (the default: the warp-specialized kernel of
// paged_prefill_hopper.cu) or tiled (paged_attention_tiled.cu, kept as the A/B baseline).
enum class PrefillKernel { kTiled, kHopper };
PrefillKernel prefill_kernel();
// The warp-specialized kernel: the same tiles of 128 query vectors and arguments as the tiled one.
void launch_paged_prefill_hopper(const PagedAttentionArgs& args, int grid_x);
int paged_prefill_hopper_blocks_per_sm();

}  // namespace se::cuda
