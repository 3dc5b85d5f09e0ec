#include "engine/engine_loop.h"

#include <algorithm>
#include <future>

#include "base/logging.h"

namespace se {

namespace {
double seconds_between(Request::Clock::time_point a, Request::Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

namespace {

std::vector<SparseController*> controllers_of(const std::vector<std::unique_ptr<EngineRank>>& ranks) {
  std::vector<SparseController*> controllers;
  controllers.reserve(ranks.size());
  for (const auto& rank : ranks) controllers.push_back(&rank->controller);
  return controllers;
}

// The runners of ranks 1 .. size - 1, which RankWorkers drive.
std::vector<ModelRunner*> follower_runners(const std::vector<std::unique_ptr<EngineRank>>& ranks) {
  std::vector<ModelRunner*> runners;
  runners.reserve(ranks.size() - 1);
  for (size_t r = 1; r < ranks.size(); ++r) runners.push_back(&ranks[r]->runner);
  return runners;
}

}  // namespace

EngineLoop::EngineLoop(const ModelBundle& bundle, const EngineConfig& config,
                       std::vector<std::unique_ptr<EngineRank>> ranks, std::string chain_fingerprint)
    : bundle_(bundle),
      config_(config),
      ranks_(std::move(ranks)),
      chains_(chain_fingerprint.empty() ? nullptr : std::make_unique<ChainCacheIndex>()),
      chain_fingerprint_(std::move(chain_fingerprint)),
      oracle_(controllers_of(ranks_), chains_.get()),
      scheduler_(SchedulerConfig{config.max_num_seqs, config.max_num_batched_tokens, config.admission}, oracle_),
      workers_(follower_runners(ranks_)) {
  publish_stats();
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() { shutdown(/*drain=*/false); }

Result<std::unique_ptr<Request>> EngineLoop::make_request(GenerationRequest& g) const {
  SE_RETURN_IF_ERROR(g.params.validate());
  const ModelConfig& model = bundle_.model->config();
  const int32_t num_prompt = static_cast<int32_t>(g.prompt_ids.size());
  if (num_prompt == 0) return invalid_argument("the prompt is empty");
  for (int32_t id : g.prompt_ids)
    if (id < 0 || id >= model.vocab_size)
      return invalid_argument("prompt token id {} is outside the vocabulary (size {})", id, model.vocab_size);
  if (static_cast<int64_t>(num_prompt) + g.params.max_tokens > config_.max_model_len)
    return out_of_range(
        "this model's maximum context length is {} tokens; the request has {} prompt tokens and asks for {} more",
        config_.max_model_len, num_prompt, g.params.max_tokens);
  const bool resumes_chain = g.chain && !g.chain->create;  // checked against its retained state instead
  if (const Status fits = resumes_chain ? Status::ok() : oracle_.check_can_ever_fit(num_prompt, g.params.max_tokens);
      !fits.is_ok())
    return resource_exhausted(
        "the request ({} prompt + {} new tokens) can never fit in the KV cache: {}; use a "
        "shorter prompt or fewer max_tokens",
        num_prompt, g.params.max_tokens, fits.message());
  if (!bundle_.tokenizer && !g.params.stop.empty())
    return invalid_argument("stop strings need a tokenizer; this model has none");

  auto request = std::make_unique<Request>(std::move(g.request_id), std::move(g.prompt_ids), g.params);
  if (bundle_.tokenizer) request->detokenizer.emplace(*bundle_.tokenizer, /*skip_special=*/true);
  request->stream = std::make_shared<OutputStream>();
  request->arrival_time = Request::Clock::now();
  return request;
}

Result<std::shared_ptr<OutputStream>> EngineLoop::submit(GenerationRequest g) {
  SE_ASSIGN_OR_RETURN(std::unique_ptr<Request> request, make_request(g));
  std::shared_ptr<OutputStream> stream = request->stream;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!accepting_) return unavailable("the engine is shutting down");
    if (live_ids_.count(request->request_id) != 0)
      return invalid_argument("request id '{}' is already in use", request->request_id);
    // Under mutex_, so a shutdown cannot come between pinning the chain and queueing the request.
    if (g.chain) SE_RETURN_IF_ERROR(begin_chain_turn(*request, *g.chain));
    live_ids_.insert(request->request_id);
    inbox_.push_back(std::move(request));
  }
  wake_.notify_one();
  return stream;
}

Result<std::vector<std::shared_ptr<OutputStream>>> EngineLoop::submit_batch(std::vector<GenerationRequest> batch) {
  std::vector<std::unique_ptr<Request>> requests;
  requests.reserve(batch.size());
  for (GenerationRequest& g : batch) {
    if (g.chain) return invalid_argument("request '{}' continues a chain: submit chain turns one at a time", g.request_id);
    SE_ASSIGN_OR_RETURN(std::unique_ptr<Request> request, make_request(g));
    requests.push_back(std::move(request));
  }
  std::vector<std::shared_ptr<OutputStream>> streams;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!accepting_) return unavailable("the engine is shutting down");
    std::unordered_set<std::string_view> batch_ids;
    for (const auto& request : requests)
      if (live_ids_.count(request->request_id) != 0 || !batch_ids.insert(request->request_id).second)
        return invalid_argument("request id '{}' is already in use", request->request_id);
    for (auto& request : requests) {
      live_ids_.insert(request->request_id);
      streams.push_back(request->stream);
      inbox_.push_back(std::move(request));
    }
  }
  wake_.notify_one();
  return streams;
}

