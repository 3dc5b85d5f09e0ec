#include "engine/request_output.h"

namespace se {

std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "";
}

std::string_view chain_status_name(ChainStatus status) {
  switch (status) {
    case ChainStatus::kNone: return "";
    case ChainStatus::kCreated: return "created";
    case ChainStatus::kResumed: return "resumed";
    case ChainStatus::kRebuilt: return "rebuilt";
  }
  return "";
}

void OutputStream::push(RequestOutput output) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_) return;
    finished_ = output.finished;
    queue_.push_back(std::move(output));
  }
  ready_.notify_all();
}

std::optional<RequestOutput> OutputStream::next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!ready_.wait_for(lock, timeout, [&] { return !queue_.empty(); })) return std::nullopt;
  RequestOutput merged = std::move(queue_.front());
  queue_.pop_front();
  while (!queue_.empty()) {
    RequestOutput& more = queue_.front();
    for (TokenOutput& t : more.tokens) merged.tokens.push_back(std::move(t));
    merged.text += more.text;
    merged.finished = more.finished;
    merged.finish_reason = more.finish_reason;
    merged.stop_reason = std::move(more.stop_reason);
    merged.error = std::move(more.error);
    merged.num_cached_tokens = more.num_cached_tokens;
    merged.num_output_tokens = more.num_output_tokens;
    merged.chain_status = more.chain_status;
    queue_.pop_front();
  }
  return merged;
}

bool OutputStream::finished() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_;
}

}  // namespace se
