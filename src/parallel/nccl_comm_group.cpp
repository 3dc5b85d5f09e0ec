#include "parallel/nccl_comm_group.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "backend/cuda/cuda_context.h"
#include "base/check.h"

namespace se {

namespace {

#define SE_NCCL_CHECK(call)                                                                 \
  do {                                                                                      \
    const ncclResult_t nccl_result = (call);                                                \
    SE_CHECK(nccl_result == ncclSuccess, "{}: {}", #call, ncclGetErrorString(nccl_result)); \
  } while (0)

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      return ncclInt32;
    default:
      SE_CHECK(false, "NCCL collectives take F32, F16, BF16 or I32, got {}", dtype_name(dtype));
  }
  return ncclFloat32;
}

void require_device(TensorView t, const char* what) {
  SE_CHECK(t.device == Device::kCuda, "{}: NCCL collectives take CUDA tensors", what);
}

}  // namespace

class NcclCommGroup::Rank final : public Communicator {
 public:
  Rank(ncclComm_t comm, int rank, int size, float* barrier_scratch)
      : comm_(comm), rank_(rank), size_(size), barrier_scratch_(barrier_scratch) {}
  ~Rank() override {
    ncclCommDestroy(comm_);
    cudaFree(barrier_scratch_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(TensorView data) override {
    require_device(data, "all_reduce_sum");
    SE_NCCL_CHECK(ncclAllReduce(data.data, data.data, static_cast<size_t>(data.numel()), nccl_type(data.dtype), ncclSum,
                                comm_, stream()));
  }

  void all_gather(TensorView out, TensorView in) override {
    require_device(out, "all_gather.out");
    require_device(in, "all_gather.in");
    SE_CHECK(out.dtype == in.dtype && out.numel() == in.numel() * size_, "all_gather: out {} for {} ranks of {}",
             out.shape.to_string(), size_, in.shape.to_string());
    SE_NCCL_CHECK(
        ncclAllGather(in.data, out.data, static_cast<size_t>(in.numel()), nccl_type(in.dtype), comm_, stream()));
  }

  void broadcast(TensorView data, int root) override {
    require_device(data, "broadcast");
    SE_CHECK(root >= 0 && root < size_, "broadcast: root {} of {} ranks", root, size_);
    SE_NCCL_CHECK(ncclBroadcast(data.data, data.data, static_cast<size_t>(data.numel()), nccl_type(data.dtype), root,
                                comm_, stream()));
  }

  void barrier() override {
    // A one-element all-reduce completes only when every rank has enqueued it behind its earlier work.
    SE_NCCL_CHECK(ncclAllReduce(barrier_scratch_, barrier_scratch_, 1, ncclFloat32, ncclSum, comm_, stream()));
    cuda::CudaContext::current().synchronize();
  }

 private:
  cudaStream_t stream() const {
    cuda::CudaContext& context = cuda::CudaContext::current();
    SE_CHECK(context.device() == rank_, "NCCL rank {} driven from a CUDA context on device {}", rank_,
             context.device());
    return context.stream();
  }

  ncclComm_t comm_;
  int rank_;
  int size_;
  float* barrier_scratch_;  // [1] on the rank's device
};

NcclCommGroup::NcclCommGroup() = default;
NcclCommGroup::~NcclCommGroup() = default;

Result<std::unique_ptr<NcclCommGroup>> NcclCommGroup::create(int size) {
  int num_devices = 0;
  if (cudaGetDeviceCount(&num_devices) != cudaSuccess || num_devices < size) {
    return failed_precondition("tensor parallelism over {} GPUs: this host shows {}", size, num_devices);
  }
  std::vector<ncclComm_t> comms(static_cast<size_t>(size));
  std::vector<int> devices(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) devices[static_cast<size_t>(r)] = r;
  if (const ncclResult_t result = ncclCommInitAll(comms.data(), size, devices.data()); result != ncclSuccess)
    return internal_error("NCCL could not set up {} ranks: {}", size, ncclGetErrorString(result));
  std::unique_ptr<NcclCommGroup> group(new NcclCommGroup());
  for (int r = 0; r < size; ++r) {
    float* scratch = nullptr;
    if (cudaSetDevice(r) != cudaSuccess || cudaMalloc(&scratch, sizeof(float)) != cudaSuccess) {
      for (int rest = r; rest < size; ++rest) ncclCommDestroy(comms[static_cast<size_t>(rest)]);
      return internal_error("NCCL rank {}: no device memory for its barrier", r);
    }
    group->ranks_.push_back(std::make_unique<Rank>(comms[static_cast<size_t>(r)], r, size, scratch));
  }
  return group;
}

Communicator& NcclCommGroup::communicator(int rank) {
  SE_CHECK(rank >= 0 && rank < size(), "rank {} of {}", rank, size());
  return *ranks_[static_cast<size_t>(rank)];
}

}  // namespace se
