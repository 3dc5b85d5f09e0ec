#include "server/generation_session.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

namespace se::server {

namespace {

// While several choices run, each is polled without blocking and the thread naps this long between rounds
// (OutputStream has no wait-for-any).
constexpr std::chrono::milliseconds kPollSlice{2};

}  // namespace

Result<std::unique_ptr<GenerationSession>> GenerationSession::submit(Engine& engine, const std::string& id,
                                                                     const std::vector<int32_t>& prompt_ids,
                                                                     const SamplingParams& params, int n,
                                                                     std::optional<ChainRequest> chain) {
  std::unique_ptr<GenerationSession> session(new GenerationSession(engine));
  for (int i = 0; i < n; ++i) {
    GenerationRequest request;
    request.request_id = n == 1 ? id : fmt::format("{}-{}", id, i);
    request.prompt_ids = prompt_ids;
    request.params = params;
    request.chain = chain;
    if (params.seed) request.params.seed = *params.seed + static_cast<uint64_t>(i);
    std::string request_id = request.request_id;
    // On an error the session's destructor aborts the choices already submitted.
    SE_ASSIGN_OR_RETURN(std::shared_ptr<OutputStream> stream, engine.submit(std::move(request)));
    session->request_ids_.push_back(std::move(request_id));
    session->streams_.push_back(std::move(stream));
    session->done_.push_back(false);
    ++session->num_unfinished_;
  }
  return session;
}

GenerationSession::~GenerationSession() {
  for (size_t i = 0; i < streams_.size(); ++i)
    if (!done_[i]) engine_.abort(request_ids_[i]);
}

std::optional<ChoiceDelta> GenerationSession::next(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const size_t n = streams_.size();
  while (num_unfinished_ > 0) {
    const auto now = std::chrono::steady_clock::now();
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::max(deadline - now, std::chrono::steady_clock::duration::zero()));
    for (size_t k = 0; k < n; ++k) {
      const size_t i = (cursor_ + k) % n;
      if (done_[i]) continue;
      // With one choice left, block on it for the whole wait.
      std::optional<RequestOutput> out = streams_[i]->next(num_unfinished_ == 1 ? left : std::chrono::milliseconds(0));
      if (!out) continue;
      cursor_ = i + 1;
      if (out->finished) {
        done_[i] = true;
        --num_unfinished_;
      }
      return ChoiceDelta{static_cast<int>(i), std::move(*out)};
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
    if (num_unfinished_ > 1) std::this_thread::sleep_for(std::min(kPollSlice, left));
  }
  return std::nullopt;
}

}  // namespace se::server
