// The KIVI store's writes on the GPU (attention_view.h, kKivi): the step's new K/V rows into each stream's bf16
// residual window, and a flush's window rows into 2/4-bit codes with fp16 scales and minima, as kivi_quantize_row
// computes them on the CPU (backend/quant/kivi_quant.h): every step is rounded to fp16 as there, with IEEE
// subtraction and division and round-half-even, so a row of the same values gets the CPU's bytes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/host_tables.h"
#include "backend/quant/quantized_kv_layout.h"

namespace se::cuda {

namespace {

struct WindowWriteArgs {
  char* kv_base;
  size_t page_bytes;
  int32_t page_size, head_dim, num_kv_heads, num_seqs;
  const int32_t* q_indptr;
  const KiviSeqView* kivi_seqs;
  const void* k;
  const void* v;
  DType dtype;  // of k and v
};

// One block per batch row; each thread moves one 16-byte chunk (8 bf16) of K and of V of one KV head into the
// window slot the cache appended for this row.
__global__ void write_kivi_window_kernel(WindowWriteArgs a) {
  const int row = blockIdx.x;
  const int s = seq_of_row(a.q_indptr, a.num_seqs, row);
  const int32_t n = a.q_indptr[s + 1] - a.q_indptr[s];
  const int32_t r = row - a.q_indptr[s];
  const KiviSeqView kivi = a.kivi_seqs[s];
  const int chunks_per_head = a.head_dim / 8;
  for (int u = threadIdx.x; u < a.num_kv_heads * chunks_per_head; u += blockDim.x) {
    const int h = u / chunks_per_head;
    const int c = u - h * chunks_per_head;
    const int32_t slot = kivi.residual.num_tokens[h] - n + r + kivi.residual_first_slot[h];
    const int32_t page = kivi.residual.page_ids[static_cast<int64_t>(h) * kivi.residual.stride + slot / a.page_size];
    char* page_base = a.kv_base + static_cast<size_t>(page) * a.page_bytes;
    const int64_t src = (static_cast<int64_t>(row) * a.num_kv_heads + h) * a.head_dim + c * 8;
    for (int kv = 0; kv < 2; ++kv) {
      const void* from = kv == 0 ? a.k : a.v;
      alignas(16) __nv_bfloat16 chunk[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) chunk[i] = __float2bfloat16(load_as_float(from, a.dtype, src + i));
      const size_t element = (static_cast<size_t>(kv) * a.page_size + slot % a.page_size) * a.head_dim + c * 8;
      *reinterpret_cast<uint4*>(page_base + element * sizeof(__nv_bfloat16)) = *reinterpret_cast<const uint4*>(chunk);
    }
  }
}

// An fp16 tensor op of the reference: computed in fp32 and rounded once to fp16.
__device__ __forceinline__ float f16_round(float x) { return __half2float(__float2half_rn(x)); }
__device__ __forceinline__ uint16_t f16_bits(float x) { return __half_as_ushort(__float2half_rn(x)); }

// kivi_quantize_row over one group of n elements, element i = value(i): its minimum and scale (fp16 bits) and its
// codes, packed 32 / bits per word lowest first into words[0, ceil(n * bits / 32)).
template <typename Value>
__device__ void quantize_group(Value value, int n, int bits, uint32_t* words, uint16_t* scale, uint16_t* mn) {
  const float max_code = static_cast<float>((1 << bits) - 1);
  // The comparisons of std::min, std::max and std::clamp on the host, so signed zeros pick the CPU's side.
  float lo = INFINITY, hi = -INFINITY;
  for (int i = 0; i < n; ++i) {
    const float x = f16_round(value(i));
    lo = x < lo ? x : lo;
    hi = hi < x ? x : hi;
  }
  const float s = f16_round(__fdiv_rn(f16_round(__fsub_rn(hi, lo)), max_code));
  *scale = f16_bits(s);
  *mn = f16_bits(lo);
  const int per_word = 32 / bits;
  uint32_t word = 0;
  for (int i = 0; i < n; ++i) {
    uint32_t q = 0;
    if (s > 0.0f) {
      const float x = f16_round(__fdiv_rn(f16_round(__fsub_rn(f16_round(value(i)), lo)), s));
      const float t = x < 0.0f ? 0.0f : (max_code < x ? max_code : x);
      q = static_cast<uint32_t>(rintf(t));  // round half to even, as torch.round
    }
    word |= q << ((i % per_word) * bits);
    if (i % per_word == per_word - 1 || i == n - 1) {
      words[i / per_word] = word;
      word = 0;
    }
  }
}

struct QuantizeArgs {
  const char* rows_base;  // the pool: window rows
  char* quantized_base;   // the pool: quantized pages
  size_t page_bytes;
  int32_t page_size;  // window rows per page
  int32_t head_dim, group_size, value_group_size, bits;
  KiviPageLayout layout;
  const int32_t* key_pages;
  const int64_t* key_rows;
  int32_t num_values;
  const int32_t* value_pages;
  const int32_t* value_slots;
  const int64_t* value_rows;
};

// Element c of row kv (0 = K, 1 = V) of window row `row` (page * page_size + slot).
__device__ __forceinline__ float window_element(const QuantizeArgs& a, int kv, int64_t row, int c) {
  const int64_t page = row / a.page_size;
  const auto* rows = reinterpret_cast<const __nv_bfloat16*>(a.rows_base + static_cast<size_t>(page) * a.page_bytes);
  return __bfloat162float(rows[(static_cast<size_t>(kv) * a.page_size + (row - page * a.page_size)) * a.head_dim + c]);
}

// One block per key group, one thread per channel: the channel's group_size keys, one code each (a warp reads each
// row's neighbouring channels together).
__global__ void quantize_kivi_keys_kernel(QuantizeArgs a) {
  const int g = blockIdx.x;
  const int64_t* rows = a.key_rows + static_cast<int64_t>(g) * a.group_size;
  char* page = a.quantized_base + static_cast<size_t>(a.key_pages[g]) * a.layout.page_bytes;
  for (int c = threadIdx.x; c < a.head_dim; c += blockDim.x)
    quantize_group(
        [&](int t) { return window_element(a, 0, rows[t], c); }, a.group_size, a.bits,
        reinterpret_cast<uint32_t*>(page + a.layout.key_codes) + static_cast<int64_t>(c) * a.layout.key_words,
        reinterpret_cast<uint16_t*>(page + a.layout.key_scale) + c,
        reinterpret_cast<uint16_t*>(page + a.layout.key_min) + c);
}

// One warp per value row, one lane per value group: the token's channels, groups of value_group_size (each starts
// on a word boundary).
__global__ void quantize_kivi_values_kernel(QuantizeArgs a) {
  const int i = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (i >= a.num_values) return;
  const int64_t row = a.value_rows[i];
  const int32_t t = a.value_slots[i];
  char* page = a.quantized_base + static_cast<size_t>(a.value_pages[i]) * a.layout.page_bytes;
  auto* words =
      reinterpret_cast<uint32_t*>(page + a.layout.value_codes) + static_cast<int64_t>(t) * a.layout.value_words;
  auto* scale =
      reinterpret_cast<uint16_t*>(page + a.layout.value_scale) + static_cast<int64_t>(t) * a.layout.value_groups;
  auto* mn = reinterpret_cast<uint16_t*>(page + a.layout.value_min) + static_cast<int64_t>(t) * a.layout.value_groups;
  const int per_word = 32 / a.bits;
  for (int group = threadIdx.x % 32; group < a.layout.value_groups; group += 32) {
    const int first = group * a.value_group_size;
    quantize_group([&](int c) { return window_element(a, 1, row, first + c); }, a.value_group_size, a.bits,
                   words + first / per_word, scale + group, mn + group);
  }
}

constexpr int kValueWarpsPerBlock = 4;

}  // namespace

void write_kivi_window(const AttentionView& view, TensorView k, TensorView v) {
  const int64_t num_rows = k.shape[0];
  if (num_rows == 0) return;
  SE_CHECK(view.head_dim % 8 == 0 && view.page_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(view.kv_base) % 16 == 0,
           "cuda::write_kv (KIVI): head_dim {} page_bytes {} must allow 16-byte rows", view.head_dim, view.page_bytes);
  const WindowWriteArgs args{static_cast<char*>(view.kv_base),
                             view.page_bytes,
                             view.page_size,
                             view.head_dim,
                             view.num_kv_heads,
                             view.num_seqs,
                             view.q_indptr,
                             view.quantized.kivi_seqs,
                             k.data,
                             v.data,
                             k.dtype};
  write_kivi_window_kernel<<<static_cast<unsigned>(num_rows), 128, 0, CudaContext::current().stream()>>>(args);
  SE_CUDA_CHECK_LAUNCH("write_kivi_window_kernel");
}

void quantize_kivi_rows(const AttentionView& pool, const KiviFlushRows& rows) {
  const QuantizedKvView& qv = pool.quantized;
  // Host tables: key pages | key rows | value pages | value slots | value rows, 8-byte aligned, one copy.
  const auto align8 = [](size_t n) { return (n + 7) / 8 * 8; };
  const size_t key_pages_at = 0;
  const size_t key_rows_at = align8(key_pages_at + rows.key_pages.size_bytes());
  const size_t value_pages_at = key_rows_at + rows.key_rows.size_bytes();
  const size_t value_slots_at = align8(value_pages_at + rows.value_pages.size_bytes());
  const size_t value_rows_at = align8(value_slots_at + rows.value_slots.size_bytes());
  const size_t num_bytes = value_rows_at + rows.value_rows.size_bytes();
  thread_local std::vector<char> tables;
  tables.assign(num_bytes, 0);
  const auto put = [&](size_t at, const auto& span) {
    std::copy_n(reinterpret_cast<const char*>(span.data()), span.size_bytes(), tables.data() + at);
  };
  put(key_pages_at, rows.key_pages);
  put(key_rows_at, rows.key_rows);
  put(value_pages_at, rows.value_pages);
  put(value_slots_at, rows.value_slots);
  put(value_rows_at, rows.value_rows);
  const auto* staged = static_cast<const char*>(stage_host_tables(tables.data(), num_bytes, 0).tables);

  QuantizeArgs a{};
  a.rows_base = static_cast<const char*>(pool.kv_base);
  a.quantized_base = static_cast<char*>(const_cast<void*>(qv.quantized_base));
  a.page_bytes = pool.page_bytes;
  a.page_size = pool.page_size;
  a.head_dim = pool.head_dim;
  a.group_size = qv.group_size;
  a.value_group_size = qv.value_group_size;
  a.bits = qv.bits;
  a.layout = kivi_page_layout(qv.group_size, qv.value_group_size, pool.head_dim, qv.bits);
  a.key_pages = reinterpret_cast<const int32_t*>(staged + key_pages_at);
  a.key_rows = reinterpret_cast<const int64_t*>(staged + key_rows_at);
  a.num_values = static_cast<int32_t>(rows.value_pages.size());
  a.value_pages = reinterpret_cast<const int32_t*>(staged + value_pages_at);
  a.value_slots = reinterpret_cast<const int32_t*>(staged + value_slots_at);
  a.value_rows = reinterpret_cast<const int64_t*>(staged + value_rows_at);
  CudaContext& context = CudaContext::current();
  if (!rows.key_pages.empty()) {
    const int threads = static_cast<int>(std::min<int64_t>(launch::ceil_div(pool.head_dim, 32) * 32, 256));
    quantize_kivi_keys_kernel<<<static_cast<unsigned>(rows.key_pages.size()), threads, 0, context.stream()>>>(a);
    SE_CUDA_CHECK_LAUNCH("quantize_kivi_keys_kernel");
  }
  if (a.num_values > 0) {
    const auto blocks = static_cast<unsigned>(launch::ceil_div(a.num_values, kValueWarpsPerBlock));
    quantize_kivi_values_kernel<<<blocks, 32 * kValueWarpsPerBlock, 0, context.stream()>>>(a);
    SE_CUDA_CHECK_LAUNCH("quantize_kivi_values_kernel");
  }
}

}  // namespace se::cuda
