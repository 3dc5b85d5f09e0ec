// Transformations the loaders apply to weights on their way to the canonical layout: dtype casts,
// llama.cpp's Q/K row permutation undone, Gemma's norm offset folded in. Each returns a new CPU
// tensor; inputs are not modified. Thread-safe.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace se {

// A copy of `t` (F32/F16/BF16) in `dtype` (F32/F16/BF16); `t` itself when the dtype already
// matches.
Tensor cast_weight(const Tensor& t, DType dtype);

// Undoes convert_hf_to_gguf.py's LlamaModel.permute on the rows of a Q or K projection (weight
// [out, in] or bias [out]) with `num_heads` heads (the KV head count for K). The converter regroups
// each head's rows from HF's rotate-half order (first half, second half) into interleaved pairs:
// GGUF row 2i+j of a head holds HF row j*(head_dim/2)+i. Precondition: out is a multiple of 2 *
// num_heads.
Tensor unpermute_qk_rows(const Tensor& t, int64_t num_heads);

// The inverse of unpermute_qk_rows (what the converter does), for tests and tools.
Tensor permute_qk_rows(const Tensor& t, int64_t num_heads);

// `t` + 1 elementwise, in t's dtype (Gemma's HF norm weights w are applied as 1 + w).
Tensor add_one(const Tensor& t);

}  // namespace se
