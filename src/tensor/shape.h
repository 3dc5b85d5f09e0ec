// Shape: up to kMaxDims extents, row-major (the last dimension is contiguous).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "base/check.h"

namespace se {

class Shape {
 public:
  static constexpr int kMaxDims = 6;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) {
    SE_CHECK(static_cast<int>(dims.size()) <= kMaxDims, "too many dims: {}", dims.size());
    for (int64_t d : dims) dims_[rank_++] = d;
  }
  template <typename It>
  Shape(It begin, It end) {
    for (It it = begin; it != end; ++it) {
      SE_CHECK(rank_ < kMaxDims, "too many dims");
      dims_[rank_++] = static_cast<int64_t>(*it);
    }
  }

  int rank() const { return rank_; }
  int64_t operator[](int i) const {
    SE_DCHECK(i >= 0 && i < rank_, "dim {} of rank {}", i, rank_);
    return dims_[i];
  }
  int64_t& operator[](int i) { return dims_[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    if (rank_ != o.rank_) return false;
    for (int i = 0; i < rank_; ++i)
      if (dims_[i] != o.dims_[i]) return false;
    return true;
  }
  std::string to_string() const {
    std::string s = "[";
    for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
    return s + "]";
  }

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int rank_ = 0;
};

}  // namespace se
