// libFuzzer target: GgufFile::parse on arbitrary bytes, then every accessor a loader uses. Any
// crash, sanitizer report or huge allocation is a bug; errors must come back as a Status.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "loader/gguf_dequant.h"
#include "loader/gguf_file.h"
#include "model/gguf_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto owned = std::make_shared<std::vector<uint8_t>>(data, data + size);
  auto file = se::GgufFile::parse(owned, {owned->data(), owned->size()}, "fuzz.gguf");
  if (!file.is_ok()) return 0;
  for (const auto& [key, value] : file->metadata()) {
    (void)value.describe();
    (void)value.to_string_array();
    (void)value.to_f32_array();
    (void)value.to_i32_array();
    (void)value.to_i64_array();
    (void)value.to_u64();
    (void)value.to_f64();
  }
  (void)se::gguf_hf_config(*file);
  for (const se::GgufTensorInfo& t : file->tensors()) {
    // Keep allocations small: dequantize only modest tensors.
    if (t.numel() <= (1 << 16)) (void)se::dequantize_tensor(t);
  }
  return 0;
}
