// Parity of the CUDA write_kv and paged attention (tiled and simple kernels) with the CPU reference
// over the same paged cache: the CPU pool holds f32 copies of the GPU's bf16 pages, pages are
// shuffled across the pool and filled with random data beyond each stream's end (masking must hide
// it). Page sizes 16 and 64, contexts 1 to 128K, GQA groups 1 to 32, ragged batches mixing prefill
// chunks and decode rows, windows and soft-capping.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "backend/ops.h"
#include "cuda_test_util.h"

namespace se {
namespace {

using test::download_f32;
using test::poisoned;
using test::random_host;
using test::relative_error;
using test::upload;

struct SeqSpec {
  int32_t
      num_tokens;   // tokens per KV head after this step (head h keeps num_tokens - h * head_skew)
  int32_t num_new;  // query rows this step
};

struct PagedCase {
  std::string name;
  int32_t page_size, num_kv_heads, group, head_dim;
  std::vector<SeqSpec> seqs;
  int32_t window = 0;
  float softcap = 0.0f;
  int32_t head_skew = 0;  // per-head stream lengths differ (as after per-head eviction)
  DType q_dtype = DType::kBF16;
  DType out_dtype = DType::kBF16;
};

// One paged cache in two copies: f32 pages on the host for the CPU reference, bf16 pages on the
// GPU, with the same page lists (device copies of the tables for the GPU view).
class PagedCacheFixture {
 public:
  PagedCacheFixture(const PagedCase& c, uint64_t seed) : c_(c) {
    const int32_t hkv = c.num_kv_heads;
    int64_t pages_needed = 0;
    for (const SeqSpec& s : c.seqs) {
      const int32_t stride =
          (s.num_tokens + c.page_size - 1) / c.page_size + 1;  // one spare page per head
      pages_needed += int64_t{stride} * hkv;
    }
    num_pages_ = static_cast<int32_t>(pages_needed + 3);
    std::vector<int32_t> free_pages(static_cast<size_t>(num_pages_));
    std::iota(free_pages.begin(), free_pages.end(), 0);
    std::shuffle(free_pages.begin(), free_pages.end(), std::mt19937_64(seed));
    size_t next_free = 0;

    q_indptr_.push_back(0);
    for (const SeqSpec& s : c.seqs) {
      const int32_t stride = (s.num_tokens + c.page_size - 1) / c.page_size + 1;
      page_offset_.push_back(static_cast<int64_t>(page_ids_.size()));
      count_offset_.push_back(static_cast<int64_t>(num_tokens_.size()));
      strides_.push_back(stride);
      for (int32_t h = 0; h < hkv; ++h) {
        num_tokens_.push_back(s.num_tokens - h * c.head_skew);
        for (int32_t i = 0; i < stride; ++i) page_ids_.push_back(free_pages[next_free++]);
      }
      q_indptr_.push_back(q_indptr_.back() + s.num_new);
    }
    // Every page, used or not, holds random bf16-representable values.
    elems_per_page_ = int64_t{2} * c.page_size * c.head_dim;
    cpu_pool_ = random_host({num_pages_, elems_per_page_}, seed + 1, DType::kBF16);
    gpu_pool_ = upload(cpu_pool_, DType::kBF16);

    d_page_ids_ = device_i32(page_ids_);
    d_num_tokens_ = device_i32(num_tokens_);
    d_q_indptr_ = device_i32(q_indptr_);
    std::vector<SeqKvView> dev_seqs;
    for (size_t s = 0; s < c.seqs.size(); ++s) {
      host_seqs_.push_back(SeqKvView{page_ids_.data() + page_offset_[s], strides_[s],
                                     num_tokens_.data() + count_offset_[s]});
      dev_seqs.push_back(SeqKvView{d_page_ids_.data<int32_t>() + page_offset_[s], strides_[s],
                                   d_num_tokens_.data<int32_t>() + count_offset_[s]});
    }
    d_seqs_ = Tensor::empty(DType::kU8, {static_cast<int64_t>(sizeof(SeqKvView) * dev_seqs.size())},
                            cuda::cuda_allocator());
    cuda::copy_bytes(d_seqs_.raw(), dev_seqs.data(), sizeof(SeqKvView) * dev_seqs.size());
  }

  int64_t num_rows() const { return q_indptr_.back(); }

