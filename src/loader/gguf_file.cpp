// GGUF parsing: a bounds-checked cursor over the file bytes. Every count read from the file is
// checked against the bytes that remain before anything is reserved, so a corrupted count cannot
// trigger a huge allocation.
#include "loader/gguf_file.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include "base/mapped_file.h"

namespace se {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint32_t kMaxDims = 4;         // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 8;        // nested arrays are legal but never deep in practice
constexpr uint32_t kMaxValueType = static_cast<uint32_t>(GgufValueType::kF64);

uint32_t byteswap32(uint32_t v) {
  return (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
}

}  // namespace

class GgufParser {
 public:
  GgufParser(std::span<const uint8_t> bytes, const std::string& name)
      : bytes_(bytes), name_(name) {}

  Result<GgufFile> run(std::shared_ptr<const void> owner) {
    GgufFile file;
    file.owner_ = std::move(owner);
    file.bytes_ = bytes_;
    file.path_ = name_;
    SE_RETURN_IF_ERROR(read_header(file));
    SE_ASSIGN_OR_RETURN(uint64_t num_tensors, read_u64("tensor count"));
    SE_ASSIGN_OR_RETURN(uint64_t num_kv, read_u64("metadata count"));
    SE_RETURN_IF_ERROR(read_metadata(file, num_kv));
    SE_RETURN_IF_ERROR(read_alignment(file));
    SE_RETURN_IF_ERROR(read_tensor_infos(file, num_tensors));
    SE_RETURN_IF_ERROR(place_tensors(file));
    return file;
  }

 private:
  size_t remaining() const { return bytes_.size() - pos_; }

  Status truncated(std::string_view what, uint64_t need) const {
    return data_loss("{}: truncated: {} needs {} bytes at offset {} but the file has {} bytes",
                     name_, what, need, pos_, bytes_.size());
  }

