#include "kv/kivi_residual_window.h"

#include <algorithm>

#include <gtest/gtest.h>

namespace se {
namespace {

TEST(KiviResidualWindow, PrefillQuantizesWholeKeyBlocksAndAllButTheLastRValues) {
  KiviResidualWindow w(128);
  const KiviFlush f = w.append(300);
  EXPECT_EQ(f.key_begin, 0);
  EXPECT_EQ(f.key_count, 256);  // 300 - 300 mod 128
  EXPECT_EQ(f.value_begin, 0);
  EXPECT_EQ(f.value_count, 172);  // all but the last 128
  EXPECT_EQ(w.full_keys(), 44);
  EXPECT_EQ(w.full_values(), 128);
}

TEST(KiviResidualWindow, ShortPrefillStaysFullPrecision) {
  KiviResidualWindow w(128);
  const KiviFlush f = w.append(128);
  EXPECT_EQ(f.key_count, 128);  // T mod R == 0: every key is quantized
  EXPECT_EQ(f.value_count, 0);  // T <= R: every value stays
  KiviResidualWindow s(128);
  EXPECT_EQ(s.append(100).key_count, 0);
}

TEST(KiviResidualWindow, DecodeFlushesKeysEveryRAndOneValuePerStep) {
  KiviResidualWindow w(32);
  w.append(40);  // keys: 32 quantized, 8 full; values: 8 quantized, 32 full
  EXPECT_EQ(w.quantized_keys(), 32);
  EXPECT_EQ(w.quantized_values(), 8);
  for (int step = 0; step < 23; ++step) {
    const KiviFlush f = w.append(1);
    EXPECT_EQ(f.key_count, 0);
    EXPECT_EQ(f.value_begin, 8 + step);
    EXPECT_EQ(f.value_count, 1);
  }
  const KiviFlush f = w.append(1);  // the 64th token completes the second key block
  EXPECT_EQ(f.key_begin, 32);
  EXPECT_EQ(f.key_count, 32);
  EXPECT_EQ(w.full_keys(), 0);
  EXPECT_EQ(w.full_values(), 32);
}

TEST(KiviResidualWindow, ChunkedPrefillEqualsOneShot) {
  for (int64_t total : {1, 31, 32, 33, 100, 257, 1000}) {
    KiviResidualWindow once(32), chunked(32);
    once.append(total);
    int64_t keys = 0, values = 0;
    for (int64_t done = 0; done < total;) {
      const int64_t n = std::min<int64_t>(total - done, 1 + done % 37);
      const KiviFlush f = chunked.append(n);
      EXPECT_EQ(f.key_begin, keys);  // flushes are contiguous, in order
      EXPECT_EQ(f.value_begin, values);
      EXPECT_EQ(f.key_count % 32, 0);
      keys += f.key_count;
      values += f.value_count;
      done += n;
    }
    EXPECT_EQ(chunked.quantized_keys(), once.quantized_keys()) << total;
    EXPECT_EQ(chunked.quantized_values(), once.quantized_values()) << total;
    EXPECT_EQ(keys, once.quantized_keys());
    EXPECT_EQ(values, once.quantized_values());
  }
}

TEST(KiviResidualWindow, HeldTokensQuantizeAtTheNextAppendAsAOneShotPrefill) {
  for (int64_t total : {1, 32, 33, 100, 257}) {
    KiviResidualWindow once(32), held(32);
    once.append(total);
    for (int64_t done = 0; done < total; done += std::min<int64_t>(total - done, 7)) {
      held.hold(std::min<int64_t>(total - done, 7));
      EXPECT_EQ(held.quantized_keys(), 0);
      EXPECT_EQ(held.quantized_values(), 0);
    }
    const KiviFlush f = held.append(0);
    EXPECT_EQ(f.key_begin, 0);
    EXPECT_EQ(f.key_count, once.quantized_keys()) << total;
    EXPECT_EQ(f.value_count, once.quantized_values()) << total;
    EXPECT_EQ(held.length(), total);
  }
}

}  // namespace
}  // namespace se
