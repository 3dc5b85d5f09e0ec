// ProgressBar: a one-line progress display on stderr while a model loads, shown only when stderr is
// a terminal. Owned by the loader for one load; not thread-safe (call from the loading thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace se {

class ProgressBar {
 public:
  // `enabled` is and-ed with isatty(stderr).
  ProgressBar(std::string label, int64_t total, bool enabled);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void advance(int64_t n = 1);
  // Draws the final state and ends the line (also done by the destructor).
  void finish();

 private:
  void draw();

  std::string label_;
  int64_t total_;
  int64_t done_ = 0;
  bool enabled_;
  bool finished_ = false;
  int last_permille_ = -1;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace se
