// Internal to the CUDA multi-head latent attention files: the per-head products with a slice of kv_b that take the
// queries into latent space (W_uk, absorb_latent_queries) and attention's latent outputs back out of it (W_uv,
// paged_latent_attention). Each head multiplies its own rows by its own block of kv_b: a batched GEMM of one small
// matrix per head.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace se::cuda {

// y[t, h, :n] = x[t, h, :k] B_h for t < rows, h < heads, where B_h is a [k, n] slice of w [?, w_cols] starting at
// row h * w_rows_per_head + w_first_row: B_h(i, j) = w[row + i][j], or w[row + j][i] when `transposed`. x, y and
// w are F32 or BF16 device memory; head h of row t starts at (t * heads + h) * x_head_stride in x (y_head_stride
// in y). fp32 accumulation.
struct HeadGemm {
  const void* x;
  DType x_dtype;
  int64_t x_head_stride;
  void* y;
  DType y_dtype;
  int64_t y_head_stride;
  const void* w;
  DType w_dtype;
  int64_t w_cols;
  int64_t w_rows_per_head;
  int64_t w_first_row;
  bool transposed;
  int32_t rows, heads, k, n;
};

// Enqueued on the current context's stream.
void head_gemm(const HeadGemm& g);

}  // namespace se::cuda
