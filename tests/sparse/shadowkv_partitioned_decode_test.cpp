// Spin's partitions for ShadowKV against ShadowKV over resident KV: the same method, behind two controllers, one over
// the paged cache and one over the tiered cache (PartitionConfig::method_tokens), given the same rows. Three prompts
// prefill in chunks beside each other's decode steps, then decode side by side, the device pool smaller than their
// KV, so every decode step retrieves what its chunks lack. Each layer's attention output must be the resident path's
// bit for bit (the same sketch, keys rewritten in the same pages, the same chunks, the same kernel over the same
// bytes); every decode step moves pages, no sequence more than it selected, and reads fewer tokens than its layers
// hold.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "../support/kv_store_steps.h"
#include "../support/page_pools.h"
#include "backend/ops.h"
#include "sparse/methods/shadowkv.h"
#include "sparse/partitioned_decode.h"
#include "sparse/sparse_controller.h"
#include "sparse/tiered_cache_manager.h"

namespace se {
namespace {

const KvLayout kLayout{.num_layers = 2, .num_kv_heads = 2, .head_dim = 8, .page_size = 4, .dtype = DType::kF32};
constexpr int32_t kNumHeads = 4;  // query heads: two per KV head
constexpr int32_t kChunkTokens = 32;
constexpr int32_t kNumDecodeSteps = 12;

// Chunks of 4 tokens, 1 local and 1 outlier chunk, 2 chunks chosen per step, keys of rank 4 (of 16): the rewritten
// keys are not the written ones, and a step reads a few of a prompt's 10-19 chunks.
const nlohmann::json kShadowKv = {{"sparse_budget", 8}, {"chunk_size", 4},     {"rank", 4},
                                  {"local_chunks", 1},  {"outlier_chunks", 1}, {"min_prompt_tokens", 32}};

std::unique_ptr<MethodRuntime> make_method() {
  auto method = ShadowKvMethod::create(kShadowKv);
  SE_CHECK(method.is_ok(), "{}", method.status().to_string());
  return std::move(method).value();
}

struct Sequence {
  int32_t prompt = 0;
  int32_t done = 0;  // tokens computed
};

TEST(ShadowKvPartitionedDecodeTest, DecodesAsResidentShadowKvOverADevicePoolSmallerThanTheKv) {
  const std::unique_ptr<MethodRuntime> resident_method = make_method();
  const std::unique_ptr<MethodRuntime> partitioned_method = make_method();
  auto resident_cache = resident_method->create_cache({kLayout, 512, cpu_allocator(), false});
  ASSERT_TRUE(resident_cache.is_ok()) << resident_cache.status().to_string();
  // As the engine completes it: a budget of the pages its chunks lie in (chunks of 4 tokens: one page each).
  PartitionConfig config = *partitioned_method->partition_config();
  ASSERT_TRUE(config.method_tokens.has_value());
  EXPECT_EQ(config.method_tokens->max_prompt_pages(kLayout.page_size), 2 + 1 + 1 + 1);
  config.token_budget = config.method_tokens->max_prompt_pages(kLayout.page_size) * kLayout.page_size;
  config.buffer_factor = 2;
  CacheSpec spec{kLayout, 64, cpu_allocator(), false, 512, cpu_allocator()};
  spec.partitions = config;
  spec.max_num_batched_tokens = 3 * kChunkTokens;
  auto cache = partitioned_method->create_cache(spec);
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  auto* tiered = dynamic_cast<TieredCacheManager*>(cache->get());
  ASSERT_NE(tiered, nullptr);
  SparseController resident(*resident_method, **resident_cache);
  SparseController partitioned(*partitioned_method, *tiered);

  std::vector<Sequence> seqs = {{61}, {80}, {45}};
  for (int32_t s = 0; s < 3; ++s) {
    ASSERT_TRUE(resident.open(s, {}).is_ok());
    ASSERT_TRUE(partitioned.open(s, {}).is_ok());
  }
  ASSERT_GT(4 * (61 + 80 + 45) / kLayout.page_size, tiered->num_total_pages()) << "the KV outgrows the device";
  const LayerConfig layer_config{.rope = RopeParams{.rotary_dim = kLayout.head_dim}};
  const AttentionParams params{.scale = 0.35f};
  std::mt19937 rng(35);
  int64_t num_decode_steps = 0, num_retrieved = 0, num_read = 0, num_held = 0;
  while (true) {
    // Each sequence's next prefill chunk or decode token, until it decoded kNumDecodeSteps tokens.
    ForwardBatch batch;
    for (int32_t s = 0; s < 3; ++s) {
      Sequence& seq = seqs[static_cast<size_t>(s)];
      if (seq.done >= seq.prompt + kNumDecodeSteps) continue;
      const int32_t n = seq.done < seq.prompt ? std::min(kChunkTokens, seq.prompt - seq.done) : 1;
      ASSERT_TRUE((*resident_cache)->reserve(s, n).is_ok());
      const Status reserved = tiered->reserve(s, n);
      ASSERT_TRUE(reserved.is_ok()) << reserved.to_string();
      batch.sequences.push_back({s, batch.num_tokens(), n, seq.prompt});
      for (int32_t i = 0; i < n; ++i) {
        batch.token_ids.push_back(0);
        batch.positions.push_back(seq.done + i);
      }
      seq.done += n;
    }
    if (batch.sequences.empty()) break;
    const int32_t t = batch.num_tokens();
    resident.prepare_step(batch);
    partitioned.prepare_step(batch);
    resident.begin_forward(batch);
    partitioned.begin_forward(batch);
    for (int32_t layer = 0; layer < kLayout.num_layers; ++layer) {
      const Tensor q = test::random_kv_rows(rng, t, kNumHeads, kLayout.head_dim);
      const Tensor k = test::random_kv_rows(rng, t, kLayout.num_kv_heads, kLayout.head_dim);
      const Tensor v = test::random_kv_rows(rng, t, kLayout.num_kv_heads, kLayout.head_dim);
      const Tensor want = Tensor::empty(DType::kF32, {t, kNumHeads, kLayout.head_dim});
      const Tensor got = Tensor::empty(DType::kF32, {t, kNumHeads, kLayout.head_dim});
      resident.attend(layer, layer_config, batch, q.view(), k.view(), v.view(), want.view(), params);
      partitioned.attend(layer, layer_config, batch, q.view(), k.view(), v.view(), got.view(), params);
      EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.nbytes()), 0)
          << "layer " << layer << " of a step at positions " << batch.positions.front() << "..";
    }
    resident.finish_step(batch);
    partitioned.finish_step(batch);
    int64_t step_retrieved = 0;
    bool decodes = false;
    for (const SequenceSlice& slice : batch.sequences) {
      const PartitionStepCounts& counts = tiered->step_counts(slice.seq);
      EXPECT_LE(counts.num_retrieved_pages, counts.num_selected_pages) << "sequence " << slice.seq;
      if (!slice.is_decode(batch.positions)) continue;
      decodes = true;
      step_retrieved += counts.num_retrieved_pages;
      num_read += counts.num_read_tokens;
      num_held += int64_t{kLayout.num_streams()} * tiered->num_logical_tokens(slice.seq);
      // The chosen, outlier and local chunks and the decode tail: fewer than the layers' tokens.
      EXPECT_LT(counts.num_read_tokens, int64_t{kLayout.num_streams()} * tiered->num_logical_tokens(slice.seq))
          << "sequence " << slice.seq;
    }
    const Status intact = tiered->check_integrity();
    EXPECT_TRUE(intact.is_ok()) << intact.to_string();
    if (!decodes) continue;
    // Some of the step's chunks were on the host.
    EXPECT_GT(step_retrieved, 0) << "decode step " << num_decode_steps;
    ++num_decode_steps;
    num_retrieved += step_retrieved;
  }
  EXPECT_GE(num_decode_steps, kNumDecodeSteps);
  EXPECT_LT(tiered->num_free_host_pages(), tiered->num_host_pages());
  std::printf("%lld decode steps: %lld pages retrieved, %lld of %lld KV tokens read\n",
              static_cast<long long>(num_decode_steps), static_cast<long long>(num_retrieved),
              static_cast<long long>(num_read), static_cast<long long>(num_held));
  for (int32_t s = 0; s < 3; ++s) {
    resident.close(s);
    partitioned.close(s);
  }
  EXPECT_EQ(tiered->num_free_pages(), tiered->num_total_pages());
  EXPECT_EQ(tiered->num_free_host_pages(), tiered->num_host_pages());
}

