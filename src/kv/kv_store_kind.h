// KvStoreKind: what the paged cache's pages hold, chosen when the cache is created (vLLM's --kv-cache-dtype).
// kExplicit keeps K/V in the backend's element type (fp32 on the CPU, bf16 on CUDA); kFp8E4M3 keeps one e4m3
// code per element in the same page layout, read back through per-(layer, KV head) scales (attention_view.h,
// kQuantized / kFp8E4M3). kKivi2 and kKivi4 keep KIVI's 2- or 4-bit group codes in pages of one key group each,
// beside a full-precision residual window in the backend's element type (attention_view.h, kKivi; the geometry
// is KvLayout's). The four TurboQuant kinds are vLLM's turboquant_* presets: each token of a stream is one slot
// of a rotated, Lloyd-Max-coded key (or an e4m3 key) and a uniformly quantized value (attention_view.h,
// kTurboQuant; backend/quant/turboquant_kv.h). kTurboQuantProd25 and kTurboQuantProd35 are the paper's store at 2.5
// and 3.5 effective bits: half of each stream's channels as outliers at one bit more, keys with a 1-bit QJL
// residual (backend/quant/turboquant_prod_kv.h, kv/turboquant_channel_table.h). kSharedLatent keeps a multi-head latent
// attention (MLA) model's one latent row per token for all heads, in the backend's element type, with no V half
// (attention_view.h, kSharedLatent); the engine picks it for a latent-attention model whose method runs over it, never
// --kv-cache-dtype. kLowRankLatent keeps low-rank KV latents: one row per token for each (layer, head group), the
// group's key latent then its value latent, in the backend's element type (attention_view.h, kLowRankLatent); the
// engine picks it for a method that projects K/V to latents (MethodRuntime::low_rank_kv). The store fixes the pages'
// element type and so their bytes, which the pool sizing, the MemoryOracle and `bench decode`'s roofline read through
// KvLayout. Plain data; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/status.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace se {

struct TurboQuantKvFormat;  // backend/quant/turboquant_kv.h

enum class KvStoreKind : uint8_t {
  kExplicit,
  kFp8E4M3,
  kKivi2,
  kKivi4,
  kTurboQuantK8V4,
  kTurboQuant4BitNc,
  kTurboQuantK3V4Nc,
  kTurboQuant3BitNc,
  kTurboQuantProd25,
  kTurboQuantProd35,
  kSharedLatent,
  kLowRankLatent,
};
// The stores --kv-cache-dtype names.
inline constexpr KvStoreKind kKvStoreKinds[] = {KvStoreKind::kExplicit,
                                                KvStoreKind::kFp8E4M3,
                                                KvStoreKind::kKivi2,
                                                KvStoreKind::kKivi4,
                                                KvStoreKind::kTurboQuantK8V4,
                                                KvStoreKind::kTurboQuant4BitNc,
                                                KvStoreKind::kTurboQuantK3V4Nc,
                                                KvStoreKind::kTurboQuant3BitNc,
                                                KvStoreKind::kTurboQuantProd25,
                                                KvStoreKind::kTurboQuantProd35};

// The --kv-cache-dtype values: "auto" (the explicit store, the model's KV dtype on the backend), "fp8" and
// "fp8_e4m3" (the same store, as vLLM accepts both), "kivi2", "kivi4" and vLLM's TurboQuant presets
// "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", and the paper's
// "turboquant_2.5" and "turboquant_3.5". Anything else is kInvalidArgument listing them.
Result<KvStoreKind> parse_kv_cache_dtype(std::string_view text);
// The canonical name: "auto", "fp8_e4m3", "kivi2", "kivi4", the TurboQuant preset's, "shared_latent" or
// "low_rank_latent".
std::string_view kv_store_kind_name(KvStoreKind store);

// KIVI's bits per code for kKivi2 / kKivi4, 0 for the other stores.
int32_t kivi_bits(KvStoreKind store);

// True for the TurboQuant presets and the paper's stores.
bool is_turboquant(KvStoreKind store);
// A TurboQuant preset's key and value bits and norm correction, as vLLM's TQ_PRESETS give them (key_bits 8: e4m3
// keys); the paper's stores: outlier_split at b = 2 or 3. Only for is_turboquant(store).
TurboQuantKvFormat turboquant_format(KvStoreKind store);

// The element type of the store's explicit rows on `device`: the backend's float type for the explicit store, the
// shared and low-rank latents and KIVI's residual window (what their attention reads: fp32 on the CPU, bf16 on CUDA),
// bytes (kU8) for FP8 codes and TurboQuant slots.
DType kv_page_dtype(Device device, KvStoreKind store = KvStoreKind::kExplicit);

}  // namespace se
