// Parity of the CUDA embedding (whole and a vocabulary shard's), norms, RoPE, gated activations and in-place
// element-wise ops with the CPU reference, on fresh random inputs, F32 and BF16 activations, several shapes; outputs
// NaN-poisoned first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <tuple>
#include <vector>

#include "backend/ops.h"
#include "cuda_test_util.h"

namespace se {
namespace {

using test::download_f32;
using test::poisoned;
using test::random_host;
using test::relative_error;
using test::tolerance;
using test::upload;

constexpr DType kActs[] = {DType::kF32, DType::kBF16};

void report(const char* op, DType dtype, const Shape& shape, double err) {
  std::printf("PARITY %-18s %-4s %-18s rel_err %.3e\n", op, dtype_name(dtype).data(),
              shape.to_string().c_str(), err);
  EXPECT_LT(err, tolerance(dtype)) << op << " " << dtype_name(dtype) << " " << shape.to_string();
}

Tensor host_i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty(DType::kI32, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

TEST(CudaOpsTest, EmbeddingGathersAndConverts) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 100;
  for (DType table_dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (DType out_dtype : kActs) {
      for (auto [vocab, dim, tokens] :
           {std::tuple{50, 64, 1}, {1000, 576, 37}, {32000, 2048, 130}}) {
        const Tensor table = random_host({vocab, dim}, seed++, table_dtype);
        test::FastRng rng(seed++);
        std::vector<int32_t> ids(static_cast<size_t>(tokens));
        for (auto& id : ids) id = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(vocab));
        const Tensor ids_host = host_i32(ids);
        Tensor ref = Tensor::empty(DType::kF32, {tokens, dim});
        embedding(ref.view(), table.view(), ids_host.view());
        Tensor out = poisoned(out_dtype, {tokens, dim});
        embedding(out.view(), upload(table, table_dtype).view(), cuda::to_device(ids_host).view());
        report("embedding", out_dtype, out.shape(), relative_error(download_f32(out), ref));
      }
    }
  }
}

// A tensor-parallel rank's lookup: ids of other ranks' rows give zeros on both backends.
TEST(CudaOpsTest, VocabShardEmbeddingMatchesCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 150;
  for (DType out_dtype : kActs) {
    for (auto [rows, first_row, dim, tokens] : {std::tuple{25, 75, 64, 9}, {16000, 16000, 2048, 130}}) {
      const Tensor table = random_host({rows, dim}, seed++, DType::kBF16);
      test::FastRng rng(seed++);
      std::vector<int32_t> ids(static_cast<size_t>(tokens));
      for (auto& id : ids) id = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(first_row + rows + 7));
      const Tensor ids_host = host_i32(ids);
      Tensor ref = Tensor::empty(DType::kF32, {tokens, dim});
      vocab_shard_embedding(ref.view(), table.view(), ids_host.view(), first_row);
      Tensor out = poisoned(out_dtype, {tokens, dim});
      vocab_shard_embedding(out.view(), upload(table, DType::kBF16).view(), cuda::to_device(ids_host).view(),
                            first_row);
      report("vocab_shard_embed", out_dtype, out.shape(), relative_error(download_f32(out), ref));
    }
  }
}

