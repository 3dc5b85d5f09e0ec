// chunkkv: ChunkKV (kvpress `ChunkKVPress` around `SnapKVPress`; no official repo). Keeps whole chunks of
// `chunk_length` consecutive prompt tokens instead of single tokens, the same chunks for every (layer's) KV
// head, so kept context stays contiguous. Engine thread only (the lifecycle is ObservationWindowMethod's).
//
// Selection per layer, for a prompt of T > budget tokens (c = chunk_length, w = window):
//   * chunks are aligned from token 0: chunk i = [i c, min((i + 1) c, T)); the last one may be partial;
//   * the chunks that overlap the window [T - w, T) are always kept (they hold the observation window, and the
//     partial chunk is one of them);
//   * chunk score = the mean over the chunk's tokens of the SnapKV scores summed over the KV heads;
//   * the other chunks (all complete and inside the prefix) are ranked by score (ties: lower chunk first) and the
//     top ones kept, for max(#window chunks, budget / c) kept chunks in all.
// kvpress scores the window max + 1 and runs one top-k over all chunks, keeping max(1, int(n_chunks (1 - r)));
// the window chunks then outrank every prefix chunk in practice, so the two agree except that we never drop a
// window token. The kept count is (chunks - 1) c + (size of the last chunk): at most the budget unless the
// window chunks alone exceed it. Prompts of T <= budget are not compressed.
//
// Config and the reference each default follows:
//   budget 2048      prompt tokens kept per (layer, KV head), the window included; mapped to budget / c chunks
//                    (kvpress uses a compression ratio; 2048 matches the other methods of the family).
//   chunk_length 20  kvpress (the paper's 10 is unverified, METHODS.md).
//   window 64, kernel 5, pooling avgpool, gqa_agg mean, gqa_order pool_then_reduce: kvpress SnapKVPress.
#pragma once

#include "sparse/methods/observation_window_method.h"

namespace se {

class ChunkKvMethod final : public ObservationWindowMethod {
 public:
  static Result<std::unique_ptr<MethodRuntime>> create(const nlohmann::json& config);

  // Prompt tokens (window included) each stream keeps from a prompt of num_prompt_tokens > budget tokens.
  static int32_t num_kept_tokens(int32_t num_prompt_tokens, int32_t budget, int32_t window, int32_t chunk_length);

 private:
  ChunkKvMethod(nlohmann::ordered_json config, const ObservationWindowConfig& window_config, int32_t chunk_length)
      : ObservationWindowMethod("chunkkv", std::move(config), window_config), chunk_length_(chunk_length) {}
  std::vector<std::vector<int32_t>> select_prefix(const WindowScores& scores, int layer,
                                                  int num_layers) const override;
  // The chunks every head keeps, ranked by scores summed over all of `scores`' heads.
  std::vector<std::vector<int32_t>> select_chunks(const WindowScores& scores) const;
  int64_t compressed_pages(const KvLayout& layout, int32_t num_prompt_tokens,
                           int32_t num_decode_tokens) const override;

  int32_t chunk_length_ = 20;
};

}  // namespace se
