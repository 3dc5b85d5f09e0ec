#include "sparse/methods/decode_compression_method.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "backend/device_memory.h"
#include "backend/ops.h"
#include "backend/step_graph.h"
#include "base/check.h"
#include "sparse/sliding_window_tail.h"

namespace se {

namespace {

// The method's own resolved config, with the prompt-time method's name and resolved config when it composes one.
nlohmann::ordered_json composed_config(nlohmann::ordered_json config, const MethodRuntime* prompt_method) {
  if (prompt_method == nullptr) return config;
  config["prompt_method"] = std::string(prompt_method->name());
  config["prompt_config"] = prompt_method->config();
  return config;
}

}  // namespace

DecodeCompressionMethod::DecodeCompressionMethod(std::string name, nlohmann::ordered_json config,
                                                 int32_t query_capacity, std::unique_ptr<MethodRuntime> prompt_method)
    : MethodRuntime(std::move(name), composed_config(std::move(config), prompt_method.get())),
      prompt_method_(std::move(prompt_method)),
      query_capacity_(query_capacity) {
  traits_.family = MethodFamily::kEviction;
  traits_.keeps_full_history = false;
  // gather_keys reads a region's keys, the subclass's scoring ops score them (each adds its own); compact_kv
  // evicts. (The query rings' scatter_rows_to_bf16 and convert have a kernel on every backend and read no KV page.)
  traits_.ops = {OpId::kGatherKeys, OpId::kCompactKv};
  // A decode forward's scatters of its queries into the rings read where each row goes from a table prepare_step
  // rewrites in place, so a captured forward replays right; compression runs in finish_step, outside the forward.
  traits_.static_decode_forward = true;
  traits_.prefix_mode = PrefixMode::kChain;
  traits_.prefill_policy = PrefillPolicy::kDense;
  // select() chooses each KV head's tokens from that head's keys and its query group's queries, and the clock that
  // triggers a compression reads positions every stream shares (each keeps the same count of the region), so a
  // tensor-parallel rank decides for its heads as one rank would; a prompt method must run split itself.
  traits_.tensor_parallel = true;
  if (prompt_method_) {
    const MethodTraits& prompt = prompt_method_->traits();
    SE_CHECK(prompt.family == MethodFamily::kEviction && prompt.prefix_mode == PrefixMode::kChain,
             "{}: '{}' is not a prompt-time eviction method", this->name(), prompt_method_->name());
    for (const OpId op : prompt.ops)
      if (std::find(traits_.ops.begin(), traits_.ops.end(), op) == traits_.ops.end()) traits_.ops.push_back(op);
    traits_.prefill_policy = prompt.prefill_policy;
    traits_.static_decode_forward = prompt.static_decode_forward;
    traits_.tensor_parallel = prompt.tensor_parallel;
    traits_.host_hooks = prompt.host_hooks;
  }
}

int64_t DecodeCompressionMethod::resident_pages(const KvLayout& layout, int32_t num_prefill_tokens,
                                                int32_t num_tokens) const {
  // The generated tokens resident count as tokens appended after the prompt.
  const int64_t resident = num_tokens <= num_prefill_tokens
                               ? num_tokens
                               : int64_t{num_prefill_tokens} + peak_generated_tokens(num_tokens - num_prefill_tokens);
  if (prompt_method_) return prompt_method_->resident_pages(layout, num_prefill_tokens, static_cast<int32_t>(resident));
  return layout.pages_for_tokens(resident);
}

int32_t DecodeCompressionMethod::transient_extra_tokens(int32_t num_prefill_tokens) const {
  return prompt_method_ ? prompt_method_->transient_extra_tokens(num_prefill_tokens) : 0;
}

int64_t DecodeCompressionMethod::sequence_device_bytes(const KvLayout& layout, int64_t query_row_elements) const {
  const int64_t ring = int64_t{layout.num_layers} * query_capacity_ * query_row_elements *
                       static_cast<int64_t>(dtype_size(DType::kBF16));
  return ring + (prompt_method_ ? prompt_method_->sequence_device_bytes(layout, query_row_elements) : 0);
}

void DecodeCompressionMethod::prepare_step(StepContext& ctx) {
  if (prompt_method_) prompt_method_->prepare_step(ctx);
  step_rows_.clear();
  for (const SequenceSlice& slice : ctx.batch.sequences) {
    if (!slice.is_decode(ctx.batch.positions)) continue;
    RecentQueries& rings = decoding_state(ctx, slice).queries;
    rings.place_rows(slice.token_begin, slice.num_tokens, step_rows_);
    ring_layer_stride_ = rings.layer_stride();  // every ring's: decoding_state gives them all one shape
  }
  num_step_rows_ = static_cast<int64_t>(step_rows_.size());
  if (num_step_rows_ == 0) return;
  const size_t bytes = step_rows_.size() * sizeof(RowDestination);
  if (step_table_.grow(query_device_, bytes)) StepGraph::note_buffers_moved();
  // The copy runs when the stream reaches it, before the forward's scatters; nothing rewrites the staging before
  // the next step.
  std::memcpy(step_table_.host(), step_rows_.data(), bytes);
  step_table_.upload(bytes);
}

DecodeCompressionMethod::SequenceState& DecodeCompressionMethod::decoding_state(const StepContext& ctx,
                                                                                const SequenceSlice& slice) {
  auto it = sequences_.find(slice.seq);
  // A sequence that took more prompt since it last decoded (the next turn of a conversation under the same id)
  // starts its generated part again, as a resumed Chain Cache turn does.
  if (it != sequences_.end() && it->second.prompt_end != slice.num_prefill_tokens) {
    end_sequence(it);
    it = sequences_.end();
  }
  if (it != sequences_.end()) return it->second;
  // The sequence's prefill ran a forward before, which showed the queries' shape.
  SE_CHECK(query_row_elements_ > 0, "{}: seq {} decodes before any forward of this method", name(), slice.seq);
  const Shape ring_shape{ctx.cache.layout().num_layers, query_capacity_, query_row_elements_};
  Tensor rings;
  if (!spare_rings_.empty() && spare_rings_.back().device() == query_device_ &&
      spare_rings_.back().shape() == ring_shape) {
    rings = std::move(spare_rings_.back());
    spare_rings_.pop_back();
  } else {
    rings = empty_on(query_device_, DType::kBF16, ring_shape);
  }
  return sequences_
      .emplace(slice.seq,
               SequenceState{
                   RecentQueries(std::move(rings)), slice.num_prefill_tokens, slice.num_prefill_tokens, 0, {}, {}, {}})
      .first->second;
}

void DecodeCompressionMethod::on_layer_end(int layer, const ForwardBatch& batch, TensorView hidden) {
  if (prompt_method_) prompt_method_->on_layer_end(layer, batch, hidden);
}

void DecodeCompressionMethod::on_pages_rewritten(int layer, const AttentionView& view) {
  if (prompt_method_) prompt_method_->on_pages_rewritten(layer, view);
}

void DecodeCompressionMethod::on_stream_compacted(int32_t seq, int layer, int kv_head, std::span<const int32_t> kept) {
  if (prompt_method_) prompt_method_->on_stream_compacted(seq, layer, kv_head, kept);
}

void DecodeCompressionMethod::set_communicator(Communicator& comm) {
  MethodRuntime::set_communicator(comm);
  if (prompt_method_) prompt_method_->set_communicator(comm);
}

void DecodeCompressionMethod::on_sequence_end(int32_t seq) {
  if (prompt_method_) prompt_method_->on_sequence_end(seq);
  if (auto it = sequences_.find(seq); it != sequences_.end()) end_sequence(it);
}

void DecodeCompressionMethod::end_sequence(std::unordered_map<int32_t, SequenceState>::iterator it) {
  spare_rings_.push_back(std::move(it->second.queries).release());
  sequences_.erase(it);
}

std::unique_ptr<MethodSequenceState> DecodeCompressionMethod::export_sequence_state(int32_t seq) {
  return prompt_method_ ? prompt_method_->export_sequence_state(seq) : nullptr;
}

Status DecodeCompressionMethod::import_sequence_state(int32_t seq, std::unique_ptr<MethodSequenceState> state) {
  if (prompt_method_) return prompt_method_->import_sequence_state(seq, std::move(state));
  return MethodRuntime::import_sequence_state(seq, std::move(state));
}

void DecodeCompressionMethod::on_attention_end(LayerContext& ctx) {
  if (prompt_method_) prompt_method_->on_attention_end(ctx);
  query_row_elements_ = ctx.q.shape[1] * ctx.q.shape[2];
  query_device_ = ctx.q.device;
  if (num_step_rows_ == 0) return;
  SE_CHECK(ctx.q.dtype == DType::kF32, "{}: F32 queries, got {}", name(), dtype_name(ctx.q.dtype));
  // Every decode slice's rows of the layer in one op: a copy per sequence would cost a launch per sequence. Layer
  // l's place is layer 0's plus l strides.
  scatter_rows_to_bf16(ctx.q, TensorView{step_table_.device(), DType::kI64, {num_step_rows_, 2}, query_device_},
                       ctx.layer * ring_layer_stride_);
}

void DecodeCompressionMethod::finish_step(StepContext& ctx) {
  num_step_rows_ = 0;  // the step's forward is over: a transient pass's forwards keep no queries
  // The prompt method compresses the prompts completed this step; decode slices are this method's.
  if (prompt_method_) prompt_method_->finish_step(ctx);
  const KvLayout& layout = ctx.cache.layout();
  int plan_layer = 0;  // a full-attention layer holds every generated token the policy counts
  while (plan_layer + 1 < layout.num_layers && ctx.sliding_window(plan_layer) > 0) ++plan_layer;
  compressions_.clear();
  for (const SequenceSlice& slice : ctx.batch.sequences) {
    if (!slice.is_decode(ctx.batch.positions)) continue;
    auto it = sequences_.find(slice.seq);
    SE_CHECK(it != sequences_.end(), "{}: seq {} decoded without its queries", name(), slice.seq);
    SequenceState& state = it->second;
    Clock clock;
    clock.num_logical = ctx.cache.num_logical_tokens(slice.seq);
    clock.num_decoded = clock.num_logical - slice.num_prefill_tokens;
    const std::span<const int32_t> positions = ctx.cache.slot_positions(slice.seq, plan_layer, 0);
    clock.num_generated_resident = static_cast<int32_t>(
        positions.end() - std::lower_bound(positions.begin(), positions.end(), slice.num_prefill_tokens));
    clock.uncompressed_from = state.uncompressed_from;
    if (const std::optional<Region> region = plan_compression(clock))
      compressions_.push_back(Compression{slice.seq, &state, *region, {}, {}, {}});
  }
  // The compressions' scores are enqueued into one buffer and come to the host in one copy, in batches of about
  // kScoresPerCopy scores: the sequences of a batch reach their thresholds together, and a copy per sequence would
  // wait for the device once per sequence.
  constexpr int64_t kScoresPerCopy = int64_t{1} << 24;
  const std::span<Compression> all(compressions_);
  for (size_t begin = 0, end = 0; begin < all.size(); begin = end) {
    int64_t num_scores_total = 0;
    while (end < all.size() && (end == begin || num_scores_total < kScoresPerCopy))
      place_scores(ctx, all[end++], num_scores_total);
    score_and_evict(ctx, all.subspan(begin, end - begin), num_scores_total);
  }
}

void DecodeCompressionMethod::score_and_evict(StepContext& ctx, std::span<const Compression> compressions,
                                              int64_t num_scores_total) {
  if (num_scores_total > 0) {
    const Device device = compressions.front().state->queries.device();
    const TensorView scores = scratch_view(scores_, device, DType::kF32, {num_scores_total});
    for (const Compression& c : compressions) enqueue_scores(ctx, c, scores);
    host_scores_.resize(static_cast<size_t>(num_scores_total));
    copy(TensorView{host_scores_.data(), DType::kF32, {num_scores_total}, Device::kCpu}, scores);
  }
  for (const Compression& c : compressions) evict_unkept(ctx, c);
}

void DecodeCompressionMethod::place_scores(StepContext& ctx, Compression& c, int64_t& num_scores_total) const {
  const KvLayout& layout = ctx.cache.layout();
  const int num_layers = layout.num_layers;
  const int32_t num_kv_heads = layout.num_kv_heads;
  const Region& region = c.region;
  SE_CHECK(region.first < region.end && region.num_queries > 0, "{}: empty region [{}, {})", name(), region.first,
           region.end);
  c.first_slot.assign(static_cast<size_t>(num_layers), 0);
  c.count.assign(static_cast<size_t>(num_layers), 0);
  c.score_offset.assign(static_cast<size_t>(num_layers), -1);
  for (int layer = 0; layer < num_layers; ++layer) {
    const auto slots_before = [&](int32_t h, int32_t position) {
      const std::span<const int32_t> positions = ctx.cache.slot_positions(c.seq, layer, h);
      return static_cast<int32_t>(std::lower_bound(positions.begin(), positions.end(), position) - positions.begin());
    };
    const int32_t a = slots_before(0, region.first), b = slots_before(0, region.end);
    c.first_slot[static_cast<size_t>(layer)] = a;
    c.count[static_cast<size_t>(layer)] = b - a;
    if (ctx.sliding_window(layer) > 0 || num_kept(b - a) >= b - a) continue;
    // Every KV head keeps the same number of each region, so the region is the same run of slots in all of them.
    for (int32_t h = 1; h < num_kv_heads; ++h)
      SE_CHECK(slots_before(h, region.first) == a && slots_before(h, region.end) == b &&
                   ctx.cache.stream_length(c.seq, layer, h) == ctx.cache.stream_length(c.seq, layer, 0),
               "{}: seq {} layer {}: KV head {} holds the region elsewhere", name(), c.seq, layer, h);
    SE_CHECK(c.state->queries.size() >= region.num_queries, "{}: seq {} holds {} of {} queries", name(), c.seq,
             c.state->queries.size(), region.num_queries);
    c.score_offset[static_cast<size_t>(layer)] = num_scores_total;
    num_scores_total += int64_t{num_kv_heads} * num_scores(b - a);
  }
}

void DecodeCompressionMethod::enqueue_scores(StepContext& ctx, const Compression& c, TensorView scores) {
  const KvLayout& layout = ctx.cache.layout();
  const int32_t num_kv_heads = layout.num_kv_heads, head_dim = layout.head_dim;
  const RecentQueries& queries_of = c.state->queries;
  const auto num_heads = static_cast<int32_t>(queries_of.row_elements() / head_dim);
  const Device device = queries_of.device();
  // One layer after another into the same key and query scratch: the device runs them in order.
  for (int layer = 0; layer < layout.num_layers; ++layer) {
    const int64_t offset = c.score_offset[static_cast<size_t>(layer)];
    if (offset < 0) continue;
    const int32_t n = c.count[static_cast<size_t>(layer)];
    const AttentionView view = ctx.cache.build_sequence_view(c.seq, layer);
    SE_CHECK(view.kv_device == device, "{}: the pool is on {}, the queries on {}", name(), device_name(view.kv_device),
             device_name(device));
    const TensorView keys = scratch_view(keys_, device, DType::kF32, {n, num_kv_heads, head_dim});
    gather_keys(keys, view, 0, c.first_slot[static_cast<size_t>(layer)]);
    const TensorView queries = scratch_view(queries_, device, DType::kF32, {c.region.num_queries, num_heads, head_dim});
    queries_of.newest(layer, c.region.num_queries, queries);
    score(TensorView{scores.ptr<float>() + offset, DType::kF32, {num_kv_heads, num_scores(n)}, device}, queries, keys);
  }
}

void DecodeCompressionMethod::evict_unkept(StepContext& ctx, const Compression& c) {
  const KvLayout& layout = ctx.cache.layout();
  const int num_layers = layout.num_layers;
  const int32_t num_kv_heads = layout.num_kv_heads;
  SequenceState& state = *c.state;
  kept_.resize(static_cast<size_t>(layout.num_streams()));
  state.last_kept.assign(static_cast<size_t>(layout.num_streams()), {});
  state.last_scores.assign(static_cast<size_t>(layout.num_streams()), {});
#pragma omp parallel for schedule(dynamic)
  for (int layer = 0; layer < num_layers; ++layer) {
    const int32_t a = c.first_slot[static_cast<size_t>(layer)], n = c.count[static_cast<size_t>(layer)];
    const int32_t window = ctx.sliding_window(layer);
    const int64_t offset = c.score_offset[static_cast<size_t>(layer)];
    for (int32_t h = 0; h < num_kv_heads; ++h) {
      const int stream = layout.stream(layer, h);
      std::vector<int32_t>& kept = kept_[static_cast<size_t>(stream)];
      const auto len = static_cast<int32_t>(ctx.cache.slot_positions(c.seq, layer, h).size());
      if (window > 0) {
        keep_sliding_window_tail(len, window, len - (n - num_kept(n)), kept);
        continue;
      }
      std::vector<int32_t>& chosen = state.last_kept[static_cast<size_t>(stream)];
      if (offset >= 0) {
        const float* head_scores = host_scores_.data() + offset + int64_t{h} * num_scores(n);
        chosen = select(head_scores, n);
        state.last_scores[static_cast<size_t>(stream)].assign(head_scores, head_scores + num_scores(n));
      } else {
        chosen.resize(static_cast<size_t>(n));  // the whole region stays
        std::iota(chosen.begin(), chosen.end(), 0);
      }
      kept.clear();
      for (int32_t s = 0; s < a; ++s) kept.push_back(s);
      for (const int32_t i : chosen) kept.push_back(a + i);
      for (int32_t s = a + n; s < len; ++s) kept.push_back(s);
    }
  }
  evictions_.clear();
  for (int layer = 0; layer < num_layers; ++layer)
    for (int32_t h = 0; h < num_kv_heads; ++h) {
      const std::vector<int32_t>& kept = kept_[static_cast<size_t>(layout.stream(layer, h))];
      if (static_cast<int32_t>(kept.size()) < ctx.cache.stream_length(c.seq, layer, h))
        evictions_.push_back({layer, h, kept});
    }
  const Status evicted = ctx.cache.evict_streams(c.seq, evictions_);
  SE_CHECK(evicted.is_ok(), "{}: {}", name(), evicted.to_string());
  state.uncompressed_from = c.region.end;
  state.last_region = {c.region.first, c.region.end};
  ++state.num_compressions;
}

nlohmann::json DecodeCompressionMethod::debug_state(int32_t seq) const {
  auto it = sequences_.find(seq);
  if (it == sequences_.end()) return nullptr;
  const SequenceState& state = it->second;
  const size_t num_layers = static_cast<size_t>(state.queries.num_layers());
  // [stream] -> [layer][kv_head]
  const auto by_layer = [&](const auto& per_stream) {
    nlohmann::json out = nlohmann::json::array();
    for (size_t stream = 0; stream < per_stream.size(); ++stream) {
      if (stream % (per_stream.size() / num_layers) == 0) out.push_back(nlohmann::json::array());
      out.back().push_back(per_stream[stream]);
    }
    return out;
  };
  return {{"uncompressed_from", state.uncompressed_from},
          {"compressions", state.num_compressions},
          {"last_region", {state.last_region.first, state.last_region.second}},
          {"last_kept", by_layer(state.last_kept)},
          {"last_scores", by_layer(state.last_scores)}};
}

}  // namespace se
