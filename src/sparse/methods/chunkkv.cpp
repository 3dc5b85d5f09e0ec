#include "sparse/methods/chunkkv.h"

#include <algorithm>

#include "base/top_k.h"

namespace se {

namespace {

struct ChunkPlan {
  int32_t num_chunks = 0;         // ceil(T / c)
  int32_t first_window_chunk = 0;  // chunks from here on overlap the window; those before lie in the prefix
  int32_t num_kept_chunks = 0;    // window chunks included
};

ChunkPlan plan_chunks(int32_t num_prompt_tokens, int32_t budget, int32_t window, int32_t chunk_length) {
  ChunkPlan p;
  p.num_chunks = (num_prompt_tokens + chunk_length - 1) / chunk_length;
  p.first_window_chunk = (num_prompt_tokens - window) / chunk_length;
  p.num_kept_chunks = std::max(p.num_chunks - p.first_window_chunk, std::min(p.num_chunks, budget / chunk_length));
  return p;
}

}  // namespace

Result<std::unique_ptr<MethodRuntime>> ChunkKvMethod::create(const nlohmann::json& config) {
  SE_ASSIGN_OR_RETURN(MethodConfig reader, MethodConfig::parse("chunkkv", config));
  SE_ASSIGN_OR_RETURN(const ObservationWindowConfig window_config,
                      read_observation_window_config(reader, "chunkkv", ObservationWindowDefaults{}));
  SE_ASSIGN_OR_RETURN(const int chunk_length, reader.get_int("chunk_length", 20, 1, 1 << 16));
  SE_RETURN_IF_ERROR(reader.finish());
  return std::unique_ptr<MethodRuntime>(new ChunkKvMethod(reader.resolved(), window_config, chunk_length));
}

int32_t ChunkKvMethod::num_kept_tokens(int32_t num_prompt_tokens, int32_t budget, int32_t window,
                                       int32_t chunk_length) {
  const ChunkPlan p = plan_chunks(num_prompt_tokens, budget, window, chunk_length);
  const int32_t last_chunk = num_prompt_tokens - (p.num_chunks - 1) * chunk_length;
  return (p.num_kept_chunks - 1) * chunk_length + last_chunk;
}

std::vector<std::vector<int32_t>> ChunkKvMethod::select_prefix(const WindowScores& scores, int /*layer*/,
                                                               int /*num_layers*/) const {
  return select_over_every_rank(scores, [this](const WindowScores& all) { return select_chunks(all); });
}

std::vector<std::vector<int32_t>> ChunkKvMethod::select_chunks(const WindowScores& scores) const {
  const int32_t c = chunk_length_;
  const ChunkPlan p = plan_chunks(scores.num_tokens, window_config().budget, window_config().window, c);
  // chunk_scores[i] = mean over chunk i's tokens of the scores summed over KV heads (prefix chunks: c tokens).
  std::vector<float> chunk_scores(static_cast<size_t>(p.first_window_chunk), 0.0f);
  for (int32_t i = 0; i < p.first_window_chunk; ++i) {
    float sum = 0.0f;
    for (int32_t j = i * c; j < (i + 1) * c; ++j) {
      float token = 0.0f;
      for (int32_t h = 0; h < scores.num_kv_heads; ++h) token += scores.head(h)[j];
      sum += token;
    }
    chunk_scores[static_cast<size_t>(i)] = sum / static_cast<float>(c);
  }
  const int32_t num_window_chunks = p.num_chunks - p.first_window_chunk;
  const std::vector<int32_t> chunks =
      top_k_ascending(chunk_scores.data(), p.first_window_chunk, p.num_kept_chunks - num_window_chunks);
  std::vector<int32_t> kept;
  for (int32_t i : chunks)
    for (int32_t j = i * c; j < (i + 1) * c; ++j) kept.push_back(j);
  // The window chunks' tokens before the window (the window itself is appended by the caller).
  for (int32_t j = p.first_window_chunk * c; j < scores.num_prefix; ++j) kept.push_back(j);
  return std::vector<std::vector<int32_t>>(static_cast<size_t>(scores.num_kv_heads), kept);
}

int64_t ChunkKvMethod::compressed_pages(const KvLayout& layout, int32_t num_prompt_tokens,
                                        int32_t num_decode_tokens) const {
  const int32_t kept =
      num_kept_tokens(num_prompt_tokens, window_config().budget, window_config().window, chunk_length_);
  return layout.pages_for_tokens(int64_t{kept} + num_decode_tokens);
}

}  // namespace se
