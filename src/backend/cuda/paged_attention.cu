// Host side of the tiled paged attention: splits the batch into a decode launch (sequences with few
// query rows, 16 query vectors per CTA) and a prefill launch (the rest, 128 per CTA, 64 at head_dim 256), picks a
// split-KV factor that fills the GPU, and merges the splits' partial results. Only host-known sizes
// are used (T, num_seqs): the per-sequence counts stay on the device and each CTA finds its tile
// there. A view with a selection runs the kernels' selection variant, whose CTAs split their
// selected keys (not the whole stream) by the same factor; the prefill launch runs dense when the view
// says every selected sequence is a decode one (AttentionView::selected_rows_max). An FP8 view (the
// FP8 store: e4m3 pages, device scales per KV head) runs the kernels' FP8 variant over the same plan, a KIVI view
// (group codes and a bf16 window, device tables) their KIVI variant; ops.cpp admits no other quantized one.
#include <algorithm>
#include <climits>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/paged_attention_args.h"

namespace se::cuda {

namespace {
constexpr int kMaxSplits = 64;
constexpr int64_t kPartialBudgetBytes = int64_t{256} << 20;

// One block of head_dim threads per (row, head), one thread per dimension: the first warp turns the splits'
// (m, l) into weights 2^(m_s - M) (M the largest m), and every thread sums its dimension over the splits, out =
// sum_s w_s o_s / sum_s w_s l_s. The loads go out 32 splits at a time, the first 32 before the weights are known,
// so a decode step's combine waits out about one memory latency instead of one per few splits.
constexpr int kSplitGroup = 32;
static_assert(kMaxSplits == 2 * kSplitGroup, "the first warp reads two splits' (m, l) per lane");

__device__ __forceinline__ void load_split_group(float (&v)[kSplitGroup], const float* part_o, int first,
                                                 int num_splits, int64_t num_items, int64_t item, int head_dim,
                                                 int d) {
#pragma unroll
  for (int j = 0; j < kSplitGroup; ++j) {
    const int s = first + j;
    v[j] = s < num_splits ? part_o[(s * num_items + item) * head_dim + d] : 0.0f;
  }
}

__global__ void combine_splits_kernel(const float* part_o, const float2* part_ml, void* out,
                                      DType out_dtype, int num_splits, int64_t num_items,
                                      int head_dim) {
  __shared__ float weight[kMaxSplits];
  __shared__ float inv_l;
  const int64_t item = blockIdx.x;
  const int d = static_cast<int>(threadIdx.x);
  float v[kSplitGroup];
  load_split_group(v, part_o, 0, num_splits, num_items, item, head_dim, d);
  if (threadIdx.x < 32) {
    const int lane = static_cast<int>(threadIdx.x);
    const float2 none = make_float2(-INFINITY, 0.0f);
    const float2 lo = lane < num_splits ? part_ml[lane * num_items + item] : none;
    const float2 hi = lane + 32 < num_splits ? part_ml[(lane + 32) * num_items + item] : none;
    float m = fmaxf(lo.x, hi.x);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    const float m_ref = m == -INFINITY ? 0.0f : m;
    const float w_lo = exp2f(lo.x - m_ref);  // 0 for an empty split (m = -inf)
    const float w_hi = exp2f(hi.x - m_ref);
    weight[lane] = w_lo;
    weight[lane + 32] = w_hi;
    const float l = warp_sum(w_lo * lo.y + w_hi * hi.y);
    if (lane == 0) inv_l = l > 0.0f ? 1.0f / l : 0.0f;
  }
  __syncthreads();
  float o = 0.0f;
  for (int first = 0; first < num_splits; first += kSplitGroup) {
    if (first > 0) load_split_group(v, part_o, first, num_splits, num_items, item, head_dim, d);
#pragma unroll
    for (int j = 0; j < kSplitGroup; ++j) o += weight[first + j] * v[j];  // first + j < kMaxSplits
  }
  store_from_float(out, out_dtype, item * head_dim + d, o * inv_l);
}

// Smallest split factor whose CTAs fill the resident slots in near-whole waves (>= 90% busy),
// bounded by the partial buffers' size; with several waves of work already, no split.
int choose_splits(int64_t base_ctas, int64_t slots, int64_t bytes_per_split) {
  if (base_ctas >= 4 * slots) return 1;
  const int max_splits = static_cast<int>(std::clamp<int64_t>(
      kPartialBudgetBytes / std::max<int64_t>(bytes_per_split, 1), 1, kMaxSplits));
  int best = 1;
  double best_busy = 0.0;
  for (int s = 1; s <= max_splits; ++s) {
    const double waves = static_cast<double>(base_ctas * s) / static_cast<double>(slots);
    const double busy = waves < 1.0 ? waves : waves / std::ceil(waves);
    if (busy >= 0.9) return s;
    if (busy > best_busy) best = s, best_busy = busy;
  }
  return best;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
}  // namespace

void paged_attention(TensorView out, TensorView q, const AttentionView& view,
                     const AttentionParams& params) {
  const int64_t num_rows = q.shape[0];
  if (num_rows == 0 || view.num_seqs == 0) return;
  const int num_heads = static_cast<int>(q.shape[1]);
  const int head_dim = view.head_dim;
  const int group = num_heads / view.num_kv_heads;
  SE_CHECK(aligned16(q.data) && aligned16(out.data) && aligned16(view.kv_base) &&
               view.page_bytes % 16 == 0,
           "cuda::paged_attention: q, out, the KV base and page_bytes must be 16-byte aligned");
  CudaContext& context = CudaContext::current();

  PagedAttentionArgs args{};
  args.q = q.data;
  args.q_dtype = q.dtype;
  args.out = out.data;
  args.out_dtype = out.dtype;
  args.kv_base = static_cast<const char*>(view.kv_base);
  args.codes = view.payload != KvPayload::kQuantized           ? KvPageCodes::kBf16
               : view.quantized.scheme == KvQuantScheme::kKivi ? KvPageCodes::kKivi
                                                               : KvPageCodes::kFp8E4M3;
  if (args.codes == KvPageCodes::kFp8E4M3) {
    args.k_scales = view.quantized.k_scales;
    args.v_scales = view.quantized.v_scales;
  }
  if (args.codes == KvPageCodes::kKivi) {
    const QuantizedKvView& qv = view.quantized;
    // A tile chunk of 8 channels decodes within one code word and one value group.
    SE_CHECK(qv.value_group_size % 8 == 0 && (32 / qv.bits) % 8 == 0,
             "cuda::paged_attention: KIVI value groups of {} channels at {} bits do not hold whole 8-channel chunks",
             qv.value_group_size, qv.bits);
    args.kivi = KiviTileArgs{static_cast<const char*>(qv.quantized_base),
                             kivi_page_layout(qv.group_size, qv.value_group_size, head_dim, qv.bits),
                             qv.bits,
                             qv.group_size,
                             qv.value_group_size,
                             qv.kivi_seqs};
  }
  args.page_bytes = view.page_bytes;
  args.page_size = view.page_size;
  args.num_kv_heads = view.num_kv_heads;
  args.group = group;
  args.num_heads = num_heads;
  args.num_rows = static_cast<int32_t>(num_rows);
  args.num_seqs = view.num_seqs;
  args.q_indptr = view.q_indptr;
  args.seqs = view.seqs;
  args.select_unit =
      !view.has_selection ? 0 : (view.selection_unit == SelectionUnit::kPage ? view.page_size : 1);
  args.produced = view.produced;
  args.scale = params.scale;
  args.softcap = params.logit_softcap;
  args.window = params.sliding_window;

  // Decode launch: sequences with n <= decode_rows, one tile each. Prefill launch: the longer ones.
  // A batch of exactly one row per sequence (every sequence has at least one) needs no prefill
  // launch.
  const int decode_qv = tiled_query_vectors(head_dim, false);
  const int decode_rows = std::max(1, decode_qv / group);
  const int decode_blocks =
      static_cast<int>(launch::ceil_div(int64_t{decode_rows} * group, decode_qv));
  const int decode_grid = view.num_seqs;
  const bool pure_decode = num_rows == view.num_seqs;
  const int prefill_qv = tiled_query_vectors(head_dim, true);
  const int prefill_rows = std::max(1, prefill_qv / group);
  const int prefill_blocks =
      static_cast<int>(launch::ceil_div(int64_t{prefill_rows} * group, prefill_qv));
  // Each sequence of the prefill launch adds at most one partial tile beyond T / prefill_rows full
  // ones.
  const int prefill_grid =
      pure_decode
          ? 0
          : static_cast<int>(num_rows / prefill_rows +
                             std::min<int64_t>(view.num_seqs, num_rows / (decode_rows + 1)) + 1);

  // Prefill chunks beside selected decode rows (dynamic selection selects for decode only) run the dense kernel.
  const bool prefill_selects =
      args.select_unit > 0 && !(view.selected_rows_max >= 0 && view.selected_rows_max <= decode_rows);

  const int64_t base_ctas = int64_t{decode_grid} * view.num_kv_heads * decode_blocks +
                            int64_t{prefill_grid} * view.num_kv_heads * prefill_blocks;
  const int64_t slots = int64_t{tiled_blocks_per_sm(head_dim, !pure_decode,
                                                    pure_decode ? args.select_unit > 0 : prefill_selects, args.codes)} *
                        context.props().multiProcessorCount;
  const int64_t items = num_rows * num_heads;
  const int64_t bytes_per_split = items * (int64_t{head_dim} * 4 + 8);
  args.num_splits = choose_splits(base_ctas, std::max<int64_t>(slots, 1), bytes_per_split);
  if (args.num_splits > 1) {
    char* scratch =
        static_cast<char*>(context.scratch(static_cast<size_t>(bytes_per_split * args.num_splits)));
    args.part_o = reinterpret_cast<float*>(scratch);
    args.part_ml = reinterpret_cast<float2*>(scratch + items * head_dim * 4 * args.num_splits);
  }

  PagedAttentionArgs decode = args;
  decode.rows_per_tile = decode_rows;
  decode.q_blocks = decode_blocks;
  decode.min_rows = 0;
  decode.max_rows = decode_rows;
  launch_paged_attention_tiled(decode, head_dim, false, decode_grid);
  if (!pure_decode) {
    PagedAttentionArgs prefill = args;
    if (!prefill_selects) prefill.select_unit = 0;
    prefill.rows_per_tile = prefill_rows;
    prefill.q_blocks = prefill_blocks;
    prefill.min_rows = decode_rows;
    prefill.max_rows = INT_MAX;
    launch_paged_attention_tiled(prefill, head_dim, true, prefill_grid);
  }
  if (args.num_splits > 1) {
    combine_splits_kernel<<<static_cast<unsigned>(items), head_dim, 0, context.stream()>>>(
        args.part_o, args.part_ml, out.data, out.dtype, args.num_splits, items, head_dim);
    SE_CUDA_CHECK_LAUNCH("combine_splits_kernel");
  }
}

}  // namespace se::cuda
