// NcclCommGroup on this host's GPUs (label `cuda`; one rank per GPU, as threads, each with a CudaContext on its
// device): every collective gives each rank the expected values, round after round and in place.
#include "parallel/nccl_comm_group.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_allocator.h"
#include "backend/cuda/cuda_context.h"
#include "backend/device_memory.h"

namespace se {
namespace {

int num_gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// body(rank, communicator) on one thread per GPU, each with a context on its device current.
void run_ranks(const std::function<void(int, Communicator&)>& body) {
  auto group = NcclCommGroup::create(num_gpus());
  ASSERT_TRUE(group.is_ok()) << group.status().to_string();
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>((*group)->size()));
  for (int r = 0; r < (*group)->size(); ++r) {
    threads.emplace_back([&, r] {
      cuda::CudaContext context(r);
      cuda::ScopedCudaContext scope(context);
      body(r, (*group)->communicator(r));
      context.synchronize();
    });
  }
  for (std::thread& t : threads) t.join();
}

Tensor on_gpu(const std::vector<float>& values) {
  Tensor host = Tensor::empty(DType::kF32, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), host.data<float>());
  return cuda::to_device(host);
}

std::vector<float> on_host(const Tensor& device) {
  const Tensor host = cuda::to_host(device);
  return {host.data<float>(), host.data<float>() + host.numel()};
}

TEST(NcclCommGroupTest, CollectivesGiveEveryRankTheExpectedValues) {
  if (num_gpus() == 0) GTEST_SKIP() << "no CUDA device";
  run_ranks([](int rank, Communicator& comm) {
    const int size = comm.size();
    EXPECT_EQ(comm.rank(), rank);
    for (int round = 0; round < 20; ++round) {
      Tensor x = on_gpu({float(rank + round), float(2 * rank), 1.0f});
      comm.all_reduce_sum(x.view());
      const int pairs = size * (size - 1) / 2;
      const auto ranks_sum = static_cast<float>(pairs);
      EXPECT_EQ(on_host(x), (std::vector<float>{ranks_sum + float(size * round), 2 * ranks_sum, float(size)}));

      Tensor gathered = on_gpu(std::vector<float>(static_cast<size_t>(2 * size), -1.0f));
      TensorView own = gathered.view();
      own.data = gathered.data<float>() + 2 * rank;
      own.shape = {2};
      copy(own, on_gpu({float(rank), float(round)}).view());
      comm.all_gather(gathered.view(), own);  // in place
      const std::vector<float> all = on_host(gathered);
      for (int r = 0; r < size; ++r) {
        EXPECT_EQ(all[static_cast<size_t>(2 * r)], float(r));
        EXPECT_EQ(all[static_cast<size_t>(2 * r + 1)], float(round));
      }

      Tensor b = on_gpu({float(rank * 10 + round)});
      const int root = round % size;
      comm.broadcast(b.view(), root);
      EXPECT_EQ(on_host(b)[0], float(root * 10 + round));
      comm.barrier();
    }
  });
}

}  // namespace
}  // namespace se
