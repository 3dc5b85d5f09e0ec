#include "kv/kivi_residual_window.h"

#include "base/check.h"

namespace se {

KiviResidualWindow::KiviResidualWindow(int64_t residual) : residual_(residual) {
  SE_CHECK(residual > 0, "KIVI residual length must be positive, not {}", residual);
}

KiviFlush KiviResidualWindow::append(int64_t n) {
  SE_CHECK(n >= 0, "cannot append {} tokens", n);
  length_ += n;
  KiviFlush flush;
  flush.key_begin = quantized_keys_;
  flush.key_count = (length_ - quantized_keys_) / residual_ * residual_;
  quantized_keys_ += flush.key_count;
  flush.value_begin = quantized_values_;
  flush.value_count = length_ - quantized_values_ > residual_ ? length_ - quantized_values_ - residual_ : 0;
  quantized_values_ += flush.value_count;
  return flush;
}

void KiviResidualWindow::hold(int64_t n) {
  SE_CHECK(n >= 0, "cannot hold {} tokens", n);
  length_ += n;
}

void KiviResidualWindow::drop(int64_t n) {
  SE_CHECK(n >= 0 && n <= quantized_values_, "cannot drop {} tokens of {} quantized", n, quantized_values_);
  length_ -= n;
  quantized_keys_ -= n;
  quantized_values_ -= n;
}

}  // namespace se
