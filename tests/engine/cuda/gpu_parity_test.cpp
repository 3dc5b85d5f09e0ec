// The GPU model path against the CPU backend: the same weights (BF16 values; the CPU holds them as F32, so only
// the GPU's activation rounding differs) run greedy continuations through the paged cache and the vanilla method
// on both devices, one sequence at a time with chunked prefill, and through the engine on the GPU (concurrent
// requests, continuous batching, mixed prefill and decode, device greedy sampling). Checks: logits relative
// error over every step the two runs share, any divergence at a near-tie (the CPU's margin between the two picked
// tokens within twice the logits' largest GPU deviation at that step). No count of identical continuations is
// required: how many of ten prompts meet a sub-0.01 tie within the run is chance (docs/fidelity.md). Real models
// (SmolLM2, Gemma 3) run when their files are present; dummy weights of tiny and real shapes always.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <unistd.h>

#include <fmt/ranges.h>

#include "../../backend/cuda/cuda_test_util.h"
#include "../../loader/test_models.h"
#include "../../support/prune_wait.h"
#include "../../support/tiny_model.h"
#include "gpu_parity_support.h"
#include "backend/device_memory.h"
#include "backend/ops.h"
#include "engine/engine.h"
#include "model/model_loader.h"
#include "model/weight_spec.h"
#include "tensor/host_memory.h"
#include "sparse/method_registry.h"
#include "sparse/paged_cache_manager.h"
#include "sparse/sparse_controller.h"
#include "structured/grammar_matcher.h"