Status EngineLoop::begin_chain_turn(Request& request, const ChainRequest& chain) {
  if (!chains_)
    return invalid_argument("chain_id needs the chain prefix cache; this server runs {} with prefix cache mode {}",
                            lead().method->name(), config_.prefix_cache_mode);
  if (chain.create) {
    SE_RETURN_IF_ERROR(chains_->create(chain.chain_id, chain_fingerprint_));
    request.chain_status = ChainStatus::kCreated;
  } else {
    SE_ASSIGN_OR_RETURN(std::unique_ptr<ChainState> state,
                        chains_->begin_turn(chain.chain_id, chain_fingerprint_, request.token_ids));
    const int32_t num_new = request.num_tokens() - state->num_logical_tokens();
    const int64_t num_held = state->num_held_pages() + state->num_pages_to_restore();
    const std::optional<int64_t> num_extension =
        state->num_pages_to_extend(int64_t{num_new} + request.params.max_tokens);
    // Where running sequences live in the host tier the state is one more such sequence, its every token kept.
    const bool fits = lead().cache->runs_on_host_tier()
                          ? oracle_.can_ever_fit(request.num_tokens(), request.params.max_tokens)
                          : oracle_.can_ever_fit_resumed(num_held, num_extension, num_new, request.params.max_tokens);
    if (!fits) {
      chains_->cancel_turn(chain.chain_id, std::move(state));
      return unavailable("no capacity to restore chain '{}': its {} pages plus {} new and {} generated tokens can "
                         "never fit in the KV cache ({} pages)", chain.chain_id, num_held, num_new,
                         request.params.max_tokens, oracle_.num_total_pages());
    }
    request.chain_state = std::move(state);
    request.chain_status = ChainStatus::kResumed;
  }
  request.chain_id = chain.chain_id;
  return Status::ok();
}

void EngineLoop::end_chain_turn(Request& r, FinishReason reason) {
  if (r.chain_id.empty()) return;
  const bool completed = reason == FinishReason::kStop || reason == FinishReason::kLength;
  if (completed && r.seq >= 0) {
    // The state covers the first num_computed_tokens tokens; the last sampled token is kept in the prefix too,
    // so the next turn computes it first.
    chains_->end_turn(r.chain_id, r.token_ids, oracle_.retain(r));
    // Where running sequences live in the host tier, the device keeps only their pages: the chain goes there.
    if (lead().cache->runs_on_host_tier()) chains_->park(r.chain_id);
  } else if (r.chain_state) {
    chains_->cancel_turn(r.chain_id, std::move(r.chain_state));
  } else {
    chains_->drop(r.chain_id);
  }
}

