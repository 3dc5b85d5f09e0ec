// The tile loop every CPU paged attention shares, whatever its pages hold: query rows of one (sequence, KV head)
// are cut into tiles, each tile collects the keys its rows see (visible_keys.h), computes the logits, the
// softmax and the weighted sum of values. What differs between the explicit, FP8 and KIVI stores is only how
// the K and V rows of token j are read, which a per-(sequence, KV head) row reader supplies:
//   const float* key(int32_t j, float* local) const;   // K row of token j, head_dim values
//   const float* value(int32_t j, float* local) const; // V row of token j
// A reader returns the row where it lies (f32 pages) or decodes it into `local` (head_dim floats owned by the tile)
// and returns that, so a quantized store is read one row at a time and no dequantized copy of the cache exists: a
// tile holds at most kGemmKeys decoded rows. Internal to backend/cpu.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "backend/cpu/vector_math.h"
#include "backend/cpu/visible_keys.h"

namespace se::cpu {

namespace paged_attention_detail {

// Query rows of one sequence and one KV head handled as one unit of work: rows [row_begin, row_end) of the
// sequence's n new rows, times the KV head's query group.
struct AttentionTile {
  int32_t slice = 0;
  int32_t kv_head = 0;
  int32_t row_begin = 0;
  int32_t row_end = 0;
};

// Below this many query vectors a tile reads each key and value row once for all its queries; from it on, it
// copies (or decodes) the rows into blocks of kGemmKeys and runs two GEMMs per block (the copy costs one pass over
// the rows, which the GEMMs' speed repays only across several queries).
constexpr int32_t kMinGemmQueries = 8;
constexpr int32_t kGemmKeys = 256;
// Query rows per tile in prefill: bounds the scores buffer (rows x group x visible keys) and leaves enough tiles
// to spread over the threads.
constexpr int32_t kTileRows = 32;

struct TileScratch {
  std::vector<int32_t> keys;
  std::vector<float> k, v, q, scores, out, inverse_sums, row;
};

// Per query row of the tile, the slice [first, end) of `keys` it sees: `keys` ascends and covers the union of
// the rows' visible ranges, so each row's visible keys are a contiguous run of it.
inline std::pair<int32_t, int32_t> visible_slice(const std::vector<int32_t>& keys, VisibleRange range) {
  const auto first = std::lower_bound(keys.begin(), keys.end(), range.first);
  const auto end = std::upper_bound(first, keys.end(), range.last);
  return {static_cast<int32_t>(first - keys.begin()), static_cast<int32_t>(end - keys.begin())};
}

// Turns one row of logits into softmax weights over [first, end) (zero elsewhere); returns 1 / their sum, or 0
// when the row sees nothing.
inline float softmax_row(float* logits, int32_t num_keys, int32_t first, int32_t end,
                         const AttentionParams& params) {
  if (params.logit_softcap > 0.0f)
    for (int32_t i = first; i < end; ++i)
      logits[i] = params.logit_softcap * std::tanh(logits[i] / params.logit_softcap);
  std::fill(logits, logits + first, 0.0f);
  std::fill(logits + std::max(first, end), logits + num_keys, 0.0f);
  if (first >= end) return 0.0f;
  const float max_logit = *std::max_element(logits + first, logits + end);
  return 1.0f / exp_shifted_sum(logits + first, end - first, max_logit);
}

template <typename Reader>
void attend_tile(TensorView out, TensorView q, const AttentionView& view, const AttentionParams& params,
                 const AttentionTile& tile, const Reader& reader, TileScratch& scratch) {
  const SeqKvView& sv = view.seqs[tile.slice];
  const int32_t num_heads = static_cast<int32_t>(q.shape[1]);
  const int32_t group = num_heads / view.num_kv_heads;
  const int32_t head_dim = view.head_dim;
  const int32_t n = view.q_indptr[tile.slice + 1] - view.q_indptr[tile.slice];
  auto row_range = [&](int32_t row) { return visible_range(sv, tile.kv_head, n, row, params.sliding_window); };
  // Query vector m of the tile: row tile.row_begin + m / group, head kv_head * group + m % group.
  const int32_t num_queries = (tile.row_end - tile.row_begin) * group;
  auto query_offset = [&](int32_t m) {
    const int64_t row = view.q_indptr[tile.slice] + tile.row_begin + m / group;
    return (row * num_heads + int64_t{tile.kv_head} * group + m % group) * head_dim;
  };

  std::vector<int32_t>& keys = scratch.keys;
  keys.clear();
  const VisibleRange all{row_range(tile.row_begin).first, row_range(tile.row_end - 1).last};
  for_each_visible_key(view, sv, tile.kv_head, all, [&](int32_t j) { keys.push_back(j); });
  const auto num_keys = static_cast<int32_t>(keys.size());
  std::vector<float>& scores = scratch.scores;
  scores.resize(static_cast<size_t>(num_queries) * static_cast<size_t>(std::max(num_keys, 1)));
  std::vector<float>& result = scratch.out;
  result.assign(static_cast<size_t>(num_queries) * static_cast<size_t>(head_dim), 0.0f);
  if (num_keys == 0) {
    for (int32_t m = 0; m < num_queries; ++m) std::fill_n(out.ptr<float>() + query_offset(m), head_dim, 0.0f);
    return;
  }
  scratch.row.resize(static_cast<size_t>(head_dim));
  float* local = scratch.row.data();  // where a quantized reader decodes the row it returns

  // Rows [first, first + count) of keys[] (key rows, or value rows), one after another in `block`.
  const auto copy_rows = [&](bool values, int32_t first, int32_t count, std::vector<float>& block) {
    block.resize(static_cast<size_t>(count) * static_cast<size_t>(head_dim));
    for (int32_t i = 0; i < count; ++i) {
      float* row = block.data() + int64_t{i} * head_dim;
      const float* read = values ? reader.value(keys[first + i], row) : reader.key(keys[first + i], row);
      if (read != row) std::memcpy(row, read, sizeof(float) * head_dim);
    }
  };
  const bool use_gemm = num_queries >= kMinGemmQueries;
  if (use_gemm) {
    // scores = scale * Q K^T, one block of keys at a time.
    scratch.q.resize(static_cast<size_t>(num_queries) * static_cast<size_t>(head_dim));
    for (int32_t m = 0; m < num_queries; ++m)
      std::memcpy(scratch.q.data() + int64_t{m} * head_dim, q.ptr<float>() + query_offset(m),
                  sizeof(float) * head_dim);
    for (int32_t first = 0; first < num_keys; first += kGemmKeys) {
      const int32_t count = std::min(kGemmKeys, num_keys - first);
      copy_rows(false, first, count, scratch.k);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, num_queries, count, head_dim, params.scale, scratch.q.data(),
                  head_dim, scratch.k.data(), head_dim, 0.0f, scores.data() + first, num_keys);
    }
  } else {
    // Few queries (decode: one row, the query group): each key row is located (and decoded) once for all of the
    // tile's queries.
    for (int32_t i = 0; i < num_keys; ++i) {
      const float* key = reader.key(keys[i], local);
      for (int32_t m = 0; m < num_queries; ++m)
        scores[int64_t{m} * num_keys + i] = dot(q.ptr<float>() + query_offset(m), key, head_dim) * params.scale;
    }
  }

