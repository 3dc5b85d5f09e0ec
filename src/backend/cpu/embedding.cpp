#include <algorithm>

#include "backend/cpu/cpu_ops.h"

namespace se::cpu {

void embedding(TensorView out, TensorView table, TensorView ids) {
  const int64_t num_tokens = ids.numel();
  const int64_t dim = table.shape[1];
  const int32_t* id = ids.ptr<int32_t>();
  const size_t row_bytes = static_cast<size_t>(dim) * dtype_size(table.dtype);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const auto* row = static_cast<const char*>(table.data) + static_cast<size_t>(id[t]) * row_bytes;
    convert_to_f32(row, table.dtype, out.ptr<float>() + t * dim, static_cast<size_t>(dim));
  }
}

void vocab_shard_embedding(TensorView out, TensorView table, TensorView ids, int64_t first_row) {
  const int64_t num_tokens = ids.numel();
  const int64_t rows = table.shape[0], dim = table.shape[1];
  const int32_t* id = ids.ptr<int32_t>();
  const size_t row_bytes = static_cast<size_t>(dim) * dtype_size(table.dtype);
  for (int64_t t = 0; t < num_tokens; ++t) {
    float* dst = out.ptr<float>() + t * dim;
    const int64_t row = id[t] - first_row;
    if (row < 0 || row >= rows) {
      std::fill(dst, dst + dim, 0.0f);
      continue;
    }
    const auto* src = static_cast<const char*>(table.data) + static_cast<size_t>(row) * row_bytes;
    convert_to_f32(src, table.dtype, dst, static_cast<size_t>(dim));
  }
}

}  // namespace se::cpu
