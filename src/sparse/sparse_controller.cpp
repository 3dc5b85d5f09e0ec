#include "sparse/sparse_controller.h"

#include <algorithm>
#include <chrono>

#include "backend/device_memory.h"

#include "sparse/low_rank_kv.h"
#include "sparse/step_driver.h"

namespace se {

namespace {

// Tokens of (sequence s, KV head h) of `view` that the sequence's last query row reads.
int64_t tokens_read_by_last_row(const AttentionView& view, int32_t s, int32_t h, int32_t sliding_window) {
  const SeqKvView& sv = view.seqs[s];
  const int32_t stored = sv.num_tokens[h];
  int64_t n = stored;
  if (sv.selected != nullptr) {
    const int32_t* list = sv.selected + static_cast<int64_t>(h) * sv.selected_stride;
    const int32_t count = sv.num_selected[h];
    if (view.selection_unit == SelectionUnit::kToken) {
      n = count;
    } else {
      n = 0;
      const int32_t unit = selection_page_tokens(view);
      for (int32_t i = 0; i < count; ++i) n += std::min(unit, stored - list[i] * unit);
    }
  }
  return sliding_window > 0 ? std::min<int64_t>(n, sliding_window) : n;
}

// Whether `here` holds on every rank of `ranks`; a collective when there are several (host memory, as the CPU
// ranks keep it).
bool on_every_rank(Communicator& ranks, bool here) {
  if (ranks.size() == 1) return here;
  float count = here ? 1.0f : 0.0f;
  ranks.all_reduce_sum(TensorView{&count, DType::kF32, {1}, Device::kCpu});
  return count == static_cast<float>(ranks.size());
}

// Over every sequence and KV head; a sequence with produced lists reports its own count (its lists may be device
// memory).
int64_t tokens_read_by_last_rows(const AttentionView& view, const Selection* selection, int32_t sliding_window) {
  int64_t n = 0;
  for (int32_t s = 0; s < view.num_seqs; ++s) {
    const std::optional<int64_t> produced = selection ? selection->produced_tokens_read(s) : std::nullopt;
    if (produced) {
      n += sliding_window > 0 ? std::min<int64_t>(*produced, int64_t{sliding_window} * view.num_kv_heads) : *produced;
      continue;
    }
    for (int32_t h = 0; h < view.num_kv_heads; ++h) n += tokens_read_by_last_row(view, s, h, sliding_window);
  }
  return n;
}

// Rows [begin, begin + n) of a [T, ...] tensor.
TensorView rows_of(TensorView t, int32_t begin, int32_t n) {
  int64_t row_elements = 1;
  for (int d = 1; d < t.shape.rank(); ++d) row_elements *= t.shape[d];
  TensorView rows = t;
  rows.data = t.ptr<char>() + begin * row_elements * static_cast<int64_t>(dtype_size(t.dtype));
  rows.shape[0] = n;
  return rows;
}

}  // namespace

void SparseController::prepare_step(const ForwardBatch& batch) {
  StepContext ctx{batch, cache_, {}, layer_windows_};
  method_.prepare_step(ctx);
}

void SparseController::finish_step(const ForwardBatch& batch) {
  StepContext ctx{batch, cache_, {}, layer_windows_};
  if (pass_forward_) {
    ctx.run_transient_pass = [this](int32_t seq, std::span<const int32_t> token_ids) {
      return run_transient_pass(seq, token_ids);
    };
  }
  const int64_t free_before = cache_.num_free_pages();
  peak_held_pages_ = std::max(peak_held_pages_, cache_.num_used_pages());
  const auto start = std::chrono::steady_clock::now();
  method_.finish_step(ctx);
  const int64_t freed = cache_.num_free_pages() - free_before;
  if (freed > 0) {
    if (device_ != Device::kCpu) synchronize(device_);
    ++num_compression_steps_;
    num_compression_freed_pages_ += freed;
  }
  compression_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Status SparseController::run_transient_pass(int32_t seq, std::span<const int32_t> token_ids) {
  if (!pass_forward_) return failed_precondition("transient pass: no model forward is attached to the controller");
  if (in_pass_) return failed_precondition("transient pass: sequence {} is inside a pass already", seq);
  const auto num_tokens = static_cast<int32_t>(token_ids.size());
  if (num_tokens == 0) return Status::ok();
  const int32_t num_before = cache_.num_logical_tokens(seq);
  Status reserved = cache_.reserve(seq, num_tokens);
  if (!on_every_rank(method_.communicator(), reserved.is_ok())) {
    if (!reserved.is_ok()) return reserved;
    SE_RETURN_IF_ERROR(cache_.truncate(seq, num_before));
    return resource_exhausted(
        "transient pass: another tensor-parallel rank has no room for the {} tokens of sequence {}", num_tokens, seq);
  }
  // Inside its step's finish_step: the batch is built as every step's is, and only the forward runs.
  clear_batch(pass_batch_);
  append_sequence(pass_batch_, seq, token_ids, num_before, /*num_prefill_tokens=*/0, /*logit_row=*/false);
  in_pass_ = true;
  pass_forward_(pass_batch_);
  in_pass_ = false;
  num_transient_pass_tokens_ += num_tokens;
  return cache_.truncate(seq, num_before);
}

void SparseController::begin_forward(const ForwardBatch& batch) {
  if (device_views_) device_views_->upload(cache_, batch);
  // Once per forward, not per layer: every layer's one-sequence batches share the forward's rows.
  if (tiered_ != nullptr && tiered_->partition_config().method_tokens.has_value()) {
    one_sequence_.token_ids = batch.token_ids;
    one_sequence_.positions = batch.positions;
  }
}

void SparseController::attend(int layer, const LayerConfig& layer_config, const ForwardBatch& batch, TensorView q,
                              TensorView k, TensorView v, TensorView out, const AttentionParams& params) {
  if (tiered_ != nullptr) {
    attend_partitioned(layer, layer_config, batch, q, k, v, out, params);
    return;
  }
  const AttentionView dense = cache_.build_view(layer, batch);
  const AttentionView dense_device = device_views_ ? device_views_->device_view(layer, dense) : dense;
  cache_.write(layer, dense_device, k, v);
  LayerContext ctx{layer, layer_config, batch, q, k, v, out, dense, dense_device, params, cache_};
  const AttentionView attended = select(ctx);
  paged_attention(out, q, device_views_ ? device_views_->device_view(layer, attended) : attended, params);
  method_.on_attention_end(ctx);
}

void SparseController::select_method_tokens(int layer, const LayerConfig& layer_config, TensorView q, TensorView k,
                                            TensorView v, TensorView out, const AttentionParams& params) {
  const AttentionView view = cache_.build_view(layer, one_sequence_);
  LayerContext ctx{layer, layer_config, one_sequence_, q, k, v, out, view, view, params, cache_};
  selection_.reset(1, view.num_kv_heads, SelectionUnit::kToken);
  method_.build_layer_selection(ctx, selection_);
  head_tokens_.clear();
  if (selection_.empty()) return;
  for (int32_t h = 0; h < view.num_kv_heads; ++h) head_tokens_.push_back(selection_.get(0, h).value());
}

void SparseController::attend_partitioned(int layer, const LayerConfig& layer_config, const ForwardBatch& batch,
                                          TensorView q, TensorView k, TensorView v, TensorView out,
                                          const AttentionParams& params) {
  const bool method_tokens = tiered_->partition_config().method_tokens.has_value();
  SE_CHECK(!method_tokens || one_sequence_.num_tokens() == batch.num_tokens(),
           "layer {}: a forward of {} tokens over the host tier did not begin with begin_forward", layer,
           batch.num_tokens());
  for (const SequenceSlice& slice : batch.sequences) {
    // A decode step computes one token; anything longer reads densely, as a prefill chunk does.
    const PartitionStep step =
        slice.is_decode(batch.positions) && slice.num_tokens == 1 ? PartitionStep::kDecode : PartitionStep::kPrefill;
    head_tokens_.clear();
    if (method_tokens) {
      one_sequence_.sequences.assign(1, slice);
      // The selection reads the step's query and the method's own state, not the pages (some are on the host).
      if (step == PartitionStep::kDecode) select_method_tokens(layer, layer_config, q, k, v, out, params);
    }
    // NOTE: reserve opened the step and checked that the device holds the sequence's working set beside every
    // sequence's metadata, and that one layer's selection stays free across the pools, so attending cannot run
    // short of room.
    const int64_t num_read = tiered_->step_counts(slice.seq).num_read_tokens;
    const Status attended = tiered_->attend(
        slice.seq, layer, rows_of(q, slice.token_begin, slice.num_tokens),
        rows_of(k, slice.token_begin, slice.num_tokens), rows_of(v, slice.token_begin, slice.num_tokens),
        rows_of(out, slice.token_begin, slice.num_tokens), params, step, head_tokens_);
    SE_CHECK(attended.is_ok(), "layer {} of sequence {} over the host tier: {}", layer, slice.seq,
             attended.to_string());
    num_attended_kv_tokens_ += tiered_->step_counts(slice.seq).num_read_tokens - num_read;
    // A prefill chunk just read the layer whole: every page of it is resident until the next sequence attends.
    if (method_tokens && step == PartitionStep::kPrefill) {
      const AttentionView view = cache_.build_view(layer, one_sequence_);
      LayerContext ctx{layer, layer_config, one_sequence_, q, k, v, out, view, view, params, cache_};
      method_.on_attention_end(ctx);
    }
  }
}

void SparseController::attend_latent(int layer, const LayerConfig& layer_config, const ForwardBatch& batch,
                                     TensorView q_latent, TensorView latent, TensorView kv_b, TensorView out,
                                     const AttentionParams& params) {
  const AttentionView dense = cache_.build_view(layer, batch);
  const AttentionView dense_device = device_views_ ? device_views_->device_view(layer, dense) : dense;
  write_kv(dense_device, latent, latent);
  LayerContext ctx{layer, layer_config, batch, q_latent, latent, latent, out, dense, dense_device, params, cache_};
  const AttentionView attended = select(ctx);
  paged_latent_attention(out, q_latent, device_views_ ? device_views_->device_view(layer, attended) : attended, kv_b,
                         params);
  method_.on_attention_end(ctx);
}

void SparseController::attend_low_rank(int layer, const LayerConfig& layer_config, const ForwardBatch& batch,
                                       TensorView q, TensorView x, TensorView out, const AttentionParams& params) {
  const LowRankKv* low_rank = method_.low_rank_kv();
  SE_CHECK(low_rank != nullptr, "attend_low_rank: method {} keeps no low-rank factors", method_.name());
  const int64_t t = x.shape[0], groups = low_rank->num_groups(), width = low_rank->row_width();
  if (!low_rank_rows_.defined() || low_rank_rows_.numel() < t * groups * width)
    low_rank_rows_ = Tensor::empty(DType::kF32, {t * groups * width});
  const TensorView rows{low_rank_rows_.data<float>(), DType::kF32, {t, groups * width}, Device::kCpu};
  linear(rows, x, low_rank->down(layer));
  const TensorView stored{rows.data, DType::kF32, {t, groups, width}, Device::kCpu};
  AttentionView dense = cache_.build_view(layer, batch);
  dense.latent = low_rank->view(layer);
  write_kv(dense, stored, stored);
  LayerContext ctx{layer, layer_config, batch, q, stored, stored, out, dense, dense, params, cache_};
  paged_low_rank_attention(out, q, select(ctx), layer_config.rope, params);
  method_.on_attention_end(ctx);
}

AttentionView SparseController::select(LayerContext& ctx) {
  const AttentionView& dense = ctx.view;
  const int32_t window = ctx.params.sliding_window;
  selection_.reset(dense.num_seqs, dense.num_kv_heads, method_.traits().selection_unit);
  method_.build_layer_selection(ctx, selection_);
  const AttentionView attended = selection_.apply(dense);
  num_attended_kv_tokens_ += tokens_read_by_last_rows(attended, &selection_, window);
  for (int32_t s = 0; s < dense.num_seqs; ++s)
    if (ctx.batch.sequences[static_cast<size_t>(s)].is_decode(ctx.batch.positions))
      num_method_metadata_bytes_ += method_.decode_reads(ctx.layer, window, dense, s).metadata_bytes;
  const auto layer = static_cast<size_t>(ctx.layer);
  if (layer >= layer_windows_.size()) layer_windows_.resize(layer + 1, 0);
  layer_windows_[layer] = window;
  if (attention_observer_) attention_observer_(ctx, attended);
  return attended;
}

void SparseController::count_replayed_forward(const ForwardBatch& batch) {
  for (size_t layer = 0; layer < layer_windows_.size(); ++layer) {
    const AttentionView view = cache_.build_view(static_cast<int>(layer), batch);
    const int32_t window = layer_windows_[layer];
    for (int32_t s = 0; s < view.num_seqs; ++s) {
      const MethodRuntime::DecodeReads reads = method_.decode_reads(static_cast<int>(layer), window, view, s);
      num_method_metadata_bytes_ += reads.metadata_bytes;
      if (reads.kv_tokens) {
        num_attended_kv_tokens_ += *reads.kv_tokens;
        continue;
      }
      for (int32_t h = 0; h < view.num_kv_heads; ++h)
        num_attended_kv_tokens_ += tokens_read_by_last_row(view, s, h, window);
    }
  }
}

void SparseController::on_layer_end(int layer, const ForwardBatch& batch, TensorView hidden) {
  method_.on_layer_end(layer, batch, hidden);
}

std::unique_ptr<RetainedSequence> SparseController::retain(int32_t seq) {
  std::unique_ptr<MethodSequenceState> method_state = method_.export_sequence_state(seq);
  std::unique_ptr<SequenceSnapshot> kv = cache_.snapshot(seq);
  method_.on_sequence_end(seq);
  return std::make_unique<RetainedSequence>(std::move(kv), std::move(method_state));
}

Result<int32_t> SparseController::resume(int32_t seq, std::unique_ptr<ChainState> state) {
  auto* retained = dynamic_cast<RetainedSequence*>(state.get());
  if (retained == nullptr)
    return invalid_argument("resume: sequence {} was given a state this engine did not retain", seq);
  const int32_t num_tokens = retained->num_logical_tokens();
  SE_RETURN_IF_ERROR(cache_.restore(seq, retained->take_kv()));
  const Status imported = method_.import_sequence_state(seq, retained->take_method_state());
  if (!imported.is_ok()) {
    close(seq);
    return imported;
  }
  return num_tokens;
}

Result<int32_t> SparseController::open(int32_t seq, std::span<const int32_t> prompt) {
  SE_ASSIGN_OR_RETURN(const int32_t num_cached, cache_.open(seq, prompt));
  cache_.visit_retrieved_pages(
      seq, [this](int layer, const AttentionView& view) { method_.on_pages_rewritten(layer, view); });
  return num_cached;
}

void SparseController::close(int32_t seq) {
  method_.on_sequence_end(seq);
  cache_.close(seq);
}

}  // namespace se
