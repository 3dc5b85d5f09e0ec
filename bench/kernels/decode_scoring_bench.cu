// The decode-time compression scores on the GPU at the shapes the methods run (Llama-3.1-8B heads: 32 query heads,
// 8 KV heads, head_dim 128), one layer of one sequence per call: R-KV's attention importance and key redundancy over
// budget + buffer = 1,152 keys with its 8-query window, and Kara's bidirectional scores of a 576-query window over
// its 512 compressible keys. Reports each op's time and the f32 rate of its dot products (the matrix every score
// reduces); the PyTorch peer, the same scores as the reference implementations write them, is
// decode_scoring_peer.py. Usage: decode_scoring_bench [--csv FILE]
#include <cstdio>
#include <functional>

#include "backend/cuda/cuda_context.h"
#include "backend/device_memory.h"
#include "backend/ops.h"
#include "csv_flag.h"
#include "cuda_timing.h"
#include "device_buffers.cuh"

namespace se {
namespace {

constexpr int kHeads = 32, kKvHeads = 8, kHeadDim = 128;

__global__ void fill_f32_kernel(float* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] = bench::hashed_uniform(i, seed) * 1.7320508f;
  }
}

Tensor random_f32(Shape shape, uint64_t seed) {
  Tensor t = empty_on(Device::kCuda, DType::kF32, shape);
  fill_f32_kernel<<<1024, 256, 0, cuda::CudaContext::current().stream()>>>(t.data<float>(),
                                                                           static_cast<size_t>(t.numel()), seed);
  SE_CUDA_CHECK_LAUNCH("fill_f32_kernel");
  return t;
}

struct Case {
  const char* op;
  int rows;  // window queries (0: keys against keys)
  int keys;
  double dot_flops;  // 2 x the multiply-adds of the op's dot products
  std::function<void(TensorView out, TensorView q, TensorView k)> run;
};

int run(const char* csv_path) {
  const Case cases[] = {
      {"group_max_attention_importance", 8, 1144, 2.0 * 8 * kHeads * 1144 * kHeadDim,
       [](TensorView out, TensorView q, TensorView k) { group_max_attention_importance(out, q, k); }},
      {"key_redundancy", 0, 1152, 2.0 * kKvHeads * 1152.0 * 1152 * kHeadDim,
       [](TensorView out, TensorView, TensorView k) { key_redundancy(out, k, 0.5f); }},
      {"bidirectional_window_scores", 576, 512, 2.0 * 576 * kHeads * 512 * kHeadDim,
       [](TensorView out, TensorView q, TensorView k) { bidirectional_window_scores(out, q, k); }},
  };
  std::FILE* csv = csv_path != nullptr ? std::fopen(csv_path, "w") : nullptr;
  if (csv != nullptr) std::fprintf(csv, "op,rows,keys,us,dot_tflops\n");
  std::printf("| op | window queries | keys | us | dot products TFLOP/s |\n|---|---|---|---|---|\n");
  for (const Case& c : cases) {
    const Tensor q = random_f32({std::max(c.rows, 1), kHeads, kHeadDim}, 1);
    const Tensor k = random_f32({c.keys, kKvHeads, kHeadDim}, 2);
    Tensor out = empty_on(Device::kCuda, DType::kF32, {kKvHeads, c.keys});
    const float ms = bench::time_ms(3, 20, [&](int) { c.run(out.view(), q.view(), k.view()); });
    const double tflops = c.dot_flops / (ms * 1e-3) / 1e12;
    std::printf("| %s | %d | %d | %.1f | %.1f |\n", c.op, c.rows, c.keys, ms * 1e3, tflops);
    if (csv != nullptr) std::fprintf(csv, "%s,%d,%d,%.2f,%.2f\n", c.op, c.rows, c.keys, ms * 1e3, tflops);
  }
  if (csv != nullptr) std::fclose(csv);
  return 0;
}

}  // namespace
}  // namespace se

int main(int argc, char** argv) { return se::bench::run_with_csv_flag(argc, argv, se::run); }
