// Prefill paged-attention benchmark on the GPU: causal attention of one prompt of L tokens over its own
// paged KV, in the engine's chunks (each chunk's rows attend to every earlier token), at Llama-3.1-8B's
// head shape (32 query heads, 8 KV heads, head_dim 128, bf16 pages of 16 shuffled through the pool).
// Reports TFLOP/s counting only the visible (causal) scores: 4 * head_dim * heads * L(L+1)/2. The peer
// is sdpa_prefill_bench.py on contiguous K/V. Times are CUDA-event medians after warm-up.
// Usage: prefill_attention_bench [--quick] [--chunk N] [--csv FILE]
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/cuda_allocator.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/ops.h"
#include "cuda_timing.h"
#include "device_buffers.cuh"

namespace se {
namespace {

using bench::device_i32;
using bench::fill_random_bf16_kernel;

constexpr int kHeads = 32, kKvHeads = 8, kHeadDim = 128, kPageSize = 16;

// One chunk of the prompt: rows [begin, end) of a sequence whose KV holds its first `end` tokens.
struct Chunk {
  Tensor num_tokens, q_indptr, seqs;
  AttentionView view;
  int64_t rows;
};

Chunk make_chunk(void* pool, const Tensor& page_ids, int32_t stride, int begin, int end) {
  Chunk c;
  c.rows = end - begin;
  c.num_tokens = device_i32(std::vector<int32_t>(kKvHeads, end));
  c.q_indptr = device_i32({0, end - begin});
  const std::vector<SeqKvView> seqs{{page_ids.data<int32_t>(), stride, c.num_tokens.data<int32_t>()}};
  c.view = bench::bf16_paged_view(pool, kPageSize, kHeadDim, kKvHeads, c.q_indptr, seqs, c.seqs);
  return c;
}

int run(bool quick, int chunk_tokens, const char* csv_path) {
  cuda::CudaContext& context = cuda::CudaContext::current();
  cudaStream_t stream = context.stream();
  std::printf("device: %s, %d SMs; chunks of %d rows\n", context.props().name,
              context.props().multiProcessorCount, chunk_tokens);
  const std::vector<int> contexts =
      quick ? std::vector<int>{4096, 32768} : std::vector<int>{4096, 16384, 32768, 131072};
  const int max_context = contexts.back();
  const int32_t stride = max_context / kPageSize;
  const size_t page_bytes = size_t{2} * kPageSize * kHeadDim * 2;
  const int32_t pool_pages = kKvHeads * stride;
  Tensor pool = Tensor::empty(DType::kU8, {static_cast<int64_t>(pool_pages * page_bytes)},
                              cuda::cuda_allocator());
  fill_random_bf16_kernel<<<8192, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(pool.raw()),
                                                    pool_pages * page_bytes / 2, 7);
  std::vector<int32_t> perm(static_cast<size_t>(pool_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(42);
  std::shuffle(perm.begin(), perm.end(), rng);
  const Tensor page_ids = device_i32(perm);  // [kKvHeads][stride]

  const int max_rows = std::min(chunk_tokens, max_context);
  Tensor q = Tensor::empty(DType::kBF16, {max_rows, kHeads, kHeadDim}, cuda::cuda_allocator());
  Tensor out = Tensor::empty(DType::kBF16, {max_rows, kHeads, kHeadDim}, cuda::cuda_allocator());
  fill_random_bf16_kernel<<<1024, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(q.raw()),
                                                    static_cast<size_t>(q.numel()), 3);
  AttentionParams params;
  params.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));

  FILE* csv = csv_path != nullptr ? std::fopen(csv_path, "w") : nullptr;
  if (csv_path != nullptr) SE_CHECK(csv != nullptr, "bench: cannot write {}", csv_path);
  if (csv != nullptr) std::fprintf(csv, "context,chunk,ms,tflops\n");
  for (const int ctx : contexts) {
    std::vector<Chunk> chunks;
    for (int begin = 0; begin < ctx; begin += chunk_tokens)
      chunks.push_back(make_chunk(pool.raw(), page_ids, stride, begin,
                                  std::min(ctx, begin + chunk_tokens)));
    const float ms = bench::time_ms(2, quick ? 3 : 5, [&](int) {
      for (const Chunk& c : chunks) {
        paged_attention(out.slice_rows(0, c.rows).view(), q.slice_rows(0, c.rows).view(), c.view,
                        params);
      }
    });
    const double flops = 4.0 * kHeadDim * kHeads * (static_cast<double>(ctx) * (ctx + 1) / 2);
    const double tflops = flops / (ms * 1e-3) / 1e12;
    std::printf("context %-6d chunk %-6d %10.2f ms  %7.1f TFLOP/s\n", ctx,
                std::min(ctx, chunk_tokens), ms, tflops);
    std::fflush(stdout);
    if (csv != nullptr)
      std::fprintf(csv, "%d,%d,%.3f,%.2f\n", ctx, std::min(ctx, chunk_tokens), ms, tflops);
  }
  if (csv != nullptr) std::fclose(csv);
  context.synchronize();
  return 0;
}

}  // namespace
}  // namespace se

int main(int argc, char** argv) {
  bool quick = false;
  int chunk = 16384;  // the engine's default --max-num-batched-tokens
  const char* csv = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--chunk") == 0 && i + 1 < argc) {
      chunk = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--csv") == 0 && i + 1 < argc) {
      csv = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--chunk N] [--csv FILE]\n", argv[0]);
      return 2;
    }
  }
  if (chunk <= 0) {
    std::fprintf(stderr, "--chunk must be positive\n");
    return 2;
  }
  return se::run(quick, chunk, csv);
}