TEST(ShadowKvPartitionedDecodeTest, RefusesTokensItCannotRead) {
  BlockPool device = test::pool_with_storage(kLayout, 64), host = test::pool_with_storage(kLayout, 64);
  HostTier tier(&device, &host);
  const PartitionConfig config{.token_budget = 8, .method_tokens = MethodTokens{.chunk_size = 4, .max_chunks = 2}};
  PartitionedDecode decode(&tier, kLayout, config);
  PartitionedDecode quest(&tier, kLayout, {.token_budget = 8});
  PageTable table(&device, kLayout);
  ASSERT_TRUE(table.append(20).is_ok());
  ASSERT_TRUE(tier.add(0, std::move(table)).is_ok());
  ASSERT_TRUE(decode.add(0, 32).is_ok());
  ASSERT_TRUE(quest.add(0, 32).is_ok());
  EXPECT_EQ(decode.index_bytes(0), 0) << "the method keeps what it selects with";
  ASSERT_TRUE(decode.begin_step(0).is_ok());
  const Tensor t = Tensor::empty(DType::kF32, {1, kNumHeads, kLayout.head_dim});
  const Tensor kv = Tensor::empty(DType::kF32, {1, kLayout.num_kv_heads, kLayout.head_dim});
  const std::vector<int32_t> ascending = {0, 1, 2, 20}, unordered = {2, 1}, past = {0, 21};
  const auto attend = [&](PartitionedDecode& partitions, std::vector<std::span<const int32_t>> tokens) {
    return partitions.attend(0, 0, t.view(), kv.view(), kv.view(), t.view(), {}, PartitionStep::kDecode, tokens).code();
  };
  EXPECT_EQ(attend(decode, {ascending}), StatusCode::kInvalidArgument) << "one list for two KV heads";
  EXPECT_EQ(attend(decode, {ascending, unordered}), StatusCode::kInvalidArgument);
  EXPECT_EQ(attend(decode, {ascending, past}), StatusCode::kInvalidArgument) << "past the stream's 21 tokens";
  EXPECT_EQ(attend(quest, {ascending, ascending}), StatusCode::kInvalidArgument) << "Quest selects pages itself";
  EXPECT_EQ(decode
                .attend(0, 0, t.view(), kv.view(), kv.view(), t.view(), {}, PartitionStep::kPrefill,
                        std::vector<std::span<const int32_t>>{ascending, ascending})
                .code(),
            StatusCode::kInvalidArgument)
      << "a prefill chunk reads its layer whole";
  EXPECT_EQ(attend(decode, {ascending, ascending}), StatusCode::kOk);
  EXPECT_EQ(decode.step_counts(0).num_read_tokens, 8);
  EXPECT_EQ(decode.step_counts(0).num_selected_pages, 2 * 2) << "pages 0 and 5 of each stream";
  EXPECT_TRUE(tier.check_integrity().is_ok());
  decode.remove(0);
  quest.remove(0);
  EXPECT_TRUE(tier.drop(0).is_ok());
}

}  // namespace
}  // namespace se