namespace se {
namespace {

using namespace gpu_parity;

// One op with bf16 operands lands under 1e-2; a whole model rounds its matmul inputs and K/V to bf16 in every
// layer (rel. 2^-9 each) and compounds them: measured 0.5e-2 (Gemma-3-shaped) to 3.4e-2 (SmolLM2) on the H200.
constexpr double kLogitsTolerance = 5e-2;
// A MoE layer's router picks its top-k experts from logits computed on those rounded activations: where two
// experts score within the rounding, the GPU routes the token to the other one and that token's output moves by
// far more than rounding (the tiny Qwen3-MoE, 1 prompt of 10 on the H200: 8.3e-2, tokens identical). A wrong
// expert kernel moves every token (rel. error ~1).
constexpr double kMoeLogitsTolerance = 1.5e-1;

// What the greedy continuations must show besides logits parity.
enum class GreedyCheck : uint8_t {
  kNone,      // dummy weights of real shapes: picks are ties, only logits are compared
  kNearTies,  // every divergence at a near-tie (how many prompts meet one within the run is chance, not a check)
};

// One sequence's greedy continuation, with the logits row each token was picked from.
struct GreedyTrace {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // [num_new][vocab]
};

// Prefill in chunks of `prefill_chunk`, then decode: the engine's step order on the model's device.
GreedyTrace run_greedy(const Model& model, const std::vector<int32_t>& prompt, int num_new, int prefill_chunk) {
  const ModelConfig& c = model.config();
  // A latent-attention model keeps its shared latent under vanilla, as the engine does: one row of kv_lora_rank +
  // qk_rope per token.
  const bool latent = c.latent_attention();
  const KvLayout layout = make_kv_layout(c.num_layers, latent ? 1 : c.num_kv_heads,
                                         latent ? c.kv_lora_rank + c.qk_rope_head_dim : c.head_dim, 16, model.device(),
                                         latent ? KvStoreKind::kSharedLatent : KvStoreKind::kExplicit, 0, 0, 0);
  const auto num_tokens = static_cast<int64_t>(prompt.size()) + num_new;
  auto cache = PagedCacheManager::create(layout, static_cast<int32_t>(layout.pages_for_tokens(num_tokens)),
                                         device_allocator(model.device()), /*enable_prefix_caching=*/false);
  SE_CHECK(cache.is_ok(), "{}", cache.status().to_string());
  auto method = create_method("vanilla", nullptr);
  SE_CHECK(method.is_ok(), "vanilla");
  SparseController controller(**method, **cache, model.device());
  ForwardWorkspace workspace = model.make_workspace();
  SE_CHECK(controller.open(0, {}).is_ok(), "open");
  const auto num_prompt = static_cast<int32_t>(prompt.size());
  std::vector<int32_t> tokens = prompt;
  GreedyTrace trace;
  ForwardBatch batch;
  for (int32_t begin = 0; static_cast<int>(trace.tokens.size()) < num_new;) {
    const int32_t n = begin < num_prompt ? std::min(prefill_chunk, num_prompt - begin) : 1;
    SE_CHECK((*cache)->reserve(0, n).is_ok(), "reserve");
    batch.token_ids.assign(tokens.begin() + begin, tokens.begin() + begin + n);
    batch.positions.resize(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) batch.positions[static_cast<size_t>(i)] = begin + i;
    batch.sequences = {{0, 0, n, num_prompt}};
    batch.logit_rows = {n - 1};
    controller.prepare_step(batch);
    const Tensor logits = model.forward(batch, controller, workspace);
    controller.finish_step(batch);
    begin += n;
    (*cache)->on_computed(0, tokens, begin);
    if (begin < num_prompt) continue;
    std::vector<float> row(static_cast<size_t>(c.vocab_size));
    copy_bytes(model.device(), row.data(), logits.raw(), row.size() * sizeof(float));
    trace.tokens.push_back(argmax(row));
    tokens.push_back(trace.tokens.back());
    trace.logits.push_back(std::move(row));
  }
  controller.close(0);
  return trace;
}

struct Divergence {
  int step = -1;       // first differing token, -1 when identical
  double gap = 0.0;    // CPU logit of the CPU's token minus that of the other token
  double noise = 0.0;  // largest |GPU - CPU| logit at that step
  bool near_tie() const { return gap <= 2.0 * noise; }
};

// Where `tokens` leaves the CPU trace, judged by the CPU's logits there (noise: the GPU's deviation there).
Divergence divergence(const GreedyTrace& cpu, const std::vector<int32_t>& tokens, double noise) {
  Divergence d;
  for (size_t i = 0; i < cpu.tokens.size() && i < tokens.size(); ++i) {
    if (cpu.tokens[i] == tokens[i]) continue;
    d.step = static_cast<int>(i);
    d.gap = cpu.logits[i][static_cast<size_t>(cpu.tokens[i])] - cpu.logits[i][static_cast<size_t>(tokens[i])];
    d.noise = noise;
    return d;
  }
  return d;
}

// Model-level parity over `prompts`; returns the largest logits deviation seen (the noise the engine test allows).
double expect_model_parity(const std::string& name, const Model& cpu, const Model& gpu,
                           const std::vector<std::vector<int32_t>>& prompts, int num_new, int prefill_chunk,
                           GreedyCheck check, std::vector<GreedyTrace>* cpu_traces = nullptr,
                           double logits_tolerance = kLogitsTolerance) {
  int num_identical = 0;
  double max_noise = 0.0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    const GreedyTrace want = run_greedy(cpu, prompts[p], num_new, prefill_chunk);
    const GreedyTrace got = run_greedy(gpu, prompts[p], num_new, prefill_chunk);
    // Steps up to the first divergence share their prefix, so their logits must agree.
    double rel_err = 0.0, noise = 0.0;
    Divergence d;
    for (size_t i = 0; i < want.tokens.size(); ++i) {
      rel_err = std::max(rel_err, relative_error(got.logits[i], want.logits[i]));
      noise = max_abs_diff(got.logits[i], want.logits[i]);
      max_noise = std::max(max_noise, noise);
      if (got.tokens[i] != want.tokens[i]) {
        d = divergence(want, got.tokens, noise);
        break;
      }
    }
    num_identical += d.step < 0;
    std::printf("PARITY model %-14s prompt %2zu (%3zu tokens) logits rel_err %.3e  %s", name.c_str(), p,
                prompts[p].size(), rel_err, d.step < 0 ? "identical" : "diverged");
    if (d.step >= 0) std::printf(" at step %d (cpu margin %.4f, gpu deviation %.4f)", d.step, d.gap, d.noise);
    std::printf("\n");
    EXPECT_LT(rel_err, logits_tolerance) << name << " prompt " << p;
    if (check != GreedyCheck::kNone && d.step >= 0)
      EXPECT_TRUE(d.near_tie()) << name << " prompt " << p << " step " << d.step;
    if (cpu_traces != nullptr) cpu_traces->push_back(want);
  }
  if (check != GreedyCheck::kNone)
    std::printf("PARITY model %-14s %d of %zu greedy continuations identical over %d tokens\n", name.c_str(),
                num_identical, prompts.size(), num_new);
  return max_noise;
}

TEST(GpuModelTest, TinyLlamaAndGemma3MatchCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  for (const std::string type : {"llama", "gemma3_text"}) {
    auto normalized = normalize_hf_config(tiny_config(type), "tiny");
    ASSERT_TRUE(normalized.is_ok());
    const auto weights = bf16_dummy_weights(*normalized, 10.0f);
    const Model cpu = create_model(*normalized, weights, Device::kCpu);
    const Model gpu = create_model(*normalized, weights, Device::kCuda);
    // Prompts past the tiny Gemma's 8-token window, prefilled in chunks of 16 against the paged prefix.
    expect_model_parity("tiny-" + type, cpu, gpu, random_prompts(10, 96, 3, 70, 5), 32, 16, GreedyCheck::kNearTies);
  }
}

// Gemma 3 270M's real shapes (262K vocabulary, head_dim 256, one KV head, 5 local layers : 1 global) on dummy
// weights: logits parity only, since random weights leave greedy picks at ties.
TEST(GpuModelTest, Gemma3ShapedDummyMatchesCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  const nlohmann::json config = {
      {"model_type", "gemma3_text"}, {"vocab_size", 262144},          {"hidden_size", 640},
      {"intermediate_size", 2048},   {"num_hidden_layers", 18},       {"num_attention_heads", 4},
      {"num_key_value_heads", 1},    {"head_dim", 256},               {"rms_norm_eps", 1e-6},
      {"rope_theta", 1000000.0},     {"rope_local_base_freq", 10000.0}, {"query_pre_attn_scalar", 256},
      {"sliding_window", 32},        {"sliding_window_pattern", 6},   {"max_position_embeddings", 32768}};
  auto normalized = normalize_hf_config(config, "gemma3-270m-shaped");
  ASSERT_TRUE(normalized.is_ok()) << normalized.status().to_string();
  const auto weights = bf16_dummy_weights(*normalized, 1.0f);
  const Model cpu = create_model(*normalized, weights, Device::kCpu);
  const Model gpu = create_model(*normalized, weights, Device::kCuda);
  expect_model_parity("gemma3-shaped", cpu, gpu, random_prompts(3, 262144, 20, 90, 6), 8, 32, GreedyCheck::kNone);
}

// Concurrent greedy requests through the GPU engine (continuous batching: more requests than sequence slots,
// prefill chunks mixed with decode steps, device argmax) against the CPU traces.
void expect_engine_parity(const std::string& name, const ModelBundle& gpu_bundle,
                          const std::vector<std::vector<int32_t>>& prompts, const std::vector<GreedyTrace>& cpu_traces,
                          double noise, int num_new) {
  EngineConfig config;
  config.device = Device::kCuda;
  config.max_num_seqs = 4;
  config.max_num_batched_tokens = 40;
  config.max_model_len = 512;
  config.gpu_memory_utilization = 0.05;
  auto engine = Engine::create(gpu_bundle, config);
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams params;
    params.temperature = 0.0f;
    params.max_tokens = num_new;
    params.ignore_eos = true;
    auto stream = (*engine)->submit({"r" + std::to_string(i), prompts[i], params});
    ASSERT_TRUE(stream.is_ok()) << stream.status().to_string();
    streams.push_back(*stream);
  }
  int num_identical = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> tokens;
    for (bool finished = false; !finished;) {
      auto out = streams[i]->next(std::chrono::milliseconds(120000));
      ASSERT_TRUE(out.has_value()) << "stream " << i << " stalled";
      for (const TokenOutput& t : out->tokens) tokens.push_back(t.token_id);
      finished = out->finished;
    }
    ASSERT_EQ(tokens.size(), static_cast<size_t>(num_new));
    const Divergence d = divergence(cpu_traces[i], tokens, noise);
    num_identical += d.step < 0;
    std::printf("PARITY engine %-13s request %2zu %s", name.c_str(), i, d.step < 0 ? "identical" : "diverged");
    if (d.step >= 0) std::printf(" at step %d (cpu margin %.4f, model-level gpu deviation %.4f)", d.step, d.gap, noise);
    std::printf("\n");
    if (d.step >= 0) EXPECT_TRUE(d.near_tie()) << name << " request " << i << " step " << d.step;
  }
  const EngineStats stats = (*engine)->stats();
  std::printf("PARITY engine %-13s %d of %zu requests identical; KV pool %lld pages\n", name.c_str(), num_identical,
              prompts.size(), static_cast<long long>(stats.num_kv_pages_total));
  (*engine)->shutdown(/*drain=*/true);
}

