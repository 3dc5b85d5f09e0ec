#include "sparse/methods/observation_window_method.h"

#include <algorithm>

#include "backend/device_memory.h"
#include "base/check.h"
#include "sparse/sliding_window_tail.h"

namespace se {

ObservationWindowMethod::ObservationWindowMethod(std::string name, nlohmann::ordered_json config,
                                                 const ObservationWindowConfig& window_config)
    : MethodRuntime(std::move(name), std::move(config)), window_config_(window_config) {
  traits_.family = MethodFamily::kEviction;
  traits_.keeps_full_history = false;
  traits_.ops = {OpId::kAttentionScores, OpId::kCompactKv, OpId::kMoveKvRows};
  traits_.static_decode_forward = true;  // scores come from the prompt; decode steps only attend
  traits_.prefix_mode = PrefixMode::kChain;
  traits_.prefill_policy = PrefillPolicy::kCompressAfter;
  traits_.keys_through_logits = true;  // the scores are the window's softmax over q . k
  // Per-head choices read one rank's heads; those spanning a layer's heads use select_over_every_rank.
  traits_.tensor_parallel = true;
}

int64_t ObservationWindowMethod::resident_pages(const KvLayout& layout, int32_t num_prefill_tokens,
                                                int32_t num_tokens) const {
  if (num_tokens < num_prefill_tokens || num_prefill_tokens <= window_config_.budget)
    return layout.pages_for_tokens(num_tokens);
  return compressed_pages(layout, num_prefill_tokens, num_tokens - num_prefill_tokens);
}

bool ObservationWindowMethod::streams_equal_on_every_rank(bool equal_here, int32_t num_tokens) const {
  Communicator& ranks = communicator();
  if (ranks.size() == 1) return equal_here;
  const float mine[2] = {equal_here ? 1.0f : 0.0f, static_cast<float>(num_tokens)};  // exact below 2^24 tokens
  std::vector<float> all(2 * static_cast<size_t>(ranks.size()));
  ranks.all_gather(TensorView{all.data(), DType::kF32, {ranks.size(), 2}, Device::kCpu},
                   TensorView{const_cast<float*>(mine), DType::kF32, {2}, Device::kCpu});
  for (size_t r = 0; r < all.size(); r += 2)
    if (all[r] != 1.0f || all[r + 1] != mine[1]) return false;
  return true;
}

std::vector<std::vector<int32_t>> ObservationWindowMethod::select_over_every_rank(
    const WindowScores& scores,
    const std::function<std::vector<std::vector<int32_t>>(const WindowScores&)>& select_all) const {
  Communicator& ranks = communicator();
  if (ranks.size() == 1) return select_all(scores);
  // Rank r holds KV heads [r * Hkv_r, (r + 1) * Hkv_r): the gathered rows are the layer's heads in order.
  WindowScores all = scores;
  all.num_kv_heads = scores.num_kv_heads * ranks.size();
  all.values.resize(static_cast<size_t>(all.num_kv_heads) * static_cast<size_t>(scores.num_prefix));
  const auto num_values = static_cast<int64_t>(scores.values.size());
  ranks.all_gather(TensorView{all.values.data(), DType::kF32, {all.num_kv_heads, scores.num_prefix}, Device::kCpu},
                   TensorView{const_cast<float*>(scores.values.data()), DType::kF32, {num_values}, Device::kCpu});
  std::vector<std::vector<int32_t>> kept = select_all(all);
  const auto first = kept.begin() + int64_t{ranks.rank()} * scores.num_kv_heads;
  return {std::make_move_iterator(first), std::make_move_iterator(first + scores.num_kv_heads)};
}

void ObservationWindowMethod::on_attention_end(LayerContext& ctx) {
  const int64_t num_heads = ctx.q.shape[1];
  const int64_t row_size = num_heads * ctx.q.shape[2];  // H * D floats per q row
  const int32_t window = window_config_.window;
  const int num_layers = ctx.cache.layout().num_layers;
  for (int32_t i = 0; i < ctx.view.num_seqs; ++i) {
    const SequenceSlice& slice = ctx.batch.sequences[static_cast<size_t>(i)];
    if (slice.num_prefill_tokens <= window_config_.budget || slice.is_decode(ctx.batch.positions)) continue;
    SequenceState& state = sequences_[slice.seq];
    if (state.window_q.empty()) {
      state.window_q.resize(static_cast<size_t>(num_layers));
      state.kept.resize(static_cast<size_t>(num_layers));
    }
    std::vector<float>& rows = state.window_q[static_cast<size_t>(ctx.layer)];
    const int32_t first_window_position = slice.num_prefill_tokens - window;
    // The slice's rows at window positions are its last ones (positions ascend): copy them, from the device too.
    int32_t first_row = 0;
    while (first_row < slice.num_tokens &&
           ctx.batch.positions[static_cast<size_t>(slice.token_begin + first_row)] < first_window_position)
      ++first_row;
    const size_t num_new = static_cast<size_t>(slice.num_tokens - first_row) * static_cast<size_t>(row_size);
    rows.resize(rows.size() + num_new);
    copy_bytes(ctx.q.device, rows.data() + rows.size() - num_new,
               ctx.q.ptr<float>() + (slice.token_begin + first_row) * row_size, num_new * sizeof(float));
    if (!slice.completes_prefill(ctx.batch.positions)) continue;

    // Every prompt key of this layer is stored now: score the prefix with the window's last `window` rows.
    const SeqKvView& seq_view = ctx.view.seqs[i];
    const int32_t num_tokens = seq_view.num_tokens[0];
    const bool equal_here = std::all_of(seq_view.num_tokens, seq_view.num_tokens + ctx.view.num_kv_heads,
                                        [num_tokens](int32_t n) { return n == num_tokens; });
    if (!streams_equal_on_every_rank(equal_here && ctx.cache.can_evict_streams(slice.seq), num_tokens)) {
      // Streams compressed before this prompt (a resumed chain), or holding tokens the store quantized (a resumed
      // chain over KIVI): left as they are, the new tokens appended.
      std::vector<float>().swap(rows);
      continue;
    }
    const auto num_rows = static_cast<int32_t>(static_cast<int64_t>(rows.size()) / row_size);
    if (num_rows < window || num_tokens <= window_config_.budget) {
      // A resumed turn (Chain Cache) whose new prompt tokens are fewer than the window (the window's older
      // queries ran in an earlier turn and are gone), or whose retained streams plus new tokens fit the budget:
      // it appends without compressing.
      std::vector<float>().swap(rows);
      continue;
    }
    SE_CHECK(num_tokens > window, "{}: seq {} layer {} has {} tokens for a window of {}", name(), slice.seq, ctx.layer,
             num_tokens, window);
    TensorView q{rows.data() + (num_rows - window) * row_size, DType::kF32, {window, num_heads, ctx.q.shape[2]},
                 Device::kCpu};  // [w, H, D]
    if (ctx.q.device != Device::kCpu) {  // the scoring op reads q where the forward runs
      if (!window_q_on_device_.defined() || window_q_on_device_.numel() < q.numel())
        window_q_on_device_ = empty_on(ctx.q.device, DType::kF32, {q.numel()});
      copy_bytes(ctx.q.device, window_q_on_device_.raw(), q.data, q.nbytes());
      q = TensorView{window_q_on_device_.raw(), DType::kF32, q.shape, ctx.q.device};
    }
    probs_.resize(static_cast<size_t>(num_heads * num_tokens));
    const TensorView probs{probs_.data(), DType::kF32, {num_heads, num_tokens}, Device::kCpu};  // [H, T]
    attention_scores(probs, q, ctx.view, i, ctx.params, ScoreReduce::kSum);
    const WindowScores scores = reduce_window_scores(probs_.data(), num_tokens, static_cast<int32_t>(num_heads),
                                                     ctx.view.num_kv_heads, num_tokens, window_config_);
    std::vector<std::vector<int32_t>> kept = select_prefix(scores, ctx.layer, num_layers);
    SE_CHECK(static_cast<int32_t>(kept.size()) == ctx.view.num_kv_heads, "{}: select_prefix heads", name());
    for (std::vector<int32_t>& head : kept) {
      for (int32_t j = num_tokens - window; j < num_tokens; ++j) head.push_back(j);
      // As many tokens, but the newest the layer can still see (sliding_window_tail.h).
      if (ctx.params.sliding_window > 0)
        keep_sliding_window_tail(num_tokens, ctx.params.sliding_window, static_cast<int32_t>(head.size()), head);
    }
    state.kept[static_cast<size_t>(ctx.layer)] = std::move(kept);
    std::vector<float>().swap(rows);
  }
}

void ObservationWindowMethod::finish_step(StepContext& ctx) {
  for (const SequenceSlice& slice : ctx.batch.sequences) {
    if (!slice.completes_prefill(ctx.batch.positions)) continue;
    auto it = sequences_.find(slice.seq);
    if (it == sequences_.end()) continue;
    std::vector<KvStreams::StreamEviction> evictions;
    for (size_t layer = 0; layer < it->second.kept.size(); ++layer) {
      const auto& heads = it->second.kept[layer];
      for (size_t h = 0; h < heads.size(); ++h)
        evictions.push_back({static_cast<int>(layer), static_cast<int>(h), heads[h]});
    }
    const Status s = ctx.cache.evict_streams(slice.seq, evictions);
    SE_CHECK(s.is_ok(), "{}: {}", name(), s.to_string());
    sequences_.erase(it);
  }
}

}  // namespace se
