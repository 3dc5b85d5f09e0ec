// The CUDA twins of backend/moe_ops.h, enqueued on CudaContext::current()'s stream, asynchronous to the host and
// free of host round trips (the expert offsets stay on the device; launch sizes depend on t alone, so a decode
// step is capturable). All tensors live on the device. Plain C++ header (no CUDA includes): moe_ops.cpp includes it.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace se::cuda {

void route_experts(TensorView experts, TensorView weights, TensorView logits, bool normalize);
void group_by_expert(TensorView offsets, TensorView rows, TensorView slots, TensorView experts);
void grouped_linear(TensorView out, TensorView x, TensorView w, TensorView offsets, int64_t max_rows,
                    TensorView w_scale);
void moe_combine(TensorView h, TensorView y, TensorView weights, TensorView slots);

}  // namespace se::cuda
