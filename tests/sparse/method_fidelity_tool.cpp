// method_fidelity_tool CASE.json OUT.json: drives one sparse method through the SparseController exactly as the
// model would (per layer: attend with the given post-RoPE q/k/v, then on_layer_end; prepare_step and
// finish_step around each step) on synthetic inputs, and reports what the method did, for the Python oracles
// of test_method_fidelity.py to check. "method" may also be snapkv_global, the prefix-pruning scorer.
//
// CASE: {"method", "config", "num_layers", "num_heads", "num_kv_heads", "head_dim", "page_size",
//        "steps": [n0, n1, ...] (tokens per forward; the first steps prefill "prefill_len" tokens),
//        "prefill_len", "data": path of f32 [per step][per layer] q [n,H,D], k [n,Hkv,D], v [n,Hkv,D],
//        optional: "token_ids": the token id of every step's rows, flat (default 0);
//        "passes": [per step] sizes of the transient passes the method runs in that step's finish_step; their
//        q/k/v follow the step's in "data", [per pass][per layer], and their outputs are not reported;
//        "encode": {text: ids} the tokenizer methods see (MethodEnvironment; absent = none), "chat_suffix"}
// The inputs tag every token: v[t, h, 0] holds the token's absolute position, so reading back the stored V
// shows which original tokens each stream kept after eviction.
// OUT: {"steps": [{"kept": [layer][head] positions in stream order,
//                  "selected": [layer][head] selected indices or null, "selection_unit": "token"|"page",
//                  "state": the method's debug_state after the step (null if it keeps none)}],
//       "outputs": path of f32 [per step][per layer] attention out [n,H,D],
//       "resident_pages": pages the sequence holds after each step, "reported_pages": what the method
//       reports for it (resident_pages of its memory model), "passes": [per step] token ids of each transient
//       pass, "pass_peak_pages": [per step] the most pages held during its passes, "transient_extra_tokens":
//       what the method declares for the prompt}
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "sparse/method_registry.h"
#include "sparse/prune/snapkv_global_scorer.h"
#include "sparse/sparse_controller.h"

namespace se {
namespace {

// Forwards every hook to the method and records the selections it builds.
class RecordingMethod final : public MethodRuntime {
 public:
  explicit RecordingMethod(MethodRuntime& inner)
      : MethodRuntime(std::string(inner.name()), inner.config()), inner_(inner) {
    traits_ = inner.traits();
  }
  Result<std::unique_ptr<CacheManager>> create_cache(const CacheSpec& spec) override {
    return inner_.create_cache(spec);
  }
  int64_t resident_pages(const KvLayout& l, int32_t p, int32_t n) const override {
    return inner_.resident_pages(l, p, n);
  }
  int32_t transient_extra_tokens(int32_t p) const override { return inner_.transient_extra_tokens(p); }
  void prepare_step(StepContext& ctx) override { inner_.prepare_step(ctx); }
  void build_layer_selection(LayerContext& ctx, Selection& sel) override {
    inner_.build_layer_selection(ctx, sel);
    for (int32_t slice = 0; slice < ctx.view.num_seqs; ++slice) record(ctx, slice, sel);
  }
  void on_attention_end(LayerContext& ctx) override { inner_.on_attention_end(ctx); }
  void on_layer_end(int layer, const ForwardBatch& batch, TensorView hidden) override {
    inner_.on_layer_end(layer, batch, hidden);
  }
  void finish_step(StepContext& ctx) override { inner_.finish_step(ctx); }
  void on_sequence_end(int32_t seq) override { inner_.on_sequence_end(seq); }
  DecodeReads decode_reads(int layer, int32_t window, const AttentionView& view, int32_t slice) const override {
    return inner_.decode_reads(layer, window, view, slice);
  }
  nlohmann::json debug_state(int32_t seq) const override { return inner_.debug_state(seq); }

  nlohmann::json selected = nlohmann::json::array();  // [layer][head] of the current step