void expect_real_model_parity(const std::string& name, const char* env, std::optional<std::string> fallback) {
  std::optional<RealModel> m = load_real(env, std::move(fallback));
  if (!m) GTEST_SKIP() << name << " is not available (set " << env << ")";
  std::vector<GreedyTrace> cpu_traces;
  const double noise = expect_model_parity(name, *m->bundles.cpu.model, *m->bundles.gpu.model, m->prompts, 32, 8,
                                           GreedyCheck::kNearTies, &cpu_traces);
  expect_engine_parity(name, m->bundles.gpu, m->prompts, cpu_traces, noise, 32);
}

TEST(GpuModelTest, SmolLM2MatchesCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  expect_real_model_parity("smollm2-135m", "SE_TEST_SMOLLM2", testing::smollm2_path());
}

TEST(GpuModelTest, Gemma3MatchesCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  expect_real_model_parity("gemma3-270m", "SE_TEST_GEMMA3", testing::gemma3_path());
}

TEST(GpuEngineTest, TinyModelConcurrentGreedyMatchesCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  auto normalized = normalize_hf_config(tiny_config("llama"), "tiny");
  ASSERT_TRUE(normalized.is_ok());
  const auto weights = bf16_dummy_weights(*normalized, 10.0f);
  const Model cpu = create_model(*normalized, weights, Device::kCpu);
  ModelBundle gpu;
  gpu.name = "tiny";
  gpu.model = std::make_unique<Model>(create_model(*normalized, weights, Device::kCuda));
  const auto prompts = random_prompts(10, 96, 3, 90, 8);
  std::vector<GreedyTrace> cpu_traces;
  const double noise =
      expect_model_parity("tiny-llama", cpu, *gpu.model, prompts, 24, 40, GreedyCheck::kNearTies, &cpu_traces);
  expect_engine_parity("tiny-llama", gpu, prompts, cpu_traces, noise, 24);
}

