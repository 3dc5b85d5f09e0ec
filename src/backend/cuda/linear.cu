#include <cstdint>
#include <unordered_map>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"

namespace se::cuda {

namespace {
struct LinearKey {
  int64_t m, n, k;
  DType in_dtype, out_dtype;
  uint32_t alignment;  // bytes every operand pointer is aligned to (capped at 256)
  bool operator==(const LinearKey&) const = default;
};

struct LinearKeyHash {
  size_t operator()(const LinearKey& key) const {
    size_t h = std::hash<int64_t>()(key.m);
    h = h * 1000003u ^ std::hash<int64_t>()(key.n);
    h = h * 1000003u ^ std::hash<int64_t>()(key.k);
    return h * 1000003u ^ (static_cast<size_t>(key.in_dtype) << 16 |
                           static_cast<size_t>(key.out_dtype) << 8 | key.alignment);
  }
};

struct LinearPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t w_layout = nullptr, x_layout = nullptr, out_layout = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

cudaDataType_t cuda_type(DType dtype) { return dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }

uint32_t alignment_of(const void* a, const void* b, const void* c) {
  const uintptr_t bits = reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
                         reinterpret_cast<uintptr_t>(c) | uintptr_t{256};
  return static_cast<uint32_t>(bits & (~bits + 1));  // lowest set bit
}

// Row-major out[M, N] = x[M, K] @ w[N, K]^T is, in cuBLAS's column-major terms, out^T[N, M] = w^T
// x^T: A = w (K x N, ld K) transposed, B = x (K x M, ld K), D = out (N x M, ld N).
LinearPlan make_plan(const LinearKey& key, const CudaContext& context) {
  LinearPlan plan;
  SE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  SE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose,
                                                 sizeof(transpose)));
  SE_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep)));
  SE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.w_layout, cuda_type(key.in_dtype),
                                             static_cast<uint64_t>(key.k),
                                             static_cast<uint64_t>(key.n), key.k));
  SE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.x_layout, cuda_type(key.in_dtype),
                                             static_cast<uint64_t>(key.k),
                                             static_cast<uint64_t>(key.m), key.k));
  SE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.out_layout, cuda_type(key.out_dtype),
                                             static_cast<uint64_t>(key.n),
                                             static_cast<uint64_t>(key.m), key.n));
  cublasLtMatmulPreference_t preference = nullptr;
  SE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t workspace = context.workspace_bytes();
  SE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    SE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, attr, &key.alignment,
                                                         sizeof(key.alignment)));
  cublasLtMatmulHeuristicResult_t result{};
  int num_results = 0;
  SE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(context.lt(), plan.desc, plan.w_layout,
                                                 plan.x_layout, plan.out_layout, plan.out_layout,
                                                 preference, 1, &result, &num_results));
  cublasLtMatmulPreferenceDestroy(preference);
  SE_CHECK(num_results > 0, "cuBLASLt has no algorithm for linear M={} N={} K={} {} -> {}", key.m,
           key.n, key.k, dtype_name(key.in_dtype), dtype_name(key.out_dtype));
  plan.algo = result.algo;
  return plan;
}

__global__ void add_bias_kernel(void* out, DType out_dtype, const void* bias, DType bias_dtype,
                                int64_t n, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store_from_float(out, out_dtype, i,
                     load_as_float(out, out_dtype, i) + load_as_float(bias, bias_dtype, i % n));
}
}  // namespace

struct LinearPlanCache {
  std::unordered_map<LinearKey, LinearPlan, LinearKeyHash> plans;
  ~LinearPlanCache() {
    for (auto& [key, plan] : plans) {
      cublasLtMatrixLayoutDestroy(plan.out_layout);
      cublasLtMatrixLayoutDestroy(plan.x_layout);
      cublasLtMatrixLayoutDestroy(plan.w_layout);
      cublasLtMatmulDescDestroy(plan.desc);
    }
  }
};

void destroy_linear_plans(LinearPlanCache* cache) { delete cache; }

namespace {
// out = x w^T (+ bias), or out += x w^T with `accumulate` (beta = 1, out read as cuBLASLt's C).
void project(TensorView out, TensorView x, TensorView w, const TensorView* bias, bool accumulate) {
  CudaContext& context = CudaContext::current();
  const int64_t k = w.shape[1];
  const int64_t n = w.shape[0];
  const int64_t m = x.numel() / k;
  if (m == 0) return;
  LinearPlanCache*& cache = context.linear_plans();
  if (cache == nullptr) cache = new LinearPlanCache();
  const LinearKey key{m, n, k, x.dtype, out.dtype, alignment_of(out.data, x.data, w.data)};
  auto it = cache->plans.find(key);
  if (it == cache->plans.end()) it = cache->plans.emplace(key, make_plan(key, context)).first;
  const LinearPlan& plan = it->second;
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  SE_CUBLAS_CHECK(cublasLtMatmul(context.lt(), plan.desc, &alpha, w.data, plan.w_layout, x.data,
                                 plan.x_layout, &beta, out.data, plan.out_layout, out.data,
                                 plan.out_layout, &plan.algo, context.workspace(),
                                 context.workspace_bytes(), context.stream()));
  if (bias != nullptr) {
    const int64_t total = m * n;
    add_bias_kernel<<<launch::grid_for(total, 256), 256, 0, context.stream()>>>(
        out.data, out.dtype, bias->data, bias->dtype, n, total);
    SE_CUDA_CHECK_LAUNCH("add_bias_kernel");
  }
}
}  // namespace

void linear(TensorView out, TensorView x, TensorView w, const TensorView* bias) {
  project(out, x, w, bias, false);
}

void linear_add(TensorView out, TensorView x, TensorView w) { project(out, x, w, nullptr, true); }

}  // namespace se::cuda
