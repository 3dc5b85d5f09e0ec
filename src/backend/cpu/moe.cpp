#include "backend/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "tensor/fp8.h"

namespace se::cpu {

namespace {
// Expert e of FP8 codes `w` [num_experts, n, k] with block scales `w_scale` (moe_ops.h) as fp32 [n, k] in `out`.
void dequantize_fp8_expert(float* out, TensorView w, TensorView w_scale, int64_t e) {
  const int64_t n = w.shape[1], k = w.shape[2];
  const int64_t scale_rows = w_scale.shape[1], scale_cols = w_scale.shape[2];
  const int64_t block_rows = n / scale_rows, block_cols = k / scale_cols;
  const uint8_t* codes = w.ptr<uint8_t>() + e * n * k;
  const float* scale = w_scale.ptr<float>() + e * scale_rows * scale_cols;
#pragma omp parallel for schedule(static) if (n * k > (1 << 16))
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c)
      out[r * k + c] =
          fp8_to_f32(codes[r * k + c], Fp8Format::kE4M3) * scale[r / block_rows * scale_cols + c / block_cols];
  }
}
}  // namespace

void route_experts(TensorView experts, TensorView weights, TensorView logits, bool normalize) {
  const int64_t t = logits.shape[0], num_experts = logits.shape[1], k = experts.shape[1];
  std::vector<float> probs(static_cast<size_t>(num_experts));
  std::vector<int32_t> order(static_cast<size_t>(num_experts));
  for (int64_t row = 0; row < t; ++row) {
    // Softmax in fp32, as transformers computes it before its top-k.
    const float* logit = logits.ptr<float>() + row * num_experts;
    const float max_logit = *std::max_element(logit, logit + num_experts);
    float sum = 0.0f;
    for (int64_t e = 0; e < num_experts; ++e) sum += probs[static_cast<size_t>(e)] = std::exp(logit[e] - max_logit);
    for (float& p : probs) p /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&probs](int32_t a, int32_t b) {
      const float pa = probs[static_cast<size_t>(a)], pb = probs[static_cast<size_t>(b)];
      return pa > pb || (pa == pb && a < b);
    });
    float chosen = 0.0f;
    for (int64_t j = 0; j < k; ++j) chosen += probs[static_cast<size_t>(order[static_cast<size_t>(j)])];
    int32_t* expert = experts.ptr<int32_t>() + row * k;
    float* weight = weights.ptr<float>() + row * k;
    for (int64_t j = 0; j < k; ++j) {
      expert[j] = order[static_cast<size_t>(j)];
      weight[j] = probs[static_cast<size_t>(expert[j])] / (normalize ? chosen : 1.0f);
    }
  }
}

void group_by_expert(TensorView offsets, TensorView rows, TensorView slots, TensorView experts) {
  // A counting sort of the t * k choices.
  const int64_t pairs = experts.numel(), k = experts.shape[1], num_experts = offsets.numel() - 1;
  const int32_t* id = experts.ptr<int32_t>();
  int32_t* begin = offsets.ptr<int32_t>();
  std::fill(begin, begin + num_experts + 1, 0);
  for (int64_t j = 0; j < pairs; ++j) ++begin[id[j] + 1];
  std::partial_sum(begin, begin + num_experts + 1, begin);
  std::vector<int32_t> next(begin, begin + num_experts);
  for (int64_t j = 0; j < pairs; ++j) {
    const int32_t slot = next[static_cast<size_t>(id[j])]++;
    rows.ptr<int32_t>()[slot] = static_cast<int32_t>(j / k);
    slots.ptr<int32_t>()[j] = slot;
  }
}

void grouped_linear(TensorView out, TensorView x, TensorView w, TensorView offsets, TensorView w_scale) {
  const int64_t num_experts = w.shape[0], n = w.shape[1], k = w.shape[2];
  const int32_t* begin = offsets.ptr<int32_t>();
  const size_t x_row = static_cast<size_t>(k) * dtype_size(x.dtype),
               out_row = static_cast<size_t>(n) * dtype_size(out.dtype);
  const size_t w_matrix = static_cast<size_t>(n * k) * dtype_size(w.dtype);
  // FP8 experts: each chosen expert's weights dequantized to fp32 here, the values the load would have made.
  Tensor dequantized = w.dtype == DType::kU8 ? Tensor::empty(DType::kF32, {n, k}) : Tensor();
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t first = begin[e], count = begin[e + 1] - first;
    if (count == 0) continue;  // an expert no row chose is not read
    TensorView weight{static_cast<char*>(w.data) + e * w_matrix, w.dtype, {n, k}, w.device};
    if (dequantized.defined()) {
      dequantize_fp8_expert(dequantized.data<float>(), w, w_scale, e);
      weight = dequantized.view();
    }
    cpu::linear(TensorView{static_cast<char*>(out.data) + first * out_row, out.dtype, {count, n}, out.device},
                TensorView{static_cast<char*>(x.data) + first * x_row, x.dtype, {count, k}, x.device}, weight, nullptr);
  }
}

void moe_combine(TensorView h, TensorView y, TensorView weights, TensorView slots) {
  const int64_t t = h.shape[0], hidden = h.shape[1], k = weights.shape[1];
  const float* gate = weights.ptr<float>();
  const int32_t* slot = slots.ptr<int32_t>();
#pragma omp parallel for schedule(static) if (t * k * hidden > (1 << 16))
  for (int64_t r = 0; r < t; ++r) {
    float* dst = h.ptr<float>() + r * hidden;
    for (int64_t j = 0; j < k; ++j) {
      const float p = gate[r * k + j];
      const float* src = y.ptr<float>() + static_cast<int64_t>(slot[r * k + j]) * hidden;
      for (int64_t d = 0; d < hidden; ++d) dst[d] += p * src[d];
    }
  }
}

}  // namespace se::cpu
