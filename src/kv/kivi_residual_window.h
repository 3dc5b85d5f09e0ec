// KiviResidualWindow: the bookkeeping of KIVI's full-precision residual for one stream (jy-yuan/KIVI,
// models/llama_kivi.py), as a pure state machine over token counts; the store that owns the bytes asks it which
// tokens to quantize after each append.
//   keys:   new tokens join a full-precision block; whenever the block holds R (= residual) tokens, all R are
//           quantized at once (R / group_size per-channel groups), so 0 .. R-1 key tokens stay full precision;
//   values: a sliding window of the last R tokens stays full precision; each token older than that is quantized
//           on its own (per-token groups), oldest first.
// A prefill of T tokens thus quantizes the first T - T mod R keys and all but the last R values, and a decode
// step at most R keys and one value, as the reference does; appending a prompt in chunks gives the same state as
// appending it at once. Tokens may also be held (hold): they join the window without quantizing anything, and the
// next append quantizes what it would have had they been appended then, so holding a prompt and appending 0 at its
// end gives the state of a one-shot prefill. Tokens whose keys and values are both quantized may leave (drop): the
// full-precision counts do not change, so later appends quantize the same tokens they would have. Token indices are
// physical slots of the stream. Not thread-safe (one per stream).
#pragma once

#include <cstdint>

namespace se {

struct KiviFlush {
  int64_t key_begin = 0;  // keys [key_begin, key_begin + key_count) become quantized (key_count a multiple of R)
  int64_t key_count = 0;
  int64_t value_begin = 0;  // values [value_begin, value_begin + value_count) become quantized
  int64_t value_count = 0;
};

class KiviResidualWindow {
 public:
  // residual R > 0 and a multiple of the key group size (checked by the caller's config).
  explicit KiviResidualWindow(int64_t residual);

  // Appends n >= 0 tokens and returns the tokens to quantize now.
  KiviFlush append(int64_t n);
  // Appends n >= 0 tokens that stay full precision until the next append.
  void hold(int64_t n);
  // Removes n tokens of [0, quantized_values): n <= quantized_values.
  void drop(int64_t n);

  int64_t length() const { return length_; }
  int64_t quantized_keys() const { return quantized_keys_; }      // keys [0, quantized_keys) are quantized
  int64_t quantized_values() const { return quantized_values_; }  // values [0, quantized_values) are quantized
  int64_t full_keys() const { return length_ - quantized_keys_; }
  int64_t full_values() const { return length_ - quantized_values_; }

 private:
  int64_t residual_;
  int64_t length_ = 0;
  int64_t quantized_keys_ = 0;
  int64_t quantized_values_ = 0;
};

}  // namespace se
