// The mixture-of-experts ops (Qwen3-MoE's sparse MLP): the router's top-k, the grouping of the (token, expert)
// pairs by expert, one GEMM per projection over every expert's rows at once, and the weighted sum back into the
// residual stream. Like ops.h: non-owning views, shape checks here, dispatch on the output's device to the CPU
// reference (backend/cpu/moe.h) or its CUDA twin (backend/cuda/moe.h). The CUDA twins never wait for the host
// (the grouping stays on the device), so a decode step that routes stays one capturable launch sequence, and an
// expert no row chose has none of its weights read. Thread-safety as ops.h.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace se {

// The routing of each row: logits [t, num_experts] F32 router logits in; out per row the top k experts (experts
// [t, k] I32, in descending softmax probability, ties to the lower index) with their fp32 softmax probabilities
// (weights [t, k] F32), renormalized to sum to 1 when `normalize`.
void route_experts(TensorView experts, TensorView weights, TensorView logits, bool normalize);

// The t * k pairs (row r, slot j) of `experts` [t, k] I32 grouped by expert, each expert's pairs in pair order:
// offsets [num_experts + 1] I32 (expert e owns grouped rows [offsets[e], offsets[e + 1])), rows [t * k] I32 (the
// row r of each grouped row) and slots [t * k] I32 (the grouped row of pair r * k + j).
void group_by_expert(TensorView offsets, TensorView rows, TensorView slots, TensorView experts);

// out[i] = x[i] @ w[e]^T for every grouped row i of expert e (offsets[e] <= i < offsets[e + 1]): x [n, K], w
// [num_experts, N, K] of one dtype (F32 on the CPU; BF16 or F32 on CUDA), out [n, N] F32 or x's dtype; offsets
// as group_by_expert writes them, with no expert above `max_rows` rows (the batch's t: a row picks an expert once).
// Rows past offsets[num_experts] are not written.
// Block-scaled FP8 experts: w holds e4m3 codes (U8) and `w_scale` their scales, F32 [num_experts, N / block_rows,
// K / block_cols] with both block sizes multiples of 32 dividing N and K; element (n, c) of expert e reads back as
// fp8(w[e, n, c]) * w_scale[e, n / block_rows, c / block_cols] (fp8_block_weights.h), and x is F32 on the CPU, BF16
// on CUDA. The codes are read as they are stored: a step reads one byte per weight.
void grouped_linear(TensorView out, TensorView x, TensorView w, TensorView offsets, int64_t max_rows,
                    TensorView w_scale = {});

// h[r] += sum_j weights[r, j] * y[slots[r * k + j]], the slots summed in order: h [t, hidden] F32, y [t * k,
// hidden] F32 (the experts' outputs in grouped order), weights [t, k] F32, slots [t * k] I32.
void moe_combine(TensorView h, TensorView y, TensorView weights, TensorView slots);

}  // namespace se