// The tiny model as a Qwen3-MoE (8 experts, 3 per token, layer 1 dense), so the router, the grouping by expert, the
// grouped expert GEMMs and the weighted sum run on the GPU: model-level parity, then the engine (continuous
// batching; its decode steps replayed from CUDA graphs, which the grouping on the device allows).
nlohmann::json tiny_moe_config() {
  nlohmann::json c = tiny_config("qwen3_moe");
  c["num_experts"] = 8;
  c["num_experts_per_tok"] = 3;
  c["moe_intermediate_size"] = 48;
  c["norm_topk_prob"] = true;
  c["mlp_only_layers"] = {1};
  return c;
}

TEST(GpuModelTest, TinyQwen3MoeMatchesCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  auto normalized = normalize_hf_config(tiny_moe_config(), "tiny-moe");
  ASSERT_TRUE(normalized.is_ok()) << normalized.status().to_string();
  const auto weights = bf16_dummy_weights(*normalized, 10.0f);
  const Model cpu = create_model(*normalized, weights, Device::kCpu);
  ModelBundle gpu;
  gpu.name = "tiny-moe";
  gpu.model = std::make_unique<Model>(create_model(*normalized, weights, Device::kCuda));
  const auto prompts = random_prompts(10, 96, 3, 90, 21);
  std::vector<GreedyTrace> cpu_traces;
  const double noise = expect_model_parity("tiny-qwen3-moe", cpu, *gpu.model, prompts, 24, 40, GreedyCheck::kNearTies,
                                           &cpu_traces, kMoeLogitsTolerance);
  expect_engine_parity("tiny-qwen3-moe", gpu, prompts, cpu_traces, noise, 24);
}

// DeepSeek-V2's multi-head latent attention over the shared latent store (a tiny random model: a dense first layer,
// then experts with a shared one), through the model and the engine; MoE routing widens the logits tolerance.
TEST(GpuModelTest, TinyDeepSeekV2MatchesCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  auto normalized = normalize_hf_config(tiny_config("deepseek_v2"), "tiny-deepseek-v2");
  ASSERT_TRUE(normalized.is_ok()) << normalized.status().to_string();
  const auto weights = bf16_dummy_weights(*normalized, 10.0f);
  const Model cpu = create_model(*normalized, weights, Device::kCpu);
  ModelBundle gpu;
  gpu.name = "tiny-deepseek-v2";
  gpu.model = std::make_unique<Model>(create_model(*normalized, weights, Device::kCuda));
  const auto prompts = random_prompts(10, 96, 3, 90, 23);
  std::vector<GreedyTrace> cpu_traces;
  const double noise = expect_model_parity("tiny-deepseek-v2", cpu, *gpu.model, prompts, 24, 40, GreedyCheck::kNearTies,
                                           &cpu_traces, kMoeLogitsTolerance);
  expect_engine_parity("tiny-deepseek-v2", gpu, prompts, cpu_traces, noise, 24);
}

