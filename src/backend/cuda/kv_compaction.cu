// CUDA compact_kv (ops.h): physical eviction in place, over many streams at once. Token kept[i] of a
// stream moves to slot i (K and V). kept ascends, so no slot lies after its source, but one parallel
// in-place pass would still race: slot i can be the source kept[j] of a later j. The moved rows are
// therefore gathered into scratch by one kernel and scattered back by a second: bit-exact copies that
// touch nothing but the streams' slots [first moved, kept.size()). The prefix already in place
// (kept[i] == i) does not move.
//
// The moved rows travel as runs (consecutive sources to consecutive slots: one token dropped by an
// accumulated-attention eviction is one run), so the tables stay small. When the rows outgrow the scratch cap they move
// in pieces, in stream and slot order: a piece writes only slots below every source of the pieces after it, so the
// pieces may run one after the other without a race. Enqueued on the context's stream (tables staged through
// host_tables.h); the call does not wait.
//
// move_kv_rows needs no scratch: no move reads a slot another one writes, so one pass copies each row.
//
// Rows move as bytes in 16-byte pieces, whatever the pages hold: bf16 elements or the FP8 store's e4m3 codes, and a
// shared latent's rows, which have no V half (one half per row where K/V pages have two).
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
// Rows moved per gather/scatter pair: bounds the scratch (32 MiB at head_dim 128).
constexpr int64_t kMaxRowsPerPiece = 65536;

struct MoveRun {
  int32_t pages_offset;  // where the stream's page list starts in the staged pages
  int32_t dest;          // the first slot the run writes
  int32_t source;        // the token that moves to `dest`
  int32_t row;           // the run's first row in the order of all moved rows
};

struct CompactArgs {
  char* kv_base;
  size_t page_bytes;
  int32_t page_size;
  int32_t row_bytes;  // one K or V row: head_dim elements
  int32_t halves;     // 2 (K and V), or 1 (a shared latent's rows)
  const int32_t* pages;
  const MoveRun* runs;
  int32_t num_runs;
  int64_t first_row, num_rows;  // this piece: rows [first_row, first_row + num_rows)
  uint4* rows;                  // [num_rows][halves][row_bytes / 16] 16-byte pieces
};

__device__ __forceinline__ uint4* piece_of(const CompactArgs& a, const int32_t* pages, int32_t token,
                                           int kv, int c) {
  const int32_t page_idx = token / a.page_size;
  const int32_t offset = token - page_idx * a.page_size;
  return reinterpret_cast<uint4*>(a.kv_base + static_cast<size_t>(pages[page_idx]) * a.page_bytes +
                                  (static_cast<size_t>(kv) * a.page_size + offset) * a.row_bytes + c * 16);
}

// The last run that starts at or before `row` (runs ascend by row).
__device__ __forceinline__ const MoveRun& run_of(const CompactArgs& a, int64_t row) {
  int32_t lo = 0, hi = a.num_runs - 1;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (a.runs[mid].row <= row) lo = mid; else hi = mid - 1;
  }
  return a.runs[lo];
}

// Gather: scratch row r = the pieces of the source of row first_row + r. Scatter: its slot = scratch row r.
// Thread i copies piece i % pieces_per_row of row i / pieces_per_row: [move][halves][row_bytes / 16].
__global__ void move_kv_rows_kernel(char* kv_base, size_t page_bytes, int32_t page_size, int32_t row_bytes,
                                    int32_t halves, const KvRowMove* moves, int64_t num_moves) {
  const int pieces = row_bytes / 16;
  const int64_t total = num_moves * halves * pieces;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const KvRowMove m = moves[i / (halves * pieces)];
    const int rest = static_cast<int>(i % (halves * pieces));
    const size_t piece = static_cast<size_t>(rest / pieces) * page_size * row_bytes + (rest % pieces) * 16;
    const auto at = [&](int32_t page, int32_t offset) {
      return reinterpret_cast<uint4*>(kv_base + static_cast<size_t>(page) * page_bytes + piece +
                                      static_cast<size_t>(offset) * row_bytes);
    };
    *at(m.dest_page, m.dest_offset) = *at(m.source_page, m.source_offset);
  }
}

template <bool kGather>
__global__ void compact_kv_move_kernel(const CompactArgs a) {
  const int pieces = a.row_bytes / 16;
  const int64_t total = a.num_rows * a.halves * pieces;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / (a.halves * pieces);
    const int rest = static_cast<int>(i - r * a.halves * pieces);
    const MoveRun& run = run_of(a, a.first_row + r);
    const auto step = static_cast<int32_t>(a.first_row + r - run.row);
    const int32_t* pages = a.pages + run.pages_offset;
    if constexpr (kGather) {
      a.rows[i] = *piece_of(a, pages, run.source + step, rest / pieces, rest % pieces);
    } else {
      *piece_of(a, pages, run.dest + step, rest / pieces, rest % pieces) = a.rows[i];
    }
  }
}

// Bytes of one K or V row of the pool's pages.
int32_t row_bytes_of(const AttentionView& pool) {
  return pool.head_dim * static_cast<int32_t>(dtype_size(pool.kv_dtype));
}

