#include "loader/safetensors_file.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "base/mapped_file.h"

namespace se {

namespace {

using nlohmann::json;

// Headers of real checkpoints are a few MB at most; the reference implementation caps them at 100
// MB.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

std::optional<size_t> dtype_bytes(std::string_view dtype) {
  static const std::map<std::string_view, size_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  auto it = kSizes.find(dtype);
  if (it == kSizes.end()) return std::nullopt;
  return it->second;
}

}  // namespace

std::optional<DType> safetensors_dtype(std::string_view dtype) {
  if (dtype == "F32") return DType::kF32;
  if (dtype == "F16") return DType::kF16;
  if (dtype == "BF16") return DType::kBF16;
  if (dtype == "I32") return DType::kI32;
  if (dtype == "I64") return DType::kI64;
  if (dtype == "U8") return DType::kU8;
  if (dtype == "I8") return DType::kI8;
  return std::nullopt;
}

int64_t SafetensorsTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

class SafetensorsParser {
 public:
  SafetensorsParser(std::span<const uint8_t> bytes, const std::string& name)
      : bytes_(bytes), name_(name) {}

  Result<SafetensorsFile> run(std::shared_ptr<const void> owner) {
    SafetensorsFile file;
    file.owner_ = std::move(owner);
    file.path_ = name_;
    if (bytes_.size() < 8) {
      return data_loss("{}: truncated: {} bytes, too short for the 8-byte header length", name_,
                       bytes_.size());
    }
    uint64_t header_len;
    std::memcpy(&header_len, bytes_.data(), 8);
    if (header_len > kMaxHeaderBytes) {
      return data_loss("{}: header length {} is over the {}-byte limit (corrupted file?)", name_,
                       header_len, kMaxHeaderBytes);
    }
    if (header_len > bytes_.size() - 8) {
      return data_loss("{}: truncated: header claims {} bytes but only {} follow", name_,
                       header_len, bytes_.size() - 8);
    }
    const auto* begin = reinterpret_cast<const char*>(bytes_.data() + 8);
    json header = json::parse(begin, begin + header_len, nullptr, /*allow_exceptions=*/false);
    if (header.is_discarded()) return invalid_argument("{}: header is not valid JSON", name_);
    if (!header.is_object()) return invalid_argument("{}: header must be a JSON object", name_);
    data_ = bytes_.subspan(8 + header_len);
    for (auto& [key, value] : header.items()) {
      if (key == "__metadata__") {
        SE_RETURN_IF_ERROR(read_metadata(value, file));
        continue;
      }
      SE_ASSIGN_OR_RETURN(SafetensorsTensorInfo t, read_tensor(key, value));
      file.index_.emplace(t.name, file.tensors_.size());
      file.tensors_.push_back(std::move(t));
    }
    SE_RETURN_IF_ERROR(check_overlap(file));
    return file;
  }

 private:
  Status read_metadata(const json& value, SafetensorsFile& file) {
    if (!value.is_object())
      return invalid_argument("{}: \"__metadata__\" must be an object", name_);
    for (auto& [k, v] : value.items()) {
      if (!v.is_string())
        return invalid_argument("{}: \"__metadata__\" value of \"{}\" must be a string", name_, k);
      file.metadata_[k] = v.get<std::string>();
    }
    return Status::ok();
  }

  Result<SafetensorsTensorInfo> read_tensor(const std::string& key, const json& value) {
    SafetensorsTensorInfo t;
    t.name = key;
    if (!value.is_object())
      return invalid_argument("{}: entry for tensor '{}' must be an object", name_, key);
    auto dtype = value.find("dtype");
    if (dtype == value.end() || !dtype->is_string()) {
      return invalid_argument("{}: tensor '{}' has no string \"dtype\"", name_, key);
    }
    t.dtype = dtype->get<std::string>();
    std::optional<size_t> esize = dtype_bytes(t.dtype);
    if (!esize)
      return invalid_argument("{}: tensor '{}' has unknown dtype \"{}\"", name_, key, t.dtype);
    auto shape = value.find("shape");
    if (shape == value.end() || !shape->is_array() || shape->size() > 8) {
      return invalid_argument("{}: tensor '{}' needs a \"shape\" array of at most 8 dims", name_,
                              key);
    }
    uint64_t numel = 1;
    for (const json& d : *shape) {
      if (!d.is_number_unsigned()) {
        return invalid_argument("{}: tensor '{}' shape entries must be non-negative integers",
                                name_, key);
      }
      const uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / dim) {
        return invalid_argument("{}: tensor '{}' element count overflows", name_, key);
      }
      numel *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    auto offsets = value.find("data_offsets");
    if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      return invalid_argument("{}: tensor '{}' needs \"data_offsets\": [begin, end]", name_, key);
    }
    t.begin = (*offsets)[0].get<uint64_t>();
    t.end = (*offsets)[1].get<uint64_t>();
    if (t.begin > t.end || t.end > data_.size()) {
      return data_loss("{}: tensor '{}' byte range [{}, {}) is outside the {}-byte data section",
                       name_, key, t.begin, t.end, data_.size());
    }
    if (numel > std::numeric_limits<uint64_t>::max() / *esize ||
        numel * *esize != t.end - t.begin) {
      return data_loss("{}: tensor '{}' of {} {} needs {} bytes but its range holds {}", name_, key,
                       fmt::format("{}", fmt::join(t.shape, "x")), t.dtype, numel * *esize,
                       t.end - t.begin);
    }
    t.data = data_.data() + t.begin;
    return t;
  }