  template <typename T>
  Result<T> read_scalar(std::string_view what) {
    if (remaining() < sizeof(T)) return truncated(what, sizeof(T));
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  Result<uint32_t> read_u32(std::string_view what) { return read_scalar<uint32_t>(what); }
  Result<uint64_t> read_u64(std::string_view what) { return read_scalar<uint64_t>(what); }

  Result<std::string_view> read_string(std::string_view what) {
    SE_ASSIGN_OR_RETURN(uint64_t len, read_u64(what));
    if (len > remaining()) return truncated(what, len);
    std::string_view s(reinterpret_cast<const char*>(bytes_.data() + pos_), len);
    pos_ += len;
    return s;
  }

  Status read_header(GgufFile& file) {
    SE_ASSIGN_OR_RETURN(uint32_t magic, read_u32("magic"));
    if (magic != kMagic) {
      return invalid_argument("{}: not a GGUF file (magic 0x{:08x}, expected \"GGUF\")", name_,
                              magic);
    }
    SE_ASSIGN_OR_RETURN(uint32_t version, read_u32("version"));
    if (version == 1)
      return unimplemented("{}: GGUF version 1 is not supported (only 2 and 3)", name_);
    if (byteswap32(version) == 2 || byteswap32(version) == 3) {
      return unimplemented("{}: big-endian GGUF files are not supported", name_);
    }
    if (version != 2 && version != 3)
      return invalid_argument("{}: unknown GGUF version {}", name_, version);
    file.version_ = version;
    return Status::ok();
  }

  Result<GgufValueType> read_value_type(std::string_view what) {
    SE_ASSIGN_OR_RETURN(uint32_t tag, read_u32(what));
    if (tag > kMaxValueType) return data_loss("{}: {} has unknown value type {}", name_, what, tag);
    return static_cast<GgufValueType>(tag);
  }

  // Reads one value of `type` at the cursor; `what` names it in errors.
  Result<GgufValue> read_value(GgufValueType type, const std::string& what, int depth) {
    const uint8_t* start = bytes_.data() + pos_;
    if (type == GgufValueType::kString) {
      SE_RETURN_IF_ERROR(read_string(what).status());
      return GgufValue(type, start, bytes_.data() + pos_ - start);
    }
    if (type != GgufValueType::kArray) {
      const size_t size = gguf_scalar_size(type);
      if (remaining() < size) return truncated(what, size);
      pos_ += size;
      return GgufValue(type, start, size);
    }
    if (depth >= kMaxArrayDepth)
      return data_loss("{}: {} nests arrays deeper than {}", name_, what, kMaxArrayDepth);
    SE_ASSIGN_OR_RETURN(GgufValueType elem, read_value_type(what + " element type"));
    SE_ASSIGN_OR_RETURN(uint64_t count, read_u64(what + " element count"));
    const uint8_t* payload = bytes_.data() + pos_;
    const size_t elem_size = gguf_scalar_size(elem);
    if (elem_size != 0) {
      if (count > remaining() / elem_size) {
        return data_loss("{}: {} claims {} elements of {} but only {} bytes remain", name_, what,
                         count, gguf_value_type_name(elem), remaining());
      }
      pos_ += count * elem_size;
    } else {
      // A string element takes at least its 8-byte length; an array element its 12-byte header.
      const size_t min_size = elem == GgufValueType::kString ? 8 : 12;
      if (count > remaining() / min_size) {
        return data_loss("{}: {} claims {} elements of {} but only {} bytes remain", name_, what,
                         count, gguf_value_type_name(elem), remaining());
      }
      for (uint64_t i = 0; i < count; ++i) {
        SE_RETURN_IF_ERROR(read_value(elem, what, depth + 1).status());
      }
    }
    return GgufValue(type, payload, bytes_.data() + pos_ - payload, elem, count);
  }

  Status read_metadata(GgufFile& file, uint64_t num_kv) {
    // A key/value takes at least 8 (key length) + 4 (type) + 1 (smallest value) bytes.
    if (num_kv > remaining() / 13) {
      return data_loss("{}: header claims {} metadata entries but only {} bytes remain", name_,
                       num_kv, remaining());
    }
    file.metadata_.reserve(num_kv);
    for (uint64_t i = 0; i < num_kv; ++i) {
      SE_ASSIGN_OR_RETURN(std::string_view key, read_string(fmt::format("metadata key #{}", i)));
      const std::string what = fmt::format("metadata '{}'", key);
      SE_ASSIGN_OR_RETURN(GgufValueType type, read_value_type(what));
      SE_ASSIGN_OR_RETURN(GgufValue value, read_value(type, what, 0));
      if (!file.metadata_index_.emplace(std::string(key), file.metadata_.size()).second) {
        return data_loss("{}: duplicate metadata key '{}'", name_, key);
      }
      file.metadata_.emplace_back(std::string(key), value);
    }
    return Status::ok();
  }

  Status read_alignment(GgufFile& file) {
    const GgufValue* v = file.find("general.alignment");
    if (v == nullptr) return Status::ok();
    std::optional<uint64_t> a = v->to_u64();
    if (!a || *a == 0 || (*a & (*a - 1)) != 0 || *a > (1u << 30)) {
      return data_loss("{}: general.alignment must be a power of two, got {}", name_,
                       v->describe());
    }
    file.alignment_ = static_cast<uint32_t>(*a);
    return Status::ok();
  }

  Status read_tensor_infos(GgufFile& file, uint64_t num_tensors) {
    // A tensor info takes at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset) bytes.
    if (num_tensors > remaining() / 24) {
      return data_loss("{}: header claims {} tensors but only {} bytes remain", name_, num_tensors,
                       remaining());
    }
    file.tensors_.reserve(num_tensors);
    for (uint64_t i = 0; i < num_tensors; ++i) {
      GgufTensorInfo t;
      SE_ASSIGN_OR_RETURN(std::string_view name, read_string(fmt::format("name of tensor #{}", i)));
      t.name = std::string(name);
      const std::string what = fmt::format("tensor '{}'", t.name);
      SE_ASSIGN_OR_RETURN(uint32_t num_dims, read_u32(what + " dim count"));
      if (num_dims > kMaxDims)
        return data_loss("{}: {} has {} dims (max {})", name_, what, num_dims, kMaxDims);
      int64_t numel = 1;
      for (uint32_t d = 0; d < num_dims; ++d) {
        SE_ASSIGN_OR_RETURN(uint64_t dim, read_u64(what + " dims"));
        if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
            (dim != 0 && numel > std::numeric_limits<int64_t>::max() / static_cast<int64_t>(dim))) {
          return data_loss("{}: {} has an element count that overflows int64", name_, what);
        }
        t.dims.push_back(static_cast<int64_t>(dim));
        numel *= static_cast<int64_t>(dim);
      }
      SE_ASSIGN_OR_RETURN(uint32_t type_id, read_u32(what + " type"));
      std::optional<GgmlTypeTraits> traits = ggml_type_traits(type_id);
      if (!traits) return unimplemented("{}: {} has unknown ggml type {}", name_, what, type_id);
      t.type = static_cast<GgmlType>(type_id);
      const int64_t row = t.dims.empty() ? 1 : t.dims[0];
      if (row % traits->block_size != 0) {
        return data_loss("{}: {} row length {} is not a multiple of the {} block size {}", name_,
                         what, row, ggml_type_name(t.type), traits->block_size);
      }
      const uint64_t num_blocks = static_cast<uint64_t>(numel / traits->block_size);
      if (num_blocks > std::numeric_limits<uint64_t>::max() / traits->type_size) {
        return data_loss("{}: {} byte size overflows", name_, what);
      }
      t.nbytes = num_blocks * traits->type_size;
      SE_ASSIGN_OR_RETURN(t.offset, read_u64(what + " offset"));
      if (!file.tensor_index_.emplace(t.name, file.tensors_.size()).second) {
        return data_loss("{}: duplicate tensor name '{}'", name_, t.name);
      }
      file.tensors_.push_back(std::move(t));
    }
    return Status::ok();
  }

