// CUDA-event timing shared by the kernel benchmarks.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"

namespace se::bench {

inline float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median milliseconds of `reps` runs of fn(rep) after `warmup` runs, each timed with its own events on the
// context's stream.
template <typename Fn>
float time_ms(int warmup, int reps, Fn&& fn) {
  cudaStream_t stream = cuda::CudaContext::current().stream();
  for (int i = 0; i < warmup; ++i) fn(i);
  cudaEvent_t start, stop;
  SE_CUDA_CHECK(cudaEventCreate(&start));
  SE_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int i = 0; i < reps; ++i) {
    SE_CUDA_CHECK(cudaEventRecord(start, stream));
    fn(warmup + i);
    SE_CUDA_CHECK(cudaEventRecord(stop, stream));
    SE_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    SE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  SE_CUDA_CHECK(cudaEventDestroy(start));
  SE_CUDA_CHECK(cudaEventDestroy(stop));
  return median(times);
}

}  // namespace se::bench
