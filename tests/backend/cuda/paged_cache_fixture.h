// A paged cache in two copies for the CUDA attention tests: f32 pages on the host for the CPU
// reference and bf16 pages on the GPU holding the same (bf16-representable) values, with the same
// page lists; or, for the FP8 store, the same e4m3 code bytes in both pools, read through the same
// per-KV-head scales (host copies for the CPU view, device copies for the GPU's). Pages are shuffled across the pool
// and every page, used or not, holds random data, so masking must hide what lies past a stream's end. A cache may carry
// a selection (token or page unit) per sequence and KV head. Views: cpu_view (host tables, host pool), gpu_view (device
// tables, device pool; what paged_attention takes on CUDA) and host_tables_gpu_view (host tables
// over the device pool; what the sparse methods' scoring ops take). run_paged_attention_case checks
// one case of paged attention against the CPU reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/attention_view.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/ops.h"
#include "cuda_test_util.h"

namespace se::test {

struct SeqSpec {
  int32_t
      num_tokens;   // tokens per KV head after this step (head h keeps num_tokens - h * head_skew)
  int32_t num_new;  // query rows this step
};

// What one sequence's selection holds, per KV head (token or page indices into the head's stream).
struct SelectSpec {
  enum Kind : uint8_t {
    kNone,    // no list (null): every visible key
    kRandom,  // a random ascending subset of about `fraction` of the head's tokens or pages
    kEmpty,   // an empty list: nothing is visible
    kFull,    // every token or page of the stream
    kOne,     // a single random entry
    kBudget,  // `count` entries: the stream's last one and count - 1 random others (Quest's pick)
  };
  Kind kind = kNone;
  double fraction = 0.0;  // kRandom
  int32_t count = 0;      // kBudget
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
  SelectionUnit selection_unit = SelectionUnit::kToken;
  std::vector<SelectSpec> select;  // per sequence; empty = the view has no selection
  bool fp8 = false;                // FP8 (e4m3) pages instead of f32 / bf16 ones
};

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
    // Every page, used or not, holds random bf16-representable values (or random finite e4m3 codes).
    elems_per_page_ = int64_t{2} * c.page_size * c.head_dim;
    if (c.fp8) {
      cpu_pool_ = random_fp8_codes({num_pages_, elems_per_page_}, seed + 1);
      gpu_pool_ = cuda::to_device(cpu_pool_);
      make_fp8_scales();
    } else {
      cpu_pool_ = random_host({num_pages_, elems_per_page_}, seed + 1, DType::kBF16);
      gpu_pool_ = upload(cpu_pool_, DType::kBF16);
    }

