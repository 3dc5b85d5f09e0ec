#include "sparse/method_traits.h"

#include <gtest/gtest.h>

#include "backend/ops.h"
#include "sparse/method_registry.h"

namespace se {
namespace {

std::vector<std::string_view> method_ops(const char* name) {
  auto method = create_method(name, nullptr);
  SE_CHECK(method.is_ok(), "{}", name);
  std::vector<std::string_view> ops;
  for (OpId op : (*method)->traits().ops) ops.push_back(op_name(op));
  return ops;
}

TEST(MethodTraitsTest, MethodsDeclareTheirOps) {
  EXPECT_EQ(method_ops("quest"), (std::vector<std::string_view>{"update_page_key_bounds", "select_pages_by_key_bounds",
                                                                 "paged_attention over a selection"}));
  EXPECT_EQ(method_ops("h2o"), (std::vector<std::string_view>{"attention_scores", "compact_kv", "move_kv_rows"}));
  EXPECT_EQ(method_ops("rkv"),
            (std::vector<std::string_view>{"gather_keys", "compact_kv", "group_max_attention_importance",
                                           "key_redundancy", "redundancy_aware_scores"}));
  EXPECT_EQ(method_ops("kara"),
            (std::vector<std::string_view>{"gather_keys", "compact_kv", "bidirectional_window_scores"}));
  EXPECT_TRUE(method_ops("vanilla").empty());
  EXPECT_TRUE(MethodTraits{}.ops.empty());
}

// Decode forwards replay as CUDA graphs for dense, prompt-scored eviction, device-ranked selection (Quest) and the
// decode-time compressors; methods that score every step on the host (H2O, OmniKV) run them eagerly.
TEST(MethodTraitsTest, StaticDecodeForwards) {
  const auto is_static = [](const char* name) {
    auto method = create_method(name, nullptr);
    SE_CHECK(method.is_ok(), "{}", name);
    return (*method)->traits().static_decode_forward;
  };
  EXPECT_TRUE(is_static("vanilla"));
  EXPECT_TRUE(is_static("snapkv"));
  EXPECT_TRUE(is_static("streamingllm"));
  EXPECT_TRUE(is_static("quest"));
  EXPECT_FALSE(is_static("h2o"));
  EXPECT_FALSE(is_static("omnikv"));
  // The decode-time compressors scatter their queries by a table prepared before the forward, and compress after it.
  EXPECT_TRUE(is_static("rkv"));
  EXPECT_TRUE(is_static("kara"));
}

// A method runs on CUDA exactly when every op it calls has a CUDA kernel in this build and its hooks need no host
// memory; a refusal names the method and each missing op, or its host hooks (a CPU-only build has no CUDA kernels
// at all, so only vanilla runs there; a CUDA build has a kernel for every op of every registered method, and
// refuses Palu and ShadowKV only for their host hooks; the decode-time compressors keep theirs on the device).
TEST(MethodTraitsTest, MethodsRunOnCudaWhenTheirOpsHaveKernels) {
  const bool cuda_built = cuda_implements(OpId::kPagedAttention);
  for (const MethodInfo& info : registered_methods()) {
    auto method = create_method(info.name, nullptr);
    ASSERT_TRUE(method.is_ok()) << info.name;
    EXPECT_TRUE(check_runs_on(Device::kCpu, (*method)->traits(), info.name).is_ok());
    const Status on_cuda = check_runs_on(Device::kCuda, (*method)->traits(), info.name);
    std::vector<std::string_view> missing;
    for (OpId op : (*method)->traits().ops)
      if (!cuda_implements(op)) missing.push_back(op_name(op));
    if (info.name == "vanilla") EXPECT_TRUE(missing.empty()) << info.name;
    if (cuda_built) EXPECT_TRUE(missing.empty()) << info.name << " lacks " << missing.front();
    if (info.name == "rkv" || info.name == "kara") EXPECT_FALSE((*method)->traits().host_hooks) << info.name;
    if ((*method)->traits().host_hooks) {
      ASSERT_EQ(on_cuda.code(), StatusCode::kUnimplemented) << info.name;
      EXPECT_NE(on_cuda.message().find(info.name), std::string::npos) << on_cuda.message();
      EXPECT_NE(on_cuda.message().find("host memory"), std::string::npos) << on_cuda.message();
      continue;
    }
    if (missing.empty()) {
      EXPECT_TRUE(on_cuda.is_ok()) << info.name << ": " << on_cuda.message();
      continue;
    }
    ASSERT_EQ(on_cuda.code(), StatusCode::kUnimplemented) << info.name;
    for (std::string_view op : missing)
      EXPECT_NE(on_cuda.message().find(std::string(op)), std::string::npos) << on_cuda.message();
    EXPECT_NE(on_cuda.message().find(info.name), std::string::npos) << on_cuda.message();
  }
}

// Every op the registered methods call has a CUDA kernel exactly in CUDA builds.
TEST(MethodTraitsTest, CudaKernelsOfTheMethodOps) {
  const bool cuda_built = cuda_implements(OpId::kPagedAttention);
  for (OpId op : {OpId::kAttentionScores, OpId::kCompactKv, OpId::kMoveKvRows, OpId::kSubsetAttentionMaxScores,
                  OpId::kUpdatePageKeyBounds, OpId::kSelectPagesByKeyBounds, OpId::kTopKeysByLogitsMaxOverHeads,
                  OpId::kTokenListsWithTail, OpId::kPagedAttentionOverSelection, OpId::kGatherKeys,
                  OpId::kBidirectionalWindowScores, OpId::kGroupMaxAttentionImportance, OpId::kKeyRedundancy,
                  OpId::kRedundancyAwareScores, OpId::kPagedAttentionOverFp8Pages, OpId::kPagedAttentionOverKiviPages,
                  OpId::kPagedLatentAttention, OpId::kAbsorbLatentQueries, OpId::kRopeLatentHeads})
    EXPECT_EQ(cuda_implements(op), cuda_built) << op_name(op);
  // The dense CPU reference attention has no CUDA twin, nor do the TurboQuant pages yet.
  EXPECT_FALSE(cuda_implements(OpId::kAttention));
  EXPECT_FALSE(cuda_implements(OpId::kPagedAttentionOverTurboQuantPages));
  EXPECT_EQ(op_name(OpId::kPagedAttentionOverSelection), "paged_attention over a selection");
}

// A latent-attention model runs every method on the CPU; on CUDA only over the shared latent, with ops whose kernels
// take its rows (eviction's row copies): vanilla and StreamingLLM run, SnapKV and Quest are refused naming the op
// without a latent kernel, and a method over the expanded heads is refused for reading them.
TEST(MethodTraitsTest, LatentAttentionOnCudaKeepsTheSharedLatent) {
  const auto on = [](Device device, const char* name) {
    auto method = create_method(name, nullptr);
    SE_CHECK(method.is_ok(), "{}", name);
    return check_latent_attention_runs_on(device, (*method)->traits(), name);
  };
  for (const MethodInfo& info : registered_methods())
    EXPECT_TRUE(on(Device::kCpu, info.name.c_str()).is_ok()) << info.name;
  EXPECT_TRUE(on(Device::kCuda, "vanilla").is_ok());
  EXPECT_TRUE(on(Device::kCuda, "streamingllm").is_ok());
  const Status snapkv = on(Device::kCuda, "snapkv");
  EXPECT_EQ(snapkv.code(), StatusCode::kUnimplemented);
  EXPECT_NE(snapkv.message().find("attention_scores"), std::string::npos) << snapkv.message();
  const Status quest = on(Device::kCuda, "quest");
  EXPECT_EQ(quest.code(), StatusCode::kUnimplemented);
  EXPECT_NE(quest.message().find("update_page_key_bounds"), std::string::npos) << quest.message();
  const Status h2o = on(Device::kCuda, "h2o");
  EXPECT_EQ(h2o.code(), StatusCode::kUnimplemented);
  EXPECT_NE(h2o.message().find("expanded keys and values"), std::string::npos) << h2o.message();
}

}  // namespace
}  // namespace se
