// GgufFile: a parsed, validated GGUF (v2/v3) file: metadata key/values, tensor infos, and the
// mmapped bytes. open() checks every length, count, offset and alignment against the file size, so
// the accessors never read out of bounds. Strings, arrays and tensor bytes point into the shared
// read-only mapping, which lives as long as any copy of the GgufFile (or a Tensor owning owner()).
// Immutable after open(): safe to share between threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "loader/ggml_type.h"

namespace se {

// Values match gguf's `enum gguf_type`.
enum class GgufValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// "UINT32", "STRING", ...; "type N" for an unknown tag.
std::string_view gguf_value_type_name(GgufValueType type);
// Encoded size of a scalar type; 0 for STRING, ARRAY and unknown tags.
size_t gguf_scalar_size(GgufValueType type);

// One metadata value, viewing the file's bytes. Scalars decode on request; arrays expose their
// element type, count and raw payload (an array of strings or arrays has a variable-size payload,
// walked on request).
class GgufValue {
 public:
  GgufValue() = default;
  GgufValue(GgufValueType type, const uint8_t* payload, size_t nbytes,
            GgufValueType elem_type = GgufValueType::kU8, uint64_t count = 0)
      : type_(type), payload_(payload), nbytes_(nbytes), elem_type_(elem_type), count_(count) {}

  GgufValueType type() const { return type_; }
  bool is_array() const { return type_ == GgufValueType::kArray; }
  // Arrays only: the element type and number of elements.
  GgufValueType elem_type() const { return elem_type_; }
  uint64_t count() const { return count_; }
  // The encoded payload (after the type tag; for arrays, after element type and count).
  const uint8_t* payload() const { return payload_; }
  size_t nbytes() const { return nbytes_; }

  // Scalar conversions; nullopt when the type does not convert or the value does not fit.
  std::optional<uint64_t> to_u64() const;             // any integer type, non-negative
  std::optional<int64_t> to_i64() const;              // any integer type
  std::optional<double> to_f64() const;               // any float or integer type
  std::optional<bool> to_bool() const;                // bool only
  std::optional<std::string_view> to_string() const;  // string only

  // Flat arrays; nullopt when this is not an array of a compatible element type.
  std::optional<std::vector<std::string>> to_string_array() const;
  std::optional<std::vector<float>> to_f32_array() const;    // F32/F64 elements
  std::optional<std::vector<int32_t>> to_i32_array() const;  // integer elements that fit in int32
  std::optional<std::vector<int64_t>> to_i64_array() const;  // integer elements that fit in int64

  // A short rendering for messages and tools: scalars in full, strings quoted, arrays as "[STRING x
  // 49152]".
  std::string describe() const;

 private:
  GgufValueType type_ = GgufValueType::kU8;
  const uint8_t* payload_ = nullptr;
  size_t nbytes_ = 0;
  GgufValueType elem_type_ = GgufValueType::kU8;
  uint64_t count_ = 0;
};

struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t>
      dims;             // ggml order: dims[0] (ne0) is the fastest-varying, i.e. the row length
  uint64_t offset = 0;  // from the start of the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the mapping; valid while any copy of the GgufFile lives

  int64_t numel() const;
};

class GgufFile {
 public:
  static constexpr uint32_t kDefaultAlignment = 32;

  // Maps and validates `path`. Errors name the file and what is wrong: kNotFound (no file),
  // kDataLoss (truncated or inconsistent), kInvalidArgument (not GGUF), kUnimplemented (version 1,
  // unknown tensor type).
  static Result<GgufFile> open(const std::string& path);
  // Parses bytes kept alive by `owner` (open() passes its mapping; the fuzzer a buffer); `name`
  // appears in error messages.
  static Result<GgufFile> parse(std::shared_ptr<const void> owner, std::span<const uint8_t> bytes,
                                const std::string& name);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  // Byte offset of the tensor data section in the file.
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return bytes_.size(); }
  // Keeps the file's bytes alive: pass it as the owner of Tensors that wrap tensor data.
  const std::shared_ptr<const void>& owner() const { return owner_; }

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;

  // Typed lookups: nullopt when the key is absent or its value does not convert (see GgufValue).
  std::optional<std::string> find_string(std::string_view key) const;
  std::optional<uint32_t> find_u32(std::string_view key) const;
  std::optional<int64_t> find_i64(std::string_view key) const;
  std::optional<float> find_f32(std::string_view key) const;
  std::optional<bool> find_bool(std::string_view key) const;
  std::optional<std::vector<std::string>> find_string_array(std::string_view key) const;
  std::optional<std::vector<float>> find_f32_array(std::string_view key) const;
  std::optional<std::vector<int32_t>> find_i32_array(std::string_view key) const;

  // Required lookups: kNotFound naming file and key when absent, kInvalidArgument when of the wrong
  // type.
  Result<std::string> get_string(std::string_view key) const;
  Result<uint32_t> get_u32(std::string_view key) const;
  Result<float> get_f32(std::string_view key) const;

  // general.architecture, or "" when absent.
  std::string architecture() const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;

 private:
  friend class GgufParser;

  std::shared_ptr<const void> owner_;
  std::span<const uint8_t> bytes_;
  std::string path_;
  uint32_t version_ = 0;
  uint32_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::map<std::string, size_t, std::less<>> metadata_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace se
