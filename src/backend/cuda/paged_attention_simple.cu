// The plain paged-attention kernel: one warp per (query row, KV head, up to 8 query heads of its
// group), keys visited one at a time in fp32 with an online softmax in natural-log units, exactly
// the CPU reference's arithmetic up to summation order; a selection is walked entry by entry as the
// CPU's for_each_visible_key does. Slow, kept for being obviously right: the tiled kernels are
// checked against it.
#include <cuda_bf16.h>

#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"

namespace se::cuda {

namespace {
constexpr int kHeadsPerWarp = 8;

struct SimpleArgs {
  const void* q;
  DType q_dtype;
  void* out;
  DType out_dtype;
  const char* kv_base;
  size_t page_bytes;
  int32_t page_size, num_kv_heads, group, num_heads, num_seqs;
  const int32_t* q_indptr;
  const SeqKvView* seqs;
  float scale, softcap;
  int32_t window;
  int32_t select_unit;  // 0: no selection in the view; else tokens per selected entry
  ProducedSelection produced;
};

template <int D>
__global__ void paged_attention_simple_kernel(const SimpleArgs a) {
  constexpr int kPerLane = D / 32;
  const int row = blockIdx.x;
  const int kv_head = blockIdx.y;
  const int g0 = blockIdx.z * kHeadsPerWarp;
  const int num_g = min(kHeadsPerWarp, a.group - g0);
  const int lane = threadIdx.x;

  const int s = seq_of_row(a.q_indptr, a.num_seqs, row);
  const SeqKvView sv = a.seqs[s];
  const int32_t n = a.q_indptr[s + 1] - a.q_indptr[s];
  const int32_t last = sv.num_tokens[kv_head] - n + (row - a.q_indptr[s]);
  const int32_t first = a.window > 0 ? max(0, last - a.window + 1) : 0;
  const int32_t* pages = sv.page_ids + static_cast<int64_t>(kv_head) * sv.stride;

  float q[kHeadsPerWarp][kPerLane], acc[kHeadsPerWarp][kPerLane], m[kHeadsPerWarp],
      l[kHeadsPerWarp];
#pragma unroll
  for (int gg = 0; gg < kHeadsPerWarp; ++gg) {
    const int64_t base =
        (static_cast<int64_t>(row) * a.num_heads + kv_head * a.group + g0 + gg) * D;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      q[gg][e] = gg < num_g ? load_as_float(a.q, a.q_dtype, base + lane * kPerLane + e) : 0.0f;
      acc[gg][e] = 0.0f;
    }
    m[gg] = -INFINITY;
    l[gg] = 0.0f;
  }
  auto attend = [&](int32_t j) {
    const int32_t page_idx = j / a.page_size;
    const int32_t offset = j - page_idx * a.page_size;
    const auto* k = reinterpret_cast<const __nv_bfloat16*>(
                        a.kv_base + static_cast<size_t>(pages[page_idx]) * a.page_bytes) +
                    static_cast<size_t>(offset) * D + lane * kPerLane;
    const __nv_bfloat16* v = k + static_cast<size_t>(a.page_size) * D;
    float kf[kPerLane], vf[kPerLane];
#pragma unroll
    for (int e = 0; e < kPerLane; ++e)
      kf[e] = __bfloat162float(k[e]), vf[e] = __bfloat162float(v[e]);
#pragma unroll
    for (int gg = 0; gg < kHeadsPerWarp; ++gg) {
      if (gg >= num_g) break;
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) dot += q[gg][e] * kf[e];
      float score = warp_sum(dot) * a.scale;
      if (a.softcap > 0.0f) score = a.softcap * tanhf(score / a.softcap);
      const float m_new = fmaxf(m[gg], score);
      const float alpha = expf(m[gg] - m_new);
      const float p = expf(score - m_new);
      l[gg] = l[gg] * alpha + p;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) acc[gg][e] = acc[gg][e] * alpha + p * vf[e];
      m[gg] = m_new;
    }
  };
  const SelectedEntries sel =
      a.select_unit == 0 ? SelectedEntries{nullptr, 0} : selected_entries(a.produced, sv, s, kv_head, a.num_kv_heads);
  if (sel.entries == nullptr) {
    for (int32_t j = first; j <= last; ++j) attend(j);
  } else {
    // Entry i covers tokens [entries[i] * unit, entries[i] * unit + unit), clipped to the visible range.
    for (int32_t i = 0; i < sel.count; ++i) {
      const int32_t begin = sel.entries[i] * a.select_unit;
      const int32_t end = min(begin + a.select_unit - 1, last);
      for (int32_t j = max(begin, first); j <= end; ++j) attend(j);
    }
  }
#pragma unroll
  for (int gg = 0; gg < kHeadsPerWarp; ++gg) {
    if (gg >= num_g) break;
    const float inv = l[gg] > 0.0f ? 1.0f / l[gg] : 0.0f;
    const int64_t base =
        (static_cast<int64_t>(row) * a.num_heads + kv_head * a.group + g0 + gg) * D;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e)
      store_from_float(a.out, a.out_dtype, base + lane * kPerLane + e, acc[gg][e] * inv);
  }
}
}  // namespace

void paged_attention_simple(TensorView out, TensorView q, const AttentionView& view,
                            const AttentionParams& params) {
  SE_CHECK(view.payload == KvPayload::kExplicit, "cuda::paged_attention_simple: reads bf16 pages only");
  const int64_t num_rows = q.shape[0];
  if (num_rows == 0 || view.num_seqs == 0) return;
  const int num_heads = static_cast<int>(q.shape[1]);
  const int group = num_heads / view.num_kv_heads;
  const SimpleArgs args{q.data,
                        q.dtype,
                        out.data,
                        out.dtype,
                        static_cast<const char*>(view.kv_base),
                        view.page_bytes,
                        view.page_size,
                        view.num_kv_heads,
                        group,
                        num_heads,
                        view.num_seqs,
                        view.q_indptr,
                        view.seqs,
                        params.scale,
                        params.logit_softcap,
                        params.sliding_window,
                        !view.has_selection ? 0
                        : view.selection_unit == SelectionUnit::kPage ? view.page_size
                                                                      : 1,
                        view.produced};
  const dim3 grid(static_cast<unsigned>(num_rows), static_cast<unsigned>(view.num_kv_heads),
                  static_cast<unsigned>((group + kHeadsPerWarp - 1) / kHeadsPerWarp));
  cudaStream_t stream = CudaContext::current().stream();
  switch (view.head_dim) {
    case 64:
      paged_attention_simple_kernel<64><<<grid, 32, 0, stream>>>(args);
      break;
    case 128:
      paged_attention_simple_kernel<128><<<grid, 32, 0, stream>>>(args);
      break;
    case 256:
      paged_attention_simple_kernel<256><<<grid, 32, 0, stream>>>(args);
      break;
    default:
      SE_CHECK(false, "cuda::paged_attention_simple: head_dim {} (64, 128 or 256)", view.head_dim);
  }
  SE_CUDA_CHECK_LAUNCH("paged_attention_simple_kernel");
}

}  // namespace se::cuda
