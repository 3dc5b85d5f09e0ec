// The dtype cast the loaders apply to every weight on its way out (LoadOptions::dtype). What an architecture does
// to its own weights (llama.cpp's Q/K row order, Gemma's norm offset) is its own (model/arch/). Returns a new CPU
// tensor, or the input when nothing changes; inputs are not modified. Thread-safe.
#pragma once

#include "tensor/tensor.h"

namespace se {

// A copy of `t` (F32/F16/BF16) in `dtype` (F32/F16/BF16); `t` itself when the dtype already
// matches.
Tensor cast_weight(const Tensor& t, DType dtype);

}  // namespace se
