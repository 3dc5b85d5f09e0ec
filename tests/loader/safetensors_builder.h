// Writes small .safetensors files and HF model directories for tests. Test-only; not thread-safe.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace se::testing {

inline std::string safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU8:
      return "U8";
    case DType::kI8:
      return "I8";
  }
  return "?";
}

// The bytes of a safetensors file holding `tensors` (name order), with a metadata entry. Tensors named in `fp8`
// hold e4m3 codes (U8) and are written as F8_E4M3.
inline std::vector<uint8_t> safetensors_bytes(const std::map<std::string, Tensor>& tensors,
                                              const std::set<std::string>& fp8 = {}) {
  nlohmann::json header = {{"__metadata__", {{"format", "pt"}}}};
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    std::vector<int64_t> shape;
    for (int i = 0; i < t.rank(); ++i) shape.push_back(t.dim(i));
    header[name] = {{"dtype", fp8.count(name) != 0 ? "F8_E4M3" : safetensors_dtype_name(t.dtype())},
                    {"shape", shape},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  const std::string text = header.dump();
  std::vector<uint8_t> out(8);
  const uint64_t len = text.size();
  std::memcpy(out.data(), &len, 8);
  out.resize(8 + text.size());  // (not insert(): GCC 12 warns falsely on it)
  std::memcpy(out.data() + 8, text.data(), text.size());
  for (const auto& [name, t] : tensors) {
    const auto* p = static_cast<const uint8_t*>(t.raw());
    out.insert(out.end(), p, p + t.nbytes());
  }
  return out;
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

// A fresh directory `name` under the scratch dir with config.json and model.safetensors.
inline std::string write_hf_dir(const std::string& dir, const nlohmann::json& config,
                                const std::map<std::string, Tensor>& weights) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  write_text(dir + "/config.json", config.dump(2));
  write_bytes(dir + "/model.safetensors", safetensors_bytes(weights));
  return dir;
}

// An f32 tensor of `shape` with values start, start + step, ...
inline Tensor ramp(Shape shape, float start = 0.0f, float step = 1.0f) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = start + step * static_cast<float>(i);
  return t;
}

}  // namespace se::testing
