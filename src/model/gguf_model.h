// GGUF -> internal model: the HF-style config built from GGUF metadata (the common keys here, the architecture's
// own by its registry entry), and the canonical HF-named weights (dequantized, then moved into the canonical
// layout by the architecture). Stateless functions; thread-safe for distinct outputs.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"
#include "loader/gguf_file.h"
#include "loader/progress_bar.h"
#include "model/config.h"
#include "model/weight_sink.h"
#include "tensor/tensor.h"

namespace se {

// The normalized HF-style config (see hf_config.h) of a GGUF of a registered architecture. llama3
// rope scaling stored as a `rope_freqs.weight` tensor becomes rope_scaling {rope_type: llama3, ...}
// when it matches the llama3 formula, and otherwise a top-level "rope_freq_factors" list (one
// divisor per rotary pair). Errors name the file and the missing or invalid key.
Result<nlohmann::json> gguf_hf_config(const GgufFile& file);

// Every weight of expected_weights(config) from `file`, in `dtype` (F32/F16/BF16), handed to `sink` one at a
// time. Errors name the file and tensor: missing tensors, wrong shapes, unsupported quant types, tensors this
// loader does not know. `progress` (nullable) advances once per tensor.
Status stream_gguf_weights(const GgufFile& file, const ModelConfig& config, DType dtype, WeightSink& sink,
                           ProgressBar* progress);

}  // namespace se
