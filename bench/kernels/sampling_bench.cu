// Sampling on the GPU: `argmax_rows` (greedy) and `sample_rows` (temperature, top-k, top-p, min-p) over a decode
// batch's logits, [rows, 128256] F32 (Llama 3's vocabulary), against the time to read those logits once. The peer,
// vLLM's PyTorch sampler (sort, mask, exponential race), is sampling_peer.py. Usage: sampling_bench [--csv FILE]
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/device_memory.h"
#include "backend/ops.h"
#include "csv_flag.h"
#include "cuda_timing.h"
#include "device_buffers.cuh"

namespace se {
namespace {

constexpr int64_t kVocab = 128256;

__global__ void fill_logits_kernel(float* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] = bench::hashed_uniform(i, seed) * 8.0f;  // logits in [-8, 8)
  }
}

struct Setting {
  const char* name;
  RowSampling row;  // unused for greedy
};

int run(const char* csv_path) {
  const Setting settings[] = {{"greedy", {}},
                              {"temperature 0.8", {0.8f, 0, 1.0f, 0.0f, 0.0}},
                              {"top_k 50 top_p 0.95", {0.8f, 50, 0.95f, 0.0f, 0.0}},
                              {"top_p 0.9", {1.0f, 0, 0.9f, 0.0f, 0.0}},
                              {"min_p 0.05", {1.0f, 0, 1.0f, 0.05f, 0.0}}};
  std::FILE* csv = csv_path != nullptr ? std::fopen(csv_path, "w") : nullptr;
  if (csv != nullptr) std::fprintf(csv, "rows,setting,us,logits_gbps\n");
  std::printf("| rows | setting | us | logits read GB/s |\n|---|---|---|---|\n");
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (int rows : {1, 8, 32, 128, 256}) {
    Tensor logits = empty_on(Device::kCuda, DType::kF32, {rows, kVocab});
    const size_t n = static_cast<size_t>(logits.numel());
    fill_logits_kernel<<<1024, 256, 0, cuda::CudaContext::current().stream()>>>(logits.data<float>(), n, rows);
    SE_CUDA_CHECK_LAUNCH("fill_logits_kernel");
    Tensor ids = empty_on(Device::kCuda, DType::kI32, {rows});
    Tensor logprobs = empty_on(Device::kCuda, DType::kF32, {rows});
    for (const Setting& s : settings) {
      std::vector<RowSampling> per_row(static_cast<size_t>(rows), s.row);
      const bool greedy = std::strcmp(s.name, "greedy") == 0;
      const float ms = bench::time_ms(3, 20, [&](int) {
        if (greedy) {
          argmax_rows(ids.view(), logprobs.view(), logits.view());
          return;
        }
        for (RowSampling& r : per_row) r.u = uniform(rng);
        sample_rows(ids.view(), logprobs.view(), logits.view(), per_row);
      });
      const double gbps = static_cast<double>(n * sizeof(float)) / (ms * 1e-3) / 1e9;
      std::printf("| %d | %s | %.1f | %.0f |\n", rows, s.name, ms * 1e3, gbps);
      if (csv != nullptr) std::fprintf(csv, "%d,%s,%.2f,%.1f\n", rows, s.name, ms * 1e3, gbps);
    }
  }
  if (csv != nullptr) std::fclose(csv);
  return 0;
}

}  // namespace
}  // namespace se

int main(int argc, char** argv) { return se::bench::run_with_csv_flag(argc, argv, se::run); }
