// SafetensorsFile: one validated .safetensors file (8-byte header length, JSON header, data),
// mmapped. SafetensorsCheckpoint: the tensors of a single file or of shards listed by
// model.safetensors.index.json. open() checks every dtype, shape and byte range against the file,
// so the accessors never read out of bounds. Immutable after open(): safe to share between threads.
// Tensor bytes live as long as any copy of the object.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "tensor/tensor.h"

namespace se {

struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype;           // as written: "F32", "BF16", "I64", ...
  std::vector<int64_t> shape;  // row-major, last dimension contiguous
  uint64_t begin = 0;          // byte range within the data section
  uint64_t end = 0;
  const uint8_t* data = nullptr;  // into the mapping

  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps and validates `path`. Errors name the file and what is wrong (kDataLoss for truncation or
  // inconsistent ranges, kInvalidArgument for a malformed header).
  static Result<SafetensorsFile> open(const std::string& path);
  // Parses bytes kept alive by `owner` (the fuzzer passes a buffer); `name` appears in error
  // messages.
  static Result<SafetensorsFile> parse(std::shared_ptr<const void> owner,
                                       std::span<const uint8_t> bytes, const std::string& name);

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  const SafetensorsTensorInfo* find(std::string_view name) const;
  // The optional "__metadata__" string map.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // A CPU copy of tensor `name` in its own dtype (F32, F16, BF16, I32, I64, U8, I8); kNotFound when
  // absent, kUnimplemented for other dtypes (F64, F8_*, ...).
  Result<Tensor> load(std::string_view name) const;

 private:
  friend class SafetensorsParser;

  std::shared_ptr<const void> owner_;
  std::string path_;
  std::vector<SafetensorsTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

class SafetensorsCheckpoint {
 public:
  // `dir`/model.safetensors.index.json when present (shards named in its weight_map, plain file
  // names only); else `dir`/model.safetensors; else every *.safetensors file in `dir`. Tensor names
  // must be unique.
  static Result<SafetensorsCheckpoint> open_dir(const std::string& dir);
  // Exactly these files.
  static Result<SafetensorsCheckpoint> open_files(const std::vector<std::string>& paths);

  bool contains(std::string_view name) const { return where_.count(name) != 0; }
  std::vector<std::string> names() const;
  // The file holding `name` and its info; nullptr when absent.
  const SafetensorsFile* file_of(std::string_view name) const;
  Result<Tensor> load(std::string_view name) const;
  const std::vector<SafetensorsFile>& files() const { return files_; }

 private:
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t, std::less<>> where_;  // tensor name -> index in files_
};

// The DType of a safetensors dtype string, or nullopt for those Tensor cannot hold.
std::optional<DType> safetensors_dtype(std::string_view dtype);

}  // namespace se
