#include "backend/cpu/cpu_ops.h"

namespace se::cpu {

void scatter_rows_to_bf16(TensorView src, std::span<const RowDestination> rows, int64_t dest_offset) {
  const int64_t row_elements = src.numel() / src.shape[0];
  const auto num_rows = static_cast<int64_t>(rows.size());
#pragma omp parallel for if (num_rows > 16)
  for (int64_t i = 0; i < num_rows; ++i) {
    const RowDestination& row = rows[static_cast<size_t>(i)];
    convert_from_f32(src.ptr<float>() + row.source_row * row_elements, static_cast<uint16_t*>(row.dest) + dest_offset,
                     DType::kBF16, static_cast<size_t>(row_elements));
  }
}

}  // namespace se::cpu