  std::vector<float>& inverse_sums = scratch.inverse_sums;
  inverse_sums.resize(static_cast<size_t>(num_queries));
  for (int32_t m = 0; m < num_queries; ++m) {
    const auto [first, end] = visible_slice(keys, row_range(tile.row_begin + m / group));
    inverse_sums[static_cast<size_t>(m)] =
        softmax_row(scores.data() + int64_t{m} * num_keys, num_keys, first, end, params);
  }

  if (use_gemm) {
    for (int32_t first = 0; first < num_keys; first += kGemmKeys) {
      const int32_t count = std::min(kGemmKeys, num_keys - first);
      copy_rows(true, first, count, scratch.v);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, num_queries, head_dim, count, 1.0f, scores.data() + first,
                  num_keys, scratch.v.data(), head_dim, first == 0 ? 0.0f : 1.0f, result.data(), head_dim);
    }
  } else {
    for (int32_t i = 0; i < num_keys; ++i) {
      const float* value = reader.value(keys[i], local);
      for (int32_t m = 0; m < num_queries; ++m) {
        const float weight = scores[int64_t{m} * num_keys + i];
        if (weight != 0.0f) axpy(weight, value, result.data() + int64_t{m} * head_dim, head_dim);
      }
    }
  }
  for (int32_t m = 0; m < num_queries; ++m) {
    float* o = out.ptr<float>() + query_offset(m);
    const float* r = result.data() + int64_t{m} * head_dim;
    const float inv = inverse_sums[static_cast<size_t>(m)];
    for (int32_t d = 0; d < head_dim; ++d) o[d] = r[d] * inv;
  }
}

}  // namespace paged_attention_detail

// Runs every tile of the batch: make_reader(slice, kv_head) gives the row reader of one stream.
template <typename MakeReader>
void paged_attention_tiles(TensorView out, TensorView q, const AttentionView& view, const AttentionParams& params,
                           MakeReader&& make_reader) {
  using namespace paged_attention_detail;
  std::vector<AttentionTile> tiles;
  for (int32_t s = 0; s < view.num_seqs; ++s) {
    const int32_t n = view.q_indptr[s + 1] - view.q_indptr[s];
    for (int32_t h = 0; h < view.num_kv_heads; ++h)
      for (int32_t r = 0; r < n; r += kTileRows) tiles.push_back({s, h, r, std::min(n, r + kTileRows)});
  }
  // Each thread runs whole tiles with a single-threaded BLAS (OpenBLAS does not nest inside a parallel region).
#pragma omp parallel
  {
    TileScratch scratch;
#pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < tiles.size(); ++i)
      attend_tile(out, q, view, params, tiles[i], make_reader(tiles[i].slice, tiles[i].kv_head), scratch);
  }
}

}  // namespace se::cpu
