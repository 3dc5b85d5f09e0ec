// decode_compression_tool CASE.json OUT.json: runs R-KV's or Kara's selection (rkv_scores.h, kara_selection.h) on
// one layer's synthetic inputs, for the Python oracles of test_fidelity_rkv.py and test_fidelity_kara.py.
//
// CASE: {"method": "rkv"|"kara", "params": {...}, "num_heads", "num_kv_heads", "head_dim", "num_queries",
//        "num_tokens", "data": path of f32 queries [num_queries, H, D] followed by keys [num_tokens, Hkv, D]}
//   rkv: the queries are the newest `window` ones and the keys the whole cache;
//   kara: the queries are the whole window's and the keys its compressible region's.
// or {"method": "rkv_trigger", "params": {"budget", "buffer"}, "prompt_len", "num_steps"}, or
//    {"method": "kara_trigger", "params": {"window", "buffer", "period"}, "num_steps"}.
// OUT: {"scores": [kv_head][token], "kept": [kv_head] ascending positions, "chunks": [kv_head] [[a, b], ...]
//       (kara)}, or {"fired": [decoded-token counts]} for the triggers
#include <fstream>
#include <iostream>
#include <vector>

#include <nlohmann/json.hpp>

#include "sparse/methods/kara_selection.h"
#include "sparse/methods/rkv_scores.h"

namespace se {
namespace {

// The decoded-token counts at which rkv_should_compress fires over a synthetic decode of single tokens, the cache
// dropping back to the budget at each.
nlohmann::json rkv_triggers(const nlohmann::json& c) {
  RkvParams params;
  params.budget = c["params"]["budget"];
  params.buffer = c["params"]["buffer"];
  int64_t resident = c["prompt_len"];
  nlohmann::json fired = nlohmann::json::array();
  for (int64_t decoded = 1; decoded <= c["num_steps"].get<int64_t>(); ++decoded) {
    ++resident;
    if (rkv_should_compress(resident, decoded, 1, params)) {
      fired.push_back(decoded);
      resident = params.budget;
    }
  }
  return fired;
}

// The same for kara_should_compress, with nothing uncompressed at the start and the protected buffer left
// uncompressed by each compression.
nlohmann::json kara_triggers(const nlohmann::json& c) {
  KaraParams params;
  params.window = c["params"]["window"];
  params.buffer = c["params"]["buffer"];
  params.period = c["params"]["period"];
  int64_t uncompressed = 0;
  nlohmann::json fired = nlohmann::json::array();
  for (int64_t decoded = 1; decoded <= c["num_steps"].get<int64_t>(); ++decoded) {
    ++uncompressed;
    if (kara_should_compress(decoded, uncompressed, params)) {
      fired.push_back(decoded);
      uncompressed = params.buffer;
    }
  }
  return fired;
}

int run(const nlohmann::json& c, nlohmann::json& out) {
  if (c["method"] == "rkv_trigger" || c["method"] == "kara_trigger") {
    out["fired"] = c["method"] == "rkv_trigger" ? rkv_triggers(c) : kara_triggers(c);
    return 0;
  }
  const int32_t heads = c["num_heads"], kv_heads = c["num_kv_heads"], dim = c["head_dim"];
  const int32_t nq = c["num_queries"], nt = c["num_tokens"];
  std::vector<float> q(static_cast<size_t>(nq) * heads * dim), k(static_cast<size_t>(nt) * kv_heads * dim);
  std::ifstream data(c["data"].get<std::string>(), std::ios::binary);
  data.read(reinterpret_cast<char*>(q.data()), static_cast<std::streamsize>(q.size() * sizeof(float)));
  data.read(reinterpret_cast<char*>(k.data()), static_cast<std::streamsize>(k.size() * sizeof(float)));
  if (!data) {
    std::cerr << "data file too short\n";
    return 1;
  }
  const nlohmann::json& p = c["params"];
  auto split = [&](const std::vector<float>& flat, int32_t n) {
    nlohmann::json rows = nlohmann::json::array();
    for (int32_t h = 0; h < kv_heads; ++h)
      rows.push_back(std::vector<float>(flat.begin() + h * n, flat.begin() + (h + 1) * n));
    return rows;
  };
  if (c["method"] == "rkv") {
    RkvParams params;
    params.budget = p.value("budget", params.budget);
    params.window = p.value("window", params.window);
    params.kernel = p.value("kernel", params.kernel);
    params.mix_lambda = p.value("mix_lambda", params.mix_lambda);
    if (nq != params.window) {
      std::cerr << "rkv wants num_queries == window\n";
      return 1;
    }
    out["kept"] = rkv_select(q.data(), k.data(), nt, heads, kv_heads, dim, params);
    if (nt > params.window)
      out["scores"] = split(rkv_scores(q.data(), k.data(), nt, heads, kv_heads, dim, params).values, nt - params.window);
    return 0;
  }
  KaraParams params;
  params.budget = p.value("budget", params.budget);
  params.candidates = p.value("candidates", params.candidates);
  params.length_exponent = p.value("length_exponent", params.length_exponent);
  out["scores"] = split(kara_scores(q.data(), nq, k.data(), nt, heads, kv_heads, dim), nt);
  out["kept"] = nlohmann::json::array();
  out["chunks"] = nlohmann::json::array();
  for (const KaraSelection& s : kara_select(q.data(), nq, k.data(), nt, heads, kv_heads, dim, params)) {
    out["kept"].push_back(s.kept);
    out["chunks"].push_back(s.chunks);
  }
  return 0;
}

}  // namespace
}  // namespace se

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: decode_compression_tool CASE.json OUT.json\n";
    return 2;
  }
  nlohmann::json out;
  const int rc = se::run(nlohmann::json::parse(std::ifstream(argv[1])), out);
  if (rc == 0) std::ofstream(argv[2]) << out.dump();
  return rc;
}
