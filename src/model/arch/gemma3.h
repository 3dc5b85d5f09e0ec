// Gemma 3's norm convention: HF Gemma checkpoints store a norm weight w that the model applies as x * (1 + w);
// the canonical weights (and llama.cpp's GGUF files) hold the multiplier 1 + w. Pure; thread-safe.
#pragma once

#include "tensor/tensor.h"

namespace se {

// The multiplier 1 + w of an HF Gemma norm weight `w` (F32/F16/BF16), a new F32 tensor.
Tensor gemma_norm_multiplier(const Tensor& w);

}  // namespace se
