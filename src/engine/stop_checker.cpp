#include "engine/stop_checker.h"

#include <algorithm>

namespace se {

std::string StopChecker::push(const std::string& text) {
  if (stopped_) return {};
  pending_ += text;
  // The earliest full match of any stop string ends the output.
  size_t earliest = std::string::npos;
  for (const std::string& s : stop_) {
    const size_t pos = pending_.find(s);
    if (pos != std::string::npos && pos < earliest) {
      earliest = pos;
      matched_ = s;
    }
  }
  if (earliest != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, earliest);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stop_) {
    const size_t max_len = std::min(s.size() - 1, pending_.size());
    for (size_t len = max_len; len > hold; --len) {
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopChecker::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace se
