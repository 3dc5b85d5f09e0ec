// LocalCommGroup: ranks as threads. Every collective gives every rank the expected bytes, round after round, with
// the ranks arriving in random order; all_reduce_sum adds in rank order, so its result is the serial rank-order sum
// bit for bit (values chosen so another order rounds differently) and identical on every rank.
#include "parallel/local_comm_group.h"

#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <functional>
#include <random>
#include <thread>
#include <vector>

namespace se {
namespace {

// Runs body(rank, communicator) on one thread per rank of a group of `size`.
void run_ranks(int size, const std::function<void(int, Communicator&)>& body) {
  LocalCommGroup group(size);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) threads.emplace_back([&, r] { body(r, group.communicator(r)); });
  for (std::thread& t : threads) t.join();
}

// A short random pause, so ranks reach each collective in varying order.
void jitter(std::mt19937& rng) {
  std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 200)(rng)));
}

// Rank r's value at element i of round `round`: magnitudes far apart, so the sum depends on its order.
float value(int round, int rank, int64_t i) {
  const float big = (rank % 2 == 0 ? 1.0f : -1.0f) * 3.0e7f * static_cast<float>(rank + 1);
  return big + 0.37f * static_cast<float>((i * 7 + round * 3 + rank) % 11);
}

class LocalCommGroupTest : public testing::TestWithParam<int> {};

TEST_P(LocalCommGroupTest, ReportsRankAndSize) {
  const int size = GetParam();
  std::vector<int> ranks(static_cast<size_t>(size), -1);
  run_ranks(size, [&](int rank, Communicator& comm) {
    EXPECT_EQ(comm.size(), size);
    ranks[static_cast<size_t>(rank)] = comm.rank();
  });
  for (int r = 0; r < size; ++r) EXPECT_EQ(ranks[static_cast<size_t>(r)], r);
}

TEST_P(LocalCommGroupTest, AllReduceSumIsTheRankOrderSumOnEveryRank) {
  const int size = GetParam();
  constexpr int kRounds = 200;
  run_ranks(size, [&](int rank, Communicator& comm) {
    std::mt19937 rng(static_cast<unsigned>(rank) * 31 + 5);
    for (int round = 0; round < kRounds; ++round) {
      // Sizes that do not divide evenly among the ranks, and an empty one.
      const int64_t numel = (round * 13) % 97;
      Tensor data = Tensor::empty(DType::kF32, {numel});
      for (int64_t i = 0; i < numel; ++i) data.data<float>()[i] = value(round, rank, i);
      jitter(rng);
      comm.all_reduce_sum(data.view());
      for (int64_t i = 0; i < numel; ++i) {
        float expected = value(round, 0, i);
        for (int r = 1; r < size; ++r) expected += value(round, r, i);
        ASSERT_EQ(std::bit_cast<uint32_t>(data.data<float>()[i]), std::bit_cast<uint32_t>(expected))
            << "round " << round << " rank " << rank << " element " << i << ": " << data.data<float>()[i]
            << " != " << expected;
      }
    }
  });
}

TEST_P(LocalCommGroupTest, AllGatherPlacesEachRankAtItsOffset) {
  const int size = GetParam();
  run_ranks(size, [&](int rank, Communicator& comm) {
    std::mt19937 rng(static_cast<unsigned>(rank) + 11);
    for (int round = 0; round < 100; ++round) {
      const int64_t part = 1 + round % 9;
      Tensor in = Tensor::empty(DType::kI32, {part});
      for (int64_t i = 0; i < part; ++i) in.data<int32_t>()[i] = round * 1000 + rank * 100 + static_cast<int>(i);
      Tensor out = Tensor::empty(DType::kI32, {size, part});
      jitter(rng);
      comm.all_gather(out.view(), in.view());
      for (int r = 0; r < size; ++r) {
        for (int64_t i = 0; i < part; ++i)
          ASSERT_EQ(out.data<int32_t>()[r * part + i], round * 1000 + r * 100 + i) << "round " << round;
      }
    }
  });
}