TEST(CudaOpsTest, RmsNormAndFusedAddMatchCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 200;
  for (DType dtype : kActs) {
    for (auto [rows, dim] : {std::pair{1, 64}, {7, 576}, {33, 4096}, {300, 2048}}) {
      const Tensor x = random_host({rows, dim}, seed++, dtype, 3.0f);
      const Tensor w = random_host({dim}, seed++, dtype);
      Tensor ref = Tensor::empty(DType::kF32, {rows, dim});
      rms_norm(ref.view(), x.view(), w.view(), 1e-6f);
      Tensor out = poisoned(dtype, {rows, dim});
      rms_norm(out.view(), upload(x, dtype).view(), upload(w, dtype).view(), 1e-6f);
      report("rms_norm", dtype, out.shape(), relative_error(download_f32(out), ref));

      // In place (out aliases x), as the model normalizes q and k.
      Tensor x_dev = upload(x, dtype);
      rms_norm(x_dev.view(), x_dev.view(), upload(w, dtype).view(), 1e-6f);
      report("rms_norm(inplace)", dtype, out.shape(), relative_error(download_f32(x_dev), ref));

      // residual += x, out = norm(residual): both results are checked. A bf16 residual is rounded
      // before the norm reads it, so the CPU reference gets the same rounded sum.
      const Tensor residual = random_host({rows, dim}, seed++, dtype, 2.0f);
      Tensor ref_res = residual.clone();
      add_inplace(ref_res.view(), x.view());
      for (int64_t i = 0; i < ref_res.numel(); ++i)
        ref_res.data<float>()[i] = test::representable(ref_res.data<float>()[i], dtype);
      Tensor ref_out = Tensor::empty(DType::kF32, {rows, dim});
      rms_norm(ref_out.view(), ref_res.view(), w.view(), 1e-5f);
      Tensor res_dev = upload(residual, dtype);
      Tensor out2 = poisoned(dtype, {rows, dim});
      add_rms_norm(out2.view(), res_dev.view(), upload(x, dtype).view(), upload(w, dtype).view(),
                   1e-5f);
      report("add_rms_norm.res", dtype, out.shape(),
             relative_error(download_f32(res_dev), ref_res));
      report("add_rms_norm.out", dtype, out.shape(), relative_error(download_f32(out2), ref_out));
    }
  }
}

TEST(CudaOpsTest, RopeMatchesCpuForEveryScaling) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 300;
  struct RopeCase {
    int tokens, heads, head_dim, rotary_dim, max_pos;
    RopeScaling scaling;
  };
  const RopeCase cases[] = {{1, 9, 64, 64, 2048, RopeScaling::kNone},
                            {37, 32, 128, 128, 131072, RopeScaling::kLlama3},
                            {200, 4, 256, 256, 32768, RopeScaling::kLinear},
                            {16, 8, 128, 64, 4096, RopeScaling::kNone},
                            {64, 8, 128, 128, 131072, RopeScaling::kYarn}};
  for (DType dtype : kActs) {
    for (const RopeCase& c : cases) {
      RopeParams p;
      p.theta = c.scaling == RopeScaling::kLlama3 ? 500000.0f : 10000.0f;
      p.rotary_dim = c.rotary_dim;
      p.scaling = c.scaling;
      p.factor = c.scaling == RopeScaling::kNone ? 1.0f : 8.0f;
      if (c.scaling == RopeScaling::kYarn) {  // Qwen3's 128K setting
        p.theta = 1e6f;
        p.factor = 4.0f;
        p.original_max_position = 32768;
        p.attention_factor = 1.1386f;
      }
      test::FastRng rng(seed++);
      std::vector<int32_t> pos(static_cast<size_t>(c.tokens));
      for (auto& v : pos) v = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(c.max_pos));
      const Tensor pos_host = host_i32(pos);
      const Tensor x = random_host({c.tokens, c.heads, c.head_dim}, seed++, dtype);
      Tensor ref = x.clone();
      rope(ref.view(), pos_host.view(), p);
      Tensor x_dev = upload(x, dtype);
      rope(x_dev.view(), cuda::to_device(pos_host).view(), p);
      report("rope", dtype, x.shape(), relative_error(download_f32(x_dev), ref));
    }
  }
}

TEST(CudaOpsTest, GatedActivationsMatchCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 400;
  for (DType dtype : kActs) {
    for (Activation act : {Activation::kSilu, Activation::kGeluTanh}) {
      for (auto [rows, width] : {std::pair{1, 1536}, {13, 8960}, {128, 14336}}) {
        const Tensor gate_up = random_host({rows, 2 * width}, seed++, dtype, 2.0f);
        Tensor ref = Tensor::empty(DType::kF32, {rows, width});
        gated_activation(ref.view(), gate_up.view(), act);
        Tensor out = poisoned(dtype, {rows, width});
        gated_activation(out.view(), upload(gate_up, dtype).view(), act);
        report(act == Activation::kSilu ? "silu_mul" : "gelu_tanh_mul", dtype, out.shape(),
               relative_error(download_f32(out), ref));
      }
    }
  }
}

