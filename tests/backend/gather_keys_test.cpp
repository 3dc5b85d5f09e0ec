// gather_keys on the CPU: the keys of a slot range of every KV head of one sequence, in slot order across pages,
// [n, num_kv_heads, head_dim]; no value rows; ranges past a head's length are refused.
#include <gtest/gtest.h>

#include <vector>

#include "backend/ops.h"
#include "op_test_util.h"

namespace se {
namespace {

constexpr int32_t kPageSize = 4;
constexpr int32_t kHeadDim = 2;
constexpr int32_t kNumPages = 6;

// A numbered pool and one sequence of two KV heads: head 0 on pages {4, 1} (7 tokens), head 1 on pages {0, 5}
// (7 tokens).
struct Pool : test::NumberedPool<kNumPages, kPageSize, kHeadDim> {
  std::vector<int32_t> pages = {4, 1, 0, 5};
  std::vector<int32_t> num_tokens = {7, 7};
  std::vector<int32_t> q_indptr = {0, 0};
  SeqKvView seq;
  Pool() {
    seq.page_ids = pages.data();
    seq.stride = 2;
    seq.num_tokens = num_tokens.data();
  }
  AttentionView view() {
    AttentionView v = NumberedPool::view();
    v.num_kv_heads = 2;
    v.num_seqs = 1;
    v.q_indptr = q_indptr.data();
    v.seqs = &seq;
    return v;
  }
};

TEST(GatherKeysTest, ReadsKeyRowsInSlotOrderAcrossPages) {
  Pool pool;
  const AttentionView view = pool.view();
  std::vector<float> out(size_t{4} * 2 * kHeadDim);
  gather_keys(TensorView{out.data(), DType::kF32, {4, 2, kHeadDim}, Device::kCpu}, view, 0, 2);
  std::vector<float> want;
  for (int32_t slot = 2; slot < 6; ++slot)
    for (int32_t h = 0; h < 2; ++h) {
      const float* k = view.element<float>(
          pool.pages[static_cast<size_t>(h) * 2 + static_cast<size_t>(slot / kPageSize)], 0, slot % kPageSize);
      want.insert(want.end(), k, k + kHeadDim);
    }
  EXPECT_EQ(out, want);
}

TEST(GatherKeysDeathTest, RefusesSlotsPastAHeadsLength) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Pool pool;
  pool.num_tokens[1] = 5;
  std::vector<float> out(size_t{4} * 2 * kHeadDim);
  EXPECT_DEATH(gather_keys(TensorView{out.data(), DType::kF32, {4, 2, kHeadDim}, Device::kCpu}, pool.view(), 0, 2),
               "gather_keys: slots \\[2, 6\\) of KV head 1, which holds 5");
}

}  // namespace
}  // namespace se
