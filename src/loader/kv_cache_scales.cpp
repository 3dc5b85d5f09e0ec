#include "loader/kv_cache_scales.h"

#include <cmath>

#include <fmt/format.h>

#include "loader/weight_transforms.h"

namespace se {

KvCacheScales KvCacheScales::heads(int32_t first, int32_t count) const {
  KvCacheScales out;
  out.num_kv_heads = count;
  const auto num_layers = static_cast<int32_t>(k.size()) / num_kv_heads;
  for (int32_t l = 0; l < num_layers; ++l) {
    const size_t begin = static_cast<size_t>(l) * static_cast<size_t>(num_kv_heads) + static_cast<size_t>(first);
    out.k.insert(out.k.end(), k.begin() + static_cast<std::ptrdiff_t>(begin),
                 k.begin() + static_cast<std::ptrdiff_t>(begin + static_cast<size_t>(count)));
    out.v.insert(out.v.end(), v.begin() + static_cast<std::ptrdiff_t>(begin),
                 v.begin() + static_cast<std::ptrdiff_t>(begin + static_cast<size_t>(count)));
  }
  return out;
}

namespace {

// The first of `names` the checkpoint holds, or "".
std::string first_present(const SafetensorsCheckpoint& checkpoint, std::initializer_list<std::string> names) {
  for (const std::string& name : names)
    if (checkpoint.contains(name)) return name;
  return {};
}

// Tensor `name` as num_kv_heads scales (a scalar repeated), appended to `out`.
Status append_scales(const SafetensorsCheckpoint& checkpoint, const std::string& name, int32_t num_kv_heads,
                     const std::string& where, std::vector<float>& out) {
  SE_ASSIGN_OR_RETURN(Tensor stored, checkpoint.load(name));
  const Tensor scales = cast_weight(stored, DType::kF32);
  const int64_t n = scales.numel();
  if (n != 1 && n != num_kv_heads)
    return data_loss("{}: KV cache scale '{}' holds {} values; expected one, or one per KV head ({})", where, name, n,
                     num_kv_heads);
  for (int32_t h = 0; h < num_kv_heads; ++h) {
    const float s = scales.data<float>()[n == 1 ? 0 : h];
    if (!std::isfinite(s) || s <= 0.0f)
      return data_loss("{}: KV cache scale '{}' is {}; a scale must be a finite positive number", where, name, s);
    out.push_back(s);
  }
  return Status::ok();
}

}  // namespace

Result<std::optional<KvCacheScales>> read_kv_cache_scales(const SafetensorsCheckpoint& checkpoint, int32_t num_layers,
                                                          int32_t num_kv_heads, const std::string& where) {
  KvCacheScales scales;
  scales.num_kv_heads = num_kv_heads;
  int32_t num_scaled = 0;
  for (int32_t l = 0; l < num_layers; ++l) {
    const std::string prefix = fmt::format("model.layers.{}.self_attn.", l);
    const std::string both = first_present(checkpoint, {prefix + "kv_scale"});
    const std::string k =
        both.empty() ? first_present(checkpoint, {prefix + "k_scale", prefix + "k_proj.output_scale"}) : both;
    const std::string v =
        both.empty() ? first_present(checkpoint, {prefix + "v_scale", prefix + "v_proj.output_scale"}) : both;
    if (k.empty() != v.empty())
      return data_loss("{}: layer {} has a KV cache scale for its {} only ('{}')", where, l,
                       k.empty() ? "values" : "keys", k.empty() ? v : k);
    if (k.empty()) continue;
    if (num_scaled != l)
      return data_loss("{}: layer {} has KV cache scales but layer {} has none", where, l, num_scaled);
    SE_RETURN_IF_ERROR(append_scales(checkpoint, k, num_kv_heads, where, scales.k));
    SE_RETURN_IF_ERROR(append_scales(checkpoint, v, num_kv_heads, where, scales.v));
    ++num_scaled;
  }
  if (num_scaled == 0) return std::optional<KvCacheScales>();
  if (num_scaled != num_layers)
    return data_loss("{}: layers 0 to {} have KV cache scales but layer {} has none", where, num_scaled - 1,
                     num_scaled);
  return std::optional<KvCacheScales>(std::move(scales));
}

}  // namespace se
