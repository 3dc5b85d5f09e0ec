// Block-scaled FP8 weights as HF checkpoints store them (config.json quantization_config {quant_method: "fp8",
// fmt: "e4m3", weight_block_size: [rows, cols]}: Qwen3-*-FP8, DeepSeek-V3): each quantized linear weight
// [..., out, in] is an F8_E4M3 tensor beside an fp32 `weight_scale_inv` [..., ceil(out / rows), ceil(in / cols)],
// and element (r, c) reads back as fp8(w[r, c]) * scale_inv[r / rows, c / cols]. Tensors stored in another dtype
// (norms, embeddings, lm_head, routers, modules_to_not_convert) carry no scale and load as they are. The e4m3
// decoding is tensor/fp8.h's. Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "tensor/tensor.h"

namespace se {

struct Fp8BlockQuantization {
  int64_t block_rows = 128;
  int64_t block_cols = 128;
  std::vector<std::string> modules_to_not_convert;  // module names; a weight whose name contains one stays as is
};

// The weight quantization config.json declares: nullopt without a quantization_config; an error naming `source`
// for a method other than fp8, a format other than e4m3, or a weight_block_size that is not two positive sizes.
Result<std::optional<Fp8BlockQuantization>> fp8_block_quantization(const nlohmann::json& config,
                                                                   const std::string& source);

// The name of the scale tensor of weight `weight_name` ("x.weight" -> "x.weight_scale_inv").
std::string fp8_scale_name(std::string_view weight_name);

// The scale shape [..., ceil(out / rows), ceil(in / cols)] of a weight shaped [..., out, in] (rank >= 2).
Shape fp8_block_scale_shape(const Shape& weight, const Fp8BlockQuantization& q);

// Whether a weight named `name` is one the checkpoint quantizes when written by this config (not in
// modules_to_not_convert, and not the output head, which transformers' quantizers always keep).
bool fp8_quantizes(const Fp8BlockQuantization& q, std::string_view name);

// Whether `scale_inv` fits a weight of `shape` (its dtype F32, F16 or BF16, shaped fp8_block_scale_shape(shape));
// the error names `scale_name`.
Status check_fp8_scales(const Shape& shape, const Tensor& scale_inv, const Fp8BlockQuantization& q,
                        std::string_view scale_name);

// The fp32 weight [..., out, in] of e4m3 `codes` (numel(shape) bytes) and their `scale_inv` (F32, F16 or BF16,
// shaped fp8_block_scale_shape(shape)). A scale of another shape or dtype is an error naming `scale_name`.
Result<Tensor> dequantize_fp8_blocks(const uint8_t* codes, const Shape& shape, const Tensor& scale_inv,
                                     const Fp8BlockQuantization& q, std::string_view scale_name);

// What a checkpoint writer stores for the fp32 `weight` [..., out, in]: e4m3 codes (U8, weight's shape) with
// scale_inv = max|block| / 448 per block (1 for an all-zero block).
struct Fp8BlockWeight {
  Tensor codes;      // U8 [..., out, in]
  Tensor scale_inv;  // F32 [..., ceil(out / rows), ceil(in / cols)]
};
Fp8BlockWeight quantize_fp8_blocks(const Tensor& weight, const Fp8BlockQuantization& q);

}  // namespace se
