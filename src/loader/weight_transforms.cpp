#include "loader/weight_transforms.h"

namespace se {

Tensor cast_weight(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  // An F32 weight converts from itself: a copy of it beside the caller's would double a GPU load's host peak.
  const Tensor f32 = t.dtype() == DType::kF32 ? t : t.to_f32();
  if (dtype == DType::kF32) return f32;
  Tensor out = Tensor::empty(dtype, t.shape());
  convert_from_f32(f32.data<float>(), out.raw(), dtype, static_cast<size_t>(t.numel()));
  return out;
}

}  // namespace se
