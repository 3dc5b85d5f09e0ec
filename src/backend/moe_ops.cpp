// Shape checks and device dispatch for backend/moe_ops.h.
#include "backend/moe_ops.h"

#include <initializer_list>

#include "backend/cpu/moe.h"
#include "backend/cuda/moe.h"
#include "backend/device_memory.h"
#include "backend/op_dispatch.h"
#include "base/check.h"

namespace se {

namespace {
// True when the op runs on the GPU: every tensor of it lives on one device, the GPU, and the build has the CUDA
// backend.
bool all_on_cuda(std::initializer_list<const TensorView*> tensors, const char* what) {
  const Device device = (*tensors.begin())->device;
  for (const TensorView* t : tensors)
    SE_CHECK(t->device == device, "{}: tensors on {} and {}", what, device_name(device), device_name(t->device));
  return on_cuda(**tensors.begin(), what);
}
void require(const TensorView& t, DType dtype, int rank, const char* what) {
  SE_CHECK(t.dtype == dtype && t.shape.rank() == rank, "{}: expected a rank-{} {} tensor, got {} {}", what, rank,
           dtype_name(dtype), dtype_name(t.dtype), t.shape.to_string());
}
}  // namespace

void route_experts(TensorView experts, TensorView weights, TensorView logits, bool normalize) {
  require(logits, DType::kF32, 2, "route_experts.logits");
  require(experts, DType::kI32, 2, "route_experts.experts");
  require(weights, DType::kF32, 2, "route_experts.weights");
  SE_CHECK(experts.shape == weights.shape && experts.shape[0] == logits.shape[0] && experts.shape[1] >= 1 &&
               experts.shape[1] <= logits.shape[1],
           "route_experts: experts {} weights {} for logits {}", experts.shape.to_string(), weights.shape.to_string(),
           logits.shape.to_string());
  if (logits.shape[0] == 0) return;
  if (all_on_cuda({&experts, &weights, &logits}, "route_experts")) {
    if constexpr (kCudaBuilt) cuda::route_experts(experts, weights, logits, normalize);
    return;
  }
  cpu::route_experts(experts, weights, logits, normalize);
}

void group_by_expert(TensorView offsets, TensorView rows, TensorView slots, TensorView experts) {
  require(experts, DType::kI32, 2, "group_by_expert.experts");
  SE_CHECK(offsets.dtype == DType::kI32 && rows.dtype == DType::kI32 && slots.dtype == DType::kI32 &&
               offsets.numel() >= 2 && rows.numel() == experts.numel() && slots.numel() == experts.numel(),
           "group_by_expert: offsets {} rows {} slots {} for experts {}", offsets.shape.to_string(),
           rows.shape.to_string(), slots.shape.to_string(), experts.shape.to_string());
  if (all_on_cuda({&offsets, &rows, &slots, &experts}, "group_by_expert")) {
    if constexpr (kCudaBuilt) cuda::group_by_expert(offsets, rows, slots, experts);
    return;
  }
  cpu::group_by_expert(offsets, rows, slots, experts);
}

void grouped_linear(TensorView out, TensorView x, TensorView w, TensorView offsets, int64_t max_rows,
                    TensorView w_scale) {
  SE_CHECK(x.shape.rank() == 2 && w.shape.rank() == 3 && out.shape.rank() == 2 && x.shape[1] == w.shape[2] &&
               out.shape[0] == x.shape[0] && out.shape[1] == w.shape[1] && offsets.dtype == DType::kI32 &&
               offsets.numel() == w.shape[0] + 1 && max_rows >= 0,
           "grouped_linear: out {} x {} w {} offsets {}", out.shape.to_string(), x.shape.to_string(),
           w.shape.to_string(), offsets.shape.to_string());
  const bool fp8 = w.dtype == DType::kU8;
  SE_CHECK((x.dtype == w.dtype || fp8) && (out.dtype == DType::kF32 || out.dtype == x.dtype),
           "grouped_linear: x {} w {} out {} (x and w of one dtype, or FP8 codes; out f32 or x's)", dtype_name(x.dtype),
           dtype_name(w.dtype), dtype_name(out.dtype));
  SE_CHECK(fp8 == (w_scale.data != nullptr),
           "grouped_linear: FP8 codes (U8 w) come with their scales, other "
           "weights without (w {}, scales {})",
           dtype_name(w.dtype), w_scale.data != nullptr ? "given" : "none");
  if (fp8) {
    require(w_scale, DType::kF32, 3, "grouped_linear.w_scale");
    const int64_t n = w.shape[1], k = w.shape[2];
    const bool blocks_divide = w_scale.shape[0] == w.shape[0] && w_scale.shape[1] > 0 && w_scale.shape[2] > 0 &&
                               n % w_scale.shape[1] == 0 && k % w_scale.shape[2] == 0;
    SE_CHECK(blocks_divide && n / w_scale.shape[1] % 32 == 0 && k / w_scale.shape[2] % 32 == 0,
             "grouped_linear: scales {} for FP8 weights {}: blocks must divide the weight and be multiples of 32",
             w_scale.shape.to_string(), w.shape.to_string());
  }
  if (all_on_cuda({&out, &x, &w, &offsets}, "grouped_linear")) {
    SE_CHECK(x.dtype == DType::kBF16 || (x.dtype == DType::kF32 && !fp8),
             "grouped_linear: CUDA takes bf16 or f32 (FP8 weights: bf16 x), got {}", dtype_name(x.dtype));
    if constexpr (kCudaBuilt) cuda::grouped_linear(out, x, w, offsets, max_rows, w_scale);
    return;
  }
  SE_CHECK(x.dtype == DType::kF32 && out.dtype == DType::kF32, "grouped_linear: the CPU takes f32, got {}",
           dtype_name(x.dtype));
  cpu::grouped_linear(out, x, w, offsets, w_scale);
}

void moe_combine(TensorView h, TensorView y, TensorView weights, TensorView slots) {
  require(h, DType::kF32, 2, "moe_combine.h");
  require(y, DType::kF32, 2, "moe_combine.y");
  require(weights, DType::kF32, 2, "moe_combine.weights");
  SE_CHECK(slots.dtype == DType::kI32 && weights.shape[0] == h.shape[0] && y.shape[1] == h.shape[1] &&
               slots.numel() == weights.numel() && y.shape[0] >= weights.numel(),
           "moe_combine: h {} y {} weights {} slots {}", h.shape.to_string(), y.shape.to_string(),
           weights.shape.to_string(), slots.shape.to_string());
  if (h.shape[0] == 0) return;
  if (all_on_cuda({&h, &y, &weights, &slots}, "moe_combine")) {
    if constexpr (kCudaBuilt) cuda::moe_combine(h, y, weights, slots);
    return;
  }
  cpu::moe_combine(h, y, weights, slots);
}

}  // namespace se
