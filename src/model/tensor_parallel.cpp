#include "model/tensor_parallel.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"

namespace se {

namespace {

Status check_divides(int size, int64_t count, const char* what) {
  if (count % size == 0) return Status::ok();
  return invalid_argument("tensor parallel size {} does not divide the model's {} {}", size, count, what);
}

// Entries [begin, begin + count) of dimension `dim` of `t`, followed by zeros up to `padded` entries.
Tensor slice_dim(const Tensor& t, int dim, int64_t begin, int64_t count, int64_t padded) {
  const Shape& shape = t.shape();
  const int64_t n = shape[dim];
  SE_CHECK(begin >= 0 && count >= 0 && begin + count <= n && count <= padded, "slice [{}, +{}) of {} in {}", begin,
           count, n, shape.to_string());
  int64_t outer = 1;
  for (int d = 0; d < dim; ++d) outer *= shape[d];
  const size_t inner = t.nbytes() / static_cast<size_t>(outer * n);  // bytes of one entry of `dim`
  Shape out_shape = shape;
  out_shape[dim] = padded;
  Tensor out = Tensor::empty(t.dtype(), out_shape);
  const auto* src = static_cast<const char*>(t.raw());
  auto* dst = static_cast<char*>(out.raw());
  for (int64_t o = 0; o < outer; ++o) {
    char* row = dst + static_cast<size_t>(o * padded) * inner;
    std::memcpy(row, src + static_cast<size_t>(o * n + begin) * inner, static_cast<size_t>(count) * inner);
    std::memset(row + static_cast<size_t>(count) * inner, 0, static_cast<size_t>(padded - count) * inner);
  }
  return out;
}

}  // namespace

int first_kv_head(int num_kv_heads, ShardLayout layout) { return layout.rank * num_kv_heads / layout.size; }

Result<ModelConfig> shard_config(const ModelConfig& config, ShardLayout layout) {
  const int size = layout.size;
  if (size < 1 || layout.rank < 0 || layout.rank >= size)
    return invalid_argument("tensor parallel rank {} of {} ranks", layout.rank, size);
  if (config.shard.size != 1)
    return invalid_argument("shard_config: the config is already rank {} of {}", config.shard.rank, config.shard.size);
  if (size == 1) return config;
  SE_RETURN_IF_ERROR(check_divides(size, config.num_heads, "attention heads"));
  // Fewer KV heads than ranks: each KV head is kept by the ranks whose query heads read it.
  if (config.num_kv_heads % size != 0 && size % config.num_kv_heads != 0) {
    return invalid_argument("tensor parallel size {} neither divides the model's {} KV heads nor is a multiple of them",
                            size, config.num_kv_heads);
  }
  SE_RETURN_IF_ERROR(check_divides(size, config.intermediate_size, "MLP width (intermediate_size)"));
  SE_RETURN_IF_ERROR(check_divides(size, config.moe_intermediate_size, "expert width (moe_intermediate_size)"));
  SE_RETURN_IF_ERROR(check_divides(size, config.shared_expert_intermediate_size,
                                   "shared expert width (shared_expert_intermediate_size)"));
  ModelConfig shard = config;
  shard.num_heads = config.num_heads / size;
  shard.num_kv_heads = std::max(1, config.num_kv_heads / size);
  shard.kv_head_copies = std::max(1, size / config.num_kv_heads);
  shard.intermediate_size = config.intermediate_size / size;
  shard.moe_intermediate_size = config.moe_intermediate_size / size;
  shard.shared_expert_intermediate_size = config.shared_expert_intermediate_size / size;
  shard.shard = layout;
  return shard;
}

Tensor shard_weight(const ModelConfig& config, ShardLayout layout, const WeightSpec& spec, const Tensor& tensor) {
  if (layout.size == 1 || spec.split == WeightSplit::kReplicated) return tensor;
  const int rank = layout.rank, size = layout.size;
  // The output dimension: rows of a matrix or of each stacked expert, the entries of a bias.
  const int out_dim = tensor.rank() >= 2 ? tensor.rank() - 2 : 0;
  const int64_t n_out = tensor.dim(out_dim);
  switch (spec.split) {
    case WeightSplit::kVocab: {
      const int64_t rows = (int64_t{config.vocab_size} + size - 1) / size;  // ModelConfig::vocab_shard_rows
      const int64_t begin = std::min<int64_t>(rank * rows, n_out);
      return slice_dim(tensor, 0, begin, std::min(rows, n_out - begin), rows);
    }
    case WeightSplit::kOut:
      return slice_dim(tensor, out_dim, rank * (n_out / size), n_out / size, n_out / size);
    case WeightSplit::kKvHeads: {
      const int64_t head_rows = n_out / config.num_kv_heads;
      const int64_t heads = std::max(1, config.num_kv_heads / size);
      return slice_dim(tensor, out_dim, first_kv_head(config.num_kv_heads, layout) * head_rows, heads * head_rows,
                       heads * head_rows);
    }
    case WeightSplit::kIn: {
      const int in_dim = tensor.rank() - 1;
      const int64_t part = tensor.dim(in_dim) / size;
      return slice_dim(tensor, in_dim, rank * part, part, part);
    }
    case WeightSplit::kReplicated:
      break;
  }
  return tensor;
}

}  // namespace se
