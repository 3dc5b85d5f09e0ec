// EngineConfig: the serving knobs (vLLM flag names) that size the KV pool and bound each step.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/admission.h"
#include "tensor/tensor.h"

namespace se {

struct EngineConfig {
  Device device = Device::kCpu;      // where the model runs and the KV pool lives (the model must be loaded there)
  // Ranks the model is split over (vLLM's --tensor-parallel-size; the model must be loaded so): each holds its
  // part of the weights and the KV of its heads, in a pool of kv_cache_memory bytes (on the CPU by default the
  // ranks share the default budget).
  int tensor_parallel_size = 1;
  int max_model_len = 0;             // 0 = the model's max_position_embeddings
  int max_num_seqs = 64;             // running requests at most (fewer when the KV budget holds fewer, kv_budget.h)
  int max_num_batched_tokens = 2048; // tokens per step (prefill chunks + decode tokens)
  Admission admission = Admission::kOptimistic;  // when a waiting request may start (scheduler.h)
  int page_size = 16;                // tokens per KV page
  // Bytes for the KV cache: the pool and the method's per-sequence state beside it (kv_budget.h); 0 = derive from
  // gpu_memory_utilization (CUDA) or the host's memory (CPU).
  int64_t kv_cache_memory = 0;
  // Bytes of the host tier (vLLM's --kv-offloading-size, in GiB there): host memory (pinned beside a GPU) holding
  // the KV pages of idle chains and radix blocks the pool reclaims, so they come back instead of being dropped;
  // 0 = none.
  int64_t kv_offloading_size = 0;
  // Spin's partitions (--kv-partitions): running sequences' KV lives in the host tier page by page as well, and a
  // method whose decode can run as the partitions (partition_config) brings in only the pages it selects, so a
  // request's KV may exceed the device pool. Needs kv_offloading_size. The buffer each request keeps resident is
  // elastic, kv_partition_buffer_factor times the pages its step's selections read (Spin's default 5), or fixed at
  // kv_partition_fixed_pages pages when that is above 0.
  bool kv_partitions = false;
  int kv_partition_buffer_factor = 5;
  int kv_partition_fixed_pages = 0;
  double gpu_memory_utilization = 0.9;  // CUDA: the fraction of the device memory still free after the weights and
                                        // the forward's workspace that the KV pool takes
  // CUDA: decode steps of methods whose decode forward is static (method_traits.h) replay a CUDA graph captured
  // per batch size; true runs every step eagerly (vLLM's --enforce-eager).
  bool enforce_eager = false;
  bool enable_prefix_caching = true;
  // Which prefix reuse runs: "auto" (the method's traits: radix for full-history methods, chain for eviction
  // methods), "radix", "chain" or "off". enable_prefix_caching = false means "off".
  std::string prefix_cache_mode = "auto";
  std::string sparse_method = "vanilla";  // a name from the method registry
  nlohmann::json sparse_config;            // the method's hyperparameters (JSON object or null)
  // What the KV pages hold (vLLM's --kv-cache-dtype): "auto" (the backend's K/V dtype), "fp8" or "fp8_e4m3",
  // "kivi2" or "kivi4" (kv/kv_store_kind.h).
  std::string kv_cache_dtype = "auto";
  // The KIVI stores' geometry (KIVI's defaults): tokens per key group (and per quantized page), and R, the
  // full-precision residual window per stream, a multiple of the group. Values are grouped per token in groups of
  // min(kivi_group_size, head_dim) channels.
  int kivi_group_size = 32;
  int kivi_residual = 128;
};

}  // namespace se
