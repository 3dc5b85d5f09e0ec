#include "sparse/method_registry.h"

#include <algorithm>

#include "sparse/methods/adakv.h"
#include "sparse/methods/chunkkv.h"
#include "sparse/methods/h2o.h"
#include "sparse/methods/kara.h"
#include "sparse/methods/kvzip.h"
#include "sparse/methods/omnikv.h"
#include "sparse/methods/palu.h"
#include "sparse/methods/pyramidkv.h"
#include "sparse/methods/quest.h"
#include "sparse/methods/rkv.h"
#include "sparse/methods/shadowkv.h"
#include "sparse/methods/snapkv.h"
#include "sparse/methods/streamingllm.h"
#include "sparse/methods/vanilla.h"

namespace se {

namespace {
using Factory = Result<std::unique_ptr<MethodRuntime>> (*)(const nlohmann::json&);
// For methods that read the MethodEnvironment (their `create` is then null).
using EnvironmentFactory = Result<std::unique_ptr<MethodRuntime>> (*)(const nlohmann::json&,
                                                                      const MethodEnvironment&);
// For decode-time methods: the config without the composition keys, and the prompt-time method (or null).
using DecodeTimeFactory = Result<std::unique_ptr<MethodRuntime>> (*)(const nlohmann::json&,
                                                                     std::unique_ptr<MethodRuntime>);

struct Entry {
  MethodInfo info;
  Factory create;
  EnvironmentFactory create_in_environment = nullptr;
  DecodeTimeFactory create_decode_time = nullptr;
};

const std::vector<Entry>& entries() {
  static const std::vector<Entry> kEntries = {
      {{"vanilla", "dense attention over every token; radix prefix cache"}, &VanillaMethod::create},
      {{"quest",
        "decode reads the top pages by per-page key bounds (+ the last page); full history; under --kv-partitions "
        "two_level_group ranks groups of pages first (Spin's two-level metadata)"},
       &QuestMethod::create},
      {{"omnikv", "filter layers pick prompt tokens by max-head logits for the layers after them; full history"},
       &OmniKvMethod::create},
      {{"streamingllm", "attention sinks + recent window, evicted after every step"}, &StreamingLlmMethod::create},
      {{"h2o", "heavy hitters by accumulated attention + recent window, evicted after every step"}, &H2oMethod::create},
      {{"snapkv", "once after the prompt: top tokens by observation-window attention + the window, per KV head",
        Composition::kPromptTime},
       &SnapKvMethod::create},
      {{"pyramidkv", "SnapKV with a per-layer budget shrinking linearly from the first layer to the last",
        Composition::kPromptTime},
       &PyramidKvMethod::create},
      // Its KV heads keep different numbers of prompt tokens, which decode-time compression (one region of slots
      // per layer) does not take.
      {{"adakv", "SnapKV scores; a layer's budget is split adaptively across its KV heads (per-head lengths)"},
       &AdaKvMethod::create},
      // Per-head lengths too (one global threshold), and its reconstruction passes run at the end of prefill.
      {{"kvzip", "once after the prompt: context-reconstruction passes rate every pair; one global threshold"},
       nullptr,
       &KvzipMethod::create},
      {{"chunkkv", "once after the prompt: top chunks of 20 tokens by window attention, same for every head",
        Composition::kPromptTime},
       &ChunkKvMethod::create},
      {{"rkv",
        "decode-time: the generated part, at budget + buffer, keeps its top tokens by attention minus key "
        "redundancy (mix_lambda 1: attention alone, a threshold-triggered SnapKV); the prompt stays whole unless a "
        "prompt_method compresses it; on a GPU scored on the device, the top tokens picked on the host",
        Composition::kDecodeTime},
       nullptr,
       nullptr,
       &RkvMethod::create},
      {{"kara",
        "decode-time: every period, the newest window of generated tokens keeps its top tokens by "
        "bidirectional window attention, as Token2Chunk spans; the prompt stays whole unless a prompt_method "
        "compresses it; on a GPU scored on the device, the spans picked on the host",
        Composition::kDecodeTime,
        /*budget_per_window=*/true},
       nullptr,
       nullptr,
       &KaraMethod::create},
      {{"shadowkv",
        "after the prompt: low-rank pre-RoPE keys, chunk landmarks and exact outliers; decode reads the top "
        "chunks by landmark score, their keys rebuilt, plus the local window; CPU only"},
       &ShadowKvMethod::create},
      {{"palu",
        "low-rank KV: W_k and W_v factored per group of KV heads by SVD at load time; the cache keeps the latents, "
        "attention rebuilds keys (RoPE at their positions) and applies U_v after the softmax; full history; CPU "
        "only"},
       nullptr,
       &PaluMethod::create},
  };
  return kEntries;
}
}  // namespace

const std::vector<MethodInfo>& registered_methods() {
  static const std::vector<MethodInfo> kInfos = [] {
    std::vector<MethodInfo> infos;
    for (const Entry& e : entries()) infos.push_back(e.info);
    return infos;
  }();
  return kInfos;
}

std::string_view composition_name(Composition composition) {
  switch (composition) {
    case Composition::kNone:
      return "none";
    case Composition::kPromptTime:
      return "prompt-time";
    case Composition::kDecodeTime:
      return "decode-time";
  }
  return "?";
}

namespace {

// The names of the entries composing as `composition`, comma-separated.
std::string names_of(Composition composition) {
  std::string names;
  for (const Entry& e : entries())
    if (e.info.composition == composition) names += (names.empty() ? "" : ", ") + e.info.name;
  return names;
}

// Decode-time method `entry` with `config`, whose "prompt_method" and "prompt_config" keys (if any) name the
// prompt-time method it composes with.
Result<std::unique_ptr<MethodRuntime>> create_decode_time(const Entry& entry, const nlohmann::json& config,
                                                          const MethodEnvironment& environment) {
  if (!config.is_object() || !config.contains("prompt_method")) {
    if (config.is_object() && config.contains("prompt_config"))
      return invalid_argument("{}: 'prompt_config' without a 'prompt_method'", entry.info.name);
    return entry.create_decode_time(config, nullptr);
  }
  const nlohmann::json& prompt_name = config["prompt_method"];
  const std::string prompt_methods = names_of(Composition::kPromptTime);
  if (!prompt_name.is_string())
    return invalid_argument("{}: 'prompt_method' must be a method name ({}), got {}", entry.info.name, prompt_methods,
                            prompt_name.dump());
  const auto prompt_entry = std::find_if(entries().begin(), entries().end(),
                                         [&](const Entry& e) { return e.info.name == prompt_name.get<std::string>(); });
  if (prompt_entry == entries().end() || prompt_entry->info.composition != Composition::kPromptTime)
    return invalid_argument("{}: 'prompt_method' = '{}' is not a prompt-time method it composes with (valid: {})",
                            entry.info.name, prompt_name.get<std::string>(), prompt_methods);
  nlohmann::json decode_config = config;
  decode_config.erase("prompt_method");
  const nlohmann::json prompt_config = config.value("prompt_config", nlohmann::json());
  decode_config.erase("prompt_config");
  auto prompt = create_method(prompt_entry->info.name, prompt_config, environment);
  if (!prompt.is_ok()) return invalid_argument("{}: 'prompt_config': {}", entry.info.name, prompt.status().message());
  return entry.create_decode_time(decode_config, std::move(prompt).value());
}

}  // namespace

Result<std::unique_ptr<MethodRuntime>> create_method(const std::string& name, const nlohmann::json& config,
                                                     const MethodEnvironment& environment) {
  std::string known;
  for (const Entry& e : entries()) {
    if (e.info.name == name) {
      if (e.create_decode_time) return create_decode_time(e, config, environment);
      if (config.is_object() && (config.contains("prompt_method") || config.contains("prompt_config")))
        return invalid_argument("{}: 'prompt_method' composes only a decode-time method ({}) with a prompt-time one",
                                name, names_of(Composition::kDecodeTime));
      return e.create_in_environment ? e.create_in_environment(config, environment) : e.create(config);
    }
    known += (known.empty() ? "" : ", ") + e.info.name;
  }
  return invalid_argument("unknown --sparse-method '{}' (known: {})", name, known);
}

}  // namespace se
