// What the engine tests over the tiny model share: the model as a bundle (no tokenizer: token ids only) and
// greedy sampling that runs to max_tokens.
#pragma once

#include <memory>

#include "engine/model_bundle.h"
#include "engine/sampling_params.h"
#include "tiny_model.h"

namespace se::test {

inline ModelBundle tiny_bundle(const std::string& model_type = "llama") {
  ModelBundle bundle;
  bundle.name = "tiny";
  bundle.source_format = "dummy";
  bundle.model = std::make_unique<Model>(tiny_model(model_type));
  return bundle;
}

inline SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

}  // namespace se::test
