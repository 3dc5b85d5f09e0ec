// Dummy weights (`--load-format dummy`): every weight a config needs, filled with deterministic
// pseudo-random values so large shapes can be benchmarked without a checkpoint. Linear and
// embedding weights are roughly normal(0, 0.02), norms are ones (the applied multiplier), biases
// zeros, so activations stay finite. Values depend only on (seed, weight name, element index): the
// same on every machine and thread count.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "loader/progress_bar.h"
#include "tensor/tensor.h"

namespace se {

// `config` must be normalized (hf_config.h). `progress` (nullable) advances once per weight.
std::map<std::string, Tensor> dummy_weights(const nlohmann::json& config, DType dtype,
                                            uint64_t seed, ProgressBar* progress);

}  // namespace se
