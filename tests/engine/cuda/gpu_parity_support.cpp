#include "gpu_parity_support.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>

#include "../../backend/cuda/cuda_test_util.h"
#include "../../support/tiny_model.h"
#include "engine/engine.h"
#include "model/model_loader.h"

namespace se::gpu_parity {

int32_t argmax(const std::vector<float>& row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / (den + 1e-30));
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

std::map<std::string, Tensor> bf16_dummy_weights(const nlohmann::json& normalized, float scale) {
  auto weights = dummy_weights(*parse_model_config(normalized), DType::kF32, /*seed=*/11, nullptr);
  for (auto& [name, t] : weights) {
    const float s = name.find("norm") == std::string::npos ? scale : 1.0f;
    for (int64_t i = 0; i < t.numel(); ++i)
      t.data<float>()[i] = test::representable(t.data<float>()[i] * s, DType::kBF16);
  }
  return weights;
}

Model create_model(const nlohmann::json& normalized, const std::map<std::string, Tensor>& weights, Device device) {
  auto model = Model::create(*parse_model_config(normalized), weights, device);
  SE_CHECK(model.is_ok(), "{}", model.status().to_string());
  return std::move(model).value();
}

nlohmann::json tiny_config(const std::string& model_type) {
  nlohmann::json c = test::tiny_config(model_type);
  c["head_dim"] = 64;
  return c;
}

std::vector<std::vector<int32_t>> random_prompts(int count, int vocab, int min_len, int max_len, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < count; ++i) {
    std::vector<int32_t> p(static_cast<size_t>(min_len + static_cast<int>(rng() % (max_len - min_len + 1))));
    for (int32_t& t : p) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
    prompts.push_back(std::move(p));
  }
  return prompts;
}

DeviceBundles tiny_cpu_and_gpu_bundles() {
  auto normalized = normalize_hf_config(tiny_config("llama"), "tiny");
  SE_CHECK(normalized.is_ok(), "{}", normalized.status().to_string());
  const auto weights = bf16_dummy_weights(*normalized, 10.0f);
  DeviceBundles bundles;
  bundles.cpu.name = bundles.gpu.name = "tiny";
  bundles.cpu.model = std::make_unique<Model>(create_model(*normalized, weights, Device::kCpu));
  bundles.gpu.model = std::make_unique<Model>(create_model(*normalized, weights, Device::kCuda));
  return bundles;
}

const std::vector<std::string>& prompt_texts() {
  static const std::vector<std::string> texts = {
      "The capital of France is",
      "Once upon a time, in a small village by the sea,",
      "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
      "Photosynthesis is the process by which plants",
      "The three primary colors are",
      "Q: What is 17 times 23?\nA:",
      "In 1969, the Apollo 11 mission",
      "A good recipe for pancakes needs flour, eggs,",
      "The quick brown fox jumps over the lazy dog. Then the fox",
      "Machine learning models are trained by minimizing a loss function that measures"};
  return texts;
}

std::optional<RealModel> load_real(const char* env, std::optional<std::string> fallback) {
  const char* override_path = std::getenv(env);
  const std::optional<std::string> path =
      override_path != nullptr ? std::optional<std::string>(override_path) : std::move(fallback);
  if (!path) return std::nullopt;
  LoadOptions options;
  options.dtype = DType::kBF16;
  options.show_progress = false;
  auto cpu = ModelBundle::load(*path, options, Device::kCpu);
  auto gpu = ModelBundle::load(*path, options, Device::kCuda);
  SE_CHECK(cpu.is_ok() && gpu.is_ok(), "loading {}", *path);
  RealModel m{{std::move(*cpu), std::move(*gpu)}, {}};
  for (const std::string& text : prompt_texts())
    m.prompts.push_back(m.bundles.cpu.tokenizer->encode(text, /*add_special=*/true, /*parse_special=*/false));
  return m;
}

std::vector<EngineTrace> engine_traces(const ModelBundle& bundle, Device device, const std::string& method,
                                       const nlohmann::json& method_config,
                                       const std::vector<std::vector<int32_t>>& prompts, int num_new,
                                       bool enforce_eager, int max_num_seqs, const std::string& kv_cache_dtype,
                                       int kivi_residual) {
  EngineConfig config;
  config.device = device;
  config.max_num_seqs = max_num_seqs;
  config.max_num_batched_tokens = 24;
  config.max_model_len = 512;
  config.kv_cache_memory = int64_t{64} << 20;
  config.enforce_eager = enforce_eager;
  config.sparse_method = method;
  config.sparse_config = method_config;
  config.kv_cache_dtype = kv_cache_dtype;
  config.kivi_residual = kivi_residual;
  auto engine = Engine::create(bundle, config);
  SE_CHECK(engine.is_ok(), "{} on {}: {}", method, device_name(device), engine.status().to_string());
  // One batch, so every run schedules the same steps: an eviction method's prefill chunks decide what it keeps,
  // and the batch shape picks the GEMM kernels.
  std::vector<GenerationRequest> batch;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams params;
    params.temperature = 0.0f;
    params.max_tokens = num_new;
    params.ignore_eos = true;
    params.logprobs = 2;
    batch.push_back({"r" + std::to_string(i), prompts[i], params});
  }
  auto submitted = (*engine)->submit_batch(std::move(batch));
  SE_CHECK(submitted.is_ok(), "{}", submitted.status().to_string());
  const std::vector<std::shared_ptr<OutputStream>>& streams = *submitted;
  std::vector<EngineTrace> traces(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (bool finished = false; !finished;) {
      auto out = streams[i]->next(std::chrono::milliseconds(120000));
      SE_CHECK(out.has_value() && out->finish_reason != FinishReason::kError, "{} on {}: request {} failed", method,
               device_name(device), i);
      for (const TokenOutput& t : out->tokens) {
        traces[i].tokens.push_back(t.token_id);
        traces[i].margins.push_back(t.top.size() >= 2 ? t.top[0].logprob - t.top[1].logprob : 0.0f);
      }
      finished = out->finished;
    }
  }
  (*engine)->shutdown(/*drain=*/true);
  return traces;
}

}  // namespace se::gpu_parity
