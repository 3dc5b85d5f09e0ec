// dequant_tool TYPE_ID IN OUT: dequantizes the raw GGML blocks in IN (type id as in ggml's enum)
// and writes the fp32 values to OUT. Used by dequant_test.py to compare against gguf-py.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "loader/gguf_dequant.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s TYPE_ID IN OUT\n", argv[0]);
    return 2;
  }
  const uint32_t type_id = static_cast<uint32_t>(std::stoul(argv[1]));
  const auto traits = se::ggml_type_traits(type_id);
  const auto type = static_cast<se::GgmlType>(type_id);
  if (!traits || !se::can_dequantize(type)) {
    std::fprintf(stderr, "type %u cannot be dequantized\n", type_id);
    return 1;
  }
  std::ifstream in(argv[2], std::ios::binary);
  std::vector<uint8_t> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (raw.size() % traits->type_size != 0) {
    std::fprintf(stderr, "%s: %zu bytes is not a whole number of %zu-byte blocks\n", argv[2],
                 raw.size(), traits->type_size);
    return 1;
  }
  const int64_t num_blocks = static_cast<int64_t>(raw.size() / traits->type_size);
  std::vector<float> out(static_cast<size_t>(num_blocks * traits->block_size));
  se::dequantize_blocks(type, raw.data(), out.data(), num_blocks);
  std::ofstream(argv[3], std::ios::binary)
      .write(reinterpret_cast<const char*>(out.data()),
             static_cast<std::streamsize>(out.size() * 4));
  return 0;
}
