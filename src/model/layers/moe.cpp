#include "model/layers/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "base/check.h"

namespace se {

void route_tokens(TensorView logits, bool normalize, TensorView experts, TensorView weights) {
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

void moe_add(const BlockInputs& in, TensorView h, TensorView x) {
  const ModelConfig& c = in.config;
  const LayerWeights& w = in.weights;
  SE_CHECK(in.ws.device() == Device::kCpu, "the mixture-of-experts layer runs on the CPU only");
  const int64_t t = in.t, hidden = c.hidden_size, inter = c.moe_intermediate_size;
  const int k = c.num_experts_per_tok, num_experts = c.num_experts;

  const TensorView logits = in.ws.router_logits(t);
  linear(logits, x, w.router.view());
  const TensorView ids = in.ws.expert_ids(t);
  const TensorView gates = in.ws.expert_weights(t);
  route_tokens(logits, c.norm_topk_prob, ids, gates);
  if (!c.norm_topk_prob && c.routed_scaling_factor != 1.0f) scale_inplace(gates, c.routed_scaling_factor);
  in.hooks.on_expert_choice(in.layer, in.batch, ids);
  const int32_t* id = ids.ptr<int32_t>();
  const float* gate = gates.ptr<float>();

  // The (token, slot) pairs grouped by expert: a counting sort of the t * k choices.
  std::vector<int64_t> begin(static_cast<size_t>(num_experts) + 1, 0);
  for (int64_t j = 0; j < t * k; ++j) ++begin[static_cast<size_t>(id[j]) + 1];
  std::partial_sum(begin.begin(), begin.end(), begin.begin());
  std::vector<int64_t> pairs(static_cast<size_t>(t * k));
  std::vector<int64_t> next(begin.begin(), begin.end() - 1);
  for (int64_t j = 0; j < t * k; ++j) pairs[static_cast<size_t>(next[static_cast<size_t>(id[j])]++)] = j;

  const size_t x_row_bytes = static_cast<size_t>(hidden) * dtype_size(x.dtype);
  const size_t w_bytes = dtype_size(w.experts_gate_up.dtype());
  for (int e = 0; e < num_experts; ++e) {
    const int64_t first = begin[static_cast<size_t>(e)], n = begin[static_cast<size_t>(e) + 1] - first;
    if (n == 0) continue;  // an expert no token chose is not read
    const TensorView xe = in.ws.expert_in(n);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t token = pairs[static_cast<size_t>(first + r)] / k;
      std::memcpy(static_cast<char*>(xe.data) + r * x_row_bytes, static_cast<const char*>(x.data) + token * x_row_bytes,
                  x_row_bytes);
    }
    // This expert's [2 * inter, hidden] and [hidden, inter] slices of the stacked weights.
    const TensorView gate_up_w{static_cast<char*>(w.experts_gate_up.raw()) + e * 2 * inter * hidden * w_bytes,
                               w.experts_gate_up.dtype(),
                               {2 * inter, hidden},
                               in.ws.device()};
    const TensorView down_w{static_cast<char*>(w.experts_down.raw()) + e * hidden * inter * w_bytes,
                            w.experts_down.dtype(),
                            {hidden, inter},
                            in.ws.device()};
    const TensorView gate_up = in.ws.expert_gate_up(n);
    linear(gate_up, xe, gate_up_w);
    const TensorView act = in.ws.expert_act(n);
    gated_activation(act, gate_up, c.activation);
    const TensorView out = in.ws.proj(n);
    linear(out, act, down_w);
    auto* hp = static_cast<float*>(h.data);
    const auto* op = static_cast<const float*>(out.data);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t pair = pairs[static_cast<size_t>(first + r)];
      const float p = gate[pair];
      float* dst = hp + (pair / k) * hidden;
      const float* src = op + r * hidden;
      for (int64_t d = 0; d < hidden; ++d) dst[d] += p * src[d];
    }
  }
  if (c.shared_expert_intermediate_size == 0) return;
  // The shared experts (one gated MLP as wide as all of them together) see every token, with weight 1.
  const TensorView shared_gate_up = in.ws.shared_expert_gate_up(t);
  linear(shared_gate_up, x, w.shared_gate_up.view());
  const TensorView shared_act = in.ws.shared_expert_act(t);
  gated_activation(shared_act, shared_gate_up, c.activation);
  linear_add(h, shared_act, w.shared_down.view());
}

}  // namespace se
