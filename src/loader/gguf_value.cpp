// Decoding of GGUF metadata values. Payloads were bounds-checked when the file was parsed; the
// walkers here still stop at nbytes() so a GgufValue built by hand cannot read past its payload.
#include <cstring>
#include <limits>

#include "loader/gguf_file.h"

namespace se {

namespace {

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

bool is_integer(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kU16:
    case GgufValueType::kI16:
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kU64:
    case GgufValueType::kI64:
      return true;
    default:
      return false;
  }
}

// Integer scalars widened to a signed/unsigned pair: `neg` holds a negative value, `pos` a
// non-negative one.
struct WideInt {
  bool negative;
  int64_t neg;
  uint64_t pos;
};

WideInt load_int(GgufValueType t, const uint8_t* p) {
  int64_t s = 0;
  switch (t) {
    case GgufValueType::kU8:
      return {false, 0, load<uint8_t>(p)};
    case GgufValueType::kU16:
      return {false, 0, load<uint16_t>(p)};
    case GgufValueType::kU32:
      return {false, 0, load<uint32_t>(p)};
    case GgufValueType::kU64:
      return {false, 0, load<uint64_t>(p)};
    case GgufValueType::kI8:
      s = load<int8_t>(p);
      break;
    case GgufValueType::kI16:
      s = load<int16_t>(p);
      break;
    case GgufValueType::kI32:
      s = load<int32_t>(p);
      break;
    default:
      s = load<int64_t>(p);
      break;
  }
  if (s < 0) return {true, s, 0};
  return {false, 0, static_cast<uint64_t>(s)};
}

std::optional<int64_t> int_to_i64(GgufValueType t, const uint8_t* p) {
  WideInt w = load_int(t, p);
  if (w.negative) return w.neg;
  if (w.pos > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return static_cast<int64_t>(w.pos);
}

template <typename T>
std::optional<std::vector<T>> int_array(GgufValueType elem, const uint8_t* p, uint64_t count,
                                        size_t nbytes) {
  const size_t esize = gguf_scalar_size(elem);
  if (!is_integer(elem) || count > nbytes / esize) return std::nullopt;
  std::vector<T> out;
  out.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    std::optional<int64_t> v = int_to_i64(elem, p + i * esize);
    if (!v || *v < std::numeric_limits<T>::min() || *v > std::numeric_limits<T>::max())
      return std::nullopt;
    out.push_back(static_cast<T>(*v));
  }
  return out;
}

}  // namespace

std::string_view gguf_value_type_name(GgufValueType type) {
  switch (type) {
    case GgufValueType::kU8:
      return "UINT8";
    case GgufValueType::kI8:
      return "INT8";
    case GgufValueType::kU16:
      return "UINT16";
    case GgufValueType::kI16:
      return "INT16";
    case GgufValueType::kU32:
      return "UINT32";
    case GgufValueType::kI32:
      return "INT32";
    case GgufValueType::kF32:
      return "FLOAT32";
    case GgufValueType::kBool:
      return "BOOL";
    case GgufValueType::kString:
      return "STRING";
    case GgufValueType::kArray:
      return "ARRAY";
    case GgufValueType::kU64:
      return "UINT64";
    case GgufValueType::kI64:
      return "INT64";
    case GgufValueType::kF64:
      return "FLOAT64";
  }
  return "unknown type";
}

size_t gguf_scalar_size(GgufValueType type) {
  switch (type) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kU16:
    case GgufValueType::kI16:
      return 2;
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kF32:
      return 4;
    case GgufValueType::kU64:
    case GgufValueType::kI64:
    case GgufValueType::kF64:
      return 8;
    default:
      return 0;
  }
}

std::optional<uint64_t> GgufValue::to_u64() const {
  if (!is_integer(type_)) return std::nullopt;
  WideInt w = load_int(type_, payload_);
  if (w.negative) return std::nullopt;
  return w.pos;
}

std::optional<int64_t> GgufValue::to_i64() const {
  if (!is_integer(type_)) return std::nullopt;
  return int_to_i64(type_, payload_);
}

std::optional<double> GgufValue::to_f64() const {
  if (type_ == GgufValueType::kF32) return load<float>(payload_);
  if (type_ == GgufValueType::kF64) return load<double>(payload_);
  if (!is_integer(type_)) return std::nullopt;
  WideInt w = load_int(type_, payload_);
  return w.negative ? static_cast<double>(w.neg) : static_cast<double>(w.pos);
}

std::optional<bool> GgufValue::to_bool() const {
  if (type_ != GgufValueType::kBool) return std::nullopt;
  return payload_[0] != 0;
}

std::optional<std::string_view> GgufValue::to_string() const {
  if (type_ != GgufValueType::kString) return std::nullopt;
  return std::string_view(reinterpret_cast<const char*>(payload_ + 8), nbytes_ - 8);
}

std::optional<std::vector<std::string>> GgufValue::to_string_array() const {
  if (type_ != GgufValueType::kArray || elem_type_ != GgufValueType::kString) return std::nullopt;
  std::vector<std::string> out;
  out.reserve(count_);
  size_t pos = 0;
  for (uint64_t i = 0; i < count_; ++i) {
    if (nbytes_ - pos < 8) return std::nullopt;
    const uint64_t len = load<uint64_t>(payload_ + pos);
    pos += 8;
    if (len > nbytes_ - pos) return std::nullopt;
    out.emplace_back(reinterpret_cast<const char*>(payload_ + pos), len);
    pos += len;
  }
  return out;
}

std::optional<std::vector<float>> GgufValue::to_f32_array() const {
  if (type_ != GgufValueType::kArray) return std::nullopt;
  const size_t esize = gguf_scalar_size(elem_type_);
  if ((elem_type_ != GgufValueType::kF32 && elem_type_ != GgufValueType::kF64) ||
      count_ > nbytes_ / esize) {
    return std::nullopt;
  }
  std::vector<float> out(count_);
  for (uint64_t i = 0; i < count_; ++i) {
    out[i] = elem_type_ == GgufValueType::kF32 ? load<float>(payload_ + i * 4)
                                               : static_cast<float>(load<double>(payload_ + i * 8));
  }
  return out;
}

std::optional<std::vector<int32_t>> GgufValue::to_i32_array() const {
  if (type_ != GgufValueType::kArray) return std::nullopt;
  return int_array<int32_t>(elem_type_, payload_, count_, nbytes_);
}

std::optional<std::vector<int64_t>> GgufValue::to_i64_array() const {
  if (type_ != GgufValueType::kArray) return std::nullopt;
  return int_array<int64_t>(elem_type_, payload_, count_, nbytes_);
}

std::string GgufValue::describe() const {
  if (type_ == GgufValueType::kArray) {
    return fmt::format("[{} x {}]", gguf_value_type_name(elem_type_), count_);
  }
  if (type_ == GgufValueType::kString) {
    std::string_view s = *to_string();
    if (s.size() > 60) return fmt::format("\"{}...\" ({} bytes)", s.substr(0, 60), s.size());
    return fmt::format("\"{}\"", s);
  }
  if (type_ == GgufValueType::kBool) return *to_bool() ? "true" : "false";
  if (type_ == GgufValueType::kF32 || type_ == GgufValueType::kF64)
    return fmt::format("{}", *to_f64());
  WideInt w = load_int(type_, payload_);
  return w.negative ? std::to_string(w.neg) : std::to_string(w.pos);
}

}  // namespace se