  Status check_overlap(const SafetensorsFile& file) {
    std::vector<size_t> order(file.tensors_.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return file.tensors_[a].begin < file.tensors_[b].begin; });
    // Empty tensors occupy no bytes; every other tensor must start at or after the furthest end so
    // far.
    const SafetensorsTensorInfo* furthest = nullptr;
    for (size_t i : order) {
      const SafetensorsTensorInfo& cur = file.tensors_[i];
      if (cur.begin == cur.end) continue;
      if (furthest != nullptr && furthest->end > cur.begin) {
        return data_loss("{}: tensors '{}' and '{}' overlap", name_, furthest->name, cur.name);
      }
      if (furthest == nullptr || cur.end > furthest->end) furthest = &cur;
    }
    return Status::ok();
  }

  std::span<const uint8_t> bytes_;
  std::span<const uint8_t> data_;
  const std::string& name_;
};

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  SE_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::open(path));
  auto mapping = std::make_shared<const MappedFile>(std::move(mapped));
  return parse(mapping, mapping->bytes(), path);
}

Result<SafetensorsFile> SafetensorsFile::parse(std::shared_ptr<const void> owner,
                                               std::span<const uint8_t> bytes,
                                               const std::string& name) {
  return SafetensorsParser(bytes, name).run(std::move(owner));
}

const SafetensorsTensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Result<Tensor> SafetensorsFile::load(std::string_view name) const {
  const SafetensorsTensorInfo* t = find(name);
  if (t == nullptr) return not_found("{}: no tensor '{}'", path_, name);
  std::optional<DType> dtype = safetensors_dtype(t->dtype);
  if (!dtype)
    return unimplemented("{}: tensor '{}' has dtype {}, which cannot be loaded", path_, name,
                         t->dtype);
  if (t->shape.size() > static_cast<size_t>(Shape::kMaxDims)) {
    return unimplemented("{}: tensor '{}' has {} dims (max {})", path_, name, t->shape.size(),
                         Shape::kMaxDims);
  }
  Tensor out = Tensor::empty(*dtype, Shape(t->shape.begin(), t->shape.end()));
  std::memcpy(out.raw(), t->data, t->end - t->begin);
  return out;
}

Result<SafetensorsCheckpoint> SafetensorsCheckpoint::open_files(
    const std::vector<std::string>& paths) {
  SafetensorsCheckpoint ckpt;
  for (const std::string& path : paths) {
    SE_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path));
    for (const SafetensorsTensorInfo& t : file.tensors()) {
      if (!ckpt.where_.emplace(t.name, ckpt.files_.size()).second) {
        return data_loss("{}: tensor '{}' also appears in {}", path, t.name,
                         ckpt.files_[ckpt.where_.find(t.name)->second].path());
      }
    }
    ckpt.files_.push_back(std::move(file));
  }
  return ckpt;
}

Result<SafetensorsCheckpoint> SafetensorsCheckpoint::open_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    SE_ASSIGN_OR_RETURN(std::string text, read_file(index_path.string()));
    json index = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
        !index["weight_map"].is_object()) {
      return invalid_argument("{}: expected a JSON object with a \"weight_map\" object",
                              index_path.string());
    }
    std::vector<std::string> shards;
    std::set<std::string> seen;
    for (auto& [tensor, file] : index["weight_map"].items()) {
      if (!file.is_string()) {
        return invalid_argument("{}: weight_map entry for '{}' must be a file name",
                                index_path.string(), tensor);
      }
      const std::string name = file.get<std::string>();
      // Shards must sit beside the index: no directories, no "..".
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
        return invalid_argument("{}: weight_map names shard \"{}\", which is not a plain file name",
                                index_path.string(), name);
      }
      if (seen.insert(name).second) shards.push_back((fs::path(dir) / name).string());
    }
    SE_ASSIGN_OR_RETURN(SafetensorsCheckpoint ckpt, open_files(shards));
    for (auto& [tensor, file] : index["weight_map"].items()) {
      const SafetensorsFile* holder = ckpt.file_of(tensor);
      if (holder == nullptr || fs::path(holder->path()).filename() != file.get<std::string>()) {
        return data_loss("{}: weight_map puts '{}' in {}, but that shard does not hold it",
                         index_path.string(), tensor, file.get<std::string>());
      }
    }
    return ckpt;
  }
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(single)) return open_files({single.string()});
  std::vector<std::string> all;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".safetensors") all.push_back(entry.path().string());
  }
  if (ec) return not_found("{}: cannot list directory: {}", dir, ec.message());
  if (all.empty()) return not_found("{}: no model.safetensors, index, or *.safetensors file", dir);
  std::sort(all.begin(), all.end());
  return open_files(all);
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, idx] : where_) out.push_back(name);
  return out;
}

const SafetensorsFile* SafetensorsCheckpoint::file_of(std::string_view name) const {
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : &files_[it->second];
}

Result<Tensor> SafetensorsCheckpoint::load(std::string_view name) const {
  const SafetensorsFile* file = file_of(name);
  if (file == nullptr) return not_found("no tensor '{}' in the checkpoint", name);
  return file->load(name);
}

}  // namespace se
