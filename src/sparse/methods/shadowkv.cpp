#include "sparse/methods/shadowkv.h"

#include <algorithm>

#include "base/check.h"
#include "sparse/method_config.h"

namespace se {

struct ShadowKvMethod::State final : MethodSequenceState {
  SequenceSketch layers;
};

Result<std::unique_ptr<MethodRuntime>> ShadowKvMethod::create(const nlohmann::json& config) {
  SE_ASSIGN_OR_RETURN(MethodConfig reader, MethodConfig::parse("shadowkv", config));
  ShadowKvParams params;
  // The reference's defaults (ShadowKVCache's constructor and its local_chunk / outlier_chunk constants).
  SE_ASSIGN_OR_RETURN(params.sparse_budget, reader.get_int("sparse_budget", 2048, 1, 1 << 30));
  SE_ASSIGN_OR_RETURN(params.chunk_size, reader.get_int("chunk_size", 8, 1, 1 << 16));
  SE_ASSIGN_OR_RETURN(params.rank, reader.get_int("rank", 160, 1, 1 << 16));
  SE_ASSIGN_OR_RETURN(params.local_chunks, reader.get_int("local_chunks", 4, 0, 1 << 20));
  SE_ASSIGN_OR_RETURN(params.outlier_chunks, reader.get_int("outlier_chunks", 48, 0, 1 << 20));
  // The reference sketches prompts longer than 4096 tokens (its prefill branch); shorter ones stay dense here.
  SE_ASSIGN_OR_RETURN(int min_prompt_tokens, reader.get_int("min_prompt_tokens", 4097, 1, 1 << 30));
  SE_RETURN_IF_ERROR(reader.finish());
  if (params.sparse_budget % params.chunk_size != 0)
    return invalid_argument("shadowkv: 'sparse_budget' = {} is not a whole number of chunks of 'chunk_size' = {}",
                            params.sparse_budget, params.chunk_size);
  return std::unique_ptr<MethodRuntime>(new ShadowKvMethod(reader.resolved(), params, min_prompt_tokens));
}

ShadowKvMethod::ShadowKvMethod(nlohmann::ordered_json config, ShadowKvParams params, int32_t min_prompt_tokens)
    : MethodRuntime("shadowkv", std::move(config)), params_(params), min_prompt_tokens_(min_prompt_tokens) {
  traits_.family = MethodFamily::kDynamicSelection;
  // The sketched chunks' keys are rewritten in the sequence's pages, which no other sequence may then share.
  traits_.keeps_full_history = false;
  traits_.ops = {OpId::kGatherKeys, OpId::kPagedAttentionOverSelection};
  // The sketch is built and the keys rebuilt from host tensors (the step's queries, the pages).
  traits_.host_hooks = true;
  traits_.static_decode_forward = false;  // the chunks are chosen on the host every step
  traits_.prefix_mode = PrefixMode::kChain;
  traits_.prefill_policy = PrefillPolicy::kCompressAfter;
  // The low-rank factors span the layer's every KV head: each rank sketches every rank's keys, gathered
  // (sketch_layer), and keeps its heads' part; landmarks, outliers and the chunks a step reads are per KV head.
  traits_.tensor_parallel = true;
}

std::vector<float> ShadowKvMethod::heads_of_every_rank(const std::vector<float>& mine, int32_t num_rows) const {
  Communicator& ranks = communicator();
  if (ranks.size() == 1) return mine;
  const auto size = static_cast<int64_t>(ranks.size()), n = static_cast<int64_t>(mine.size());
  std::vector<float> gathered(static_cast<size_t>(size * n));
  ranks.all_gather(TensorView{gathered.data(), DType::kF32, {size * n}, Device::kCpu},
                   TensorView{const_cast<float*>(mine.data()), DType::kF32, {n}, Device::kCpu});
  // [rank][row][its heads] -> [row][rank][its heads]: rank r holds the layer's KV heads r * Hkv_r onwards.
  const int64_t width = n / num_rows;
  std::vector<float> rows(gathered.size());
  for (int64_t r = 0; r < size; ++r)
    for (int64_t t = 0; t < num_rows; ++t)
      std::copy_n(gathered.data() + r * n + t * width, width, rows.data() + (t * size + r) * width);
  return rows;
}

void ShadowKvMethod::on_attention_end(LayerContext& ctx) {
  if (ctx.params.sliding_window > 0) return;
  for (int32_t slice = 0; slice < static_cast<int32_t>(ctx.batch.sequences.size()); ++slice) {
    const SequenceSlice& s = ctx.batch.sequences[static_cast<size_t>(slice)];
    if (!s.completes_prefill(ctx.batch.positions)) continue;
    const int32_t n = ctx.view.seqs[slice].num_tokens[0];
    if (n < min_prompt_tokens_ || !shadowkv_can_sketch(n, params_)) continue;
    SequenceSketch& layers = sketches_[s.seq];
    layers.resize(static_cast<size_t>(ctx.cache.layout().num_layers));
    // A resumed chain keeps the sketch of its first prompt: the keys it rewrote are not the model's to sketch.
    if (!layers[static_cast<size_t>(ctx.layer)]) sketch_layer(ctx, slice, n, layers);
  }
}

void ShadowKvMethod::sketch_layer(LayerContext& ctx, int32_t slice, int32_t n, SequenceSketch& layers) {
  const AttentionView& view = ctx.view;
  SE_CHECK(view.kv_device == Device::kCpu && view.kv_dtype == DType::kF32,
           "shadowkv: rewrites keys in a host f32 pool (CPU backend only)");
  const int32_t seq = ctx.batch.sequences[static_cast<size_t>(slice)].seq;
  const int32_t kv_heads = view.num_kv_heads, d = view.head_dim;
  for (int32_t h = 0; h < kv_heads; ++h) {
    // Every stream of a sequence that never evicts holds its positions in slot order.
    const std::span<const int32_t> at = ctx.cache.slot_positions(seq, ctx.layer, h);
    SE_CHECK(static_cast<int32_t>(at.size()) == n && (n == 0 || at.back() == n - 1),
             "shadowkv: stream ({}, {}) of seq {} is not its positions in order", ctx.layer, h, seq);
  }
  std::vector<float> post(static_cast<size_t>(n) * kv_heads * d);
  gather_keys(TensorView{post.data(), DType::kF32, {n, kv_heads, d}, Device::kCpu}, view, slice, 0);
  // Pre-RoPE keys: rotated back by -position, and YaRN's attention factor (which scales cos and sin) divided out.
  const RopeParams& rope_params = ctx.layer_config.rope;
  std::vector<int32_t> positions(static_cast<size_t>(n));
  for (int32_t t = 0; t < n; ++t) positions[t] = -t;
  std::vector<float> pre = post;
  rope(TensorView{pre.data(), DType::kF32, {n, kv_heads, d}, Device::kCpu},
       TensorView{positions.data(), DType::kI32, {n}, Device::kCpu}, rope_params);
  if (rope_params.attention_factor != 1.0f) {
    const float undo = 1.0f / (rope_params.attention_factor * rope_params.attention_factor);
    for (size_t row = 0; row < pre.size() / d; ++row)
      for (int32_t e = 0; e < rope_params.rotary_dim; ++e) pre[row * d + e] *= undo;
  }
  const int size = communicator().size();
  ShadowKvLayerSketch sketch =
      shadowkv_sketch_heads(shadowkv_sketch(heads_of_every_rank(pre, n).data(), heads_of_every_rank(post, n).data(), n,
                                            kv_heads * size, d, params_),
                            communicator().rank() * kv_heads, kv_heads);

  // Rewrite the landmark chunks' keys with their rebuild: what the reference rebuilds at every step, once.
  const SeqKvView& sv = view.seqs[slice];
  const int32_t cs = sketch.chunk_size;
  for (int32_t h = 0; h < kv_heads; ++h) {
    const std::vector<int32_t>& chunks = sketch.landmark_chunks[h];
    std::vector<float> rebuilt(chunks.size() * cs * d);
    shadowkv_rebuild_keys(sketch, h, chunks, rebuilt.data());
    std::vector<int32_t> rows_at;
    rows_at.reserve(chunks.size() * cs);
    for (int32_t c : chunks)
      for (int32_t j = 0; j < cs; ++j) rows_at.push_back(c * cs + j);
    const auto rows = static_cast<int64_t>(rows_at.size());
    rope(TensorView{rebuilt.data(), DType::kF32, {rows, 1, d}, Device::kCpu},
         TensorView{rows_at.data(), DType::kI32, {rows}, Device::kCpu}, rope_params);
    const int32_t* pages = sv.page_ids + static_cast<int64_t>(h) * sv.stride;
    for (int64_t i = 0; i < rows; ++i) {
      const int32_t t = rows_at[static_cast<size_t>(i)];
      std::copy_n(rebuilt.data() + i * d, d, view.element<float>(pages[t / view.page_size], 0, t % view.page_size));
    }
  }
  // The factors are spent: decode reads the rewritten keys. Swapped out, since `= {}` keeps a vector's capacity.
  std::vector<float>().swap(sketch.u);
  std::vector<float>().swap(sketch.sv);
  layers[static_cast<size_t>(ctx.layer)] = std::move(sketch);
}

void ShadowKvMethod::build_decode_selection(LayerContext& ctx, int32_t slice, Selection& selection) {
  const SequenceSlice& s = ctx.batch.sequences[static_cast<size_t>(slice)];
  const auto it = sketches_.find(s.seq);
  if (it == sketches_.end() || !it->second[static_cast<size_t>(ctx.layer)]) return;
  const ShadowKvLayerSketch& sketch = *it->second[static_cast<size_t>(ctx.layer)];
  SE_CHECK(ctx.q.device == Device::kCpu, "shadowkv: decode queries are scored in host memory (CPU backend only)");
  const TensorView q = ctx.last_query_row(slice);
  const auto scores = shadowkv_chunk_scores(sketch, q.ptr<float>(), 1, static_cast<int32_t>(q.shape[0]));
  const auto chosen = shadowkv_select_chunks(scores, sketch, params_);
  const SeqKvView& sv = ctx.view.seqs[slice];
  std::vector<int32_t> tokens;
  for (int32_t h = 0; h < sketch.num_kv_heads; ++h) {
    tokens.clear();
    for (int32_t c : chosen[h])
      for (int32_t j = 0; j < sketch.chunk_size; ++j) tokens.push_back(c * sketch.chunk_size + j);
    const std::vector<int32_t> exact = shadowkv_exact_positions(sketch, h);
    const auto middle = static_cast<std::ptrdiff_t>(tokens.size());
    tokens.insert(tokens.end(), exact.begin(), exact.end());
    std::inplace_merge(tokens.begin(), tokens.begin() + middle, tokens.end());
    // Every token after the prompt, the step's own included (slots are positions: nothing is evicted).
    for (int32_t t = sketch.num_tokens; t < sv.num_tokens[h]; ++t) tokens.push_back(t);
    selection.set(slice, h, tokens);
  }
}

std::optional<PartitionConfig> ShadowKvMethod::partition_config() const {
  PartitionConfig config;
  // The chosen chunks, the outliers, and the local window: its whole chunks and the remainder of the last.
  config.method_tokens = MethodTokens{
      .chunk_size = params_.chunk_size,
      .max_chunks = params_.sparse_budget / params_.chunk_size + params_.outlier_chunks + params_.local_chunks + 1};
  return config;
}

int64_t ShadowKvMethod::state_bytes_per_page(const KvLayout& layout) const {
  // A stream of n tokens keeps at most n / chunk_size landmarks (outlier chunks keep only their id), so page_size
  // tokens' share of them, rounded up, bounds what each page stands for.
  const int64_t per_chunk = int64_t{layout.head_dim} * static_cast<int64_t>(sizeof(float)) + sizeof(int32_t);
  return (int64_t{layout.page_size} * per_chunk + params_.chunk_size - 1) / params_.chunk_size;
}

std::unique_ptr<MethodSequenceState> ShadowKvMethod::export_sequence_state(int32_t seq) {
  const auto it = sketches_.find(seq);
  if (it == sketches_.end()) return nullptr;
  auto state = std::make_unique<State>();
  state->layers = std::move(it->second);
  sketches_.erase(it);
  return state;
}

Status ShadowKvMethod::import_sequence_state(int32_t seq, std::unique_ptr<MethodSequenceState> state) {
  if (!state) return Status::ok();
  auto* own = dynamic_cast<State*>(state.get());
  if (own == nullptr) return invalid_argument("shadowkv: sequence {} was given another method's state", seq);
  sketches_[seq] = std::move(own->layers);
  return Status::ok();
}

}  // namespace se
