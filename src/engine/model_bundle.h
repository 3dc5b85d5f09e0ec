// ModelBundle: everything needed to serve one model: the Model, its Tokenizer and its chat template, loaded
// from one --model path. Immutable after load; the tokenizer and template may be shared across threads. Split
// over tensor-parallel ranks (model/tensor_parallel.h), it holds every rank's part of the model and the group of
// communicators their forwards run on: ranks as threads of this process (LocalCommGroup, the CPU backend).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "model/model_loader.h"
#include "model/model.h"
#include "parallel/local_comm_group.h"
#include "tokenizer/tokenizer.h"

namespace se {

// What a chat request adds to its messages when the template renders: tool schemas (a list, or null) and its
// chat_template_kwargs (e.g. enable_thinking).
struct ChatExtras {
  nlohmann::ordered_json tools = nullptr;
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
};

struct ModelBundle {
  std::string name;        // served model name (--served-model-name, else the file or directory name)
  std::string path;
  std::string source_format;
  // The ranks' communicators (null for one rank); declared before the models, which use them.
  std::unique_ptr<LocalCommGroup> rank_group;
  std::unique_ptr<Model> model;                     // rank 0's part under tensor parallelism
  std::vector<std::unique_ptr<Model>> other_ranks;  // ranks 1 .. size - 1's parts (empty for one rank)
  std::optional<Tokenizer> tokenizer;         // absent when the directory has no tokenizer.json (token ids only)
  std::optional<ChatTemplate> chat_template;  // absent when the model ships none
  std::optional<KvCacheScales> kv_cache_scales;  // the checkpoint's FP8 KV cache scales, every KV head's

  // Loads weights (placed on `device`; split over `tensor_parallel_size` ranks, each keeping only its part),
  // tokenizer (GGUF vocabulary or tokenizer.json) and chat template. Errors name the file, or what the ranks do
  // not divide (shard_config); more than one rank runs on the CPU only for now (kUnimplemented on CUDA).
  static Result<ModelBundle> load(const std::string& path, const LoadOptions& options, Device device = Device::kCpu,
                                  int tensor_parallel_size = 1);

  int tensor_parallel_size() const { return 1 + static_cast<int>(other_ranks.size()); }
  // Rank `rank`'s part of the model (the whole model for one rank).
  const Model& rank_model(int rank) const { return rank == 0 ? *model : *other_ranks[static_cast<size_t>(rank - 1)]; }

  // The prompt of a chat: the template rendered with the generation prompt on (or off: a conversation so far).
  Result<std::string> render_chat(const nlohmann::ordered_json& messages, bool add_generation_prompt = true,
                                  const ChatExtras& extras = {}) const;
  // Whether the chat template renders tool schemas at all (it reads a `tools` variable).
  bool chat_template_supports_tools() const;
};

// The tokenizer of a loaded model: the GGUF vocabulary, or tokenizer.json (+ tokenizer_config.json) of its
// directory; none when the directory has no tokenizer.json.
Result<std::optional<Tokenizer>> load_tokenizer(const LoadedModel& loaded);

}  // namespace se
