// ModelWeightsBuilder: the WeightSink that turns a load's canonical HF-named weights (weight_spec.h) into the
// ModelWeights a device runs, each weight as it arrives. Each one is converted to the dtype its field takes
// (matrices: `matrix_dtype`; norms and biases: fp32) and written into its field on the device, q/k/v and gate/up
// parts into their row ranges of the stacked matrix, expert gate/up into each expert's half; on the CPU a weight
// that needs no stacking and no conversion is kept as the loader's tensor. Fed by a streaming load
// (load_model with a sink), a GPU load holds one weight on the host at a time instead of the whole model in fp32.
// Expert weights of a block-scaled FP8 checkpoint stay FP8 on a GPU (codes and scales, LayerWeights), half the
// bytes of bf16 for the MoE kernels to read; the CPU dequantizes them unless told to keep them too.
// Not thread-safe; spent by finish().
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "model/weight_sink.h"
#include "model/weights.h"
#include "tensor/tensor.h"

namespace se {

// The dtype a device multiplies weight matrices in: fp32 on the CPU (its backend computes in f32), BF16 on CUDA
// (what cuBLASLt multiplies).
DType matrix_dtype(Device device);

class ModelWeightsBuilder final : public WeightSink {
 public:
  ModelWeightsBuilder(Device device, DType matrix_dtype);
  // Whether FP8 expert weights stay FP8 (default: on a GPU). Call before the load.
  void keep_fp8_experts(bool keep) { keep_fp8_experts_ = keep; }

  // Lays out the fields `config` has and the weights each takes.
  Status begin(const ModelConfig& config) override;
  // Places one weight; errors name a weight the model has no field for, one given twice, or one whose element
  // count is not its field's.
  Status put(const WeightSpec& spec, Tensor tensor) override { return place(spec.name, std::move(tensor)); }
  Status place(const std::string& name, Tensor tensor);
  // FP8 expert weights whose blocks the MoE kernels take (multiples of 32 dividing the weight), when kept.
  bool keeps_fp8(const WeightSpec& spec, const Fp8BlockQuantization& q) const override;
  Status put_fp8(const WeightSpec& spec, Fp8BlockWeight&& weight) override;
  // Places every weight of the model found in `tensors` (others are ignored).
  Status put_all(const std::map<std::string, Tensor>& tensors);
  // The weights once all have arrived (a missing lm_head is the tied embedding table); errors name the first
  // missing weight.
  Result<ModelWeights> finish();

 private:
  // Where a weight lands in its field.
  enum class Placement : uint8_t {
    kWhole,       // the field is this weight
    kRows,        // rows [first_row, first_row + shape[0]) of the field
    kExpertHalf,  // [experts, rows, cols] -> each expert's gate (half 0) or up (half 1) rows of [experts, 2 rows, cols]
  };
  struct Slot {
    Tensor* field;
    Tensor* scale_field;  // where FP8 block scales go (expert weights), else null
    Shape field_shape;
    Shape shape;  // this weight's
    bool matrix;  // in matrix_dtype_, else fp32
    Placement placement;
    int64_t first_row_or_half;
    bool required;
    bool received = false;
  };
  void add(const std::string& name, Tensor& field, Shape field_shape, Shape shape, bool matrix, Placement placement,
           int64_t first_row_or_half = 0, bool required = true, Tensor* scale_field = nullptr);
  void add_whole(const std::string& name, Tensor& field, Shape shape, bool matrix, bool required = true) {
    add(name, field, shape, shape, matrix, Placement::kWhole, 0, required);
  }

  // The slot of weight `name`, marked received; errors name an unknown weight, one given twice or one of another
  // element count.
  Result<Slot*> receive(const std::string& name, int64_t numel);
  // Copies host tensor `part` (the slot's weight, or its scales: `part_shape` of `field_shape`) into `field` (of
  // `dtype`, allocated on first use) where the slot's placement puts it.
  void copy_into(const Slot& slot, Tensor& field, DType dtype, const Shape& field_shape, const Tensor& part);

  Device device_;
  DType matrix_dtype_;
  bool keep_fp8_experts_;
  ModelWeights weights_;
  std::map<std::string, Slot> slots_;
  std::vector<std::string> order_;  // the slots' names in model order, for errors and put_all
};

}  // namespace se