Status EngineLoop::post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!accepting_) return unavailable("the engine is shutting down");
    jobs_.push_back(std::move(job));
  }
  wake_.notify_one();
  return Status::ok();
}

Result<std::string> EngineLoop::submit_prune(PruneRequest request) {
  SE_RETURN_IF_ERROR(validate_prune_request(request));
  const int32_t vocab_size = bundle_.model->config().vocab_size;
  for (int32_t id : request.token_ids)
    if (id < 0 || id >= vocab_size)
      return invalid_argument("token id {} is outside the vocabulary (size {})", id, vocab_size);
  if (ranks_.size() > 1)
    return unimplemented("prefix pruning does not run under tensor parallelism yet ({} ranks)", ranks_.size());
  if (!request.chain_id.empty() && !chains_)
    return invalid_argument("chain_id given, but this server runs without Chain Cache (prefix cache mode {})",
                            config_.prefix_cache_mode);
  std::string prune_id = prunes_.add_queued();
  SE_RETURN_IF_ERROR(post([this, prune_id, request = std::move(request)] {
    PruneStatus status =
        request.chain_id.empty()
            ? run_prune(request, *lead().cache, *lead().method, *bundle_.model, method_environment(bundle_))
            : run_chain_prune(request, *chains_, lead().controller, *bundle_.model, method_environment(bundle_));
    status.prune_id = prune_id;
    prunes_.set(std::move(status));
  }));
  return prune_id;
}

Result<PrefixCacheInspection> EngineLoop::inspect_prefix(std::vector<int32_t> tokens, bool as_prompt) {
  // A prompt's last token is always computed, so it is never part of what a request reuses.
  if (as_prompt && !tokens.empty()) tokens.pop_back();
  auto answer = std::make_shared<std::promise<Result<PrefixCacheInspection>>>();
  std::future<Result<PrefixCacheInspection>> future = answer->get_future();
  SE_RETURN_IF_ERROR(post([this, answer, tokens = std::move(tokens)] {
    Result<RadixCache::PrefixMatch> match = lead().cache->inspect_prefix(tokens);
    if (!match.is_ok()) return answer->set_value(match.status());
    const int32_t page_size = lead().cache->layout().page_size;
    PrefixCacheInspection out;
    out.num_cached_tokens = match->num_cached_tokens;
    out.num_resident_tokens = match->num_resident_blocks * page_size;
    for (const RadixCache::BlockRange& b : match->pruned_segments)
      out.pruned_segments.push_back({b.first_block * page_size, b.end_block * page_size});
    answer->set_value(std::move(out));
  }));
  return future.get();
}

void EngineLoop::abort(const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    aborts_.push_back(request_id);
  }
  wake_.notify_one();
}

void EngineLoop::shutdown(bool drain) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    accepting_ = false;
    stop_ = true;
    drain_ = drain;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

EngineStats EngineLoop::stats() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return stats_;
}

bool EngineLoop::take_inbox() {
  std::vector<std::unique_ptr<Request>> arrivals;
  std::vector<std::string> aborts;
  std::vector<std::function<void()>> jobs;
  bool stop = false, drain = false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    wake_.wait(lock, [&] {
      return !inbox_.empty() || !aborts_.empty() || !jobs_.empty() || stop_ || scheduler_.has_work();
    });
    arrivals.swap(inbox_);
    aborts.swap(aborts_);
    jobs.swap(jobs_);
    stop = stop_;
    drain = drain_;
  }
  // Between steps: a prune finds locked exactly the blocks of requests that ran so far.
  for (const std::function<void()>& job : jobs) job();
  for (auto& request : arrivals) {
    counters_.prompt_tokens_total += static_cast<uint64_t>(request->num_prompt_tokens);
    scheduler_.add(request.get());
    requests_.emplace(request->request_id, std::move(request));
  }
  for (const std::string& id : aborts) {
    auto it = requests_.find(id);
    if (it != requests_.end()) abort_request(*it->second);
  }
  if (stop && !drain) {
    std::vector<Request*> all;
    for (auto& [id, request] : requests_) all.push_back(request.get());
    for (Request* request : all) abort_request(*request);
  }
  return !(stop && !scheduler_.has_work());
}

