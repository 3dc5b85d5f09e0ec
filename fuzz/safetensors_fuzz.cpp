// libFuzzer target: SafetensorsFile::parse on arbitrary bytes, then load() of every small tensor.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "loader/safetensors_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto owned = std::make_shared<std::vector<uint8_t>>(data, data + size);
  auto file = se::SafetensorsFile::parse(owned, {owned->data(), owned->size()}, "fuzz.safetensors");
  if (!file.is_ok()) return 0;
  for (const se::SafetensorsTensorInfo& t : file->tensors()) {
    if (t.end - t.begin <= (1 << 20)) (void)file->load(t.name);
  }
  return 0;
}
