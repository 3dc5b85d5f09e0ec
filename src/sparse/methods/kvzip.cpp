#include "sparse/methods/kvzip.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>

#include "base/check.h"
#include "sparse/sliding_window_tail.h"
#include "base/logging.h"

namespace se {

namespace {

constexpr const char* kFirstInstruction = "\n\nRepeat the previous context exactly.";
constexpr const char* kNextInstruction = "\n\nRepeat the part of the previous context exactly, starting with ";
constexpr int32_t kNumCarriedTokens = 8;  // the previous chunk's tail that opens a later chunk's repeat input

// The most pages `num_streams` streams can hold when each holds `base` tokens plus x_s <= `cap` more, with
// sum x_s <= `total`. A stream's next page costs `first` tokens (the rest of its partial last page and one
// more), every later page `page_size` >= first; taking the cheapest pages first is therefore optimal.
int64_t most_pages(int64_t num_streams, int64_t base, int64_t cap, int64_t total, int64_t page_size) {
  int64_t pages = num_streams * ((base + page_size - 1) / page_size);
  const int64_t first = (page_size - base % page_size) % page_size + 1;
  if (cap < first) return pages;
  const int64_t num_first = std::min(num_streams, total / first);
  const int64_t later_per_stream = (cap - first) / page_size;
  return pages + num_first + std::min(num_first * later_per_stream, (total - num_first * first) / page_size);
}

}  // namespace

Result<std::unique_ptr<MethodRuntime>> KvzipMethod::create(const nlohmann::json& config,
                                                           const MethodEnvironment& environment) {
  SE_ASSIGN_OR_RETURN(std::unique_ptr<KvzipMethod> method, make(config, environment));
  return std::unique_ptr<MethodRuntime>(std::move(method));
}

Result<std::unique_ptr<KvzipMethod>> KvzipMethod::make(const nlohmann::json& config,
                                                       const MethodEnvironment& environment) {
  SE_ASSIGN_OR_RETURN(MethodConfig reader, MethodConfig::parse("kvzip", config));
  SE_ASSIGN_OR_RETURN(double ratio, reader.get_double("ratio", 0.3, 0.0, 1.0));
  SE_ASSIGN_OR_RETURN(int chunk_size, reader.get_int("chunk_size", 2048, 1, 1 << 20));
  SE_ASSIGN_OR_RETURN(int num_sink, reader.get_int("n_sink", 4, 0, 1 << 20));
  SE_ASSIGN_OR_RETURN(std::string level, reader.get_choice("level", "pair", {"pair", "pair-uniform"}));
  SE_RETURN_IF_ERROR(reader.finish());
  return std::unique_ptr<KvzipMethod>(
      new KvzipMethod(reader.resolved(), ratio, chunk_size, num_sink, level == "pair-uniform", environment));
}

KvzipMethod::KvzipMethod(nlohmann::ordered_json config, double ratio, int32_t chunk_size, int32_t num_sink,
                         bool uniform, const MethodEnvironment& environment)
    : MethodRuntime("kvzip", std::move(config)),
      ratio_(ratio),
      chunk_size_(chunk_size),
      num_sink_(num_sink),
      uniform_(uniform) {
  traits_.family = MethodFamily::kEviction;
  traits_.keeps_full_history = false;
  traits_.ops = {OpId::kSubsetAttentionMaxScores, OpId::kCompactKv, OpId::kMoveKvRows};
  traits_.static_decode_forward = true;  // scores come from the reconstruction passes; decode steps only attend
  traits_.prefix_mode = PrefixMode::kChain;
  traits_.prefill_policy = PrefillPolicy::kCompressAfter;
  // Each rank rates its own KV heads in the passes every rank runs alike, and the one threshold is taken over every
  // rank's scores (select), so each keeps what one rank keeps of its heads.
  traits_.tensor_parallel = true;
  if (environment.encode) {
    has_tokenizer_ = true;
    first_instruction_ids_ = environment.encode(kFirstInstruction);
    next_instruction_ids_ = environment.encode(kNextInstruction);
    suffix_ids_ = environment.encode(environment.chat_suffix);
  }
}

int32_t KvzipMethod::transient_extra_tokens(int32_t num_prefill_tokens) const {
  const int32_t num_context = num_prefill_tokens - num_sink_;
  if (ratio_ >= 1.0 || num_context <= 0) return 0;
  const auto suffix = static_cast<int32_t>(suffix_ids_.size());
  int32_t longest = static_cast<int32_t>(first_instruction_ids_.size()) + suffix + std::min(chunk_size_, num_context);
  if (num_context > chunk_size_)
    longest = std::max(longest, static_cast<int32_t>(next_instruction_ids_.size()) +
                                    std::min(kNumCarriedTokens, chunk_size_) + suffix + chunk_size_);
  return longest;
}

int64_t KvzipMethod::resident_pages(const KvLayout& layout, int32_t num_prefill_tokens, int32_t num_tokens) const {
  const int64_t num_context = int64_t{num_prefill_tokens} - num_sink_;
  if (num_tokens < num_prefill_tokens || ratio_ >= 1.0 || num_context <= 0) return layout.pages_for_tokens(num_tokens);
  const int64_t num_streams = layout.num_streams();
  const int64_t base = int64_t{num_sink_} + (num_tokens - num_prefill_tokens);  // sinks + decode tokens
  if (uniform_) {
    const auto kept = static_cast<int64_t>(static_cast<double>(num_context) * ratio_);
    return num_streams * layout.pages_per_stream(base + kept);
  }
  // The threshold is over every rank's streams, whose kept pairs may all fall in this rank's.
  const int64_t num_all_streams = num_streams * communicator().size();
  const auto num_pairs = static_cast<int64_t>(static_cast<double>(num_all_streams * num_context) * ratio_);
  return most_pages(num_streams, base, num_context, std::max<int64_t>(num_pairs - 1, 0), layout.page_size);
}

void KvzipMethod::prepare_step(StepContext& ctx) {
  for (const SequenceSlice& slice : ctx.batch.sequences) {
    if (slice.is_decode(ctx.batch.positions)) {
      sequences_.erase(slice.seq);  // the scores of its compression were for debug_state only
      continue;
    }
    if (ratio_ >= 1.0 || slice.num_prefill_tokens <= num_sink_) continue;
    std::vector<int32_t>& ids = sequences_[slice.seq].token_ids;
    const auto first = static_cast<size_t>(ctx.batch.positions[static_cast<size_t>(slice.token_begin)]);
    if (ids.size() < first) continue;  // earlier tokens never passed by: compress() will decline
    ids.resize(first);
    const auto* begin = ctx.batch.token_ids.data() + slice.token_begin;
    ids.insert(ids.end(), begin, begin + slice.num_tokens);
  }
}

void KvzipMethod::on_attention_end(LayerContext& ctx) {
  if (active_.state == nullptr) return;
  for (int32_t i = 0; i < ctx.view.num_seqs; ++i) {
    const SequenceSlice& slice = ctx.batch.sequences[static_cast<size_t>(i)];
    if (slice.seq != active_.seq) continue;
    ++active_.num_scored_layers;
    // A sliding-window layer is not rated: select() keeps what its later queries can see.
    active_.state->windows[static_cast<size_t>(ctx.layer)] = ctx.params.sliding_window;
    if (ctx.params.sliding_window > 0) continue;
    const int64_t num_heads = ctx.q.shape[1], head_dim = ctx.q.shape[2];
    const TensorView q{ctx.q.ptr<float>() + slice.token_begin * num_heads * head_dim, DType::kF32,
                       {slice.num_tokens, num_heads, head_dim}, ctx.q.device};  // [n, H, D] repeat rows
    const int32_t num_kv_heads = ctx.view.num_kv_heads;
    const int32_t chunk = active_.end - active_.begin;
    chunk_scores_.resize(static_cast<size_t>(num_kv_heads) * static_cast<size_t>(chunk));
    const TensorView out{chunk_scores_.data(), DType::kF32, {num_kv_heads, chunk}, Device::kCpu};  // [Hkv, chunk]
    subset_attention_max_scores(out, q, ctx.view, i, num_sink_, active_.begin, ctx.params);
    for (int32_t h = 0; h < num_kv_heads; ++h) {
      const int64_t stream = int64_t{ctx.layer} * num_kv_heads + h;
      std::copy_n(chunk_scores_.data() + int64_t{h} * chunk, chunk,
                  active_.state->scores.data() + stream * active_.num_context + (active_.begin - num_sink_));
    }
  }
}

void KvzipMethod::finish_step(StepContext& ctx) {
  for (const SequenceSlice& slice : ctx.batch.sequences) {
    if (!slice.completes_prefill(ctx.batch.positions)) continue;
    auto it = sequences_.find(slice.seq);
    if (it == sequences_.end()) continue;
    if (!compress(ctx, slice.seq, slice.num_prefill_tokens, it->second)) sequences_.erase(it);
  }
}

std::vector<int32_t> KvzipMethod::repeat_input(const std::vector<int32_t>& ids, int32_t begin, int32_t end) const {
  std::vector<int32_t> input;
  if (begin == num_sink_) {
    input = first_instruction_ids_;
  } else {
    input = next_instruction_ids_;
    input.insert(input.end(), ids.begin() + (begin - std::min(kNumCarriedTokens, chunk_size_)), ids.begin() + begin);
  }
  input.insert(input.end(), suffix_ids_.begin(), suffix_ids_.end());
  input.insert(input.end(), ids.begin() + begin, ids.begin() + end);
  return input;
}

bool KvzipMethod::compress(StepContext& ctx, int32_t seq, int32_t num_prefill_tokens, SequenceState& state) {
  const int32_t num_context = num_prefill_tokens - num_sink_;
  if (static_cast<int32_t>(state.token_ids.size()) < num_prefill_tokens) {
    SE_LOG_WARN("kvzip: sequence {}: only {} of its {} prompt tokens went through a forward; not compressed", seq,
                state.token_ids.size(), num_prefill_tokens);
    return false;
  }
  if (!ctx.run_transient_pass) {
    warn_once(warned_no_passes_, "this driver runs no transient passes; prompts stay uncompressed");
    return false;
  }
  if (!has_tokenizer_)
    warn_once(warned_no_tokenizer_, "no tokenizer: the repeat inputs carry no instruction and no chat suffix");
  const KvLayout& layout = ctx.cache.layout();
  const int num_streams = layout.num_streams();
  state.scores.assign(static_cast<size_t>(num_streams) * static_cast<size_t>(num_context), 0.0f);
  state.num_layers = layout.num_layers;
  state.num_kv_heads = layout.num_kv_heads;
  state.windows.assign(static_cast<size_t>(layout.num_layers), 0);
  state.pass_lengths.clear();
  for (int32_t begin = num_sink_; begin < num_prefill_tokens; begin += chunk_size_) {
    const int32_t end = std::min(begin + chunk_size_, num_prefill_tokens);
    const std::vector<int32_t> input = repeat_input(state.token_ids, begin, end);
    active_ = ActivePass{&state, seq, begin, end, num_context, 0};
    const Status status = ctx.run_transient_pass(seq, input);
    const int num_scored_layers = active_.num_scored_layers;
    active_ = ActivePass{};
    if (!status.is_ok()) {
      warn_once(warned_failed_pass_, "a reconstruction pass failed (" + status.to_string() +
                                         "); that prompt stays uncompressed (logged once)");
      return false;
    }
    SE_CHECK(num_scored_layers == layout.num_layers, "kvzip: the pass of sequence {} scored {} of {} layers", seq,
             num_scored_layers, layout.num_layers);
    state.pass_lengths.push_back(static_cast<int32_t>(input.size()));
  }

  const std::vector<std::vector<int32_t>> kept = select(state, num_context, num_streams);
  std::vector<std::vector<int32_t>> indices(static_cast<size_t>(num_streams));
  std::vector<KvStreams::StreamEviction> evictions;
  for (int layer = 0; layer < layout.num_layers; ++layer) {
    for (int h = 0; h < layout.num_kv_heads; ++h) {
      const auto stream = static_cast<size_t>(layout.stream(layer, h));
      const int32_t length = ctx.cache.stream_length(seq, layer, h);
      std::vector<int32_t>& slots = indices[stream];
      for (int32_t j = first_visible_sink(state, layer, num_prefill_tokens); j < num_sink_; ++j) slots.push_back(j);
      for (int32_t j : kept[stream]) slots.push_back(num_sink_ + j);
      for (int32_t j = num_prefill_tokens; j < length; ++j) slots.push_back(j);
      evictions.push_back({layer, h, slots});
    }
  }
  const Status s = ctx.cache.evict_streams(seq, evictions);
  SE_CHECK(s.is_ok(), "kvzip: {}", s.to_string());
  std::vector<int32_t>().swap(state.token_ids);
  return true;
}

int32_t KvzipMethod::first_visible_sink(const SequenceState& state, int layer, int32_t num_prefill_tokens) {
  // The next query, at position P, sees positions >= P - W + 1 of a layer with window W; a sink below that is
  // out of reach for good, and kept it would sit inside the window of W physical slots the layer reads.
  const int32_t window = state.windows[static_cast<size_t>(layer)];
  return window > 0 ? std::max(0, num_prefill_tokens - window + 1) : 0;
}

std::vector<std::vector<int32_t>> KvzipMethod::select(SequenceState& state, int32_t num_context,
                                                      int num_streams) const {
  std::vector<std::vector<int32_t>> kept(static_cast<size_t>(num_streams));
  const float* scores = state.scores.data();
  const auto per_stream = static_cast<int32_t>(static_cast<double>(num_context) * ratio_);
  auto window_of = [&](int s) { return state.windows[static_cast<size_t>(s / state.num_kv_heads)]; };
  // A sliding-window layer is not rated: it keeps the newest context tokens its later queries can still see,
  // within the per-stream share (sliding_window_tail.h).
  std::vector<int> rated;
  for (int s = 0; s < num_streams; ++s) {
    if (window_of(s) == 0) {
      rated.push_back(s);
      continue;
    }
    keep_sliding_window_tail(num_context, window_of(s), per_stream, kept[static_cast<size_t>(s)]);
  }
  state.threshold = std::numeric_limits<double>::quiet_NaN();
  if (uniform_) {
    std::vector<int32_t> order(static_cast<size_t>(num_context));
    for (int s : rated) {
      const float* row = scores + int64_t{s} * num_context;
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + per_stream, order.end(),
                        [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
      kept[static_cast<size_t>(s)].assign(order.begin(), order.begin() + per_stream);
      std::sort(kept[static_cast<size_t>(s)].begin(), kept[static_cast<size_t>(s)].end());
    }
    return kept;
  }
  if (rated.empty()) return kept;  // on every rank alike: the ranks rate the same layers
  // One threshold over every rated (layer, KV head, token) pair of every rank.
  std::vector<float> mine;
  mine.reserve(rated.size() * static_cast<size_t>(num_context));
  for (int s : rated) mine.insert(mine.end(), scores + int64_t{s} * num_context, scores + int64_t{s + 1} * num_context);
  std::vector<float> sorted = gather_over_every_rank(std::move(mine));
  const auto num_pairs = static_cast<int64_t>(sorted.size());
  const int64_t n = std::max<int64_t>(static_cast<int64_t>(static_cast<double>(num_pairs) * ratio_) - 1, 0);
  std::nth_element(sorted.begin(), sorted.begin() + n, sorted.end(), std::greater<float>());
  const float threshold = sorted[static_cast<size_t>(n)];
  state.threshold = threshold;
  for (int s : rated) {
    const float* row = scores + int64_t{s} * num_context;
    for (int32_t j = 0; j < num_context; ++j)
      if (row[j] > threshold) kept[static_cast<size_t>(s)].push_back(j);
  }
  return kept;
}

std::vector<float> KvzipMethod::gather_over_every_rank(std::vector<float> mine) const {
  Communicator& ranks = communicator();
  if (ranks.size() == 1) return mine;
  const auto n = static_cast<int64_t>(mine.size());
  std::vector<float> all(static_cast<size_t>(n * ranks.size()));
  ranks.all_gather(TensorView{all.data(), DType::kF32, {n * ranks.size()}, Device::kCpu},
                   TensorView{mine.data(), DType::kF32, {n}, Device::kCpu});
  return all;
}

nlohmann::json KvzipMethod::debug_state(int32_t seq) const {
  auto it = sequences_.find(seq);
  if (it == sequences_.end() || it->second.pass_lengths.empty()) return nullptr;
  const SequenceState& state = it->second;
  const size_t num_context = state.scores.size() / static_cast<size_t>(state.num_layers * state.num_kv_heads);
  nlohmann::json layers = nlohmann::json::array();
  for (int layer = 0; layer < state.num_layers; ++layer) {
    nlohmann::json heads = nlohmann::json::array();
    for (int h = 0; h < state.num_kv_heads; ++h) {
      const float* row = state.scores.data() + static_cast<size_t>(layer * state.num_kv_heads + h) * num_context;
      heads.push_back(std::vector<float>(row, row + num_context));
    }
    layers.push_back(std::move(heads));
  }
  return {{"scores", std::move(layers)},
          {"threshold", state.threshold},
          {"passes", state.pass_lengths}};
}

std::span<const float> KvzipMethod::last_scores(int32_t seq) const {
  auto it = sequences_.find(seq);
  if (it == sequences_.end() || it->second.pass_lengths.empty()) return {};
  return it->second.scores;
}

void KvzipMethod::warn_once(bool& flag, const std::string& message) {
  if (flag) return;
  flag = true;
  SE_LOG_WARN("kvzip: {}", message);
}

}  // namespace se
