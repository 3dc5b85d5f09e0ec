// Llama's decoder block, which the architectures that keep its shape (Qwen2, Qwen3) run too.
#pragma once

#include "model/layers/block_inputs.h"

namespace se {

// Pre-norm block: h += attention(norm(h)); h += gated_mlp(norm(h)), each residual add fused into its last GEMM.
void llama_block(const BlockInputs& in);

}  // namespace se
