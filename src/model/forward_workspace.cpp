#include "model/forward_workspace.h"

#include <algorithm>

#include "backend/device_memory.h"

namespace se {

TensorView ForwardWorkspace::rows(const Tensor& buffer, int64_t n) {
  TensorView v = buffer.view();
  v.shape[0] = n;
  return v;
}

TensorView ForwardWorkspace::i32_rows(int64_t offset, int64_t n) const {
  return TensorView{inputs_.data<int32_t>() + offset, DType::kI32, {n}, device_};
}

TensorView ForwardWorkspace::qkv(int64_t t) const {
  return TensorView{qkv_.raw(), DType::kF32, {t, config_.q_size() + 2 * config_.kv_size()}, device_};
}

Tensor ForwardWorkspace::buffer(DType dtype, Shape shape) const { return empty_on(device_, dtype, shape); }

void ForwardWorkspace::reserve(int32_t num_tokens, int32_t num_logit_rows) {
  if (num_tokens <= capacity_tokens_ && num_logit_rows <= capacity_logit_rows_) return;
  const int64_t t = std::max(num_tokens, capacity_tokens_);
  const int64_t r = std::max({num_logit_rows, capacity_logit_rows_, 1});
  const ModelConfig& c = config_;
  // Drop the old buffers first so the device never holds two generations at once.
  const uint64_t generation = generation_ + 1;
  *this = ForwardWorkspace(c, device_, matmul_dtype_);
  generation_ = generation;
  inputs_ = buffer(DType::kI32, {2 * t + r});
  hidden_ = buffer(DType::kF32, {t, c.hidden_size});
  normed_ = buffer(matmul_dtype_, {t, c.hidden_size});
  q_ = buffer(DType::kF32, {t, c.num_heads, c.head_dim});
  k_ = buffer(DType::kF32, {t, c.num_kv_heads, c.head_dim});
  v_ = buffer(DType::kF32, {t, c.num_kv_heads, c.head_dim});
  attn_ = buffer(matmul_dtype_, {t, c.num_heads, c.head_dim});
  proj_ = buffer(DType::kF32, {t, c.hidden_size});
  gate_up_ = buffer(DType::kF32, {t, 2 * int64_t{c.intermediate_size}});
  const int64_t qkv_width = c.q_size() + 2 * c.kv_size();
  qkv_ = qkv_width <= 2 * int64_t{c.intermediate_size} ? gate_up_ : buffer(DType::kF32, {t, qkv_width});
  act_ = buffer(matmul_dtype_, {t, c.intermediate_size});
  last_ = buffer(DType::kF32, {r, c.hidden_size});
  last_normed_ = buffer(matmul_dtype_, {r, c.hidden_size});
  logits_ = buffer(DType::kF32, {r, c.vocab_size});
  capacity_tokens_ = static_cast<int32_t>(t);
  capacity_logit_rows_ = static_cast<int32_t>(r);
}

int64_t ForwardWorkspace::bytes_for(const ModelConfig& c, DType matmul_dtype, int32_t num_tokens,
                                    int32_t num_logit_rows) {
  const int64_t t = num_tokens, r = std::max(num_logit_rows, 1);
  const int64_t qkv_width = c.q_size() + 2 * c.kv_size();
  const int64_t f32_per_row = 2 * int64_t{c.hidden_size} + c.q_size() + 2 * c.kv_size() +
                              2 * int64_t{c.intermediate_size} +
                              (qkv_width <= 2 * int64_t{c.intermediate_size} ? 0 : qkv_width);
  const int64_t matmul_per_row = int64_t{c.hidden_size} + c.q_size() + c.intermediate_size;
  return 4 * (2 * t + r) + 4 * t * f32_per_row + static_cast<int64_t>(dtype_size(matmul_dtype)) * t * matmul_per_row +
         r * (4 * int64_t{c.hidden_size} + static_cast<int64_t>(dtype_size(matmul_dtype)) * c.hidden_size +
              4 * int64_t{c.vocab_size});
}

void ForwardWorkspace::upload_inputs(const ForwardBatch& batch) {
  const int32_t t = batch.num_tokens();
  const auto r = static_cast<int32_t>(batch.logit_rows.size());
  reserve(t, r);
  host_inputs_.resize(inputs_.numel());
  std::copy(batch.token_ids.begin(), batch.token_ids.end(), host_inputs_.begin());
  std::copy(batch.positions.begin(), batch.positions.end(), host_inputs_.begin() + capacity_tokens_);
  std::copy(batch.logit_rows.begin(), batch.logit_rows.end(), host_inputs_.begin() + 2 * capacity_tokens_);
  copy_bytes(device_, inputs_.raw(), host_inputs_.data(), host_inputs_.size() * sizeof(int32_t));
}

}  // namespace se