 private:
  void record(const LayerContext& ctx, int32_t slice, const Selection& sel) {
    nlohmann::json heads = nullptr;
    if (sel.get(slice, 0)) {
      heads = nlohmann::json::array();
      for (int32_t h = 0; h < ctx.view.num_kv_heads; ++h) {
        const std::span<const int32_t> list = *sel.get(slice, h);
        heads.push_back(std::vector<int32_t>(list.begin(), list.end()));
      }
    }
    selected.push_back(heads);
  }
  MethodRuntime& inner_;
};

int run(const std::string& case_path, const std::string& out_path) {
  const nlohmann::json c = nlohmann::json::parse(std::ifstream(case_path));
  const int num_layers = c["num_layers"], num_heads = c["num_heads"], num_kv_heads = c["num_kv_heads"];
  const int head_dim = c["head_dim"];
  const int prefill_len = c["prefill_len"];
  MethodEnvironment environment;
  if (c.contains("encode")) {
    environment.encode = [vocab = c["encode"]](std::string_view text) {
      auto it = vocab.find(std::string(text));
      SE_CHECK(it != vocab.end(), "the case's \"encode\" has no entry for {}", nlohmann::json(text).dump());
      return it->get<std::vector<int32_t>>();
    };
  }
  environment.chat_suffix = c.value("chat_suffix", std::string("\n"));
  // The prefix-pruning scorer is no registered method; the tool drives it the same way.
  auto method = c["method"] == "snapkv_global"
                    ? Result<std::unique_ptr<MethodRuntime>>(std::make_unique<SnapKvGlobalScorer>(
                          c.value("config", nlohmann::json::object()).value("window", 32)))
                    : create_method(c["method"], c.value("config", nlohmann::json::object()), environment);
  if (!method.is_ok()) {
    std::cerr << method.status().to_string() << "\n";
    return 2;
  }
  RecordingMethod recorder(**method);
  KvLayout layout{num_layers, num_kv_heads, head_dim, c["page_size"], DType::kF32};
  auto cache = recorder.create_cache(CacheSpec{layout, 1 << 16, cpu_allocator(), false});
  SE_CHECK(cache.is_ok(), "{}", cache.status().to_string());
  SparseController controller(recorder, **cache);
  SE_CHECK(controller.open(0, {}).is_ok(), "open");

  std::ifstream data(c["data"].get<std::string>(), std::ios::binary);
  const std::string outputs_path = out_path + ".f32";
  std::ofstream outputs(outputs_path, std::ios::binary);
  nlohmann::json steps = nlohmann::json::array();
  nlohmann::json resident = nlohmann::json::array(), reported = nlohmann::json::array();
  std::vector<LayerConfig> layer_configs(static_cast<size_t>(num_layers));
  // Per layer: the scale, and the case's sliding window (0 = full attention).
  const std::vector<int> windows = c.value("sliding_windows", std::vector<int>(static_cast<size_t>(num_layers), 0));
  SE_CHECK(static_cast<int>(windows.size()) == num_layers, "sliding_windows: {} entries for {} layers",
           windows.size(), num_layers);
  std::vector<AttentionParams> layer_params(static_cast<size_t>(num_layers));
  for (int layer = 0; layer < num_layers; ++layer) {
    layer_params[static_cast<size_t>(layer)].scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    layer_params[static_cast<size_t>(layer)].sliding_window = windows[static_cast<size_t>(layer)];
  }
  const std::vector<int32_t> token_ids = c.value("token_ids", std::vector<int32_t>{});
  const nlohmann::json expected_passes = c.value("passes", nlohmann::json::array());
  auto read_layer = [&](int n, Tensor& q, Tensor& k, Tensor& v) {
    q = Tensor::empty(DType::kF32, {n, num_heads, head_dim});
    k = Tensor::empty(DType::kF32, {n, num_kv_heads, head_dim});
    v = Tensor::empty(DType::kF32, {n, num_kv_heads, head_dim});
    for (Tensor* t : {&q, &k, &v})
      data.read(reinterpret_cast<char*>(t->data<float>()), static_cast<std::streamsize>(t->numel() * 4));
    SE_CHECK(data.good(), "case data ends early");
  };
  // Transient passes: the next q/k/v of the case, layer by layer, as the model would produce them.
  size_t step_index = 0, pass_index = 0;
  nlohmann::json step_passes = nlohmann::json::array();
  int64_t pass_peak_pages = 0;
  // Every layer of one forward, as the model runs them, fed from the case data; outputs go to `sink` if given.
  auto forward_layers = [&](const ForwardBatch& batch, std::ofstream* sink) {
    const int n = batch.num_tokens();
    Tensor hidden = Tensor::empty(DType::kF32, {n, 1});
    controller.begin_forward(batch);
    for (int layer = 0; layer < num_layers; ++layer) {
      Tensor q, k, v;
      read_layer(n, q, k, v);
      Tensor out = Tensor::empty(DType::kF32, {n, num_heads, head_dim});
      controller.attend(layer, layer_configs[static_cast<size_t>(layer)], batch, q.view(), k.view(), v.view(),
                        out.view(), layer_params[static_cast<size_t>(layer)]);
      controller.on_layer_end(layer, batch, hidden.view());
      if (sink != nullptr)
        sink->write(reinterpret_cast<const char*>(out.data<float>()), static_cast<std::streamsize>(out.numel() * 4));
    }
  };
  controller.set_pass_forward([&](const ForwardBatch& batch) {
    const int n = batch.num_tokens();
    const nlohmann::json want =
        step_index < expected_passes.size() ? expected_passes[step_index] : nlohmann::json::array();
    SE_CHECK(pass_index < want.size() && want[pass_index].get<int>() == n,
             "step {}: the method runs transient pass {} of {} tokens; the case lists {}", step_index, pass_index, n,
             want.dump());
    ++pass_index;
    step_passes.push_back(batch.token_ids);
    pass_peak_pages = std::max(pass_peak_pages, (*cache)->num_held_pages(0));
    forward_layers(batch, nullptr);
  });
  nlohmann::json passes = nlohmann::json::array(), peaks = nlohmann::json::array();
  int32_t position = 0;
  for (int n : c["steps"]) {
    SE_CHECK((*cache)->reserve(0, n).is_ok(), "reserve {}", n);
    ForwardBatch batch;
    batch.sequences.push_back({0, 0, n, prefill_len});
    for (int i = 0; i < n; ++i) {
      const auto at = static_cast<size_t>(position + i);
      batch.token_ids.push_back(at < token_ids.size() ? token_ids[at] : 0);
      batch.positions.push_back(position + i);
    }
    recorder.selected = nlohmann::json::array();
    controller.prepare_step(batch);
    forward_layers(batch, &outputs);
    pass_index = 0;
    step_passes = nlohmann::json::array();
    pass_peak_pages = 0;
    controller.finish_step(batch);
    const size_t num_expected = step_index < expected_passes.size() ? expected_passes[step_index].size() : 0;
    SE_CHECK(pass_index == num_expected, "step {}: the method ran {} transient passes, the case lists {}",
             step_index, pass_index, num_expected);
    passes.push_back(step_passes);
    peaks.push_back(pass_peak_pages);
    ++step_index;
    position += n;
    (*cache)->on_computed(0, std::vector<int32_t>(static_cast<size_t>(position), 0), position);

    nlohmann::json kept = nlohmann::json::array();
    for (int layer = 0; layer < num_layers; ++layer) {
      const AttentionView view = (*cache)->build_sequence_view(0, layer);
      nlohmann::json heads = nlohmann::json::array();
      for (int h = 0; h < num_kv_heads; ++h) {
        const int32_t* pages = view.seqs[0].page_ids + static_cast<int64_t>(h) * view.seqs[0].stride;
        std::vector<int32_t> positions;
        for (int32_t j = 0; j < view.seqs[0].num_tokens[h]; ++j)
          positions.push_back(static_cast<int32_t>(
              view.element<float>(pages[j / view.page_size], 1, j % view.page_size)[0]));
        heads.push_back(positions);
      }
      kept.push_back(heads);
    }
    steps.push_back({{"kept", kept}, {"selected", recorder.selected}, {"state", recorder.debug_state(0)}});
    resident.push_back((*cache)->num_held_pages(0));
    reported.push_back(recorder.resident_pages(layout, prefill_len, position));
    SE_CHECK((*cache)->check_integrity().is_ok(), "{}", (*cache)->check_integrity().to_string());
  }
  controller.close(0);
  SE_CHECK((*cache)->check_integrity().is_ok(), "after close: {}", (*cache)->check_integrity().to_string());
  SE_CHECK((*cache)->num_free_pages() == (*cache)->num_total_pages(), "pages leaked after close");
  nlohmann::json out = {{"steps", steps},
                        {"outputs", outputs_path},
                        {"selection_unit", recorder.traits().selection_unit == SelectionUnit::kPage ? "page" : "token"},
                        {"resident_pages", resident},
                        {"reported_pages", reported},
                        {"passes", passes},
                        {"pass_peak_pages", peaks},
                        {"transient_extra_tokens", recorder.transient_extra_tokens(prefill_len)}};
  std::ofstream(out_path) << out.dump();
  return 0;
}

}  // namespace
}  // namespace se

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: method_fidelity_tool CASE.json OUT.json\n";
    return 2;
  }
  return se::run(argv[1], argv[2]);
}
