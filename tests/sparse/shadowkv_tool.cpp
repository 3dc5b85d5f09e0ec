// shadowkv_tool CASE.json OUT.json: sketches one layer's synthetic prompt and runs one decode step's chunk choice and
// key rebuild (shadowkv_sketch.h), for the numpy oracle of test_fidelity_shadowkv.py.
//
// CASE: {"params": {...}, "theta", "num_tokens", "num_kv_heads", "head_dim", "num_queries", "num_heads",
//        "data": path of f32 pre-RoPE keys [num_tokens, Hkv, D] followed by post-RoPE queries [num_queries, H, D]}
// The post-RoPE keys are the pre-RoPE ones rotated by the backend's rope at positions 0..n-1 (plain RoPE, theta).
// OUT: per KV head "outliers", "landmark_chunks", "landmarks" (flat), "scores", "chosen" (ascending chunk ids),
//      "exact" (ascending positions), "rebuilt" (the chosen chunks' keys rebuilt and rotated, flat); and "rank".
#include <fstream>
#include <iostream>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "sparse/methods/shadowkv_sketch.h"

namespace se {
namespace {

void rotate(std::vector<float>& rows, const std::vector<int32_t>& positions, int32_t heads, int32_t dim,
            const RopeParams& rope_params) {
  const auto n = static_cast<int64_t>(positions.size());
  rope(TensorView{rows.data(), DType::kF32, {n, heads, dim}, Device::kCpu},
       TensorView{const_cast<int32_t*>(positions.data()), DType::kI32, {n}, Device::kCpu}, rope_params);
}

int run(const nlohmann::json& c, nlohmann::json& out) {
  const int32_t n = c["num_tokens"], kv_heads = c["num_kv_heads"], dim = c["head_dim"];
  const int32_t nq = c["num_queries"], heads = c["num_heads"];
  std::vector<float> pre(static_cast<size_t>(n) * kv_heads * dim), q(static_cast<size_t>(nq) * heads * dim);
  std::ifstream data(c["data"].get<std::string>(), std::ios::binary);
  data.read(reinterpret_cast<char*>(pre.data()), static_cast<std::streamsize>(pre.size() * sizeof(float)));
  data.read(reinterpret_cast<char*>(q.data()), static_cast<std::streamsize>(q.size() * sizeof(float)));
  if (!data) {
    std::cerr << "data file too short\n";
    return 1;
  }
  const nlohmann::json& p = c["params"];
  ShadowKvParams params;
  params.sparse_budget = p.value("sparse_budget", params.sparse_budget);
  params.chunk_size = p.value("chunk_size", params.chunk_size);
  params.rank = p.value("rank", params.rank);
  params.local_chunks = p.value("local_chunks", params.local_chunks);
  params.outlier_chunks = p.value("outlier_chunks", params.outlier_chunks);
  if (!shadowkv_can_sketch(n, params)) {
    std::cerr << "these params cannot sketch " << n << " tokens\n";
    return 1;
  }
  RopeParams rope_params;
  rope_params.theta = c["theta"];
  rope_params.rotary_dim = dim;
  std::vector<int32_t> positions(static_cast<size_t>(n));
  for (int32_t t = 0; t < n; ++t) positions[t] = t;
  std::vector<float> post = pre;
  rotate(post, positions, kv_heads, dim, rope_params);

  const ShadowKvLayerSketch sketch = shadowkv_sketch(pre.data(), post.data(), n, kv_heads, dim, params);
  const auto scores = shadowkv_chunk_scores(sketch, q.data(), nq, heads);
  const auto chosen = shadowkv_select_chunks(scores, sketch, params);
  out["rank"] = sketch.rank;
  for (int32_t h = 0; h < kv_heads; ++h) {
    std::vector<float> rebuilt(chosen[h].size() * sketch.chunk_size * dim);
    shadowkv_rebuild_keys(sketch, h, chosen[h], rebuilt.data());
    std::vector<int32_t> at;
    for (int32_t chunk : chosen[h])
      for (int32_t j = 0; j < sketch.chunk_size; ++j) at.push_back(chunk * sketch.chunk_size + j);
    rotate(rebuilt, at, 1, dim, rope_params);
    out["outliers"].push_back(sketch.outliers[h]);
    out["landmark_chunks"].push_back(sketch.landmark_chunks[h]);
    out["landmarks"].push_back(sketch.landmarks[h]);
    out["scores"].push_back(scores[h]);
    out["chosen"].push_back(chosen[h]);
    out["exact"].push_back(shadowkv_exact_positions(sketch, h));
    out["rebuilt"].push_back(rebuilt);
  }
  return 0;
}

}  // namespace
}  // namespace se

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: shadowkv_tool CASE.json OUT.json\n";
    return 2;
  }
  nlohmann::json out;
  const int rc = se::run(nlohmann::json::parse(std::ifstream(argv[1])), out);
  if (rc == 0) std::ofstream(argv[2]) << out.dump();
  return rc;
}
