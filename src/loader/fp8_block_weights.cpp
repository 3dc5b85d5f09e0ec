#include "loader/fp8_block_weights.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "tensor/fp8.h"

namespace se {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A [..., out, in] weight seen as `matrices` [out, in] matrices, each cut into blocks of its scale grid.
struct BlockGrid {
  int64_t matrices, out, in, scale_rows, scale_cols;
};
BlockGrid block_grid(const Shape& weight, const Fp8BlockQuantization& q) {
  const int64_t out = weight[weight.rank() - 2], in = weight[weight.rank() - 1];
  return {out * in == 0 ? 0 : weight.numel() / (out * in), out, in, ceil_div(out, q.block_rows),
          ceil_div(in, q.block_cols)};
}

// Large weights (a checkpoint's experts) are split over threads; small ones are not worth the fork.
constexpr int64_t kParallelElements = int64_t{1} << 20;

}  // namespace

Result<std::optional<Fp8BlockQuantization>> fp8_block_quantization(const nlohmann::json& config,
                                                                   const std::string& source) {
  if (!config.contains("quantization_config") || config["quantization_config"].is_null())
    return std::optional<Fp8BlockQuantization>();
  const nlohmann::json& qc = config["quantization_config"];
  if (!qc.is_object()) return invalid_argument("{}: \"quantization_config\" must be an object", source);
  const auto method_key = qc.find("quant_method");
  const std::string method = method_key == qc.end()    ? std::string("(absent)")
                             : method_key->is_string() ? method_key->get<std::string>()
                                                       : method_key->dump();
  if (method != "fp8")
    return unimplemented(
        "{}: quantization_config quant_method \"{}\" is not supported (only \"fp8\" with "
        "weight_block_size)",
        source, method);
  if (qc.contains("fmt") && !(qc["fmt"].is_string() && qc["fmt"].get<std::string>() == "e4m3"))
    return unimplemented("{}: fp8 quantization_config fmt {} is not supported (only \"e4m3\")", source,
                         qc["fmt"].dump());
  const auto block = qc.find("weight_block_size");
  if (block == qc.end() || !block->is_array() || block->size() != 2 || !(*block)[0].is_number_integer() ||
      !(*block)[1].is_number_integer() || (*block)[0].get<int64_t>() <= 0 || (*block)[1].get<int64_t>() <= 0) {
    return unimplemented(
        "{}: fp8 quantization_config weight_block_size {} is not supported (two positive sizes, "
        "e.g. [128, 128]; per-tensor scales are not)",
        source, block == qc.end() ? std::string("(absent)") : block->dump());
  }
  Fp8BlockQuantization q{(*block)[0].get<int64_t>(), (*block)[1].get<int64_t>(), {}};
  if (const auto skip = qc.find("modules_to_not_convert"); skip != qc.end() && !skip->is_null()) {
    if (!skip->is_array()) return invalid_argument("{}: \"modules_to_not_convert\" must be a list", source);
    for (const auto& name : *skip) {
      if (!name.is_string()) return invalid_argument("{}: \"modules_to_not_convert\" holds {}", source, name.dump());
      q.modules_to_not_convert.push_back(name.get<std::string>());
    }
  }
  return std::optional<Fp8BlockQuantization>(std::move(q));
}

std::string fp8_scale_name(std::string_view weight_name) { return std::string(weight_name) + "_scale_inv"; }

Shape fp8_block_scale_shape(const Shape& weight, const Fp8BlockQuantization& q) {
  SE_CHECK(weight.rank() >= 2, "an FP8 block-scaled weight has rank >= 2, not {}", weight.to_string());
  Shape s = weight;
  s[s.rank() - 2] = ceil_div(weight[weight.rank() - 2], q.block_rows);
  s[s.rank() - 1] = ceil_div(weight[weight.rank() - 1], q.block_cols);
  return s;
}

bool fp8_quantizes(const Fp8BlockQuantization& q, std::string_view name) {
  if (name.find("lm_head") != std::string_view::npos) return false;
  return std::none_of(q.modules_to_not_convert.begin(), q.modules_to_not_convert.end(),
                      [name](const std::string& m) { return name.find(m) != std::string_view::npos; });
}

