#include "cli/engine_options.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/device_memory.h"
#include "engine/engine.h"
#include "kv/kv_layout.h"
#include "sparse/method_registry.h"

namespace se::cli {

namespace {

// "2GiB", "512MiB", "1.5G", "1000000" -> bytes (K/M/G/T and KiB.. are powers of 1024, KB.. powers of 1000).
bool parse_byte_size(const std::string& text, int64_t& bytes) {
  size_t pos = 0;
  while (pos < text.size() && (std::isdigit(static_cast<unsigned char>(text[pos])) || text[pos] == '.')) ++pos;
  std::string suffix;
  for (char c : text.substr(pos)) suffix += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double value = 0.0;
  try {
    size_t used = 0;
    value = std::stod(text.substr(0, pos), &used);
    if (used != pos) return false;
  } catch (const std::exception&) {
    return false;
  }
  static constexpr std::string_view kUnits = "KMGT";
  double scale = 0.0;
  if (suffix.empty() || suffix == "B") {
    scale = 1.0;
  } else if (const size_t unit = kUnits.find(suffix[0]); unit != std::string_view::npos) {
    const std::string rest = suffix.substr(1);
    const int power = static_cast<int>(unit) + 1;
    if (rest.empty() || rest == "I" || rest == "IB") scale = std::pow(1024.0, power);
    if (rest == "B") scale = std::pow(1000.0, power);
  }
  if (scale == 0.0 || !std::isfinite(value * scale) || value * scale > 9.0e18) return false;
  bytes = static_cast<int64_t>(value * scale);
  return true;
}

}  // namespace

void add_device_option(CLI::App& command, Device& device, bool check_usable) {
  CLI::Option* device_option =
      command
          .add_option_function<std::string>(
              "--device",
              [&device, check_usable](const std::string& text) {
                if (text == "auto") return;  // resolved below
                Result<Device> parsed = parse_device(text);
                if (!parsed.is_ok()) throw CLI::ValidationError("--device", parsed.status().message());
                if (!device_built(*parsed))
                  throw CLI::ValidationError("--device",
                                             "this build has no CUDA backend (configure with -DSE_CUDA=ON)");
                if (*parsed == Device::kCuda && check_usable)
                  if (const Status usable = cuda_device_status(); !usable.is_ok())
                    throw CLI::ValidationError("--device", std::string(usable.message()));
                device = *parsed;
              },
              "where the model and its KV cache live: cpu, cuda, or auto (cuda when a Hopper GPU is visible)")
          ->default_str("auto");
  // Once the command line is read, so that commands which never run never load the GPU driver.
  command.parse_complete_callback([&device, device_option] {
    if (device_option->count() == 0 || device_option->as<std::string>() == "auto") device = default_device();
  });
}

void add_engine_options(CLI::App& command, EngineConfig& config) {
  add_device_option(command, config.device);
  command.add_option("--max-model-len", config.max_model_len, "context length (0 = the model's)")
      ->capture_default_str();
  command.add_option("--max-num-seqs", config.max_num_seqs, "requests running at once at most")
      ->capture_default_str();
  command.add_option("--max-num-batched-tokens", config.max_num_batched_tokens, "tokens per engine step at most")
      ->capture_default_str();
  std::vector<std::string> admission_names;
  admission_names.reserve(kAdmissionNames.size());
  for (const auto& [name, policy] : kAdmissionNames) admission_names.emplace_back(name);
  command
      .add_option_function<std::string>(
          "--admission",
          [&config](const std::string& chosen) {
            for (const auto& [name, policy] : kAdmissionNames)
              if (name == chosen) config.admission = policy;
          },
          "when a waiting request starts: optimistic (as soon as its next chunk fits; one that later runs short "
          "preempts the newest, which recomputes) or peak (only when it and every running request fit at their "
          "peak lengths, prompt plus max_tokens as their method holds them: never preempted for memory)")
      ->check(CLI::IsMember(admission_names))
      ->default_str(std::string(admission_name(config.admission)));
  command.add_option("--page-size", config.page_size, "tokens per KV page")->capture_default_str();
  command
      .add_option("--tensor-parallel-size", config.tensor_parallel_size,
                  "ranks the model is split over (attention and KV heads, MLP width, vocabulary); CPU: one thread "
                  "per rank")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command.add_option_function<std::string>(
      "--kv-cache-memory",
      [&config](const std::string& text) {
        if (!parse_byte_size(text, config.kv_cache_memory) || config.kv_cache_memory <= 0)
          throw CLI::ValidationError("--kv-cache-memory",
                                     "'" + text + "' is not a byte size (e.g. 2GiB, 512MiB, 1000000)");
      },
      "bytes for the KV cache, e.g. 2GiB: its pages and what the sparse method keeps per running sequence "
      "beside them (default: derived from --gpu-memory-utilization; on the CPU at most 2 GiB)");
  command.add_option_function<double>(
      "--kv-offloading-size",
      [&config](double gib) {
        constexpr double kMaxGib = 1 << 20;
        if (!(gib >= 0 && gib <= kMaxGib))
          throw CLI::ValidationError("--kv-offloading-size",
                                     "expects GiB between 0 and 2^20, got " + std::to_string(gib));
        config.kv_offloading_size = static_cast<int64_t>(gib * static_cast<double>(int64_t{1} << 30));
      },
      "GiB of host memory for the host KV tier (vLLM's flag; pinned beside a GPU): idle Chain Cache chains and "
      "radix prefix blocks the pool reclaims move there and come back on a hit (default 0: none)");
  // Its own flag rather than a form of --kv-offloading-size: that one sizes the tier (vLLM's meaning, idle state
  // only), this one changes how the running requests' decode reads their KV, and only some methods can.
  command.add_option_function<std::string>(
      "--kv-partitions",
      [&config](const std::string& text) {
        const size_t colon = text.find(':');
        const std::string mode = text.substr(0, colon);
        int value = 0;
        const bool has_value = colon != std::string::npos;
        if (has_value) {
          try {
            size_t used = 0;
            value = std::stoi(text.substr(colon + 1), &used);
            if (used != text.size() - colon - 1) value = 0;
          } catch (const std::exception&) {
            value = 0;
          }
        }
        if (mode == "elastic" && (!has_value || value >= 1)) {
          config.kv_partitions = true;
          if (has_value) config.kv_partition_buffer_factor = value;
        } else if (mode == "fixed" && value >= 1) {
          config.kv_partitions = true;
          config.kv_partition_fixed_pages = value;
        } else {
          throw CLI::ValidationError(
              "--kv-partitions",
              "expects elastic, elastic:FACTOR or fixed:PAGES (positive integers), got '" + text + "'");
        }
      },
      "Spin's partitions: running requests' KV lives in the host tier (--kv-offloading-size) page by page too, and "
      "the method's decode brings in only the pages it selects, so a request's KV may exceed the device pool "
      "(CPU; `sparse-engine methods` lists the methods that can); a preempted request keeps its KV there, and with "
      "--prefix-cache-mode chain so does a finished turn. elastic keeps FACTOR (default 5) resident pages per "
      "page a step's selections read, "
      "fixed:PAGES "
      "that many per request");
  command.add_option("--gpu-memory-utilization", config.gpu_memory_utilization,
                     "with --device cuda: the fraction of the device memory left after weights and workspace that the "
                     "KV cache takes")
      ->capture_default_str();
  command.add_flag("--enforce-eager", config.enforce_eager, "CUDA: run every step eagerly (no CUDA graphs)");
  command.add_flag("!--no-enable-prefix-caching", config.enable_prefix_caching, "disable prefix reuse (radix and chain)");
  command
      .add_option("--prefix-cache-mode", config.prefix_cache_mode,
                  "prefix reuse: radix (full-history methods), chain (Chain Cache: eviction methods, and any "
                  "method under --kv-partitions), off, or auto (by the method's traits; off under --kv-partitions)")
      ->check(CLI::IsMember({"auto", "radix", "chain", "off"}))
      ->capture_default_str();
  command
      .add_option(
          "--kv-cache-dtype", config.kv_cache_dtype,
          "what the KV pages hold: auto (the backend's dtype), fp8 or fp8_e4m3 (e4m3 codes with "
          "per-layer, per-KV-head scales), kivi2 or kivi4 (KIVI's 2- or 4-bit group codes and a "
          "full-precision residual window), turboquant_k8v4, turboquant_4bit_nc, turboquant_k3v4_nc or "
          "turboquant_3bit_nc (vLLM's TurboQuant presets: rotated Lloyd-Max keys or e4m3 keys, uniform "
          "values, per token), turboquant_2.5 or turboquant_3.5 (the paper's store: outlier channels at one "
          "bit more, QJL-corrected keys); all on the CPU, auto, fp8 and kivi also on CUDA; `sparse-engine methods` "
          "lists the methods each supports")
      ->capture_default_str();
  command
      .add_option("--kivi-group-size", config.kivi_group_size,
                  "KIVI stores: tokens per key group and per quantized page (a multiple of 16 for kivi2, of 8 "
                  "for kivi4); values are grouped per token in min(this, head_dim) channels")
      ->capture_default_str();
  command
      .add_option("--kivi-residual", config.kivi_residual,
                  "KIVI stores: R, the newest tokens per stream kept in full precision (a multiple of "
                  "--kivi-group-size)")
      ->capture_default_str();
  command.add_option("--sparse-method", config.sparse_method, "sparse KV method (`sparse-engine methods` lists them)")
      ->capture_default_str();
  command.add_option_function<std::string>(
      "--sparse-config",
      [&config](const std::string& text) {
        nlohmann::json parsed;
        try {
          parsed = nlohmann::json::parse(text);
        } catch (const nlohmann::json::parse_error& e) {
          // e.what() reads "[json.exception.parse_error.101] parse error at ...": keep what follows the tag.
          const std::string what = e.what();
          const size_t tag_end = what.find("] ");
          const std::string detail = what.substr(tag_end == std::string::npos ? 0 : tag_end + 2);
          throw CLI::ValidationError("--sparse-config", "'" + text + "' is not valid JSON (" + detail + ")");
        }
        if (!parsed.is_object() && !parsed.is_null())
          throw CLI::ValidationError("--sparse-config", "must be a JSON object, got " + parsed.dump());
        config.sparse_config = std::move(parsed);
      },
      "the method's hyperparameters as a JSON object, e.g. '{\"token_budget\": 512}' (defaults: `sparse-engine "
      "methods`)");
}

Status check_sparse_options(const EngineConfig& config) {
  SE_ASSIGN_OR_RETURN(std::unique_ptr<MethodRuntime> method, create_method(config.sparse_method, config.sparse_config));
  SE_ASSIGN_OR_RETURN(const KvStoreKind store, parse_kv_cache_dtype(config.kv_cache_dtype));
  SE_RETURN_IF_ERROR(check_method_runs(config.device, store, method->traits(), method->name()));
  SE_RETURN_IF_ERROR(check_kv_partitions(config, *method));
  if (config.tensor_parallel_size > 1) {
    if (config.device != Device::kCpu)
      return unimplemented("--tensor-parallel-size {} runs on the CPU only for now; use --device cpu",
                           config.tensor_parallel_size);
    SE_RETURN_IF_ERROR(check_tensor_parallel(method->traits(), method->name()));
  }
  if (kivi_bits(store) == 0) return Status::ok();
  // The KIVI geometry as far as it does not depend on the model: a stand-in head of one group's channels
  // (Engine::create checks it again with the model's head_dim).
  return make_kv_layout(1, 1, config.kivi_group_size, config.page_size, config.device, store, config.kivi_group_size,
                        config.kivi_residual, config.max_num_batched_tokens)
      .validate();
}

int report_usage_error(const Status& status) {
  std::fprintf(stderr, "error: %s\n", status.message().c_str());
  return 2;
}

}  // namespace se::cli
