#include "loader/progress_bar.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace se {

ProgressBar::ProgressBar(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)),
      total_(std::max<int64_t>(total, 1)),
      enabled_(enabled && ::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::advance(int64_t n) {
  done_ = std::min(done_ + n, total_);
  draw();
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (!enabled_) return;
  last_permille_ = -1;
  draw();
  std::fputc('\n', stderr);
}

void ProgressBar::draw() {
  if (!enabled_) return;
  const int permille = static_cast<int>(done_ * 1000 / total_);
  if (permille == last_permille_) return;  // redraw only when the bar moves
  last_permille_ = permille;
  constexpr int kWidth = 30;
  const int filled = permille * kWidth / 1000;
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::fprintf(stderr, "\r%s [%.*s%*s] %3d%% %lld/%lld %.1fs", label_.c_str(), filled,
               "##############################", kWidth - filled, "", permille / 10,
               static_cast<long long>(done_), static_cast<long long>(total_), secs);
  std::fflush(stderr);
}

}  // namespace se
