// Byte geometry of the quantized KV pages (backend/quant/quantized_kv_layout.h): the sizes the pool, the
// MemoryOracle and the roofline will read, worked out by hand from attention_view.h's layouts.
#include <gtest/gtest.h>

#include "backend/quant/quantized_kv_layout.h"

namespace se {
namespace {

TEST(QuantizedKvLayout, Fp8IsOneBytePerElement) { EXPECT_EQ(fp8_kv_bytes_per_token(128), 256u); }

TEST(QuantizedKvLayout, KiviPageParts) {
  // 2 bits, group 32, value group 32, head_dim 128: a page of 32 tokens.
  const KiviPageLayout l = kivi_page_layout(32, 32, 128, 2);
  EXPECT_EQ(l.key_words, 2);     // 32 codes of 2 bits per channel
  EXPECT_EQ(l.value_words, 8);   // 128 codes per token
  EXPECT_EQ(l.value_groups, 4);
  EXPECT_EQ(l.value_codes, 128u * 2 * 4);
  EXPECT_EQ(l.key_scale, l.value_codes + 32u * 8 * 4);
  EXPECT_EQ(l.key_min, l.key_scale + 128u * 2);
  EXPECT_EQ(l.value_scale, l.key_min + 128u * 2);
  EXPECT_EQ(l.value_min, l.value_scale + 32u * 4 * 2);
  EXPECT_EQ(l.page_bytes, l.value_min + 32u * 4 * 2);
  // 64 code bytes, 16 bytes of key and 16 of value parameters per token; bf16 would take 512.
  EXPECT_DOUBLE_EQ(kivi_quantized_bytes_per_token(l, 32), 96.0);
  // 4 bits, group 32, head_dim 64, value group 64: 64 code bytes + 8 + 4.
  EXPECT_DOUBLE_EQ(kivi_quantized_bytes_per_token(kivi_page_layout(32, 64, 64, 4), 32), 76.0);
}

TEST(QuantizedKvLayout, KiviStreamBytesFollowTheResidualWindow) {
  const KiviPageLayout l = kivi_page_layout(32, 32, 128, 2);
  const size_t explicit_page = 2 * 16 * 128 * 2;  // bf16, page size 16
  EXPECT_EQ(kivi_stream_bytes(0, 128, 32, l, 16, explicit_page), 0u);
  // 100 < R tokens: nothing quantized, 100 residual tokens in at most 8 pages of 16 (the first one partial).
  EXPECT_EQ(kivi_stream_bytes(100, 128, 32, l, 16, explicit_page), 8 * explicit_page);
  // 300 tokens: 256 quantized keys (8 pages of 32), 172 quantized values inside them, the last 128 values in at
  // most 9 explicit pages.
  EXPECT_EQ(kivi_stream_bytes(300, 128, 32, l, 16, explicit_page), 8 * l.page_bytes + 9 * explicit_page);
}

}  // namespace
}  // namespace se