// DeepSeek-V2-Lite's attention widths (16 heads, a latent of 512 and a RoPE key of 64 under its YaRN scaling, q_nope
// and v 128) in two layers, one dense and one of experts, on dummy weights: logits parity only (random weights leave
// greedy picks at ties).
TEST(GpuModelTest, DeepSeekV2LiteShapedDummyMatchesCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  const nlohmann::json config = {{"model_type", "deepseek_v2"},
                                 {"vocab_size", 8192},
                                 {"hidden_size", 1024},
                                 {"intermediate_size", 2816},
                                 {"moe_intermediate_size", 352},
                                 {"num_hidden_layers", 2},
                                 {"num_attention_heads", 16},
                                 {"num_key_value_heads", 16},
                                 {"kv_lora_rank", 512},
                                 {"q_lora_rank", nullptr},
                                 {"qk_nope_head_dim", 128},
                                 {"qk_rope_head_dim", 64},
                                 {"v_head_dim", 128},
                                 {"n_routed_experts", 16},
                                 {"num_experts_per_tok", 6},
                                 {"n_shared_experts", 2},
                                 {"first_k_dense_replace", 1},
                                 {"routed_scaling_factor", 1.0},
                                 {"rms_norm_eps", 1e-6},
                                 {"rope_theta", 10000.0},
                                 {"max_position_embeddings", 163840},
                                 {"rope_scaling",
                                  {{"type", "yarn"},
                                   {"factor", 40},
                                   {"original_max_position_embeddings", 4096},
                                   {"beta_fast", 32},
                                   {"beta_slow", 1},
                                   {"mscale", 0.707},
                                   {"mscale_all_dim", 0.707}}}};
  auto normalized = normalize_hf_config(config, "deepseek-v2-lite-shaped");
  ASSERT_TRUE(normalized.is_ok()) << normalized.status().to_string();
  const auto weights = bf16_dummy_weights(*normalized, 1.0f);
  const Model cpu = create_model(*normalized, weights, Device::kCpu);
  const Model gpu = create_model(*normalized, weights, Device::kCuda);
  expect_model_parity("v2-lite-shaped", cpu, gpu, random_prompts(3, 8192, 20, 150, 24), 8, 64, GreedyCheck::kNone,
                      nullptr, kMoeLogitsTolerance);
}

// A config.json in a directory of its own, loaded with --load-format dummy in bf16; removed with the object.
class DummyCheckpoint {
 public:
  DummyCheckpoint(const nlohmann::json& config, std::string_view name)
      : dir_(std::filesystem::temp_directory_path() / fmt::format("{}_{}", name, getpid())) {
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "config.json") << config.dump();
  }
  ~DummyCheckpoint() { std::filesystem::remove_all(dir_); }
  DummyCheckpoint(const DummyCheckpoint&) = delete;
  DummyCheckpoint& operator=(const DummyCheckpoint&) = delete;

  Result<ModelBundle> load(Device device) const {
    LoadOptions options;
    options.format = LoadFormat::kDummy;
    options.dtype = DType::kBF16;
    options.show_progress = false;
    return ModelBundle::load((dir_ / "config.json").string(), options, device);
  }

 private:
  std::filesystem::path dir_;
};