    d_page_ids_ = device_i32(page_ids_);
    d_num_tokens_ = device_i32(num_tokens_);
    d_q_indptr_ = device_i32(q_indptr_);
    if (!c.select.empty()) make_selection(seed + 5);
    build_seq_views();
  }

  int64_t num_rows() const { return q_indptr_.back(); }
  int32_t num_pool_pages() const { return num_pages_; }
  int32_t num_tokens(size_t seq, int32_t kv_head) const {
    return num_tokens_[static_cast<size_t>(count_offset_[seq]) + static_cast<size_t>(kv_head)];
  }
  // Tokens every KV head of sequence `seq` holds: its shortest stream.
  int32_t shortest_stream(size_t seq) const {
    int32_t shortest = num_tokens(seq, 0);
    for (int32_t h = 1; h < c_.num_kv_heads; ++h) shortest = std::min(shortest, num_tokens(seq, h));
    return shortest;
  }
  // Selected entries of every (sequence, KV head) (for the report).
  int64_t num_selected_entries() const { return static_cast<int64_t>(selected_.size()); }

  AttentionView cpu_view() const {
    AttentionView v = common();
    v.kv_base = cpu_pool_.raw();
    v.kv_device = Device::kCpu;
    v.kv_dtype = DType::kF32;
    v.page_bytes = static_cast<size_t>(elems_per_page_) * sizeof(float);
    v.q_indptr = q_indptr_.data();
    v.seqs = host_seqs_.data();
    if (c_.fp8) quantized(v, k_scales_.data(), v_scales_.data());
    return v;
  }
  AttentionView gpu_view() const {
    AttentionView v = host_tables_gpu_view();
    v.q_indptr = d_q_indptr_.data<int32_t>();
    v.seqs = static_cast<const SeqKvView*>(d_seqs_.raw());
    v.tables_device = Device::kCuda;
    return v;
  }
  AttentionView host_tables_gpu_view() const {
    AttentionView v = common();
    v.kv_base = gpu_pool_.raw();
    v.kv_device = Device::kCuda;
    v.kv_dtype = DType::kBF16;
    v.page_bytes = static_cast<size_t>(elems_per_page_) * 2;
    v.q_indptr = q_indptr_.data();
    v.seqs = host_seqs_.data();
    if (c_.fp8) quantized(v, d_k_scales_.data<float>(), d_v_scales_.data<float>());
    return v;
  }

  // Number of pool elements where the GPU's bf16 pages differ from the CPU's f32 pages (FP8: bytes where the two
  // pools' codes differ).
  int64_t count_pool_mismatches() const {
    if (c_.fp8) {
      const Tensor gpu = cuda::to_host(gpu_pool_);
      int64_t mismatches = 0;
      for (int64_t i = 0; i < gpu.numel(); ++i) mismatches += gpu.data<uint8_t>()[i] != cpu_pool_.data<uint8_t>()[i];
      return mismatches;
    }
    const Tensor gpu = download_f32(gpu_pool_);
    int64_t mismatches = 0;
    for (int64_t i = 0; i < gpu.numel(); ++i)
      mismatches += gpu.data<float>()[i] != representable(cpu_pool_.data<float>()[i], DType::kBF16);
    return mismatches;
  }

 private:
  // Random e4m3 codes of finite values (0x7f and 0xff are NaN, which masking could not hide from P V).
  static Tensor random_fp8_codes(Shape shape, uint64_t seed) {
    Tensor t = Tensor::empty(DType::kU8, shape);
    FastRng rng(seed);
    for (int64_t i = 0; i < t.numel(); ++i) {
      const auto code = static_cast<uint8_t>(rng.next() >> 56);
      t.data<uint8_t>()[i] = (code & 0x7f) == 0x7f ? code - 1 : code;
    }
    return t;
  }
  // Per-KV-head scales around max|x| / 448 for the test's unit-variance values; head 0's keys a quarter of that,
  // so some of its writes saturate at +-448.
  void make_fp8_scales() {
    for (int32_t h = 0; h < c_.num_kv_heads; ++h) {
      k_scales_.push_back((h == 0 ? 0.001f : 0.004f) * static_cast<float>(1 + h % 3));
      v_scales_.push_back(0.005f * static_cast<float>(1 + h % 2));
    }
    d_k_scales_ = device_f32(k_scales_);
    d_v_scales_ = device_f32(v_scales_);
  }
  // The FP8 store's view over the same tables: one-byte codes, scales per KV head.
  void quantized(AttentionView& v, const float* k_scales, const float* v_scales) const {
    v.kv_dtype = DType::kU8;
    v.page_bytes = static_cast<size_t>(elems_per_page_);
    v.payload = KvPayload::kQuantized;
    v.quantized.scheme = KvQuantScheme::kFp8E4M3;
    v.quantized.k_scales = k_scales;
    v.quantized.v_scales = v_scales;
  }

  static Tensor device_f32(const std::vector<float>& v) {
    Tensor host = Tensor::empty(DType::kF32, {static_cast<int64_t>(v.size())});
    std::copy(v.begin(), v.end(), host.data<float>());
    return cuda::to_device(host);
  }
  static Tensor device_i32(const std::vector<int32_t>& v) {
    Tensor host =
        Tensor::empty(DType::kI32, {std::max<int64_t>(1, static_cast<int64_t>(v.size()))});
    std::copy(v.begin(), v.end(), host.data<int32_t>());
    return cuda::to_device(host);
  }
  AttentionView common() const {
    AttentionView v;
    v.page_size = c_.page_size;
    v.head_dim = c_.head_dim;
    v.num_kv_heads = c_.num_kv_heads;
    v.num_seqs = static_cast<int32_t>(c_.seqs.size());
    v.has_selection = !c_.select.empty();
    v.selection_unit = c_.selection_unit;
    if (v.has_selection) {  // as Selection::apply records it
      v.selected_rows_max = 0;
      for (size_t s = 0; s < c_.select.size() && s < c_.seqs.size(); ++s)
        if (c_.select[s].kind != SelectSpec::kNone)
          v.selected_rows_max = std::max(v.selected_rows_max, c_.seqs[s].num_new);
    }
    return v;
  }

  // Draws every sequence's lists per its SelectSpec: [num_kv_heads][stride] entries per selected
  // sequence (stride = its longest list), ascending, in selected_ with counts in selected_counts_.
  void make_selection(uint64_t seed) {
    std::mt19937_64 rng(seed);
    const bool pages = c_.selection_unit == SelectionUnit::kPage;
    for (size_t s = 0; s < c_.seqs.size(); ++s) {
      const SelectSpec spec = s < c_.select.size() ? c_.select[s] : SelectSpec{};
      sel_offset_.push_back(static_cast<int64_t>(selected_.size()));
      sel_count_offset_.push_back(static_cast<int64_t>(selected_counts_.size()));
      if (spec.kind == SelectSpec::kNone) {
        sel_strides_.push_back(0);
        continue;
      }
      std::vector<std::vector<int32_t>> lists(static_cast<size_t>(c_.num_kv_heads));
      for (int32_t h = 0; h < c_.num_kv_heads; ++h) {
        const int32_t len = num_tokens(s, h);
        const int32_t universe = pages ? (len + c_.page_size - 1) / c_.page_size : len;
        std::vector<int32_t>& list = lists[static_cast<size_t>(h)];
        if (spec.kind == SelectSpec::kFull) {
          list.resize(static_cast<size_t>(universe));
          std::iota(list.begin(), list.end(), 0);
        } else if (spec.kind == SelectSpec::kOne && universe > 0) {
          list.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(universe)));
        } else if (spec.kind == SelectSpec::kBudget && universe > 0) {
          std::vector<int32_t> others(static_cast<size_t>(universe - 1));
          std::iota(others.begin(), others.end(), 0);
          const size_t picks =
              std::min(others.size(), static_cast<size_t>(std::max(spec.count - 1, 0)));
          for (size_t i = 0; i < picks; ++i)
            std::swap(others[i], others[i + rng() % (others.size() - i)]);
          list.assign(others.begin(), others.begin() + static_cast<int64_t>(picks));
          list.push_back(universe - 1);
          std::sort(list.begin(), list.end());
        } else if (spec.kind == SelectSpec::kRandom) {
          std::bernoulli_distribution keep(spec.fraction);
          for (int32_t i = 0; i < universe; ++i)
            if (keep(rng)) list.push_back(i);
        }
      }
      size_t stride = 0;
      for (const auto& list : lists) stride = std::max(stride, list.size());
      sel_strides_.push_back(static_cast<int32_t>(stride));
      for (const auto& list : lists) {
        selected_counts_.push_back(static_cast<int32_t>(list.size()));
        selected_.insert(selected_.end(), list.begin(), list.end());
        selected_.insert(selected_.end(), stride - list.size(), -7);  // padding, never read
      }
    }
    d_selected_ = device_i32(selected_);
    d_selected_counts_ = device_i32(selected_counts_);
  }

  void build_seq_views() {
    const bool selecting = !c_.select.empty();
    std::vector<SeqKvView> dev_seqs;
    host_seqs_.clear();
    for (size_t s = 0; s < c_.seqs.size(); ++s) {
      SeqKvView host{page_ids_.data() + page_offset_[s], strides_[s],
                     num_tokens_.data() + count_offset_[s]};
      SeqKvView dev{d_page_ids_.data<int32_t>() + page_offset_[s], strides_[s],
                    d_num_tokens_.data<int32_t>() + count_offset_[s]};
      const bool listed =
          selecting && s < c_.select.size() && c_.select[s].kind != SelectSpec::kNone;
      if (listed) {
        host.selected = selected_.data() + sel_offset_[s];
        host.selected_stride = sel_strides_[s];
        host.num_selected = selected_counts_.data() + sel_count_offset_[s];
        dev.selected = d_selected_.data<int32_t>() + sel_offset_[s];
        dev.selected_stride = sel_strides_[s];
        dev.num_selected = d_selected_counts_.data<int32_t>() + sel_count_offset_[s];
      }
      host_seqs_.push_back(host);
      dev_seqs.push_back(dev);
    }
    d_seqs_ = Tensor::empty(DType::kU8, {static_cast<int64_t>(sizeof(SeqKvView) * dev_seqs.size())},
                            cuda::cuda_allocator());
    cuda::copy_bytes(d_seqs_.raw(), dev_seqs.data(), sizeof(SeqKvView) * dev_seqs.size());
  }

  PagedCase c_;
  int32_t num_pages_ = 0;
  int64_t elems_per_page_ = 0;
  std::vector<int32_t> q_indptr_, page_ids_, num_tokens_, strides_;
  std::vector<int64_t> page_offset_, count_offset_;
  std::vector<int32_t> selected_, selected_counts_, sel_strides_;
  std::vector<int64_t> sel_offset_, sel_count_offset_;
  std::vector<SeqKvView> host_seqs_;
  std::vector<float> k_scales_, v_scales_;  // FP8: [num_kv_heads]
  Tensor cpu_pool_, gpu_pool_, d_page_ids_, d_num_tokens_, d_q_indptr_, d_seqs_, d_selected_, d_selected_counts_,
      d_k_scales_, d_v_scales_;
};

enum class Kernel { kTiled, kSimple };

// Writes the step's K/V through write_kv on both copies (checked bit-exact), then attends with
// `kernel` and compares with the CPU reference. The simple kernel is fp32 throughout: an f32 output
// is held to fp32 accuracy (1e-5; 1e-4 past 4K keys, where the reference's own fp32 sums over the
// context drift by about sqrt(keys) ulps). The tiled kernel feeds bf16 Q and P to the tensor cores
// (1e-2).
inline void run_paged_attention_case(const PagedCase& c, Kernel kernel, uint64_t seed) {
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

}  // namespace se::test