TEST(CudaOpsTest, SplitQkvRopeMatchesCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 450;
  struct Case {
    int tokens, q_heads, kv_heads, head_dim, rotary_dim;
    bool qk_norm;
  };
  // Llama-3.1-8B (decode and a chunk), Qwen3-8B (q/k norm), Gemma 3 270M (head_dim 256, norm), SmolLM2
  // (head_dim 64) and a partial rotation.
  const Case cases[] = {{1, 32, 8, 128, 128, false}, {37, 32, 8, 128, 128, false}, {5, 32, 8, 128, 128, true},
                        {9, 4, 1, 256, 256, true},    {3, 9, 3, 64, 64, false},      {16, 8, 2, 128, 64, true}};
  for (DType dtype : kActs) {
    for (const Case& c : cases) {
      RopeParams p;
      p.theta = 500000.0f;
      p.rotary_dim = c.rotary_dim;
      p.scaling = RopeScaling::kLlama3;
      p.factor = 8.0f;
      test::FastRng rng(seed++);
      std::vector<int32_t> pos(static_cast<size_t>(c.tokens));
      for (auto& v : pos) v = static_cast<int32_t>(rng.next() % 131072);
      const Tensor pos_host = host_i32(pos);
      const int width = (c.q_heads + 2 * c.kv_heads) * c.head_dim;
      const Tensor qkv = random_host({c.tokens, width}, seed++, dtype, 3.0f);
      const Tensor q_weight = random_host({c.head_dim}, seed++, dtype), k_weight = random_host({c.head_dim}, seed++, dtype);
      const Shape q_shape{c.tokens, c.q_heads, c.head_dim}, kv_shape{c.tokens, c.kv_heads, c.head_dim};
      Tensor q_ref = Tensor::empty(DType::kF32, q_shape), k_ref = Tensor::empty(DType::kF32, kv_shape),
             v_ref = Tensor::empty(DType::kF32, kv_shape);
      const QkNorm norm_ref{q_weight.view(), k_weight.view(), 1e-6f};
      split_qkv_rope(q_ref.view(), k_ref.view(), v_ref.view(), qkv.view(), pos_host.view(), p,
                     c.qk_norm ? &norm_ref : nullptr);
      Tensor q = poisoned(dtype, q_shape), k = poisoned(dtype, kv_shape), v = poisoned(dtype, kv_shape);
      const Tensor q_weight_dev = upload(q_weight, dtype), k_weight_dev = upload(k_weight, dtype);
      const QkNorm norm{q_weight_dev.view(), k_weight_dev.view(), 1e-6f};
      split_qkv_rope(q.view(), k.view(), v.view(), upload(qkv, dtype).view(), cuda::to_device(pos_host).view(), p,
                     c.qk_norm ? &norm : nullptr);
      report(c.qk_norm ? "split_qkv_rope q+n" : "split_qkv_rope q", dtype, q_shape,
             relative_error(download_f32(q), q_ref));
      report(c.qk_norm ? "split_qkv_rope k+n" : "split_qkv_rope k", dtype, kv_shape,
             relative_error(download_f32(k), k_ref));
      // v is a copy: exact.
      const double v_err = relative_error(download_f32(v), v_ref);
      std::printf("PARITY split_qkv_rope v   %-4s %-18s rel_err %.3e\n", dtype_name(dtype).data(),
                  kv_shape.to_string().c_str(), v_err);
      EXPECT_EQ(v_err, 0.0);
    }
  }
}

TEST(CudaOpsTest, InPlaceElementwiseOpsMatchCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 500;
  for (DType dtype : kActs) {
    for (Shape shape : {Shape{5}, Shape{3, 1000}, Shape{64, 151936}}) {
      const Tensor x = random_host(shape, seed++, dtype, 4.0f);
      const Tensor y = random_host(shape, seed++, dtype);

      Tensor ref = x.clone();
      add_inplace(ref.view(), y.view());
      Tensor dev = upload(x, dtype);
      add_inplace(dev.view(), upload(y, dtype).view());
      report("add_inplace", dtype, shape, relative_error(download_f32(dev), ref));

      ref = x.clone();
      scale_inplace(ref.view(), 33.941f);
      dev = upload(x, dtype);
      scale_inplace(dev.view(), 33.941f);
      report("scale_inplace", dtype, shape, relative_error(download_f32(dev), ref));

      ref = x.clone();
      softcap_inplace(ref.view(), 3.0f);
      dev = upload(x, dtype);
      softcap_inplace(dev.view(), 3.0f);
      report("softcap_inplace", dtype, shape, relative_error(download_f32(dev), ref));
    }
  }
}

}  // namespace
}  // namespace se