// --load-format dummy with a block-scaled FP8 quantization_config: the projections are written as e4m3 codes and
// scales and dequantized at load, then uploaded as bf16 (the GPU has no FP8 GEMM yet). Logits parity only: the
// unscaled dummy weights leave greedy picks at ties.
TEST(GpuModelTest, Fp8DummyQwen3MoeMatchesCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  nlohmann::json config = tiny_moe_config();
  config["moe_intermediate_size"] = 64;  // blocks of 32 tile the experts: the GPU keeps them in FP8
  config["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {32, 32}}};
  const DummyCheckpoint checkpoint(config, "se_fp8_moe");
  auto cpu = checkpoint.load(Device::kCpu);
  auto gpu = checkpoint.load(Device::kCuda);
  ASSERT_TRUE(cpu.is_ok()) << cpu.status().to_string();
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();
  EXPECT_EQ(gpu->model->weights().layers[0].experts_gate_up.dtype(), DType::kU8);
  EXPECT_EQ(cpu->model->weights().layers[0].experts_gate_up.dtype(), DType::kF32);
  expect_model_parity("fp8-dummy-moe", *cpu->model, *gpu->model, random_prompts(4, 96, 10, 60, 22), 8, 16,
                      GreedyCheck::kNone, nullptr, kMoeLogitsTolerance);
}

// A GPU load streams: each weight is converted and uploaded as the loader produces it, so the host holds about one
// weight at a time (Qwen3-30B-A3B in fp32 is 122 GB, the H200 machine's whole memory). An FP8 dummy MoE of ~340 MB
// loaded onto the GPU keeps its host peak under twice its largest weight, and runs as its CPU load does.
TEST(GpuModelTest, StreamedMoeLoadHoldsOneWeightOnTheHost) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  nlohmann::json config = tiny_moe_config();
  config.update({{"vocab_size", 32000},
                 {"hidden_size", 512},
                 {"intermediate_size", 1024},
                 {"num_hidden_layers", 4},
                 {"num_attention_heads", 8},
                 {"num_key_value_heads", 4},
                 {"num_experts", 32},
                 {"num_experts_per_tok", 4},
                 {"moe_intermediate_size", 256}});
  config["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}};
  auto normalized = normalize_hf_config(config, "streamed-moe");
  ASSERT_TRUE(normalized.is_ok()) << normalized.status().to_string();
  size_t largest = 0, total = 0;
  for (const WeightSpec& spec : expected_weights(*parse_model_config(*normalized))) {
    largest = std::max(largest, static_cast<size_t>(spec.shape.numel()) * sizeof(float));
    total += static_cast<size_t>(spec.shape.numel()) * sizeof(float);
  }
  ASSERT_GT(total, 4 * largest);  // the bound means something only for a model much larger than it
  const DummyCheckpoint checkpoint(config, "se_streamed_moe");
  const size_t before = host_tensor_bytes();
  reset_host_tensor_peak();
  auto gpu = checkpoint.load(Device::kCuda);
  const size_t peak = host_tensor_peak_bytes() - before;
  auto cpu = checkpoint.load(Device::kCpu);
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();
  ASSERT_TRUE(cpu.is_ok()) << cpu.status().to_string();
  EXPECT_LT(peak, 2 * largest) << "host peak " << peak << " B, largest weight " << largest << " B, model " << total
                               << " B";
  EXPECT_EQ(gpu->model->weights().layers[0].experts_gate_up.dtype(), DType::kU8);  // FP8 experts kept as stored
  expect_model_parity("streamed-moe", *cpu->model, *gpu->model, random_prompts(3, 32000, 10, 40, 23), 8, 16,
                      GreedyCheck::kNone, nullptr, kMoeLogitsTolerance);
}

// Constrained decoding samples on the device: the grammar's allowed tokens go up as bits, the device masks a copy
// of the logits and samples it, and the host matcher moves past the token. Against the same GPU engine sampling
// on the host (asking for logprobs keeps a request there), from the same logits: the same tokens, greedy and
// seeded random, the same model logprobs, and every output a JSON object the grammar accepts. The tiny model's
// 96 ids spell JSON pieces; id 95 ends generation.
TEST(GpuEngineTest, ConstrainedDecodingSamplesOnTheDeviceLikeOnTheHost) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  const DeviceBundles bundles = tiny_cpu_and_gpu_bundles();
  // ":" among them: without it a key could only be closed into a dead end.
  const std::vector<std::string> pieces = {"{", "}", "\"",   "\":",  ",", "a",   "b", "1", "2",
                                           "[", "]", "true", "null", " ", "\"k", "0", ":"};
  std::vector<std::string> vocab;
  vocab.reserve(96);
  for (int32_t id = 0; id < 95; ++id) vocab.push_back(pieces[static_cast<size_t>(id) % pieces.size()]);
  const int32_t eog = 95;
  vocab.push_back("");
  const auto grammar = std::make_shared<const TokenGrammar>(
      TokenGrammar{JsonGrammar::any_object(), std::make_shared<const VocabTrie>(vocab), {eog}});
  const auto prompts = random_prompts(6, 96, 10, 60, 31);
  struct Output {
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
  };
  const auto run = [&](bool on_host, float temperature) {
    EngineConfig config;
    config.device = Device::kCuda;
    config.max_num_seqs = 4;
    config.max_num_batched_tokens = 24;
    config.max_model_len = 512;
    config.kv_cache_memory = int64_t{64} << 20;
    auto engine = Engine::create(bundles.gpu, config);
    SE_CHECK(engine.is_ok(), "{}", engine.status().to_string());
    std::vector<GenerationRequest> batch;
    for (size_t i = 0; i < prompts.size(); ++i) {
      SamplingParams params;
      params.temperature = temperature;
      params.seed = 100 + i;
      params.max_tokens = 48;
      params.stop_token_ids = {eog};
      params.logprobs = on_host ? 1 : -1;
      params.grammar = grammar;
      batch.push_back({"c" + std::to_string(i), prompts[i], params});
    }
    auto submitted = (*engine)->submit_batch(std::move(batch));
    SE_CHECK(submitted.is_ok(), "{}", submitted.status().to_string());
    std::vector<Output> outputs(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i)
      for (bool finished = false; !finished;) {
        auto out = (*submitted)[i]->next(std::chrono::milliseconds(120000));
        SE_CHECK(out.has_value() && out->finish_reason != FinishReason::kError, "request {} failed", i);
        for (const TokenOutput& t : out->tokens) {
          outputs[i].tokens.push_back(t.token_id);
          outputs[i].logprobs.push_back(t.logprob);
        }
        finished = out->finished;
      }
    (*engine)->shutdown(/*drain=*/true);
    return outputs;
  };
  for (float temperature : {0.0f, 1.0f}) {
    const std::vector<Output> host = run(/*on_host=*/true, temperature);
    const std::vector<Output> device = run(/*on_host=*/false, temperature);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(device[i].tokens, host[i].tokens) << "temperature " << temperature << " request " << i;
      for (size_t t = 0; t < std::min(device[i].logprobs.size(), host[i].logprobs.size()); ++t)
        EXPECT_NEAR(device[i].logprobs[t], host[i].logprobs[t], 1e-4) << "request " << i << " token " << t;
      GrammarMatcher replay(grammar);
      std::string text;
      for (int32_t token : device[i].tokens) {
        ASSERT_TRUE(replay.accept(token)) << "request " << i << " after '" << text << "'";
        if (token != eog) text += vocab[static_cast<size_t>(token)];
      }
      if (!device[i].tokens.empty() && device[i].tokens.back() == eog)
        EXPECT_TRUE(nlohmann::json::accept(text)) << text;
      std::printf("CONSTRAINED t=%.0f request %zu: %s\n", temperature, i, text.c_str());
    }
  }
}

