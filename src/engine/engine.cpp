#include "engine/engine.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "backend/device_memory.h"
#include "base/logging.h"
#include "engine/engine_loop.h"
#include "engine/engine_rank.h"
#include "engine/kv_budget.h"
#include "model/tensor_parallel.h"
#include "sparse/low_rank_kv.h"
#include "sparse/method_registry.h"
#include "sparse/method_traits.h"

namespace se {

namespace {

constexpr int64_t kDefaultHostKvBytes = int64_t{2} << 30;

// MemAvailable from /proc/meminfo, in bytes (0 when unreadable).
int64_t host_available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

// Each rank's KV budget (the pool and the method's per-sequence state beside it, kv_budget.h): --kv-cache-memory;
// else on CUDA --gpu-memory-utilization of the device memory left free (the weights and the workspace are allocated
// by now); on the CPU at most 2 GiB and half of the free host memory, shared by the ranks.
int64_t kv_budget_bytes(const EngineConfig& config, int num_ranks) {
  if (config.kv_cache_memory > 0) return config.kv_cache_memory;
  if (config.device == Device::kCuda)
    return static_cast<int64_t>(static_cast<double>(cuda_memory_info().free_bytes) * config.gpu_memory_utilization);
  const int64_t available = host_available_bytes();
  return (available > 0 ? std::min(kDefaultHostKvBytes, available / 2) : kDefaultHostKvBytes) / num_ranks;
}

// What a method needs to run on `size` ranks of `model` (rank 0's config): its traits say it decides per KV
// head or agrees across ranks, each rank holds whole query groups (a KV head replicated over ranks splits its query
// heads, whose scores no rank then sees whole; so does a latent-attention model's shared latent, which every rank
// keeps for its share of the heads), and no host tier (a rank's states move there alone).
Status check_runs_sharded(const ModelConfig& model, int size, const MethodRuntime& method, const EngineConfig& config) {
  if (config.tensor_parallel_size != size)
    return invalid_argument("the model was loaded for --tensor-parallel-size {} but the engine runs {}", size,
                            config.tensor_parallel_size);
  if (size == 1) return Status::ok();
  SE_RETURN_IF_ERROR(check_tensor_parallel(method.traits(), method.name()));
  if (model.kv_head_copies > 1 && !method.traits().position_only)
    return invalid_argument(
        "{} scores each KV head with its query heads, but {} ranks split the model's {} KV heads' "
        "query groups (each KV head is kept by {} ranks); use a --tensor-parallel-size that "
        "divides the KV heads",
        method.name(), size, size / model.kv_head_copies, model.kv_head_copies);
  if (model.latent_attention() && method.traits().keys_through_logits && !method.traits().position_only)
    return invalid_argument(
        "{} scores the shared latent of {} with every query head, but {} ranks split the heads; run it with "
        "--tensor-parallel-size 1",
        method.name(), model.model_type, size);
  if (config.kv_offloading_size > 0)
    return unimplemented("--kv-offloading-size does not run under tensor parallelism yet");
  return Status::ok();
}

// What the chat template puts after a user message up to the assistant's reply, found as kvpress does: render
// one user turn whose content ends in a marker, with the generation prompt (and thinking off), and take the text
// after the marker. "\n" without a template or when the marker does not come through.
std::string chat_reply_suffix(const ModelBundle& bundle) {
  if (!bundle.chat_template || !bundle.tokenizer) return "\n";
  const std::string content = "dummy context";
  std::string marker(content.size() + 1, '#');  // "\n#############"
  marker.front() = '\n';
  ChatTemplateOptions options;
  options.add_generation_prompt = true;
  options.bos_token = bundle.tokenizer->bos_token();
  options.eos_token = bundle.tokenizer->eos_token();
  options.extra_variables = {{"enable_thinking", false}};
  const nlohmann::ordered_json messages = {{{"role", "user"}, {"content", content + marker}}};
  Result<std::string> rendered = bundle.chat_template->render(messages, options);
  if (!rendered.is_ok()) return "\n";
  const size_t at = rendered->find(marker);
  return at == std::string::npos ? "\n" : rendered->substr(at + marker.size());
}

// EngineConfig::prefix_cache_mode resolved against the method: "radix", "chain" or "off".
Result<std::string> resolve_prefix_cache_mode(const EngineConfig& config, const MethodRuntime& method,
                                              const KvLayout& layout) {
  const MethodTraits& traits = method.traits();
  const std::string& mode = config.prefix_cache_mode;
  if (mode != "auto" && mode != "radix" && mode != "chain" && mode != "off")
    return invalid_argument("--prefix-cache-mode must be auto, radix, chain or off, got '{}'", mode);
  if (!config.enable_prefix_caching || mode == "off") return std::string("off");
  const bool chain = traits.prefix_mode == PrefixMode::kChain;
  // A KIVI stream's window slides and flushes its rows into key groups formed from the tokens of that stream alone,
  // so no block of pages stays the same to share between sequences; a chain keeps its one sequence's streams whole.
  if (layout.kivi() && mode == "radix")
    return invalid_argument(
        "--prefix-cache-mode radix: the {} KV store keeps no radix prefix cache (its residual window slides and "
        "flushes into groups of one sequence's tokens, so no page is shared); use chain (with a method that has a "
        "chain mode), off or auto",
        kv_store_kind_name(layout.store));
  if (layout.kivi() && mode == "auto") return std::string(chain ? "chain" : "off");
  if (mode == "radix" && !traits.keeps_full_history)
    return invalid_argument("--prefix-cache-mode radix needs a method that keeps every token resident; {} evicts "
                            "(use chain)", method.name());
  if (mode == "chain" && !chain)
    return invalid_argument("--prefix-cache-mode chain: {} has no chain mode (use radix)", method.name());
  if (mode == "auto") return std::string(chain ? "chain" : "radix");
  return mode;
}

// What a retained chain state depends on: resuming it under other settings (the KV store and the tensor-parallel
// layout included: each rank's state holds its KV heads) would read foreign KV.
std::string make_chain_fingerprint(const ModelBundle& bundle, const KvLayout& layout, const MethodRuntime& method) {
  const ModelConfig& model = bundle.model->config();
  return fmt::format("{}:{}:{}x{}x{}|{}|{}|tp{}|{}|{}", bundle.path, model.arch, layout.num_layers, layout.num_kv_heads,
                     layout.head_dim, dtype_name(layout.dtype), kv_store_kind_name(layout.store),
                     bundle.tensor_parallel_size(), method.name(), method.config().dump());
}

// The checkpoint's FP8 KV cache scales of rank `rank`'s KV heads, where the store is FP8 and the checkpoint ships
// them (an FP8 store always keeps the model's K/V heads: latent stores refuse quantized dtypes).
std::optional<KvCacheScales> checkpoint_fp8_scales(const ModelBundle& bundle, const KvLayout& layout, int rank) {
  if (!bundle.kv_cache_scales || layout.store != KvStoreKind::kFp8E4M3) return std::nullopt;
  const ModelConfig& rank_model = bundle.rank_model(rank).config();
  const KvCacheScales& all = *bundle.kv_cache_scales;
  return all.heads(first_kv_head(all.num_kv_heads, rank_model.shard), layout.num_kv_heads);
}

}  // namespace

Status check_kv_partitions(const EngineConfig& config, const MethodRuntime& method) {
  if (!config.kv_partitions) {
    const std::optional<PartitionConfig> partitions = method.partition_config();
    if (partitions && partitions->two_level)
      return invalid_argument(
          "{}: the two-level ranking (two_level_group) runs over Spin's partitions only: give --kv-partitions (with "
          "--kv-offloading-size), or leave two_level_group out",
          method.name());
    return Status::ok();
  }
  if (config.kv_offloading_size <= 0)
    return invalid_argument("--kv-partitions keeps running sequences in the host tier: give it --kv-offloading-size");
  if (!method.partition_config())
    return invalid_argument(
        "--kv-partitions: {} cannot run its decode as Spin's partitions with this configuration (`sparse-engine "
        "methods` lists the methods that can)",
        method.name());
  if (config.device != Device::kCpu)
    return unimplemented("--kv-partitions runs on the CPU backend only for now (use --device cpu)");
  if (config.tensor_parallel_size > 1) return unimplemented("--kv-partitions does not run under tensor parallelism");
  if (config.kv_cache_dtype != "auto")
    return unimplemented("--kv-partitions reads explicit K/V pages: use --kv-cache-dtype auto, not {}",
                         config.kv_cache_dtype);
  if (config.enable_prefix_caching && config.prefix_cache_mode == "radix")
    return invalid_argument(
        "--kv-partitions keeps each page one sequence's, so no radix prefix cache runs beside it: use "
        "--prefix-cache-mode chain (a finished turn kept whole in the host tier) or off");
  if (config.kv_partition_buffer_factor < 1 || config.kv_partition_fixed_pages < 0)
    return invalid_argument(
        "--kv-partitions: an elastic buffer's factor must be at least 1 and a fixed buffer's "
        "pages positive (got {} and {})",
        config.kv_partition_buffer_factor, config.kv_partition_fixed_pages);
  return Status::ok();
}

Result<PartitionConfig> engine_partition_config(const EngineConfig& config, MethodRuntime& method,
                                                const KvLayout& layout) {
  PartitionConfig partitions = *method.partition_config();
  method.complete_partition_config(partitions, layout.num_layers);
  // A token filter reads at most one page per kept token per KV head; the method's own tokens, the pages of its
  // chunks.
  if (partitions.token_filters)
    partitions.token_budget = std::max(1, partitions.token_filters->num_kept_tokens) * layout.page_size;
  if (partitions.method_tokens)
    partitions.token_budget =
        std::max(1, partitions.method_tokens->max_prompt_pages(layout.page_size)) * layout.page_size;
  // The two-level ranking is host code over fp32 bounds.
  if (partitions.two_level && layout.dtype != DType::kF32)
    return unimplemented("{}: the two-level ranking (two_level_group) reads fp32 KV pages, not {}", method.name(),
                         dtype_name(layout.dtype));
  partitions.state_bytes_per_page = method.state_bytes_per_page(layout);
  partitions.buffer_factor = config.kv_partition_buffer_factor;
  if (config.kv_partition_fixed_pages > 0) {
    partitions.buffer = PartitionBuffer::kFixed;
    partitions.fixed_buffer_pages = config.kv_partition_fixed_pages;
    // A layer's selection must stay resident while it is attended.
    const int64_t selection = int64_t{layout.num_kv_heads} * std::max(1, partitions.token_budget / layout.page_size);
    if (partitions.fixed_buffer_pages < selection)
      return invalid_argument("--kv-partitions fixed:{} holds fewer pages than one layer's selection ({})",
                              partitions.fixed_buffer_pages, selection);
  }
  return partitions;
}

// The model as sparse methods may see it (method_environment.h): its tokenizer and chat reply suffix.
MethodEnvironment method_environment(const ModelBundle& bundle) {
  MethodEnvironment environment;
  if (bundle.tokenizer) {
    const Tokenizer* tokenizer = &*bundle.tokenizer;  // the bundle outlives the engine and its method
    environment.encode = [tokenizer](std::string_view text) {
      return tokenizer->encode(text, /*add_special=*/false, /*parse_special=*/true);
    };
  }
  environment.chat_suffix = chat_reply_suffix(bundle);
  environment.model = bundle.model.get();
  return environment;
}

Result<std::unique_ptr<Engine>> Engine::create(const ModelBundle& bundle, const EngineConfig& requested) {
  const ModelConfig& model = bundle.model->config();
  EngineConfig config = requested;
  if (config.max_model_len <= 0) config.max_model_len = model.max_position_embeddings;
  if (config.max_model_len > model.max_position_embeddings)
    return invalid_argument("--max-model-len {} exceeds the model's context of {} tokens", config.max_model_len,
                            model.max_position_embeddings);
  if (config.max_num_seqs < 1) return invalid_argument("--max-num-seqs must be at least 1");
  if (config.max_num_batched_tokens < 1) return invalid_argument("--max-num-batched-tokens must be at least 1");
  if (config.page_size < 1 || config.page_size > 1024) return invalid_argument("--page-size must be in [1, 1024]");
  if (config.gpu_memory_utilization <= 0.0 || config.gpu_memory_utilization > 1.0)
    return invalid_argument("--gpu-memory-utilization must be in (0, 1], got {}", config.gpu_memory_utilization);
  if (bundle.model->device() != config.device)
    return invalid_argument("the model was loaded on {} but the engine runs on {}", device_name(bundle.model->device()),
                            device_name(config.device));
  const int num_ranks = bundle.tensor_parallel_size();
  const MethodEnvironment environment = method_environment(bundle);
  SE_ASSIGN_OR_RETURN(std::unique_ptr<MethodRuntime> method,
                      create_method(config.sparse_method, config.sparse_config, environment));
  SE_ASSIGN_OR_RETURN(const KvStoreKind requested_store, parse_kv_cache_dtype(config.kv_cache_dtype));
  SE_RETURN_IF_ERROR(check_method_runs(config.device, requested_store, method->traits(), method->name()));
  if (model.latent_attention())
    SE_RETURN_IF_ERROR(check_latent_attention_runs_on(config.device, method->traits(), method->name()));
  SE_RETURN_IF_ERROR(check_runs_sharded(model, num_ranks, *method, config));
  SE_RETURN_IF_ERROR(check_kv_partitions(config, *method));
  // The workspaces first: the KV pool takes a share of what remains.
  std::vector<ForwardWorkspace> workspaces;
  workspaces.reserve(static_cast<size_t>(num_ranks));
  for (int r = 0; r < num_ranks; ++r) {
    workspaces.push_back(bundle.rank_model(r).make_workspace());
    workspaces.back().reserve(config.max_num_batched_tokens, config.max_num_seqs);
  }

  // A shared latent is kv_lora_rank + qk_rope per token for every head, as one "KV head".
  SE_ASSIGN_OR_RETURN(const KvStoreKind store,
                      model_kv_store(requested_store, model.latent_attention(), method->traits()));
  const bool shared_latent = store == KvStoreKind::kSharedLatent;
  KvLayout layout =
      make_kv_layout(model.num_layers, shared_latent ? 1 : model.num_kv_heads,
                     shared_latent ? model.kv_lora_rank + model.qk_rope_head_dim : model.head_dim, config.page_size,
                     config.device, store, config.kivi_group_size, config.kivi_residual, config.max_num_batched_tokens);
  // A method that keeps low-rank latents keeps them in place of the K/V pages, one stream per head group.
  if (const LowRankKv* low_rank = method->low_rank_kv()) {
    if (store != KvStoreKind::kExplicit)
      return invalid_argument("--kv-cache-dtype {}: {} keeps its own low_rank_latent store (use auto)",
                              kv_store_kind_name(store), method->name());
    layout = low_rank->store_layout(layout);
  }
  SE_RETURN_IF_ERROR(layout.validate());
  const int64_t budget_bytes = kv_budget_bytes(config, num_ranks);
  // On the host tier a sequence's state beside the pool is held as metadata pages instead, as it grows.
  const int64_t page_bytes = static_cast<int64_t>(layout.page_bytes() + method->page_metadata_bytes(layout)) +
                             (config.kv_partitions ? 0 : method->state_bytes_per_page(layout));
  // What the method keeps per running sequence beside the pool comes out of the same budget.
  const KvBudget budget{budget_bytes,
                        page_bytes,
                        method->sequence_device_bytes(layout, int64_t{model.num_heads} * model.head_dim),
                        method->peak_pages(layout, config.max_model_len, 0),
                        config.max_model_len,
                        config.max_num_seqs};
  SE_ASSIGN_OR_RETURN(const KvBudgetSplit split, split_kv_budget(budget, method->name()));
  if (split.max_num_seqs < config.max_num_seqs) {
    SE_LOG_WARN(
        "{} keeps {} bytes per running sequence beside the KV cache's pages: the budget of {} bytes holds that for "
        "{} sequences beside the pages of one --max-model-len request, so that many run at once, not --max-num-seqs "
        "{}; later requests wait",
        method->name(), budget.sequence_bytes, budget_bytes, split.max_num_seqs, config.max_num_seqs);
    config.max_num_seqs = split.max_num_seqs;
  }
  const int64_t num_pages = split.num_pages;
  if (num_pages < layout.num_streams())
    return resource_exhausted("the KV cache budget of {} bytes holds {} pages, fewer than the {} one token needs",
                              budget_bytes, num_pages, layout.num_streams());
  // The partitions keep every token of a sequence in the tier and its index beside it, so a finished turn is kept
  // whole whatever the method (chain, when asked for); a page is one sequence's, so no radix cache.
  if (config.kv_partitions) {
    config.prefix_cache_mode = config.enable_prefix_caching && config.prefix_cache_mode == "chain" ? "chain" : "off";
  } else {
    SE_ASSIGN_OR_RETURN(config.prefix_cache_mode, resolve_prefix_cache_mode(config, *method, layout));
  }
  const int64_t num_host_pages = config.kv_offloading_size / static_cast<int64_t>(layout.page_bytes());
  // Radix blocks that come back from the host tier land under new ids, and the method recomputes its metadata for
  // them (MethodRuntime::on_pages_rewritten); a chain's pages are not told to it (the partitions' index travels
  // with the chain instead).
  if (num_host_pages > 0 && method->page_metadata_bytes(layout) > 0 && config.prefix_cache_mode == "chain" &&
      !config.kv_partitions)
    return unimplemented(
        "{} keeps metadata per device page, which a chain's pages coming back from the host tier lack; run it "
        "without --kv-offloading-size or with --prefix-cache-mode radix",
        method->name());
  CacheSpec spec{layout,
                 static_cast<int32_t>(std::min<int64_t>(num_pages, INT32_MAX)),
                 device_allocator(config.device),
                 config.prefix_cache_mode == "radix",
                 static_cast<int32_t>(std::min<int64_t>(num_host_pages, INT32_MAX)),
                 staging_allocator(config.device)};
  if (config.kv_partitions) {
    SE_ASSIGN_OR_RETURN(spec.partitions, engine_partition_config(config, *method, layout));
    spec.max_num_batched_tokens = config.max_num_batched_tokens;
  }
  SE_LOG_INFO(
      "KV cache on {}: {} pages of {} tokens{}, {}{} ({} tokens per layer and KV head across the pool); "
      "sparse method {} {}; prefix cache {}; host tier {} pages{}",
      device_name(config.device), num_pages, layout.page_size,
      num_ranks > 1 ? fmt::format(" on each of {} tensor-parallel ranks", num_ranks) : std::string(),
      kv_store_kind_name(layout.store),
      layout.store != KvStoreKind::kFp8E4M3 ? ""
      : bundle.kv_cache_scales              ? " with the checkpoint's scales"
                                            : " with scales from the first batch",
      num_pages / layout.num_streams() * layout.page_size, method->name(), method->config().dump(),
      config.prefix_cache_mode, num_host_pages,
      !config.kv_partitions ? ""
      : config.kv_partition_fixed_pages > 0
          ? fmt::format(", running sequences in it (fixed buffer of {} pages)", config.kv_partition_fixed_pages)
          : fmt::format(", running sequences in it (elastic buffer, {}x)", config.kv_partition_buffer_factor));
  std::string fingerprint =
      config.prefix_cache_mode == "chain" ? make_chain_fingerprint(bundle, layout, *method) : std::string();
  // Every rank runs an instance of the method over its KV heads, in a pool of the same pages.
  std::vector<std::unique_ptr<MethodRuntime>> methods;
  methods.reserve(static_cast<size_t>(num_ranks));
  methods.push_back(std::move(method));
  for (int r = 1; r < num_ranks; ++r) {
    // A method that reads the model's weights (low-rank factors of its projections) reads the rank's part.
    MethodEnvironment rank_environment = environment;
    rank_environment.model = &bundle.rank_model(r);
    SE_ASSIGN_OR_RETURN(std::unique_ptr<MethodRuntime> rank_method,
                        create_method(config.sparse_method, config.sparse_config, rank_environment));
    methods.push_back(std::move(rank_method));
  }
  std::vector<std::unique_ptr<EngineRank>> ranks;
  ranks.reserve(static_cast<size_t>(num_ranks));
  for (int r = 0; r < num_ranks; ++r) {
    const Model& rank_model = bundle.rank_model(r);
    std::unique_ptr<MethodRuntime>& rank_method = methods[static_cast<size_t>(r)];
    rank_method->set_communicator(rank_model.communicator());
    CacheSpec rank_spec = spec;
    rank_spec.fp8_scales = checkpoint_fp8_scales(bundle, layout, r);
    SE_ASSIGN_OR_RETURN(std::unique_ptr<CacheManager> cache, rank_method->create_cache(rank_spec));
    ranks.push_back(std::make_unique<EngineRank>(rank_model, std::move(rank_method), std::move(cache),
                                                 std::move(workspaces[static_cast<size_t>(r)]),
                                                 config.device == Device::kCuda && !config.enforce_eager));
  }
  return std::unique_ptr<Engine>(
      new Engine(std::make_unique<EngineLoop>(bundle, config, std::move(ranks), std::move(fingerprint))));
}

Engine::Engine(std::unique_ptr<EngineLoop> loop) : loop_(std::move(loop)) {}
Engine::~Engine() = default;

Result<std::shared_ptr<OutputStream>> Engine::submit(GenerationRequest request) {
  return loop_->submit(std::move(request));
}

Result<std::vector<std::shared_ptr<OutputStream>>> Engine::submit_batch(std::vector<GenerationRequest> batch) {
  return loop_->submit_batch(std::move(batch));
}
void Engine::abort(const std::string& request_id) { loop_->abort(request_id); }
void Engine::shutdown(bool drain) { loop_->shutdown(drain); }
EngineStats Engine::stats() const { return loop_->stats(); }
std::optional<ChainInfo> Engine::find_chain(const std::string& chain_id) const {
  return loop_->chains() ? loop_->chains()->find(chain_id) : std::nullopt;
}
std::vector<int32_t> Engine::chain_prefix(const std::string& chain_id) const {
  return loop_->chains() ? loop_->chains()->prefix(chain_id) : std::vector<int32_t>();
}
const std::string& Engine::chain_fingerprint() const { return loop_->chain_fingerprint(); }
Result<std::string> Engine::submit_prune(PruneRequest request) { return loop_->submit_prune(std::move(request)); }
std::optional<PruneStatus> Engine::prune_status(const std::string& prune_id) const {
  return loop_->prune_status(prune_id);
}
Result<PrefixCacheInspection> Engine::inspect_prefix(std::vector<int32_t> tokens, bool as_prompt) {
  return loop_->inspect_prefix(std::move(tokens), as_prompt);
}
const ModelBundle& Engine::bundle() const { return loop_->bundle(); }
const EngineConfig& Engine::config() const { return loop_->config(); }

}  // namespace se
