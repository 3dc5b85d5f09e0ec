// Staging for the CUDA ops that take the cache's host view (the sparse methods' scoring ops, see
// cuda_ops.h): the op packs the tables its kernel reads into a host buffer, and stage_host_tables
// copies them into the current context's scratch in one transfer (through the context's pinned ring,
// so it does not wait for the stream), with room after them for the op's device-side results. The scratch grows geometrically (no allocation in a steady state) and is
// shared with the other ops that use it: what is staged is valid for the kernels enqueued before
// the next scratch user, which stream order guarantees. Engine thread only, as CudaContext.
#pragma once

#include <cstddef>

#include "backend/attention_view.h"

namespace se::cuda {

struct StagedTables {
  const void* tables;  // the copy of the host bytes (device)
  void* results;       // result_bytes of uninitialized device memory, 16-byte aligned
};

// Enqueues the copy of host[0, table_bytes) on the current stream; `host` may be reused on return.
StagedTables stage_host_tables(const void* host, size_t table_bytes, size_t result_bytes);

// Stages a host view's tables the same way: q_indptr, the sequences' views and their page lists (cut to the pages
// each stream holds; the selection is not copied). The returned view reads them on the device.
struct StagedView {
  AttentionView view;
  void* results;  // result_bytes of uninitialized device memory, 16-byte aligned
};
StagedView stage_view_tables(const AttentionView& host_view, size_t result_bytes);

// Copies `nbytes` of device results into host memory and waits for the stream (so the caller may
// read them and execution errors of the op's kernels surface here).
void fetch_results(void* host, const void* device, size_t nbytes);

}  // namespace se::cuda