// A decode step replayed from a CUDA graph computes what the eager step computes: the same greedy tokens for a
// dense, an eviction and a selection method (Quest ranks on the device inside the graph) and the decode-time
// compressors (their query rings filled by a table rewritten before each replay, compressing between replays), over
// batch sizes that change as requests finish (several graphs, re-captured as the page tables grow).
TEST(GpuEngineTest, CudaGraphDecodeMatchesEager) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  auto normalized = normalize_hf_config(tiny_config("llama"), "tiny");
  ASSERT_TRUE(normalized.is_ok());
  ModelBundle gpu;
  gpu.name = "tiny";
  gpu.model = std::make_unique<Model>(create_model(*normalized, bf16_dummy_weights(*normalized, 10.0f), Device::kCuda));
  const auto prompts = random_prompts(10, 96, 3, 90, 13);
  for (const auto& [method, config] : std::map<std::string, nlohmann::json>{
           {"vanilla", nullptr},
           {"streamingllm", {{"budget", 48}}},
           {"quest", {{"token_budget", 32}, {"dense_layers", 1}}},
           {"rkv", {{"budget", 24}, {"buffer", 8}, {"window", 4}, {"kernel", 3}}},
           {"kara", {{"window", 16}, {"buffer", 4}, {"candidates", 4}, {"budget", 6}, {"period", 8}}}}) {
    const auto eager = engine_traces(gpu, Device::kCuda, method, config, prompts, 120, /*enforce_eager=*/true);
    const auto graphs = engine_traces(gpu, Device::kCuda, method, config, prompts, 120);
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(graphs[i].tokens, eager[i].tokens) << method << " request " << i;
  }
}