  // Checks every tensor lies inside the data section, aligned and without overlap, then points it
  // at its bytes.
  Status place_tensors(GgufFile& file) {
    const uint64_t align = file.alignment_;
    const uint64_t data_offset = (pos_ + align - 1) / align * align;
    file.data_offset_ = data_offset;
    if (file.tensors_.empty()) return Status::ok();
    if (data_offset > bytes_.size()) {
      return data_loss(
          "{}: truncated: tensor data should start at offset {} but the file has {} bytes", name_,
          data_offset, bytes_.size());
    }
    const uint64_t data_size = bytes_.size() - data_offset;
    for (GgufTensorInfo& t : file.tensors_) {
      if (t.offset % align != 0) {
        return data_loss("{}: tensor '{}' offset {} is not a multiple of the alignment {}", name_,
                         t.name, t.offset, align);
      }
      if (t.offset > data_size || t.nbytes > data_size - t.offset) {
        return data_loss(
            "{}: truncated: tensor '{}' needs bytes [{}, {}) of the data section but it has {} "
            "bytes",
            name_, t.name, t.offset, t.offset + t.nbytes, data_size);
      }
      t.data = bytes_.data() + data_offset + t.offset;
    }
    std::vector<size_t> order(file.tensors_.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return file.tensors_[a].offset < file.tensors_[b].offset;
    });
    for (size_t i = 1; i < order.size(); ++i) {
      const GgufTensorInfo& prev = file.tensors_[order[i - 1]];
      const GgufTensorInfo& cur = file.tensors_[order[i]];
      if (prev.offset + prev.nbytes > cur.offset) {
        return data_loss("{}: tensors '{}' and '{}' overlap", name_, prev.name, cur.name);
      }
    }
    return Status::ok();
  }

  std::span<const uint8_t> bytes_;
  const std::string& name_;
  size_t pos_ = 0;
};

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

Result<GgufFile> GgufFile::open(const std::string& path) {
  SE_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::open(path));
  auto mapping = std::make_shared<const MappedFile>(std::move(mapped));
  return parse(mapping, mapping->bytes(), path);
}

Result<GgufFile> GgufFile::parse(std::shared_ptr<const void> owner, std::span<const uint8_t> bytes,
                                 const std::string& name) {
  return GgufParser(bytes, name).run(std::move(owner));
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

std::optional<std::string> GgufFile::find_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  std::optional<std::string_view> s = v->to_string();
  if (!s) return std::nullopt;
  return std::string(*s);
}

std::optional<uint32_t> GgufFile::find_u32(std::string_view key) const {
  const GgufValue* v = find(key);
  std::optional<uint64_t> u = v ? v->to_u64() : std::nullopt;
  if (!u || *u > std::numeric_limits<uint32_t>::max()) return std::nullopt;
  return static_cast<uint32_t>(*u);
}

std::optional<int64_t> GgufFile::find_i64(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? v->to_i64() : std::nullopt;
}

std::optional<float> GgufFile::find_f32(std::string_view key) const {
  const GgufValue* v = find(key);
  std::optional<double> d = v ? v->to_f64() : std::nullopt;
  if (!d) return std::nullopt;
  return static_cast<float>(*d);
}

std::optional<bool> GgufFile::find_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? v->to_bool() : std::nullopt;
}

std::optional<std::vector<std::string>> GgufFile::find_string_array(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? v->to_string_array() : std::nullopt;
}

std::optional<std::vector<float>> GgufFile::find_f32_array(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? v->to_f32_array() : std::nullopt;
}

std::optional<std::vector<int32_t>> GgufFile::find_i32_array(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? v->to_i32_array() : std::nullopt;
}

namespace {
template <typename T>
Result<T> require(const GgufFile& file, std::string_view key, std::optional<T> value,
                  std::string_view expected) {
  if (value) return *std::move(value);
  const GgufValue* v = file.find(key);
  if (v == nullptr) return not_found("{}: missing metadata key '{}'", file.path(), key);
  return invalid_argument("{}: metadata '{}' should be {}, got {} {}", file.path(), key, expected,
                          gguf_value_type_name(v->type()), v->describe());
}
}  // namespace

Result<std::string> GgufFile::get_string(std::string_view key) const {
  return require(*this, key, find_string(key), "a string");
}

Result<uint32_t> GgufFile::get_u32(std::string_view key) const {
  return require(*this, key, find_u32(key), "an unsigned 32-bit integer");
}

Result<float> GgufFile::get_f32(std::string_view key) const {
  return require(*this, key, find_f32(key), "a number");
}

std::string GgufFile::architecture() const {
  return find_string("general.architecture").value_or("");
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace se