  AttentionView cpu_view() const {
    AttentionView v = common();
    v.kv_base = cpu_pool_.raw();
    v.kv_dtype = DType::kF32;
    v.page_bytes = static_cast<size_t>(elems_per_page_) * sizeof(float);
    v.q_indptr = q_indptr_.data();
    v.seqs = host_seqs_.data();
    return v;
  }
  AttentionView gpu_view() const {
    AttentionView v = common();
    v.kv_base = gpu_pool_.raw();
    v.kv_dtype = DType::kBF16;
    v.page_bytes = static_cast<size_t>(elems_per_page_) * 2;
    v.q_indptr = d_q_indptr_.data<int32_t>();
    v.seqs = static_cast<const SeqKvView*>(d_seqs_.raw());
    return v;
  }

  // Number of pool elements where the GPU's bf16 pages differ from the CPU's f32 pages.
  int64_t count_pool_mismatches() const {
    const Tensor gpu = download_f32(gpu_pool_);
    int64_t mismatches = 0;
    for (int64_t i = 0; i < gpu.numel(); ++i)
      mismatches +=
          gpu.data<float>()[i] != test::representable(cpu_pool_.data<float>()[i], DType::kBF16);
    return mismatches;
  }

 private:
  static Tensor device_i32(const std::vector<int32_t>& v) {
    Tensor host = Tensor::empty(DType::kI32, {static_cast<int64_t>(v.size())});
    std::copy(v.begin(), v.end(), host.data<int32_t>());
    return cuda::to_device(host);
  }
  AttentionView common() const {
    AttentionView v;
    v.page_size = c_.page_size;
    v.head_dim = c_.head_dim;
    v.num_kv_heads = c_.num_kv_heads;
    v.num_seqs = static_cast<int32_t>(c_.seqs.size());
    return v;
  }