void EngineLoop::run() {
  while (take_inbox()) {
    if (scheduler_.has_work()) step();
    publish_stats();
  }
  publish_stats();
}

void EngineLoop::step() {
  StepPlan plan = scheduler_.schedule();
  counters_.preemptions_total += plan.preempted.size();
  if (plan.empty()) {
    // Nothing fits even with an empty engine: only requests larger than memory, which submit() rejects.
    if (scheduler_.running().empty() && !scheduler_.waiting().empty()) {
      Request& stuck = *scheduler_.waiting().front();
      RequestOutput output;
      output.error = "the request does not fit in the KV cache";
      finish(stuck, output, FinishReason::kError);
    }
    return;
  }
  workers_.start(plan);
  std::vector<SampledToken> sampled = lead().runner.execute(plan);
  workers_.finish();
  ++counters_.steps_total;
  for (const ScheduledRequest& s : plan.scheduled) {
    Request& r = *s.request;
    r.num_computed_tokens += s.num_tokens;
    oracle_.commit(r);
  }
  for (const SampledToken& t : sampled) {
    RequestOutput output = accept_token(*t.request, t.sample);
    if (!output.finished) t.request->stream->push(std::move(output));
  }
  scheduler_.remove_finished();
}

RequestOutput EngineLoop::accept_token(Request& r, const SampleResult& sample) {
  const auto now = Request::Clock::now();
  if (!r.first_token_time) {
    r.first_token_time = now;
    counters_.time_to_first_token.observe(seconds_between(r.arrival_time, now));
  } else {
    counters_.inter_token_latency.observe(seconds_between(r.last_token_time, now));
  }
  r.last_token_time = now;
  ++counters_.generation_tokens_total;

  RequestOutput output;
  const int32_t token = sample.token_id;
  r.token_ids.push_back(token);
  TokenOutput token_output{token, {}, sample.logprob, sample.top};
  if (bundle_.tokenizer) token_output.text = std::string(bundle_.tokenizer->token_bytes(token));
  output.tokens.push_back(std::move(token_output));

  const bool eog = !r.params.ignore_eos && bundle_.tokenizer && bundle_.tokenizer->is_eog(token);
  const bool stop_token =
      std::find(r.params.stop_token_ids.begin(), r.params.stop_token_ids.end(), token) != r.params.stop_token_ids.end();
  if (eog || stop_token) {
    finish(r, output, FinishReason::kStop);
    return output;
  }
  if (r.detokenizer) {
    auto piece = r.detokenizer->push(token);
    output.text = r.stop_checker.push(piece.is_ok() ? *piece : std::string());
    if (r.stop_checker.stopped()) {
      output.stop_reason = r.stop_checker.matched();
      finish(r, output, FinishReason::kStop);
      return output;
    }
  }
  if (r.num_output_tokens() >= r.params.max_tokens) finish(r, output, FinishReason::kLength);
  return output;
}

