// Parity of the bf16 row ops' CUDA twins with their CPU twins, bit for bit: scatter_rows_to_bf16 over a batch of
// 300 rows of 1,000 values (not a multiple of the block) into two device buffers, the destinations a shuffled subset
// so some rows stay unwritten, at the table's places and two rows past them, and 4,096 rows of 4,096 values (a
// 128-sequence decode step of an 8B model's queries into 32 rings each); convert both ways over the same values. The
// values cover ties to even, subnormals, infinities and magnitudes from 1e-30 to 1e30 (NaN excepted: its bits are the
// backend's own).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "backend/ops.h"
#include "cuda_test_util.h"

namespace se {
namespace {

using test::poisoned;

// Host F32 [rows, width]: random magnitudes, with exact bf16 ties, subnormals and infinities among them.
Tensor awkward_rows(int64_t rows, int64_t width, uint64_t seed) {
  Tensor t = Tensor::empty(DType::kF32, {rows, width});
  test::FastRng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) {
    float& x = t.data<float>()[i];
    switch (rng.next() % 8) {
      case 0: {  // a tie: the dropped half is exactly 0x8000
        uint32_t bits = static_cast<uint32_t>(rng.next()) & 0x7f7f0000u;
        bits |= 0x8000u;
        std::memcpy(&x, &bits, 4);
        break;
      }
      case 1:
        x = rng.uniform(1e-39f);  // subnormal
        break;
      case 2:
        x = (rng.next() & 1) != 0 ? std::numeric_limits<float>::infinity() : -3.4e38f;
        break;
      default:
        x = rng.uniform() * std::pow(10.0f, static_cast<float>(static_cast<int>(rng.next() % 61) - 30));
    }
  }
  return t;
}

std::vector<uint16_t> host_bits(const Tensor& device_bf16) {
  const Tensor host = cuda::to_host(device_bf16);
  return std::vector<uint16_t>(host.data<uint16_t>(), host.data<uint16_t>() + host.numel());
}

// The table of `destinations` as scatter_rows_to_bf16 takes it, on `device`.
Tensor table_on(Device device, const std::vector<RowDestination>& destinations) {
  Tensor host = Tensor::empty(DType::kI64, {static_cast<int64_t>(destinations.size()), 2});
  std::memcpy(host.raw(), destinations.data(), host.nbytes());
  return device == Device::kCpu ? host : cuda::to_device(host);
}

// Scatters `num_dest` of the source's rows (shuffled) into two buffers of `num_dest` + 2 rows each, half in each,
// with the table's places shifted by `offset_rows` (even) rows, so every other row stays unwritten, on both
// backends; the bits must agree everywhere.
void check_scatter(int64_t rows, int64_t width, int64_t num_dest, int64_t offset_rows, uint64_t seed) {
  const Tensor src = awkward_rows(rows, width, seed);
  std::vector<int64_t> order(static_cast<size_t>(rows));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<uint32_t>(seed)));
  Tensor host_a = Tensor::empty(DType::kBF16, {num_dest + 2, width}),
         host_b = Tensor::empty(DType::kBF16, {num_dest + 2, width});
  std::memset(host_a.raw(), 0xff, host_a.nbytes());
  std::memset(host_b.raw(), 0xff, host_b.nbytes());
  Tensor device_a = poisoned(DType::kBF16, {num_dest + 2, width}),
         device_b = poisoned(DType::kBF16, {num_dest + 2, width});
  std::vector<RowDestination> on_host, on_device;
  for (int64_t i = 0; i < num_dest; ++i) {
    const int64_t row = (i / 2) * 2;  // rows 0, 2, 4, ... of each buffer
    const bool in_a = i % 2 == 0;
    const int64_t source = order[static_cast<size_t>(i % rows)];
    on_host.push_back({source, (in_a ? host_a : host_b).data<uint16_t>() + row * width});
    on_device.push_back({source, (in_a ? device_a : device_b).data<uint16_t>() + row * width});
  }
  scatter_rows_to_bf16(src.view(), table_on(Device::kCpu, on_host).view(), offset_rows * width);
  const Tensor device_src = cuda::to_device(src);
  scatter_rows_to_bf16(device_src.view(), table_on(Device::kCuda, on_device).view(), offset_rows * width);
  const std::vector<uint16_t> got_a = host_bits(device_a), got_b = host_bits(device_b);
  EXPECT_TRUE(std::equal(got_a.begin(), got_a.end(), host_a.data<uint16_t>())) << rows << " x " << width;
  EXPECT_TRUE(std::equal(got_b.begin(), got_b.end(), host_b.data<uint16_t>())) << rows << " x " << width;
  EXPECT_EQ(got_a[static_cast<size_t>(width)], 0xffff);  // row 1 of a buffer is never written
}

TEST(CudaBf16RowsTest, ScatterMatchesTheCpuBitForBit) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  check_scatter(300, 1000, 200, 0, 1);
  check_scatter(300, 1000, 200, 2, 3);
  check_scatter(4096, 4096, 4096, 0, 2);
}

TEST(CudaBf16RowsTest, ConvertMatchesTheCpuBitForBit) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  const Tensor wide = awkward_rows(37, 1000, 3);
  Tensor host_narrow = Tensor::empty(DType::kBF16, wide.shape());
  convert(host_narrow.view(), wide.view());
  const Tensor device_wide = cuda::to_device(wide);
  Tensor device_narrow = poisoned(DType::kBF16, wide.shape());
  convert(device_narrow.view(), device_wide.view());
  const std::vector<uint16_t> narrow_bits = host_bits(device_narrow);
  EXPECT_TRUE(std::equal(narrow_bits.begin(), narrow_bits.end(), host_narrow.data<uint16_t>()));
  // And back: the widening is exact on both.
  Tensor host_back = Tensor::empty(DType::kF32, wide.shape());
  convert(host_back.view(), host_narrow.view());
  Tensor device_back = poisoned(DType::kF32, wide.shape());
  convert(device_back.view(), device_narrow.view());
  const Tensor got = cuda::to_host(device_back);
  EXPECT_EQ(std::memcmp(got.raw(), host_back.raw(), host_back.nbytes()), 0);
}

}  // namespace
}  // namespace se
