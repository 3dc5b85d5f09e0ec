#include "model/contiguous_kv_cache.h"

#include "base/check.h"

namespace se {

ContiguousKvCache::ContiguousKvCache(const ModelConfig& config, int num_seqs)
    : num_layers_(config.num_layers),
      kv_row_(config.kv_size()),
      num_kv_heads_(config.num_kv_heads),
      head_dim_(config.head_dim),
      stores_(static_cast<size_t>(num_seqs) * static_cast<size_t>(config.num_layers)) {}

void ContiguousKvCache::attend(int layer, const LayerConfig&, const ForwardBatch& batch, TensorView q,
                               TensorView k, TensorView v, TensorView out, const AttentionParams& params) {
  const int num_heads = static_cast<int>(q.shape[1]);
  for (const SequenceSlice& slice : batch.sequences) {
    LayerStore& s = store(slice.seq, layer);
    const size_t row_begin = static_cast<size_t>(slice.token_begin) * static_cast<size_t>(kv_row_);
    const size_t row_end = row_begin + static_cast<size_t>(slice.num_tokens) * static_cast<size_t>(kv_row_);
    s.k.insert(s.k.end(), k.ptr<float>() + row_begin, k.ptr<float>() + row_end);
    s.v.insert(s.v.end(), v.ptr<float>() + row_begin, v.ptr<float>() + row_end);
    s.positions.insert(s.positions.end(), batch.positions.begin() + slice.token_begin,
                       batch.positions.begin() + slice.token_begin + slice.num_tokens);
    const int64_t n = static_cast<int64_t>(s.positions.size());
    const int64_t t0 = slice.token_begin;
    const int64_t nt = slice.num_tokens;
    const int64_t qrow = static_cast<int64_t>(num_heads) * head_dim_;
    TensorView q_seq{q.ptr<float>() + t0 * qrow, DType::kF32, {nt, num_heads, head_dim_}};
    TensorView out_seq{out.ptr<float>() + t0 * qrow, DType::kF32, {nt, num_heads, head_dim_}};
    TensorView k_all{s.k.data(), DType::kF32, {n, num_kv_heads_, head_dim_}};
    TensorView v_all{s.v.data(), DType::kF32, {n, num_kv_heads_, head_dim_}};
    TensorView qpos{const_cast<int32_t*>(batch.positions.data()) + t0, DType::kI32, {nt}};
    TensorView kpos{s.positions.data(), DType::kI32, {n}};
    attention(out_seq, q_seq, k_all, v_all, qpos, kpos, params);
  }
}

int ContiguousKvCache::num_tokens(int seq) const {
  return static_cast<int>(stores_[static_cast<size_t>(seq) * static_cast<size_t>(num_layers_)].positions.size());
}

void ContiguousKvCache::clear(int seq) { truncate(seq, 0); }

void ContiguousKvCache::truncate(int seq, int num_tokens) {
  SE_CHECK(num_tokens >= 0, "truncate to {}", num_tokens);
  for (int l = 0; l < num_layers_; ++l) {
    LayerStore& s = store(seq, l);
    if (static_cast<int>(s.positions.size()) <= num_tokens) continue;
    s.k.resize(static_cast<size_t>(num_tokens) * static_cast<size_t>(kv_row_));
    s.v.resize(static_cast<size_t>(num_tokens) * static_cast<size_t>(kv_row_));
    s.positions.resize(static_cast<size_t>(num_tokens));
  }
}

}  // namespace se
