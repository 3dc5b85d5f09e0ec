// The CPU reference of backend/moe_ops.h (fp32; host memory). Same contracts; moe_ops.cpp checks the shapes.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace se::cpu {

void route_experts(TensorView experts, TensorView weights, TensorView logits, bool normalize);
void group_by_expert(TensorView offsets, TensorView rows, TensorView slots, TensorView experts);
void grouped_linear(TensorView out, TensorView x, TensorView w, TensorView offsets, TensorView w_scale);
void moe_combine(TensorView h, TensorView y, TensorView weights, TensorView slots);

}  // namespace se::cpu