Status check_fp8_scales(const Shape& shape, const Tensor& scale_inv, const Fp8BlockQuantization& q,
                        std::string_view scale_name) {
  if (shape.rank() < 2)
    return data_loss("FP8 scale '{}' belongs to a weight of shape {}; block scales need a matrix", scale_name,
                     shape.to_string());
  const Shape expected = fp8_block_scale_shape(shape, q);
  if (!(scale_inv.shape() == expected)) {
    return data_loss("FP8 scale '{}' has shape {}; its weight {} in blocks of {}x{} needs {}", scale_name,
                     scale_inv.shape().to_string(), shape.to_string(), q.block_rows, q.block_cols,
                     expected.to_string());
  }
  if (scale_inv.dtype() != DType::kF32 && scale_inv.dtype() != DType::kBF16 && scale_inv.dtype() != DType::kF16)
    return data_loss("FP8 scale '{}' has dtype {} (F32, BF16 or F16 expected)", scale_name,
                     dtype_name(scale_inv.dtype()));
  return Status::ok();
}

Result<Tensor> dequantize_fp8_blocks(const uint8_t* codes, const Shape& shape, const Tensor& scale_inv,
                                     const Fp8BlockQuantization& q, std::string_view scale_name) {
  SE_RETURN_IF_ERROR(check_fp8_scales(shape, scale_inv, q, scale_name));
  const Tensor scales = scale_inv.to_f32();
  const float* s = scales.data<float>();
  const BlockGrid g = block_grid(shape, q);
  Tensor out = Tensor::empty(DType::kF32, shape);
  float* w = out.data<float>();
#pragma omp parallel for schedule(static) if (shape.numel() > kParallelElements)
  for (int64_t row = 0; row < g.matrices * g.out; ++row) {
    const int64_t m = row / g.out, r = row % g.out;
    const float* row_scales = s + (m * g.scale_rows + r / q.block_rows) * g.scale_cols;
    for (int64_t c = 0; c < g.in; ++c)
      w[row * g.in + c] = fp8_to_f32(codes[row * g.in + c], Fp8Format::kE4M3) * row_scales[c / q.block_cols];
  }
  return out;
}

Fp8BlockWeight quantize_fp8_blocks(const Tensor& weight, const Fp8BlockQuantization& q) {
  const Tensor f = weight.to_f32();
  const BlockGrid g = block_grid(f.shape(), q);
  Fp8BlockWeight out{Tensor::empty(DType::kU8, f.shape()),
                     Tensor::empty(DType::kF32, fp8_block_scale_shape(f.shape(), q))};
  const float* w = f.data<float>();
  float* s = out.scale_inv.data<float>();
  auto* codes = out.codes.data<uint8_t>();
  const float max_code = fp8_max_finite(Fp8Format::kE4M3);
  // One band of block_rows rows of one matrix at a time: its blocks' maxima, then its codes.
#pragma omp parallel for schedule(static) if (f.numel() > kParallelElements)
  for (int64_t band = 0; band < g.matrices * g.scale_rows; ++band) {
    const int64_t m = band / g.scale_rows, first = (band % g.scale_rows) * q.block_rows;
    const int64_t last = std::min(first + q.block_rows, g.out);
    float* band_scales = s + band * g.scale_cols;
    std::fill(band_scales, band_scales + g.scale_cols, 0.0f);
    for (int64_t r = first; r < last; ++r)
      for (int64_t c = 0; c < g.in; ++c) {
        float& amax = band_scales[c / q.block_cols];
        amax = std::fmax(amax, std::fabs(w[(m * g.out + r) * g.in + c]));
      }
    for (int64_t b = 0; b < g.scale_cols; ++b)
      band_scales[b] = band_scales[b] > 0.0f ? band_scales[b] / max_code : 1.0f;
    for (int64_t r = first; r < last; ++r)
      for (int64_t c = 0; c < g.in; ++c) {
        const int64_t i = (m * g.out + r) * g.in + c;
        codes[i] = f32_to_fp8_satfinite(w[i] / band_scales[c / q.block_cols], Fp8Format::kE4M3);
      }
  }
  return out;
}

}  // namespace se