// The rows a token keeps in a page: K and V, or a shared latent's one row.
int32_t halves_of(const AttentionView& pool) { return pool.payload == KvPayload::kSharedLatent ? 1 : 2; }

void check_16_byte_moves(const AttentionView& pool, const char* what) {
  SE_CHECK(
      row_bytes_of(pool) % 16 == 0 && pool.page_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(pool.kv_base) % 16 == 0,
      "{}: rows of {} bytes and page_bytes {} must allow 16-byte moves", what, row_bytes_of(pool), pool.page_bytes);
}
}  // namespace

void compact_kv(const AttentionView& pool, std::span<const StreamCompaction> streams) {
  check_16_byte_moves(pool, "cuda::compact_kv");
  // Host tables: [page lists | runs], one copy.
  thread_local std::vector<int32_t> pages;
  thread_local std::vector<MoveRun> runs;
  thread_local std::vector<char> tables;
  pages.clear();
  runs.clear();
  int64_t num_rows = 0;
  for (const StreamCompaction& s : streams) {
    const auto num_kept = static_cast<int32_t>(s.kept.size());
    int32_t i = 0;
    while (i < num_kept && s.kept[static_cast<size_t>(i)] == i) ++i;
    if (i == num_kept) continue;  // nothing moves
    const auto pages_offset = static_cast<int32_t>(pages.size());
    const auto num_pages = launch::ceil_div(s.kept.back() + 1, pool.page_size);
    pages.insert(pages.end(), s.pages, s.pages + num_pages);
    SE_CHECK(num_rows + (num_kept - i) <= INT32_MAX, "cuda::compact_kv: more than 2^31 moved rows");
    for (; i < num_kept; ++i, ++num_rows) {
      const int32_t source = s.kept[static_cast<size_t>(i)];
      const bool continues = !runs.empty() && runs.back().pages_offset == pages_offset &&
                             runs.back().source + (num_rows - runs.back().row) == source;
      if (!continues)
        runs.push_back(MoveRun{pages_offset, i, source, static_cast<int32_t>(num_rows)});
    }
  }
  if (num_rows == 0) return;
  const size_t pages_bytes = (pages.size() * sizeof(int32_t) + 15) / 16 * 16;
  tables.resize(pages_bytes + runs.size() * sizeof(MoveRun));
  std::copy_n(reinterpret_cast<const char*>(pages.data()), pages.size() * sizeof(int32_t), tables.data());
  std::copy_n(reinterpret_cast<const char*>(runs.data()), runs.size() * sizeof(MoveRun),
              tables.data() + pages_bytes);
  const int64_t piece_rows = std::min(num_rows, kMaxRowsPerPiece);
  const size_t row_bytes = static_cast<size_t>(halves_of(pool)) * static_cast<size_t>(row_bytes_of(pool));
  const StagedTables staged =
      stage_host_tables(tables.data(), tables.size(), static_cast<size_t>(piece_rows) * row_bytes);

  CompactArgs a{};
  a.kv_base = static_cast<char*>(pool.kv_base);
  a.page_bytes = pool.page_bytes;
  a.page_size = pool.page_size;
  a.row_bytes = row_bytes_of(pool);
  a.halves = halves_of(pool);
  a.pages = static_cast<const int32_t*>(staged.tables);
  a.runs = reinterpret_cast<const MoveRun*>(static_cast<const char*>(staged.tables) + pages_bytes);
  a.num_runs = static_cast<int32_t>(runs.size());
  a.rows = static_cast<uint4*>(staged.results);
  CudaContext& context = CudaContext::current();
  for (a.first_row = 0; a.first_row < num_rows; a.first_row += piece_rows) {
    a.num_rows = std::min(piece_rows, num_rows - a.first_row);
    const unsigned grid = launch::grid_for(a.num_rows * a.halves * (a.row_bytes / 16), kThreads);
    compact_kv_move_kernel<true><<<grid, kThreads, 0, context.stream()>>>(a);
    SE_CUDA_CHECK_LAUNCH("compact_kv_move_kernel (gather)");
    compact_kv_move_kernel<false><<<grid, kThreads, 0, context.stream()>>>(a);
    SE_CUDA_CHECK_LAUNCH("compact_kv_move_kernel (scatter)");
  }
}

void move_kv_rows(const AttentionView& pool, std::span<const KvRowMove> moves) {
  check_16_byte_moves(pool, "cuda::move_kv_rows");
  if (moves.empty()) return;
  const StagedTables staged = stage_host_tables(moves.data(), moves.size_bytes(), 0);
  const auto num_moves = static_cast<int64_t>(moves.size());
  const int32_t row_bytes = row_bytes_of(pool);
  const int32_t halves = halves_of(pool);
  const unsigned grid = launch::grid_for(num_moves * halves * (row_bytes / 16), kThreads);
  move_kv_rows_kernel<<<grid, kThreads, 0, CudaContext::current().stream()>>>(
      static_cast<char*>(pool.kv_base), pool.page_bytes, pool.page_size, row_bytes, halves,
      static_cast<const KvRowMove*>(staged.tables), num_moves);
  SE_CUDA_CHECK_LAUNCH("move_kv_rows_kernel");
}

}  // namespace se::cuda
