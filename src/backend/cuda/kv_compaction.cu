// CUDA compact_kv (ops.h): physical eviction inside one stream, in place. Token kept[i] moves to
// slot i (K and V). kept ascends, so no slot lies after its source, but one parallel in-place pass
// would still race: slot i can be the source kept[j] of a later j. The moved rows are therefore
// gathered into scratch by one kernel and scattered back by a second: bit-exact copies that touch
// nothing but the stream's slots [first moved, kept.size()). The prefix already in place
// (kept[i] == i) does not move. Enqueued on the context's stream (tables staged through
// host_tables.h); the call does not wait.
#include <cuda_bf16.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/host_tables.h"

namespace se::cuda {

namespace {
constexpr int kThreads = 256;

struct CompactArgs {
  char* kv_base;
  size_t page_bytes;
  int32_t page_size, head_dim;
  const int32_t* pages;    // the stream's page list
  const int32_t* sources;  // [num_moved] the token that moves to slot first + i
  int32_t first;           // the first slot that changes
  int32_t num_moved;
  uint4* rows;  // [num_moved][2 (K, V)][head_dim / 8] 16-byte pieces
};

__device__ __forceinline__ uint4* piece_of(const CompactArgs& a, int32_t token, int kv, int c) {
  const int32_t page_idx = token / a.page_size;
  const int32_t offset = token - page_idx * a.page_size;
  return reinterpret_cast<uint4*>(
      a.kv_base + static_cast<size_t>(a.pages[page_idx]) * a.page_bytes +
      ((static_cast<size_t>(kv) * a.page_size + offset) * a.head_dim + c * 8) *
          sizeof(__nv_bfloat16));
}

// Gather: rows[i] = the pieces of token sources[i]. Scatter: slot first + i = rows[i].
template <bool kGather>
__global__ void compact_kv_move_kernel(const CompactArgs a) {
  const int pieces = a.head_dim / 8;
  const int64_t total = int64_t{a.num_moved} * 2 * pieces;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t row = static_cast<int32_t>(i / (2 * pieces));
    const int rest = static_cast<int>(i - int64_t{row} * 2 * pieces);
    if constexpr (kGather) {
      a.rows[i] = *piece_of(a, a.sources[row], rest / pieces, rest % pieces);
    } else {
      *piece_of(a, a.first + row, rest / pieces, rest % pieces) = a.rows[i];
    }
  }
}
}  // namespace

void compact_kv(const AttentionView& view, int32_t seq, int32_t kv_head,
                const std::vector<int32_t>& kept) {
  const auto num_kept = static_cast<int32_t>(kept.size());
  int32_t first = 0;
  while (first < num_kept && kept[static_cast<size_t>(first)] == first) ++first;
  if (first == num_kept) return;  // nothing moves
  SE_CHECK(view.head_dim % 8 == 0 && view.page_bytes % 16 == 0 &&
               reinterpret_cast<uintptr_t>(view.kv_base) % 16 == 0,
           "cuda::compact_kv: head_dim {} and page_bytes {} must allow 16-byte moves",
           view.head_dim, view.page_bytes);
  CudaContext& context = CudaContext::current();
  const SeqKvView& sv = view.seqs[seq];
  const int32_t num_pages = static_cast<int32_t>(launch::ceil_div(kept.back() + 1, view.page_size));
  const int32_t num_moved = num_kept - first;

  // Host tables [pages | sources], one copy; from pageable memory the copy returns once staged.
  thread_local std::vector<int32_t> tables;
  tables.resize(static_cast<size_t>(num_pages + num_moved));
  std::copy_n(sv.page_ids + static_cast<int64_t>(kv_head) * sv.stride, num_pages, tables.begin());
  std::copy(kept.begin() + first, kept.end(), tables.begin() + num_pages);
  const size_t row_bytes = size_t{2} * view.head_dim * sizeof(__nv_bfloat16);
  const StagedTables staged = stage_host_tables(tables.data(), tables.size() * sizeof(int32_t),
                                                static_cast<size_t>(num_moved) * row_bytes);

  CompactArgs a{};
  a.kv_base = static_cast<char*>(view.kv_base);
  a.page_bytes = view.page_bytes;
  a.page_size = view.page_size;
  a.head_dim = view.head_dim;
  a.pages = static_cast<const int32_t*>(staged.tables);
  a.sources = a.pages + num_pages;
  a.first = first;
  a.num_moved = num_moved;
  a.rows = static_cast<uint4*>(staged.results);
  const unsigned grid = launch::grid_for(int64_t{num_moved} * 2 * (view.head_dim / 8), kThreads);
  compact_kv_move_kernel<true><<<grid, kThreads, 0, context.stream()>>>(a);
  SE_CUDA_CHECK_LAUNCH("compact_kv_move_kernel (gather)");
  compact_kv_move_kernel<false><<<grid, kThreads, 0, context.stream()>>>(a);
  SE_CUDA_CHECK_LAUNCH("compact_kv_move_kernel (scatter)");
}

}  // namespace se::cuda
