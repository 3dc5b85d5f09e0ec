// Dequantization of GGML tensor encodings to fp32: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
// Q4_K, Q5_K, Q6_K. Results are bit-identical to gguf-py's `gguf.quants.dequantize` (plain fp32
// multiply/add, no FMA). Pure functions; thread-safe. dequantize_tensor splits work over OpenMP
// threads.
#pragma once

#include <cstdint>

#include "base/status.h"
#include "loader/ggml_type.h"
#include "loader/gguf_file.h"
#include "tensor/tensor.h"

namespace se {

// Whether dequantize_blocks supports `type`.
bool can_dequantize(GgmlType type);

// Decodes `num_blocks` blocks of `type` at `src` into num_blocks * block_size floats at `dst`.
// Precondition: can_dequantize(type), and `src` holds num_blocks * type_size bytes.
void dequantize_blocks(GgmlType type, const uint8_t* src, float* dst, int64_t num_blocks);

// An fp32 CPU tensor of `info`, shaped row-major with the ggml dims reversed ([ne1, ne0] for a
// matrix). kUnimplemented naming the tensor and its type when the type cannot be dequantized.
Result<Tensor> dequantize_tensor(const GgufTensorInfo& info);

}  // namespace se
