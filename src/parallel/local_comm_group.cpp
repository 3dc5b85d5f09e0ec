#include "parallel/local_comm_group.h"

#include <cstring>

#include "base/check.h"

namespace se {

namespace {

void require_host(TensorView t, const char* what) {
  SE_CHECK(t.device == Device::kCpu, "{}: a local communicator group reduces host memory, got a {} tensor", what,
           t.device == Device::kCuda ? "CUDA" : "non-host");
}

}  // namespace

class LocalCommGroup::Rank final : public Communicator {
 public:
  Rank(LocalCommGroup& group, int rank) : group_(group), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_.size(); }

  void all_reduce_sum(TensorView data) override {
    require_host(data, "all_reduce_sum");
    SE_CHECK(data.dtype == DType::kF32, "all_reduce_sum: F32 on the CPU, got {}", dtype_name(data.dtype));
    group_.post_and_wait(rank_, {Op::kAllReduceSum, data.data, data.data, data.numel(), data.dtype, 0});
    // Each rank sums its share of the elements over every rank's buffer and writes the sum back to all of them.
    const int n = size();
    const int64_t numel = data.numel();
    const int64_t begin = numel * rank_ / n, end = numel * (rank_ + 1) / n;
    std::vector<float*> buffers(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r)
      buffers[static_cast<size_t>(r)] = static_cast<float*>(group_.posted_[static_cast<size_t>(r)].data);
    for (int64_t i = begin; i < end; ++i) {
      float sum = buffers[0][i];
      for (int r = 1; r < n; ++r) sum += buffers[static_cast<size_t>(r)][i];
      for (float* buffer : buffers) buffer[i] = sum;
    }
    group_.wait_for_all();
  }

  void all_gather(TensorView out, TensorView in) override {
    require_host(out, "all_gather.out");
    require_host(in, "all_gather.in");
    SE_CHECK(out.dtype == in.dtype && out.numel() == in.numel() * size(), "all_gather: out {} {} for {} ranks of {} {}",
             dtype_name(out.dtype), out.shape.to_string(), size(), dtype_name(in.dtype), in.shape.to_string());
    group_.post_and_wait(rank_, {Op::kAllGather, out.data, in.data, in.numel(), in.dtype, 0});
    const size_t part = in.nbytes();
    for (int r = 0; r < size(); ++r) {
      char* dst = static_cast<char*>(out.data) + static_cast<size_t>(r) * part;
      const void* src = group_.posted_[static_cast<size_t>(r)].in;
      if (dst != src) std::memcpy(dst, src, part);  // a rank may gather in place
    }
    group_.wait_for_all();
  }

  void broadcast(TensorView data, int root) override {
    require_host(data, "broadcast");
    SE_CHECK(root >= 0 && root < size(), "broadcast: root {} of {} ranks", root, size());
    group_.post_and_wait(rank_, {Op::kBroadcast, data.data, data.data, data.numel(), data.dtype, root});
    if (rank_ != root) std::memcpy(data.data, group_.posted_[static_cast<size_t>(root)].data, data.nbytes());
    group_.wait_for_all();
  }

  void barrier() override {
    group_.post_and_wait(rank_, {Op::kBarrier, nullptr, nullptr, 0, DType::kF32, 0});
    group_.wait_for_all();
  }

 private:
  LocalCommGroup& group_;
  int rank_;
};

const char* LocalCommGroup::op_name(Op op) {
  switch (op) {
    case Op::kAllReduceSum:
      return "all_reduce_sum";
    case Op::kAllGather:
      return "all_gather";
    case Op::kBroadcast:
      return "broadcast";
    case Op::kBarrier:
      return "barrier";
  }
  return "?";
}

LocalCommGroup::LocalCommGroup(int size) : posted_(static_cast<size_t>(size)), barrier_(size) {
  SE_CHECK(size >= 1, "a communicator group of {} ranks", size);
  for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<Rank>(*this, r));
}

LocalCommGroup::~LocalCommGroup() = default;

Communicator& LocalCommGroup::communicator(int rank) {
  SE_CHECK(rank >= 0 && rank < size(), "rank {} of {}", rank, size());
  return *ranks_[static_cast<size_t>(rank)];
}

void LocalCommGroup::post_and_wait(int rank, const Posted& posted) {
  posted_[static_cast<size_t>(rank)] = posted;
  wait_for_all();
  const Posted& first = posted_[0];
  SE_CHECK(
      posted.op == first.op && posted.numel == first.numel && posted.dtype == first.dtype && posted.root == first.root,
      "collective mismatch: rank {} called {} of {} {} (root {}), rank 0 {} of {} {} (root {})", rank,
      op_name(posted.op), posted.numel, dtype_name(posted.dtype), posted.root, op_name(first.op), first.numel,
      dtype_name(first.dtype), first.root);
}

}  // namespace se
