// MappedFile: a read-only memory map of a whole file. Owns the mapping; movable, not copyable.
// The bytes stay valid until the MappedFile is destroyed; concurrent reads are safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "base/status.h"

namespace se {

class MappedFile {
 public:
  // Maps `path` read-only. Errors name the path: not found, not a regular file, or mmap failure.
  static Result<MappedFile> open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  void reset();

  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// Reads a whole file into a string; errors name the path.
Result<std::string> read_file(const std::string& path);

}  // namespace se
