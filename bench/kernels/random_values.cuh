// Reproducible random fill values for the kernel benchmarks: a splitmix64 hash of the element index.
#pragma once

#include <cstddef>
#include <cstdint>

namespace se::bench {

// Uniform in [-1, 1) for element i under `seed`.
__device__ __forceinline__ float hashed_uniform(size_t i, uint64_t seed) {
  uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
}

}  // namespace se::bench
