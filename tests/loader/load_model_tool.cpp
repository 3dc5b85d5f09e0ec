// load_model_tool PATH FORMAT OUT.json: loads a model with load_model (FORMAT: auto, gguf, hf,
// dummy) and writes its config plus, per weight, shape, dtype, an FNV-1a hash of the bytes and
// value sums. Used by the Python tests that compare load paths (GGUF vs converted HF directory vs
// F32 copy).
#include <cmath>
#include <cstdio>
#include <fstream>

#include "model/model_loader.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s PATH FORMAT OUT.json\n", argv[0]);
    return 2;
  }
  auto format = se::parse_load_format(argv[2]);
  if (!format.is_ok()) {
    std::fprintf(stderr, "%s\n", format.status().to_string().c_str());
    return 2;
  }
  se::LoadOptions options;
  options.format = *format;
  auto model = se::load_model(argv[1], options);
  if (!model.is_ok()) {
    std::fprintf(stderr, "%s\n", model.status().to_string().c_str());
    return 1;
  }
  nlohmann::json out = {{"config", model->hf_config}, {"source_format", model->source_format}};
  for (const auto& [name, t] : model->weights) {
    uint64_t hash = 0xcbf29ce484222325ull;
    const auto* bytes = static_cast<const uint8_t*>(t.raw());
    for (size_t i = 0; i < t.nbytes(); ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ull;
    se::Tensor f = t.to_f32();
    double sum = 0, abs_sum = 0;
    for (int64_t i = 0; i < f.numel(); ++i) {
      sum += f.data<float>()[i];
      abs_sum += std::fabs(f.data<float>()[i]);
    }
    std::vector<int64_t> shape;
    for (int i = 0; i < t.rank(); ++i) shape.push_back(t.dim(i));
    out["weights"][name] = {{"shape", shape},
                            {"dtype", se::dtype_name(t.dtype())},
                            {"hash", fmt::format("{:016x}", hash)},
                            {"sum", sum},
                            {"abs_sum", abs_sum}};
  }
  std::ofstream(argv[3]) << out.dump(1);
  return 0;
}
