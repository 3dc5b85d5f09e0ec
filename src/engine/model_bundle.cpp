#include "engine/model_bundle.h"

#include <filesystem>

#include "backend/cpu/thread_pool.h"
#include "model/sharding_sink.h"
#include "model/tensor_parallel.h"
#include "model/weights_builder.h"

namespace se {

Result<std::optional<Tokenizer>> load_tokenizer(const LoadedModel& loaded) {
  if (loaded.gguf) {
    SE_ASSIGN_OR_RETURN(Tokenizer t, Tokenizer::from_gguf(*loaded.gguf));
    return std::optional<Tokenizer>(std::move(t));
  }
  const std::filesystem::path dir = loaded.hf_dir;
  const std::filesystem::path tokenizer_json = dir / "tokenizer.json";
  // Without tokenizer.json the model serves token ids only (vLLM's --skip-tokenizer-init): random checkpoints
  // written for parity and speed runs have none.
  if (!std::filesystem::exists(tokenizer_json)) return std::optional<Tokenizer>();
  const std::filesystem::path config = dir / "tokenizer_config.json";
  SE_ASSIGN_OR_RETURN(Tokenizer t, Tokenizer::from_hf_files(tokenizer_json.string(),
                                                            std::filesystem::exists(config) ? config.string() : ""));
  return std::optional<Tokenizer>(std::move(t));
}

namespace {

// Each weight goes to the device as it is read: a GPU load never holds the whole model on the host. With several
// ranks each builder keeps its rank's part, and the checkpoint is read once for all of them.
Result<LoadedModel> load_rank_models(const std::string& path, const LoadOptions& options, Device device,
                                     int tensor_parallel_size, ModelBundle& bundle) {
  if (tensor_parallel_size < 1)
    return invalid_argument("--tensor-parallel-size must be at least 1, got {}", tensor_parallel_size);
  if (tensor_parallel_size > 1 && device != Device::kCpu)
    return unimplemented("--tensor-parallel-size {} runs on the CPU only for now (ranks as threads); use --device cpu",
                         tensor_parallel_size);
  std::vector<ModelWeightsBuilder> builders;
  builders.reserve(static_cast<size_t>(tensor_parallel_size));
  for (int r = 0; r < tensor_parallel_size; ++r) builders.emplace_back(device, matrix_dtype(device));
  ShardingSink sharding(tensor_parallel_size);
  for (int r = 0; r < tensor_parallel_size; ++r) sharding.add_rank(r, builders[static_cast<size_t>(r)]);
  WeightSink& sink = tensor_parallel_size == 1 ? static_cast<WeightSink&>(builders[0]) : sharding;
  SE_ASSIGN_OR_RETURN(LoadedModel loaded, load_model(path, options, sink));
  if (tensor_parallel_size > 1) bundle.rank_group = std::make_unique<LocalCommGroup>(tensor_parallel_size);
  for (int r = 0; r < tensor_parallel_size; ++r) {
    SE_ASSIGN_OR_RETURN(ModelWeights weights, builders[static_cast<size_t>(r)].finish());
    SE_ASSIGN_OR_RETURN(const ModelConfig config, shard_config(loaded.config, ShardLayout{r, tensor_parallel_size}));
    Communicator& comm = bundle.rank_group ? bundle.rank_group->communicator(r) : single_rank_communicator();
    SE_ASSIGN_OR_RETURN(Model model, Model::from_weights(config, std::move(weights), device, comm));
    auto& slot = r == 0 ? bundle.model : bundle.other_ranks.emplace_back();
    slot = std::make_unique<Model>(std::move(model));
  }
  return loaded;
}

}  // namespace

Result<ModelBundle> ModelBundle::load(const std::string& path, const LoadOptions& options, Device device,
                                      int tensor_parallel_size) {
  ModelBundle bundle;
  SE_ASSIGN_OR_RETURN(LoadedModel loaded, load_rank_models(path, options, device, tensor_parallel_size, bundle));
  bundle.path = path;
  // A model is named by its file, or by its folder where the file says nothing (an HF directory given with a
  // trailing slash, a dummy load's config.json).
  const std::filesystem::path model_path(path);
  bundle.name = model_path.filename().string();
  if (bundle.name.empty() || bundle.name == "config.json") bundle.name = model_path.parent_path().filename().string();
  bundle.source_format = loaded.source_format;
  bundle.kv_cache_scales = std::move(loaded.kv_cache_scales);
  SE_ASSIGN_OR_RETURN(bundle.tokenizer, load_tokenizer(loaded));
  if (bundle.tokenizer && !bundle.tokenizer->chat_template().empty()) {
    auto parsed = ChatTemplate::parse(bundle.tokenizer->chat_template());
    if (!parsed.is_ok()) return parsed.status().with_context(path + ": chat template");
    bundle.chat_template = std::move(parsed).value();
  }
  // Loading ran parallel loops on this thread; its OpenMP workers would otherwise outlive it and stop the engine
  // thread's workers from spinning between ops (`bench decode --device cpu` on the 2-core AMD VM, batch 1: 29 ->
  // 21 ms per step).
  cpu::release_calling_thread_workers();
  return bundle;
}

Result<std::string> ModelBundle::render_chat(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                             const ChatExtras& extras) const {
  if (!chat_template) return failed_precondition("model '{}' has no chat template", name);
  ChatTemplateOptions options;
  options.add_generation_prompt = add_generation_prompt;
  options.bos_token = tokenizer->bos_token();
  options.eos_token = tokenizer->eos_token();
  options.tools = extras.tools;
  options.extra_variables = extras.template_kwargs;
  return chat_template->render(messages, options);
}

bool ModelBundle::chat_template_supports_tools() const {
  return chat_template && chat_template->source().find("tools") != std::string::npos;
}

}  // namespace se
