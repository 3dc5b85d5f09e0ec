// StopChecker: applies stop strings to a stream of decoded text. Text that could still be the start of a stop
// string is held back; once a stop string appears, the output ends just before it (OpenAI semantics).
// One per request; not thread-safe.
#pragma once

#include <string>
#include <vector>

namespace se {

class StopChecker {
 public:
  explicit StopChecker(std::vector<std::string> stop) : stop_(std::move(stop)) {}

  // Feeds newly decoded text; returns the text now safe to emit.
  std::string push(const std::string& text);
  // Returns whatever is held back (call at the end of generation when no stop string matched).
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stop_;
  std::string pending_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace se