void EngineLoop::finish(Request& r, RequestOutput& output, FinishReason reason) {
  if (reason != FinishReason::kStop || output.stop_reason.empty()) {
    // No stop string cut the text: whatever the detokenizer and stop checker hold back is final now.
    if (r.detokenizer && reason != FinishReason::kAbort && reason != FinishReason::kError)
      output.text += r.stop_checker.push(r.detokenizer->flush()) + r.stop_checker.flush();
  }
  output.finished = true;
  output.finish_reason = reason;
  output.num_prompt_tokens = r.num_prompt_tokens;
  output.num_cached_tokens = r.num_cached_tokens;
  output.num_output_tokens = r.num_output_tokens();
  output.chain_status = r.chain_status;
  r.state = RequestState::kFinished;
  end_chain_turn(r, reason);
  oracle_.release(r);
  scheduler_.remove(&r);
  const auto now = Request::Clock::now();
  counters_.e2e_request_latency.observe(seconds_between(r.arrival_time, now));
  if (reason == FinishReason::kAbort) {
    ++counters_.requests_aborted_total;
  } else {
    ++counters_.requests_finished_total;
  }
  r.stream->push(std::move(output));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    live_ids_.erase(r.request_id);
  }
  requests_.erase(r.request_id);  // destroys `r`
}

void EngineLoop::abort_request(Request& r) {
  RequestOutput output;
  finish(r, output, FinishReason::kAbort);
}

void EngineLoop::publish_stats() {
  EngineStats s = counters_;
  s.num_running = static_cast<int>(scheduler_.running().size());
  s.num_waiting = static_cast<int>(scheduler_.waiting().size());
  s.num_prefilling = static_cast<int>(std::count_if(scheduler_.running().begin(), scheduler_.running().end(),
                                                    [](const Request* r) { return r->num_computed_tokens < r->num_prompt_tokens; }));
  const CacheManager& cache = *lead().cache;
  s.num_kv_pages_total = cache.num_total_pages();
  s.num_kv_pages_free = cache.num_free_pages();
  // What sequences and chains hold; the rest of the pages in use the radix cache could give back. (Not total less
  // available: where running sequences live partly on the host tier, available counts the room the tier has too.)
  const int64_t held = cache.num_used_pages();
  s.num_kv_pages_cached = s.num_kv_pages_total - s.num_kv_pages_free - held;
  s.num_kv_pages_chains = chains_ ? chains_->num_reclaimable_pages() : 0;
  s.num_kv_pages_used = held - s.num_kv_pages_chains;
  s.num_chains = chains_ ? chains_->num_chains() : 0;
  s.num_kv_host_pages_total = cache.num_host_pages();
  s.num_kv_host_pages_used = cache.num_host_pages() - cache.num_free_host_pages();
  counters_.num_kv_host_pages_used_peak = std::max(counters_.num_kv_host_pages_used_peak, s.num_kv_host_pages_used);
  s.num_kv_host_pages_used_peak = counters_.num_kv_host_pages_used_peak;
  s.num_chains_on_host = chains_ ? chains_->num_chains_on_host() : 0;
  const CacheManager::PrefixCacheCounters prefix = cache.prefix_cache_counters();
  s.prefix_cache_queries_total = static_cast<uint64_t>(prefix.query_tokens);
  s.prefix_cache_hits_total = static_cast<uint64_t>(prefix.hit_tokens);
  s.transient_pass_tokens_total = static_cast<uint64_t>(lead().controller.num_transient_pass_tokens());
  // Rank 0's pool, as the page counts above; every rank compresses in the same steps.
  s.num_kv_pages_used_peak = lead().controller.peak_held_pages();
  s.compression_steps_total = static_cast<uint64_t>(lead().controller.num_compression_steps());
  s.compression_freed_pages_total = static_cast<uint64_t>(lead().controller.num_compression_freed_pages());
  s.compression_seconds_total = lead().controller.compression_seconds();
  // What the ranks read together: each rank its KV heads and its part of the experts.
  for (const auto& rank : ranks_) {
    s.attended_kv_tokens_total += static_cast<uint64_t>(rank->controller.num_attended_kv_tokens());
    s.method_metadata_bytes_total += static_cast<uint64_t>(rank->controller.num_method_metadata_bytes());
    s.expert_weight_bytes_total += static_cast<uint64_t>(rank->runner.expert_weight_bytes());
  }
  s.host_gap_seconds_total = lead().runner.host_gap_seconds();
  s.published_at = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(stats_mutex_);
  stats_ = std::move(s);
}

}  // namespace se
