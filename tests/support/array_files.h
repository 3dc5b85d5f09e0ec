// Raw little-endian arrays in files: how the C++ test tools and their Python oracles hand each other tensors
// (numpy's tofile / fromfile). Plain functions; thread-compatible.
#pragma once

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace se::test {

// Every whole element of type T in the file at `path` (empty when it cannot be read).
template <typename T>
std::vector<T> read_array(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<T> out(raw.size() / sizeof(T));
  std::memcpy(out.data(), raw.data(), out.size() * sizeof(T));
  return out;
}

// Writes `v`'s elements to `path`, replacing the file.
template <typename T>
void write_array(const std::string& path, const std::vector<T>& v) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
}

}  // namespace se::test