// Prefix pruning on the GPU engine: both policies on the radix cache (vanilla) and snapkv_global on a SnapKV
// chain complete, free pages (on the radix cache as many as the CPU engine), keep mostly the same positions (the
// scores carry bf16 noise, so near-ties may go the other way), and leave the prefix reusable.
struct PruneRun {
  PruneStatus status;
  int32_t num_cached_after = 0;  // radix: the prefix's cached tokens after the prune; chain: the next turn's
};
PruneRun prune_on(const ModelBundle& bundle, Device device, const std::string& method, const nlohmann::json& config,
                  const std::vector<int32_t>& prompt, PruneRequest prune) {
  EngineConfig engine_config;
  engine_config.device = device;
  engine_config.max_model_len = 512;
  engine_config.kv_cache_memory = int64_t{64} << 20;
  engine_config.sparse_method = method;
  engine_config.sparse_config = config;
  auto engine = Engine::create(bundle, engine_config);
  SE_CHECK(engine.is_ok(), "{}", engine.status().to_string());
  SamplingParams params;
  params.temperature = 0.0f;
  params.max_tokens = 4;
  params.ignore_eos = true;
  const bool chain = !prune.chain_id.empty();
  const auto run = [&](const std::string& id, const std::vector<int32_t>& tokens, std::optional<ChainRequest> turn) {
    auto stream = (*engine)->submit({id, tokens, params, std::move(turn)});
    SE_CHECK(stream.is_ok(), "{}", stream.status().to_string());
    while (true) {
      auto out = (*stream)->next(std::chrono::milliseconds(120000));
      SE_CHECK(out.has_value() && out->finish_reason != FinishReason::kError, "request {} failed", id);
      if (out->finished) return *out;
    }
  };
  run("first", prompt, chain ? std::optional<ChainRequest>(ChainRequest{prune.chain_id, true}) : std::nullopt);
  auto prune_id = (*engine)->submit_prune(std::move(prune));
  SE_CHECK(prune_id.is_ok(), "{}", prune_id.status().to_string());
  PruneRun result{test::wait_for_prune(**engine, *prune_id)};
  if (chain) {
    std::vector<int32_t> next = (*engine)->chain_prefix("c");
    next.insert(next.end(), prompt.begin(), prompt.begin() + 10);
    result.num_cached_after = run("second", next, ChainRequest{"c"}).num_cached_tokens;
  } else {
    auto inspected = (*engine)->inspect_prefix(prompt, /*as_prompt=*/true);
    SE_CHECK(inspected.is_ok(), "{}", inspected.status().to_string());
    result.num_cached_after = inspected->num_cached_tokens;
    run("again", prompt, std::nullopt);
  }
  (*engine)->shutdown(/*drain=*/true);
  return result;
}

TEST(GpuEngineTest, PrunesRunOnTheGpuLikeOnTheCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  const DeviceBundles bundles = tiny_cpu_and_gpu_bundles();
  const ModelBundle& cpu = bundles.cpu;
  const ModelBundle& gpu = bundles.gpu;
  const std::vector<int32_t> prompt = random_prompts(1, 96, 200, 200, 21)[0];
  struct Case {
    const char* name;
    const char* method;
    nlohmann::json config;
    PrunePolicy policy;
    const char* chain_id;
  };
  for (const Case& c : {Case{"radix snapkv_global", "vanilla", nullptr, PrunePolicy::kSnapKvGlobal, ""},
                        Case{"radix kvzip_global", "vanilla", nullptr, PrunePolicy::kKvzipGlobal, ""},
                        Case{"chain snapkv_global", "snapkv", {{"budget", 64}, {"window", 8}},
                             PrunePolicy::kSnapKvGlobal, "c"}}) {
    PruneRequest prune;
    prune.chain_id = c.chain_id;
    if (prune.chain_id.empty()) prune.token_ids = prompt;
    prune.ranges = {{16, 160}};
    prune.keep_tokens = 8;
    prune.policy = c.policy;
    prune.window = 8;
    const PruneRun want = prune_on(cpu, Device::kCpu, c.method, c.config, prompt, prune);
    const PruneRun got = prune_on(gpu, Device::kCuda, c.method, c.config, prompt, prune);
    ASSERT_EQ(want.status.state, PruneState::kCompleted) << c.name << ": " << want.status.reason;
    ASSERT_EQ(got.status.state, PruneState::kCompleted) << c.name << ": " << got.status.reason;
    EXPECT_GT(got.status.num_freed_pages, 0) << c.name;
    // The radix cache frees whole blocks by count; a chain frees what its streams held in the range, which
    // SnapKV chose with bf16 noise of its own.
    if (prune.chain_id.empty()) EXPECT_EQ(got.status.num_freed_pages, want.status.num_freed_pages) << c.name;
    EXPECT_EQ(got.num_cached_after, want.num_cached_after) << c.name;
    EXPECT_GT(got.num_cached_after, 0) << c.name;
    const std::vector<int32_t>& w = want.status.ranges.at(0).kept_positions;
    const std::vector<int32_t>& g = got.status.ranges.at(0).kept_positions;
    ASSERT_EQ(g.size(), w.size()) << c.name;
    std::vector<int32_t> common;
    std::set_intersection(w.begin(), w.end(), g.begin(), g.end(), std::back_inserter(common));
    std::printf("PRUNE %-20s %zu of %zu kept positions as on the CPU, %d pages freed\n", c.name, common.size(),
                w.size(), got.status.num_freed_pages);
    EXPECT_GE(common.size() * 4, w.size() * 3) << c.name;  // at least 75% the same
  }
}

}  // namespace
}  // namespace se
