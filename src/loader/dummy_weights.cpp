#include "loader/dummy_weights.h"

#include <cmath>

namespace se {

namespace {

constexpr float kStd = 0.02f;

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t name_hash(const std::string& name, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return splitmix64(h);
}

// Fills `n` floats with an Irwin-Hall approximation of normal(0, kStd): the sum of four 16-bit
// uniforms from one counter-based hash, centred and scaled. Cheap, and independent of how the range
// is split across threads.
void fill_normal(float* dst, int64_t n, uint64_t key) {
  const float scale = kStd * std::sqrt(3.0f) / 65536.0f;  // sum of 4 uniforms has variance 4/12
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = splitmix64(key ^ static_cast<uint64_t>(i) * 0xd1b54a32d192ed03ull);
    const uint64_t sum = (r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48);
    dst[i] = (static_cast<float>(sum) - 2.0f * 65535.0f) * scale;
  }
}

}  // namespace

Tensor dummy_tensor(const std::string& name, const Shape& shape, DummyFill fill, uint64_t seed) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  float* p = t.data<float>();
  switch (fill) {
    case DummyFill::kOnes:
      for (int64_t i = 0; i < t.numel(); ++i) p[i] = 1.0f;
      break;
    case DummyFill::kZeros:
      for (int64_t i = 0; i < t.numel(); ++i) p[i] = 0.0f;
      break;
    case DummyFill::kNormal:
      fill_normal(p, t.numel(), name_hash(name, seed));
      break;
  }
  return t;
}

}  // namespace se
