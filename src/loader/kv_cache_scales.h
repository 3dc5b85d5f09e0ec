// KvCacheScales: the KV cache scales an FP8 checkpoint ships, what vLLM loads as each attention layer's k_scale
// and v_scale (a stored element is x / scale in e4m3, read back as code * scale). Checkpoints name them per layer:
//   model.layers.N.self_attn.k_scale, .v_scale                        (vLLM's FP8 checkpoints, llm-compressor)
//   model.layers.N.self_attn.k_proj.output_scale, .v_proj.output_scale (compressed-tensors' earlier names)
//   model.layers.N.self_attn.kv_scale                                 (one scale for both, the oldest format)
// each a scalar (one scale for the layer's KV heads, vLLM's per-tensor scale) or one per KV head.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "loader/safetensors_file.h"

namespace se {

struct KvCacheScales {
  int32_t num_kv_heads = 0;
  std::vector<float> k, v;  // [num_layers][num_kv_heads]

  // The scales of KV heads [first, first + count) of every layer (a tensor-parallel rank's heads).
  KvCacheScales heads(int32_t first, int32_t count) const;
};

// The scales `checkpoint` holds for a model of `num_layers` layers of `num_kv_heads` KV heads; nullopt when it
// holds none. kDataLoss (naming `where` and the tensor) when only some layers have them, when a layer has a key
// scale without a value scale, when one is neither a scalar nor one per KV head, or when one is not a finite
// positive number.
Result<std::optional<KvCacheScales>> read_kv_cache_scales(const SafetensorsCheckpoint& checkpoint, int32_t num_layers,
                                                          int32_t num_kv_heads, const std::string& where);

}  // namespace se
