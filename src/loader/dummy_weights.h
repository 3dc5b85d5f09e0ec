// Dummy weights (`--load-format dummy`): a named tensor filled with deterministic pseudo-random values, so large
// shapes can be benchmarked without a checkpoint. Values depend only on (seed, tensor name, element index): the
// same on every machine and thread count. Which tensors a model has, and which fill each takes, is the model's
// business (model/model_loader.h). Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "tensor/tensor.h"

namespace se {

enum class DummyFill {
  kNormal,  // roughly normal(0, 0.02): linear and embedding weights, so activations stay finite
  kOnes,    // norm multipliers
  kZeros,   // biases
};

// An F32 tensor of `shape` filled per `fill`.
Tensor dummy_tensor(const std::string& name, const Shape& shape, DummyFill fill, uint64_t seed);

}  // namespace se
