// GgufBuilder: writes small GGUF v3 files for tests (metadata of any type, tensors with given raw
// bytes). Test-only helper; not thread-safe.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "loader/gguf_file.h"

namespace se::testing {

class GgufBuilder {
 public:
  // A raw key/value: the value's encoding after its type tag.
  GgufBuilder& add_raw(const std::string& key, GgufValueType type,
                       const std::vector<uint8_t>& payload) {
    kv_.push_back({key, type, payload});
    return *this;
  }
  template <typename T>
  GgufBuilder& add_scalar(const std::string& key, GgufValueType type, T value) {
    std::vector<uint8_t> p(sizeof(T));
    std::memcpy(p.data(), &value, sizeof(T));
    return add_raw(key, type, p);
  }
  GgufBuilder& add_u32(const std::string& key, uint32_t v) {
    return add_scalar(key, GgufValueType::kU32, v);
  }
  GgufBuilder& add_i32(const std::string& key, int32_t v) {
    return add_scalar(key, GgufValueType::kI32, v);
  }
  GgufBuilder& add_f32(const std::string& key, float v) {
    return add_scalar(key, GgufValueType::kF32, v);
  }
  GgufBuilder& add_bool(const std::string& key, bool v) {
    return add_scalar(key, GgufValueType::kBool, static_cast<uint8_t>(v));
  }
  GgufBuilder& add_string(const std::string& key, const std::string& v) {
    std::vector<uint8_t> p;
    append_string(p, v);
    return add_raw(key, GgufValueType::kString, p);
  }
  GgufBuilder& add_string_array(const std::string& key, const std::vector<std::string>& v) {
    std::vector<uint8_t> p = array_header(GgufValueType::kString, v.size());
    for (const std::string& s : v) append_string(p, s);
    return add_raw(key, GgufValueType::kArray, p);
  }
  template <typename T>
  GgufBuilder& add_array(const std::string& key, GgufValueType elem, const std::vector<T>& v) {
    std::vector<uint8_t> p = array_header(elem, v.size());
    append_pod(p, v.data(), v.size() * sizeof(T));
    return add_raw(key, GgufValueType::kArray, p);
  }
  // dims in ggml order (ne0 first); `bytes` must have the type's exact size.
  GgufBuilder& add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& dims,
                          const std::vector<uint8_t>& bytes) {
    tensors_.push_back({name, type, dims, bytes});
    return *this;
  }
  GgufBuilder& add_f32_tensor(const std::string& name, const std::vector<int64_t>& dims,
                              const std::vector<float>& values) {
    std::vector<uint8_t> b(values.size() * 4);
    if (!b.empty()) std::memcpy(b.data(), values.data(), b.size());  // no null pointers for an empty tensor
    return add_tensor(name, GgmlType::kF32, dims, b);
  }

  static std::vector<uint8_t> array_header(GgufValueType elem, uint64_t count) {
    std::vector<uint8_t> p;
    const uint32_t tag = static_cast<uint32_t>(elem);
    append_pod(p, &tag, 4);
    append_pod(p, &count, 8);
    return p;
  }
  static void append_pod(std::vector<uint8_t>& out, const void* data, size_t n) {
    const auto* b = static_cast<const uint8_t*>(data);
    out.insert(out.end(), b, b + n);
  }
  static void append_string(std::vector<uint8_t>& out, const std::string& s) {
    const uint64_t n = s.size();
    append_pod(out, &n, 8);
    append_pod(out, s.data(), s.size());
  }

  // alignment must match a general.alignment entry if one was added.
  std::vector<uint8_t> build(uint32_t alignment = GgufFile::kDefaultAlignment) const {
    std::vector<uint8_t> out;
    const uint32_t magic = 0x46554747, version = 3;
    append_pod(out, &magic, 4);
    append_pod(out, &version, 4);
    const uint64_t num_tensors = tensors_.size(), num_kv = kv_.size();
    append_pod(out, &num_tensors, 8);
    append_pod(out, &num_kv, 8);
    for (const Kv& kv : kv_) {
      append_string(out, kv.key);
      const uint32_t tag = static_cast<uint32_t>(kv.type);
      append_pod(out, &tag, 4);
      out.insert(out.end(), kv.payload.begin(), kv.payload.end());
    }
    uint64_t offset = 0;
    for (const TensorEntry& t : tensors_) {
      append_string(out, t.name);
      const uint32_t num_dims = static_cast<uint32_t>(t.dims.size());
      append_pod(out, &num_dims, 4);
      for (int64_t d : t.dims) append_pod(out, &d, 8);
      const uint32_t type = static_cast<uint32_t>(t.type);
      append_pod(out, &type, 4);
      append_pod(out, &offset, 8);
      offset += (t.bytes.size() + alignment - 1) / alignment * alignment;
    }
    out.resize((out.size() + alignment - 1) / alignment * alignment, 0);
    for (const TensorEntry& t : tensors_) {
      out.insert(out.end(), t.bytes.begin(), t.bytes.end());
      out.resize((out.size() + alignment - 1) / alignment * alignment, 0);
    }
    return out;
  }

  void write(const std::string& path, uint32_t alignment = GgufFile::kDefaultAlignment) const {
    std::vector<uint8_t> bytes = build(alignment);
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }

 private:
  struct Kv {
    std::string key;
    GgufValueType type;
    std::vector<uint8_t> payload;
  };
  struct TensorEntry {
    std::string name;
    GgmlType type;
    std::vector<int64_t> dims;
    std::vector<uint8_t> bytes;
  };
  std::vector<Kv> kv_;
  std::vector<TensorEntry> tensors_;
};

}  // namespace se::testing
