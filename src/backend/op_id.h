// OpId: the name of a backend op (an ops.h function, or one mode of it) as a value, so a sparse method can declare
// the ops its hooks call and the engine can check them against the device before it starts. One table in ops.cpp
// gives each op its printed name and whether the CUDA backend has a kernel for it. Plain data; thread-safe.
#pragma once

#include <cstdint>
#include <string_view>

namespace se {

enum class OpId : uint8_t {
  kEmbedding,
  kRmsNorm,
  kAddRmsNorm,
  kLinear,
  kLinearAdd,
  kRope,
  kGatedActivation,
  kSplitQkvRope,
  kAddInplace,
  kScaleInplace,
  kSoftcapInplace,
  kArgmaxRows,
  kSampleRows,
  kMaskRefusedTokens,
  kTokenLogprobs,
  kAttention,  // the dense CPU reference attention over contiguous K/V
  kWriteKv,
  kPagedAttention,
  kPagedAttentionOverSelection,        // paged_attention reading a per-sequence page or token selection
  kPagedAttentionOverFp8Pages,         // paged_attention over FP8 (e4m3) KV pages
  kPagedAttentionOverKiviPages,        // paged_attention over KIVI-quantized pages and their residual
  kPagedAttentionOverTurboQuantPages,  // paged_attention over TurboQuant slots
  kUpdatePageKeyBounds,
  kPageKeyBoundScores,
  kSelectPagesByKeyBounds,
  kAttentionLogitsMaxOverHeads,
  kTopKeysByLogitsMaxOverHeads,
  kTokenListsWithTail,
  kAttentionScores,
  kCompactKv,
  kMoveKvRows,
  kSubsetAttentionMaxScores,
  kGatherKeys,
  kPagedLatentAttention,   // multi-head latent attention with absorbed weights over a latent store
  kAbsorbLatentQueries,    // the queries of multi-head latent attention taken into latent space
  kRopeLatentHeads,        // multi-head latent attention's projections normed and rotated as attention reads them
  kPagedLowRankAttention,  // attention over low-rank KV latents, keys and values rebuilt as it reads them
  kBidirectionalWindowScores,
  kGroupMaxAttentionImportance,
  kKeyRedundancy,
  kRedundancyAwareScores,
};

// The op's ops.h name ("paged_attention over a selection" for the selection mode).
std::string_view op_name(OpId op);

// True when `op` has a CUDA kernel in this build; the engine refuses, at startup, methods that call an op without
// one.
bool cuda_implements(OpId op);

}  // namespace se
