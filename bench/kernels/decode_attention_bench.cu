// Decode paged-attention benchmark on the GPU: bytes moved over time against the measured copy and
// read-only bandwidths, for the tiled and the simple kernel, at Llama-3.1-8B's head shape (32 query
// heads, 8 KV heads, head_dim 128, bf16 pages). KV pages are shuffled across a pool filled with
// random data; small cases rotate among several disjoint page sets so that repeated runs do not
// read from L2. Times are CUDA-event medians after warm-up. --selection measures the sparse decode
// of Quest and OmniKV instead: 2K selected tokens (128 pages of 16, or 2048 single tokens) of 128K
// streams against dense attention over 2K-token streams. Usage: decode_attention_bench [--quick]
// [--selection] [--csv FILE]
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
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
using bench::time_ms;

constexpr int kHeads = 32, kKvHeads = 8, kHeadDim = 128;

// Reads every 16-byte vector once (the read-only floor); the sum keeps the loads alive.
__global__ void read_kernel(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

// One decode batch: B sequences of `context` tokens per KV head, pages drawn from a shuffled pool;
// with `selected` ([batch][kKvHeads][num_selected] ascending entries of `unit`), a sparse one.
struct DecodeBatch {
  Tensor page_ids, num_tokens, q_indptr, seqs, selected, num_selected;
  AttentionView view;
};

DecodeBatch make_batch(void* pool, int page_size, int batch, int context, const int32_t* pages,
                       const std::vector<int32_t>* selected = nullptr, int num_selected = 0,
                       SelectionUnit unit = SelectionUnit::kToken) {
  DecodeBatch b;
  const int32_t stride = (context + page_size - 1) / page_size;
  std::vector<int32_t> ids(pages, pages + static_cast<size_t>(batch) * kKvHeads * stride);
  b.page_ids = device_i32(ids);
  b.num_tokens = device_i32(std::vector<int32_t>(static_cast<size_t>(batch) * kKvHeads, context));
  std::vector<int32_t> indptr(static_cast<size_t>(batch) + 1);
  std::iota(indptr.begin(), indptr.end(), 0);
  b.q_indptr = device_i32(indptr);
  if (selected != nullptr) {
    b.selected = device_i32(*selected);
    b.num_selected =
        device_i32(std::vector<int32_t>(static_cast<size_t>(batch) * kKvHeads, num_selected));
  }
  std::vector<SeqKvView> seqs;
  for (int s = 0; s < batch; ++s) {
    seqs.push_back(
        SeqKvView{b.page_ids.data<int32_t>() + static_cast<int64_t>(s) * kKvHeads * stride, stride,
                  b.num_tokens.data<int32_t>() + static_cast<int64_t>(s) * kKvHeads});
    if (selected != nullptr) {
      seqs.back().selected =
          b.selected.data<int32_t>() + static_cast<int64_t>(s) * kKvHeads * num_selected;
      seqs.back().selected_stride = num_selected;
      seqs.back().num_selected = b.num_selected.data<int32_t>() + static_cast<int64_t>(s) * kKvHeads;
    }
  }
  b.view = bench::bf16_paged_view(pool, page_size, kHeadDim, kKvHeads, b.q_indptr, seqs, b.seqs);
  b.view.has_selection = selected != nullptr;
  b.view.selection_unit = unit;
  return b;
}

// [batch][kKvHeads][count] ascending entries in [0, universe): the last one and count - 1 random
// others per stream (Quest always keeps the newest page; OmniKV the newest tokens).
std::vector<int32_t> random_selection(int batch, int universe, int count, std::mt19937_64& rng) {
  std::vector<int32_t> flat;
  std::vector<int32_t> others(static_cast<size_t>(universe - 1));
  for (int i = 0; i < batch * kKvHeads; ++i) {
    std::iota(others.begin(), others.end(), 0);
    for (int k = 0; k < count - 1; ++k)
      std::swap(others[static_cast<size_t>(k)],
                others[static_cast<size_t>(k) + rng() % (others.size() - static_cast<size_t>(k))]);
    std::vector<int32_t> list(others.begin(), others.begin() + (count - 1));
    list.push_back(universe - 1);
    std::sort(list.begin(), list.end());
    flat.insert(flat.end(), list.begin(), list.end());
  }
  return flat;
}

struct Row {
  std::string kernel;
  int page_size, batch, context;
  double us, tbps;
};

int run(bool quick, bool selection, const char* csv_path) {
  cuda::CudaContext& context = cuda::CudaContext::current();
  cudaStream_t stream = context.stream();
  std::printf("device: %s, %d SMs, L2 %d MB\n", context.props().name,
              context.props().multiProcessorCount, context.props().l2CacheSize >> 20);

  // Floors: device-to-device copy (bytes read + written) and a read-only pass, over 4 GiB.
  const size_t floor_bytes = size_t{4} << 30;
  Tensor a = Tensor::empty(DType::kU8, {static_cast<int64_t>(floor_bytes)}, cuda::cuda_allocator());
  Tensor b = Tensor::empty(DType::kU8, {static_cast<int64_t>(floor_bytes)}, cuda::cuda_allocator());
  Tensor sink = Tensor::empty(DType::kU8, {64}, cuda::cuda_allocator());
  fill_random_bf16_kernel<<<4096, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(a.raw()),
                                                    floor_bytes / 2, 1);
  const float copy_ms = time_ms(3, 20, [&](int) {
    SE_CUDA_CHECK(cudaMemcpyAsync(b.raw(), a.raw(), floor_bytes, cudaMemcpyDeviceToDevice, stream));
  });
  const float read_ms = time_ms(3, 20, [&](int) {
    read_kernel<<<context.props().multiProcessorCount * 8, 512, 0, stream>>>(
        static_cast<const uint4*>(a.raw()), floor_bytes / 16, static_cast<unsigned*>(sink.raw()));
  });
  const double copy_tbps = 2.0 * floor_bytes / (copy_ms * 1e-3) / 1e12;
  const double read_tbps = floor_bytes / (read_ms * 1e-3) / 1e12;
  std::printf("floor: copy %.3f TB/s (read+write), read-only %.3f TB/s\n", copy_tbps, read_tbps);
  a = Tensor();
  b = Tensor();

  const std::vector<int> batches = quick ? std::vector<int>{1, 16} : std::vector<int>{1, 4, 16, 64};
  const std::vector<int> contexts =
      quick ? std::vector<int>{32768} : std::vector<int>{4096, 32768, 131072};
  const size_t token_bytes = size_t{2} * kHeadDim * 2;  // K and V of one token of one KV head
  const size_t max_tokens = size_t{64} * kKvHeads * 131072;
  const size_t pool_bytes = std::max<size_t>(max_tokens * token_bytes, size_t{1} << 30);
  Tensor pool =
      Tensor::empty(DType::kU8, {static_cast<int64_t>(pool_bytes)}, cuda::cuda_allocator());
  SE_CHECK(pool.raw() != nullptr, "bench: no room for a {} GB pool", pool_bytes >> 30);
  fill_random_bf16_kernel<<<8192, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(pool.raw()),
                                                    pool_bytes / 2, 7);

  std::vector<Row> rows;
  std::mt19937_64 rng(42);
  for (int page_size : {16, 64}) {
    if (selection) break;
    const int32_t pool_pages = static_cast<int32_t>(pool_bytes / (page_size * token_bytes));
    std::vector<int32_t> perm(static_cast<size_t>(pool_pages));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int batch : batches) {
      for (int ctx : contexts) {
        if (page_size == 64 && (ctx != 32768 || batch == 4)) continue;  // page 64: a spot check
        const size_t kv_bytes = static_cast<size_t>(batch) * kKvHeads * ctx * token_bytes;
        const size_t pages_per_set =
            static_cast<size_t>(batch) * kKvHeads * ((ctx + page_size - 1) / page_size);
        // Enough disjoint page sets that one rotation streams >= 1 GB (the L2 holds 60 MB).
        const int sets = static_cast<int>(std::clamp<size_t>(
            (size_t{1} << 30) / kv_bytes, 1, std::min<size_t>(16, pool_pages / pages_per_set)));
        std::vector<DecodeBatch> batch_sets;
        for (int s = 0; s < sets; ++s)
          batch_sets.push_back(
              make_batch(pool.raw(), page_size, batch, ctx, perm.data() + s * pages_per_set));
        Tensor q = Tensor::empty(DType::kBF16, {batch, kHeads, kHeadDim}, cuda::cuda_allocator());
        Tensor out = Tensor::empty(DType::kBF16, {batch, kHeads, kHeadDim}, cuda::cuda_allocator());
        fill_random_bf16_kernel<<<256, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(q.raw()),
                                                         static_cast<size_t>(q.numel()), 3);
        AttentionParams params;
        params.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
        const double bytes = static_cast<double>(kv_bytes) + 2.0 * q.nbytes();
        auto record = [&](const char* kernel, float ms) {
          rows.push_back(Row{kernel, page_size, batch, ctx, ms * 1e3, bytes / (ms * 1e-3) / 1e12});
          const Row& r = rows.back();
          std::printf(
              "%-6s page %-2d batch %-2d context %-6d %9.1f us  %.3f TB/s  %5.1f%% of copy  "
              "%5.1f%% of read\n",
              kernel, page_size, batch, ctx, r.us, r.tbps, 100 * r.tbps / copy_tbps,
              100 * r.tbps / read_tbps);
          std::fflush(stdout);
        };
        record("tiled", time_ms(5, quick ? 10 : 30, [&](int i) {
                 paged_attention(out.view(), q.view(),
                                 batch_sets[static_cast<size_t>(i % sets)].view, params);
               }));
        if (page_size == 16 && ctx == 32768 && (batch == 1 || batch == 16)) {
          record("simple", time_ms(1, 3, [&](int i) {
                   cuda::paged_attention_simple(out.view(), q.view(),
                                                batch_sets[static_cast<size_t>(i % sets)].view,
                                                params);
                 }));
        }
      }
    }
  }
  if (selection) {
    // 2K of 128K at page size 16 (the issue's benchmark), against dense over 2K-token streams.
    constexpr int kPageSize = 16, kLongContext = 131072, kSelectedTokens = 2048;
    const int32_t pool_pages = static_cast<int32_t>(pool_bytes / (kPageSize * token_bytes));
    std::vector<int32_t> perm(static_cast<size_t>(pool_pages));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int batch : batches) {
      Tensor q = Tensor::empty(DType::kBF16, {batch, kHeads, kHeadDim}, cuda::cuda_allocator());
      Tensor out = Tensor::empty(DType::kBF16, {batch, kHeads, kHeadDim}, cuda::cuda_allocator());
      fill_random_bf16_kernel<<<256, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(q.raw()),
                                                       static_cast<size_t>(q.numel()), 3);
      AttentionParams params;
      params.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
      const size_t kv_bytes = static_cast<size_t>(batch) * kKvHeads * kSelectedTokens * token_bytes;
      const double bytes = static_cast<double>(kv_bytes) + 2.0 * q.nbytes();
      // Selections rotate among sets so that one rotation reads >= 1 GB (the L2 holds 60 MB).
      const int sets = static_cast<int>(std::clamp<size_t>((size_t{1} << 30) / kv_bytes, 1, 16));
      auto record = [&](const char* kernel, int ctx, float ms) {
        rows.push_back(Row{kernel, kPageSize, batch, ctx, ms * 1e3, bytes / (ms * 1e-3) / 1e12});
        const Row& r = rows.back();
        std::printf("%-13s page %-2d batch %-2d context %-6d %9.1f us  %.3f TB/s  %5.1f%% of read\n",
                    kernel, kPageSize, batch, ctx, r.us, r.tbps, 100 * r.tbps / read_tbps);
        std::fflush(stdout);
      };
      auto time_sets = [&](const std::vector<DecodeBatch>& b) {
        return time_ms(5, quick ? 10 : 30, [&](int i) {
          paged_attention(out.view(), q.view(), b[static_cast<size_t>(i) % b.size()].view, params);
        });
      };
      std::vector<DecodeBatch> dense, pages, tokens;
      const size_t dense_pages = static_cast<size_t>(batch) * kKvHeads * (kSelectedTokens / kPageSize);
      const size_t long_pages = static_cast<size_t>(batch) * kKvHeads * (kLongContext / kPageSize);
      for (int s = 0; s < sets; ++s)
        dense.push_back(make_batch(pool.raw(), kPageSize, batch, kSelectedTokens,
                                   perm.data() + s * dense_pages));
      record("dense", kSelectedTokens, time_sets(dense));
      dense.clear();
      SE_CHECK(long_pages <= perm.size(), "bench: pool too small");
      for (int s = 0; s < sets; ++s) {
        const std::vector<int32_t> page_sel = random_selection(
            batch, kLongContext / kPageSize, kSelectedTokens / kPageSize, rng);
        pages.push_back(make_batch(pool.raw(), kPageSize, batch, kLongContext, perm.data(),
                                   &page_sel, kSelectedTokens / kPageSize, SelectionUnit::kPage));
      }
      record("page-select", kLongContext, time_sets(pages));
      pages.clear();
      for (int s = 0; s < sets; ++s) {
        const std::vector<int32_t> token_sel =
            random_selection(batch, kLongContext, kSelectedTokens, rng);
        tokens.push_back(make_batch(pool.raw(), kPageSize, batch, kLongContext, perm.data(),
                                    &token_sel, kSelectedTokens, SelectionUnit::kToken));
      }
      record("token-select", kLongContext, time_sets(tokens));
    }
  }
  context.synchronize();

  if (csv_path != nullptr) {
    FILE* f = std::fopen(csv_path, "w");
    SE_CHECK(f != nullptr, "bench: cannot write {}", csv_path);
    std::fprintf(f, "kernel,page_size,batch,context,us,tbps,copy_tbps,read_tbps\n");
    for (const Row& r : rows)
      std::fprintf(f, "%s,%d,%d,%d,%.2f,%.4f,%.4f,%.4f\n", r.kernel.c_str(), r.page_size, r.batch,
                   r.context, r.us, r.tbps, copy_tbps, read_tbps);
    std::fclose(f);
  }
  return 0;
}

}  // namespace
}  // namespace se

int main(int argc, char** argv) {
  bool quick = false;
  bool selection = false;
  const char* csv = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--selection") == 0) {
      selection = true;
    } else if (std::strcmp(argv[i], "--csv") == 0 && i + 1 < argc) {
      csv = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--selection] [--csv FILE]\n", argv[0]);
      return 2;
    }
  }
  return se::run(quick, selection, csv);
}
