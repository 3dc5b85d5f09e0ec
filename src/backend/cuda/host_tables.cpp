#include "backend/cuda/host_tables.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"

namespace se::cuda {

namespace {
size_t align16(size_t n) { return (n + 15) / 16 * 16; }

// Scratch for table_bytes of tables and result_bytes after them, and pinned memory for the tables' host bytes;
// send() enqueues their copy. Through the pinned ring, so the copy neither waits for the stream (as a pageable
// source may) nor keeps the caller's memory, while it stays ordered on the stream after earlier scratch readers.
struct Staging {
  char* device;
  char* pinned;
  size_t table_bytes;

  Staging(size_t tables, size_t result_bytes) : table_bytes(tables) {
    CudaContext& context = CudaContext::current();
    device = static_cast<char*>(context.scratch(align16(tables) + result_bytes));
    pinned = tables > 0 ? static_cast<char*>(context.host_staging(tables)) : nullptr;
  }
  void send() const {
    if (table_bytes > 0)
      SE_CUDA_CHECK(cudaMemcpyAsync(device, pinned, table_bytes, cudaMemcpyHostToDevice,
                                    CudaContext::current().stream()));
  }
  void* results() const { return device + align16(table_bytes); }
};
}  // namespace

StagedTables stage_host_tables(const void* host, size_t table_bytes, size_t result_bytes) {
  const Staging staging(table_bytes, result_bytes);
  if (table_bytes > 0) std::memcpy(staging.pinned, host, table_bytes);
  staging.send();
  return StagedTables{staging.device, staging.results()};
}

StagedView stage_view_tables(const AttentionView& host_view, size_t result_bytes) {
  const int32_t num_seqs = host_view.num_seqs;
  const size_t views_bytes = static_cast<size_t>(num_seqs) * sizeof(SeqKvView);
  const size_t q_indptr_offset = views_bytes;
  const size_t tables_offset = (q_indptr_offset + (static_cast<size_t>(num_seqs) + 1) * sizeof(int32_t) + 7) / 8 * 8;
  // Per sequence: num_tokens [num_kv_heads], then its page lists [num_kv_heads][pages of its longest stream].
  const int32_t num_heads = host_view.num_kv_heads;
  const auto pages = [&](int32_t num_tokens) { return (num_tokens + host_view.page_size - 1) / host_view.page_size; };
  const auto stride_of = [&](const SeqKvView& sv) {
    return num_heads > 0 ? pages(*std::max_element(sv.num_tokens, sv.num_tokens + num_heads)) : 0;
  };
  const auto seq_bytes = [&](const SeqKvView& sv) {
    return (static_cast<size_t>(num_heads) * (1 + static_cast<size_t>(stride_of(sv))) * sizeof(int32_t) + 7) / 8 * 8;
  };
  size_t num_bytes = tables_offset;
  for (int32_t s = 0; s < num_seqs; ++s) num_bytes += seq_bytes(host_view.seqs[s]);
  const Staging staging(num_bytes, result_bytes);
  auto* views = reinterpret_cast<SeqKvView*>(staging.pinned);
  std::memcpy(staging.pinned + q_indptr_offset, host_view.q_indptr,
              (static_cast<size_t>(num_seqs) + 1) * sizeof(int32_t));
  size_t offset = tables_offset;
  for (int32_t s = 0; s < num_seqs; ++s) {
    const SeqKvView& sv = host_view.seqs[s];
    const int32_t stride = stride_of(sv);
    auto* num_tokens = reinterpret_cast<int32_t*>(staging.pinned + offset);
    std::memcpy(num_tokens, sv.num_tokens, static_cast<size_t>(num_heads) * sizeof(int32_t));
    for (int32_t h = 0; h < num_heads; ++h)
      std::memcpy(num_tokens + num_heads + static_cast<int64_t>(h) * stride,
                  sv.page_ids + static_cast<int64_t>(h) * sv.stride,
                  static_cast<size_t>(pages(sv.num_tokens[h])) * sizeof(int32_t));
    views[s] = SeqKvView{};
    views[s].num_tokens = reinterpret_cast<const int32_t*>(staging.device + offset);
    views[s].page_ids = views[s].num_tokens + num_heads;
    views[s].stride = stride;
    offset += seq_bytes(sv);
  }
  staging.send();
  StagedView staged{host_view, staging.results()};
  staged.view.q_indptr = reinterpret_cast<const int32_t*>(staging.device + q_indptr_offset);
  staged.view.seqs = reinterpret_cast<const SeqKvView*>(staging.device);
  staged.view.tables_device = Device::kCuda;
  staged.view.has_selection = false;
  staged.view.selected_rows_max = -1;
  staged.view.selection_produced = false;
  staged.view.produced = {};
  return staged;
}

void fetch_results(void* host, const void* device, size_t nbytes) {
  CudaContext& context = CudaContext::current();
  if (nbytes > 0)
    SE_CUDA_CHECK(cudaMemcpyAsync(host, device, nbytes, cudaMemcpyDeviceToHost, context.stream()));
  context.synchronize();
}

}  // namespace se::cuda