TEST_P(LocalCommGroupTest, AllGatherInPlace) {
  const int size = GetParam();
  run_ranks(size, [&](int rank, Communicator& comm) {
    Tensor out = Tensor::empty(DType::kF32, {size, 3});
    for (int64_t i = 0; i < 3; ++i) out.data<float>()[rank * 3 + i] = static_cast<float>(rank * 10 + i);
    TensorView own{out.data<float>() + rank * 3, DType::kF32, {3}, Device::kCpu};
    comm.all_gather(out.view(), own);
    for (int r = 0; r < size; ++r) {
      for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(out.data<float>()[r * 3 + i], static_cast<float>(r * 10 + i));
    }
  });
}

TEST_P(LocalCommGroupTest, BroadcastCopiesTheRootsBuffer) {
  const int size = GetParam();
  run_ranks(size, [&](int rank, Communicator& comm) {
    std::mt19937 rng(static_cast<unsigned>(rank) + 3);
    for (int round = 0; round < 100; ++round) {
      const int root = round % size;
      Tensor data = Tensor::empty(DType::kF32, {5});
      for (int64_t i = 0; i < 5; ++i) data.data<float>()[i] = static_cast<float>(rank * 100 + round + i);
      jitter(rng);
      comm.broadcast(data.view(), root);
      for (int64_t i = 0; i < 5; ++i) ASSERT_EQ(data.data<float>()[i], static_cast<float>(root * 100 + round + i));
    }
  });
}

TEST_P(LocalCommGroupTest, BarrierHoldsEveryRankUntilAllArrive) {
  const int size = GetParam();
  std::vector<std::atomic<int>> arrived(50);
  run_ranks(size, [&](int rank, Communicator& comm) {
    std::mt19937 rng(static_cast<unsigned>(rank) + 17);
    for (size_t round = 0; round < arrived.size(); ++round) {
      jitter(rng);
      arrived[round].fetch_add(1);
      comm.barrier();
      ASSERT_EQ(arrived[round].load(), size) << "round " << round;
    }
  });
}

// The collectives interleaved, as a sharded forward calls them.
TEST_P(LocalCommGroupTest, MixedCollectivesStayInStep) {
  const int size = GetParam();
  run_ranks(size, [&](int rank, Communicator& comm) {
    std::mt19937 rng(static_cast<unsigned>(rank) + 23);
    for (int round = 0; round < 300; ++round) {
      jitter(rng);
      switch (round % 4) {
        case 0: {
          Tensor x = Tensor::empty(DType::kF32, {4});
          for (int i = 0; i < 4; ++i) x.data<float>()[i] = static_cast<float>(rank + i);
          comm.all_reduce_sum(x.view());
          const int ranks_sum = size * (size - 1) / 2;
          for (int i = 0; i < 4; ++i) ASSERT_EQ(x.data<float>()[i], static_cast<float>(ranks_sum + size * i));
          break;
        }
        case 1: {
          Tensor in = Tensor::empty(DType::kF32, {1});
          in.data<float>()[0] = static_cast<float>(rank * round);
          Tensor out = Tensor::empty(DType::kF32, {size});
          comm.all_gather(out.view(), in.view());
          for (int r = 0; r < size; ++r) ASSERT_EQ(out.data<float>()[r], static_cast<float>(r * round));
          break;
        }
        case 2: {
          Tensor x = Tensor::empty(DType::kI32, {2});
          x.data<int32_t>()[0] = rank;
          x.data<int32_t>()[1] = round;
          comm.broadcast(x.view(), size - 1);
          ASSERT_EQ(x.data<int32_t>()[0], size - 1);
          break;
        }
        default:
          comm.barrier();
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, LocalCommGroupTest, testing::Values(1, 2, 4),
                         [](const testing::TestParamInfo<int>& info) { return "ranks" + std::to_string(info.param); });

TEST(SingleRankCommunicatorTest, CollectivesLeaveTheBufferAndGatherCopies) {
  Communicator& comm = single_rank_communicator();
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  Tensor x = Tensor::empty(DType::kF32, {3});
  for (int i = 0; i < 3; ++i) x.data<float>()[i] = static_cast<float>(i) + 0.5f;
  comm.all_reduce_sum(x.view());
  comm.broadcast(x.view(), 0);
  comm.barrier();
  Tensor out = Tensor::empty(DType::kF32, {3});
  comm.all_gather(out.view(), x.view());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(x.data<float>()[i], static_cast<float>(i) + 0.5f);
    EXPECT_EQ(out.data<float>()[i], x.data<float>()[i]);
  }
}

}  // namespace
}  // namespace se
