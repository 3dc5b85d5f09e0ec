#include "loader/weight_transforms.h"

#include <cstring>
#include <vector>

#include "base/check.h"

namespace se {

namespace {

// Moves rows within each head: row `from(r)` of a head in `t` becomes row r of the result.
template <typename RowMap>
Tensor regroup_rows(const Tensor& t, int64_t num_heads, RowMap from) {
  SE_CHECK(t.rank() >= 1 && num_heads > 0 && t.dim(0) % (2 * num_heads) == 0,
           "Q/K rows {} for {} heads", t.shape().to_string(), num_heads);
  const int64_t rows = t.dim(0);
  const int64_t head_dim = rows / num_heads;
  const size_t row_bytes = t.nbytes() / static_cast<size_t>(rows);
  Tensor out = Tensor::empty(t.dtype(), t.shape());
  const auto* src = static_cast<const uint8_t*>(t.raw());
  auto* dst = static_cast<uint8_t*>(out.raw());
  for (int64_t h = 0; h < num_heads; ++h) {
    for (int64_t r = 0; r < head_dim; ++r) {
      const int64_t s = from(r, head_dim / 2);
      std::memcpy(dst + (h * head_dim + r) * row_bytes, src + (h * head_dim + s) * row_bytes,
                  row_bytes);
    }
  }
  return out;
}

}  // namespace

Tensor cast_weight(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor f32 = t.to_f32();
  if (dtype == DType::kF32) return f32;
  Tensor out = Tensor::empty(dtype, t.shape());
  convert_from_f32(f32.data<float>(), out.raw(), dtype, static_cast<size_t>(t.numel()));
  return out;
}

Tensor unpermute_qk_rows(const Tensor& t, int64_t num_heads) {
  // HF row r = j*half + i sits at GGUF row 2i + j.
  return regroup_rows(t, num_heads,
                      [](int64_t r, int64_t half) { return 2 * (r % half) + r / half; });
}

Tensor permute_qk_rows(const Tensor& t, int64_t num_heads) {
  // GGUF row r = 2i + j comes from HF row j*half + i.
  return regroup_rows(t, num_heads, [](int64_t r, int64_t half) { return (r % 2) * half + r / 2; });
}

Tensor add_one(const Tensor& t) {
  Tensor shifted = t.to_f32();  // always a fresh copy
  float* p = shifted.data<float>();
  for (int64_t i = 0; i < shifted.numel(); ++i) p[i] += 1.0f;
  return cast_weight(shifted, t.dtype());
}

}  // namespace se
