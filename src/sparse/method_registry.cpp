#include "sparse/method_registry.h"

#include "sparse/methods/adakv.h"
#include "sparse/methods/chunkkv.h"
#include "sparse/methods/h2o.h"
#include "sparse/methods/kara.h"
#include "sparse/methods/kvzip.h"
#include "sparse/methods/omnikv.h"
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

struct Entry {
  MethodInfo info;
  Factory create;
  EnvironmentFactory create_in_environment = nullptr;
};

const std::vector<Entry>& entries() {
  static const std::vector<Entry> kEntries = {
      {{"vanilla", "dense attention over every token; radix prefix cache"}, &VanillaMethod::create},
      {{"quest", "decode reads the top pages by per-page key bounds (+ the last page); full history"},
       &QuestMethod::create},
      {{"omnikv", "filter layers pick prompt tokens by max-head logits for the layers after them; full history"},
       &OmniKvMethod::create},
      {{"streamingllm", "attention sinks + recent window, evicted after every step"}, &StreamingLlmMethod::create},
      {{"h2o", "heavy hitters by accumulated attention + recent window, evicted after every step"}, &H2oMethod::create},
      {{"snapkv", "once after the prompt: top tokens by observation-window attention + the window, per KV head"},
       &SnapKvMethod::create},
      {{"pyramidkv", "SnapKV with a per-layer budget shrinking linearly from the first layer to the last"},
       &PyramidKvMethod::create},
      {{"adakv", "SnapKV scores; a layer's budget is split adaptively across its KV heads (per-head lengths)"},
       &AdaKvMethod::create},
      {{"kvzip", "once after the prompt: context-reconstruction passes rate every pair; one global threshold"},
       nullptr,
       &KvzipMethod::create},
      {{"chunkkv", "once after the prompt: top chunks of 20 tokens by window attention, same for every head"},
       &ChunkKvMethod::create},
      {{"rkv",
        "decode-time: the generated part, at budget + buffer, keeps its top tokens by attention minus key "
        "redundancy; the prompt stays whole (composes with no prompt-time method yet); CPU only"},
       &RkvMethod::create},
      {{"kara",
        "decode-time: every period, the newest window of generated tokens keeps its top tokens by "
        "bidirectional window attention, as Token2Chunk spans; the prompt stays whole (composes with no "
        "prompt-time method yet); CPU only"},
       &KaraMethod::create},
      {{"shadowkv",
        "after the prompt: low-rank pre-RoPE keys, chunk landmarks and exact outliers; decode reads the top "
        "chunks by landmark score, their keys rebuilt, plus the local window; CPU only"},
       &ShadowKvMethod::create},
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

Result<std::unique_ptr<MethodRuntime>> create_method(const std::string& name, const nlohmann::json& config,
                                                     const MethodEnvironment& environment) {
  std::string known;
  for (const Entry& e : entries()) {
    if (e.info.name == name)
      return e.create_in_environment ? e.create_in_environment(config, environment) : e.create(config);
    known += (known.empty() ? "" : ", ") + e.info.name;
  }
  return invalid_argument("unknown --sparse-method '{}' (known: {})", name, known);
}

}  // namespace se