  PagedCase c_;
  int32_t num_pages_ = 0;
  int64_t elems_per_page_ = 0;
  std::vector<int32_t> q_indptr_, page_ids_, num_tokens_, strides_;
  std::vector<int64_t> page_offset_, count_offset_;
  std::vector<SeqKvView> host_seqs_;
  Tensor cpu_pool_, gpu_pool_, d_page_ids_, d_num_tokens_, d_q_indptr_, d_seqs_;
};

enum class Kernel { kTiled, kSimple };

// Writes the step's K/V through write_kv on both copies (checked bit-exact), then attends with
// `kernel`.
void run_case(const PagedCase& c, Kernel kernel, uint64_t seed) {
  SCOPED_TRACE(c.name);
  PagedCacheFixture cache(c, seed);
  const int64_t rows = cache.num_rows();
  const int64_t heads = int64_t{c.num_kv_heads} * c.group;
  const Tensor k = random_host({rows, c.num_kv_heads, c.head_dim}, seed + 2, DType::kBF16);
  const Tensor v = random_host({rows, c.num_kv_heads, c.head_dim}, seed + 3, DType::kBF16);
  const Tensor q = random_host({rows, heads, c.head_dim}, seed + 4, c.q_dtype);

  write_kv(cache.cpu_view(), k.view(), v.view());
  write_kv(cache.gpu_view(), upload(k, c.q_dtype).view(), upload(v, c.q_dtype).view());
  EXPECT_EQ(cache.count_pool_mismatches(), 0) << "write_kv";

  AttentionParams params;
  params.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  params.sliding_window = c.window;
  params.logit_softcap = c.softcap;
  Tensor ref = Tensor::empty(DType::kF32, {rows, heads, c.head_dim});
  paged_attention(ref.view(), q.view(), cache.cpu_view(), params);

  const Tensor q_dev = upload(q, c.q_dtype);
  Tensor out = poisoned(c.out_dtype, {rows, heads, c.head_dim});
  if (kernel == Kernel::kTiled) {
    paged_attention(out.view(), q_dev.view(), cache.gpu_view(), params);
  } else {
    cuda::paged_attention_simple(out.view(), q_dev.view(), cache.gpu_view(), params);
  }
  const double err = relative_error(download_f32(out), ref);
  // The simple kernel is fp32 throughout: an f32 output is held to fp32 accuracy (1e-5; 1e-4 past
  // 4K keys, where the reference's own fp32 sums over the context drift by about sqrt(keys) ulps).
  // The tiled kernel feeds bf16 Q and P to the tensor cores.
  int32_t longest = 0;
  for (const SeqSpec& s : c.seqs) longest = std::max(longest, s.num_tokens);
  const double tol = kernel == Kernel::kSimple && c.out_dtype == DType::kF32
                         ? (longest <= 4096 ? 1e-5 : 1e-4)
                         : 1e-2;
  std::printf("PARITY paged_attention.%-6s %-34s q %-4s out %-4s rows %-5lld rel_err %.3e\n",
              kernel == Kernel::kTiled ? "tiled" : "simple", c.name.c_str(),
              dtype_name(c.q_dtype).data(), dtype_name(c.out_dtype).data(),
              static_cast<long long>(rows), err);
  EXPECT_LT(err, tol);
}

std::vector<PagedCase> short_cases() {
  std::vector<PagedCase> cases;
  cases.push_back({"decode ps16 g4 d128", 16, 2, 4, 128, {{1, 1}, {17, 1}, {300, 1}}});
  cases.push_back({"fresh prefill ps16 g8 d64",
                   16,
                   1,
                   8,
                   64,
                   {{37, 37}},
                   0,
                   0.0f,
                   0,
                   DType::kF32,
                   DType::kF32});
  cases.push_back({"mixed ragged ps64 g1 d128",
                   64,
                   4,
                   1,
                   128,
                   {{1000, 1}, {64, 64}, {513, 100}, {5, 1}, {2000, 7}}});
  cases.push_back(
      {"gemma window+softcap d256", 16, 1, 4, 256, {{1500, 20}, {900, 1}, {40, 40}}, 512, 50.0f});
  cases.push_back({"group 7 mixed ps16",
                   16,
                   2,
                   7,
                   128,
                   {{700, 33}, {100, 1}, {1, 1}},
                   0,
                   0.0f,
                   0,
                   DType::kF32,
                   DType::kBF16});
  cases.push_back({"group 32 decode d64", 64, 1, 32, 64, {{3000, 1}, {50, 1}}});
  cases.push_back(
      {"per-head lengths ps16 g4", 16, 4, 4, 128, {{900, 3}, {260, 1}, {129, 40}}, 0, 0.0f, 9});
  cases.push_back({"window 100 prefill ps64", 64, 2, 4, 64, {{777, 300}, {65, 1}}, 100});
  cases.push_back({"decode f32 out d256",
                   16,
                   2,
                   2,
                   256,
                   {{4097, 1}, {63, 1}},
                   0,
                   0.0f,
                   0,
                   DType::kBF16,
                   DType::kF32});
  return cases;
}

std::vector<PagedCase> long_cases() {
  std::vector<PagedCase> cases;
  cases.push_back({"decode 32K llama8b ps16", 16, 8, 4, 128, {{32768, 1}, {20000, 1}}});
  cases.push_back(
      {"decode 32K g8 ps64", 64, 2, 8, 128, {{32768, 1}}, 0, 0.0f, 0, DType::kF32, DType::kF32});
  cases.push_back(
      {"decode 32K g1 ragged ps64", 64, 4, 1, 128, {{32768, 1}, {8191, 1}, {1, 1}, {4097, 1}}});
  cases.push_back({"chunk vs 32K prefix + decode", 16, 2, 4, 128, {{32768, 64}, {16000, 1}}});
  cases.push_back({"fresh prefill 2K ps64", 64, 2, 4, 128, {{2048, 2048}}});
  cases.push_back({"decode 128K llama8b ps16", 16, 8, 4, 128, {{131072, 1}}});
  cases.push_back(
      {"decode batch 64 x 2K ps16", 16, 8, 4, 128, std::vector<SeqSpec>(64, SeqSpec{2048, 1})});
  return cases;
}

TEST(CudaPagedAttentionTest, TiledMatchesCpuOnShortContexts) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 1000;
  for (const PagedCase& c : short_cases()) run_case(c, Kernel::kTiled, seed += 10);
}

TEST(CudaPagedAttentionTest, SimpleMatchesCpuOnShortContexts) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 2000;
  for (const PagedCase& c : short_cases()) {
    PagedCase f32 = c;
    f32.out_dtype = DType::kF32;  // fp32 end to end: the 1e-5 bound applies
    run_case(f32, Kernel::kSimple, seed += 10);
  }
}

TEST(CudaPagedAttentionTest, TiledMatchesCpuOnLongContexts) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 3000;
  for (const PagedCase& c : long_cases()) run_case(c, Kernel::kTiled, seed += 10);
}

TEST(CudaPagedAttentionTest, SimpleMatchesCpuOnLongContexts) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 4000;
  for (const PagedCase& c : long_cases()) run_case(c, Kernel::kSimple, seed += 10);
}

}  // namespace
}  // namespace se
