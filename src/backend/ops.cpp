// Shape checks and device dispatch for backend/ops.h.
#include "backend/ops.h"

#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/turboquant_rows.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/device_memory.h"
#include "backend/op_dispatch.h"
#include "backend/quant/quantized_kv_layout.h"
#include "backend/quant/turboquant_kv.h"
#include "backend/quant/turboquant_prod_kv.h"
#include "base/check.h"
#include "base/top_k.h"

namespace se {

namespace {
void require_cpu_f32(const TensorView& t, const char* what) {
  SE_CHECK(t.device == Device::kCpu, "{}: only the CPU backend is built for this op", what);
  SE_CHECK(t.dtype == DType::kF32, "{}: expected f32, got {}", what, dtype_name(t.dtype));
}
int64_t last_dim(const TensorView& t) { return t.shape[t.shape.rank() - 1]; }

// An FP8 (e4m3) pool: one-byte codes in the explicit page layout, which write_kv quantizes into and the row
// copies of eviction move as they are.
bool is_fp8_pool(const AttentionView& view) {
  return view.payload == KvPayload::kQuantized && view.quantized.scheme == KvQuantScheme::kFp8E4M3 &&
         view.kv_dtype == DType::kU8;
}
// Pages the CPU's score and row-copy ops read: f32 K/V, FP8 codes or TurboQuant slots.
bool cpu_scores_and_moves_read(const AttentionView& view) {
  return view.kv_dtype == DType::kF32 || is_fp8_pool(view) || is_turboquant_view(view);
}
// True when a sparse-method op works on a GPU KV pool (ops.h: host tables over a device pool); the
// build must then have the CUDA backend, and the pages are bf16 K/V, or FP8 codes for the ops that
// read them (`reads_fp8`: eviction's row copies and attention_scores, as on the CPU), or a shared latent's bf16 rows
// for the ops that move rows as bytes (`moves_latent_rows`: eviction's row copies).
bool pool_on_cuda(const AttentionView& view, const char* what, bool reads_fp8 = false, bool moves_latent_rows = false) {
  if (view.kv_device != Device::kCuda) return false;
  SE_CHECK(kCudaBuilt,
           "{}: the KV pool is on the GPU, but this build has no CUDA backend (configure with -DSE_CUDA=ON)", what);
  if (reads_fp8 && is_fp8_pool(view)) return true;
  if (moves_latent_rows && view.payload == KvPayload::kSharedLatent && view.kv_dtype == DType::kBF16) return true;
  SE_CHECK(view.payload == KvPayload::kExplicit, "{}: only explicit K/V pages are implemented on CUDA", what);
  SE_CHECK(view.kv_dtype == DType::kBF16, "{}: CUDA KV pages are bf16, got {}", what, dtype_name(view.kv_dtype));
  return true;
}
// A score op's output with a GPU pool: host f32 memory, since the methods read scores on the host.
void require_host_scores(const TensorView& out, const char* what) {
  SE_CHECK(out.device == Device::kCpu && out.dtype == DType::kF32,
           "{}: expected host f32 memory (the methods read scores on the host), got {} {}", what,
           device_name(out.device), dtype_name(out.dtype));
}
// A CUDA activation: on the device, F32 or BF16.
void require_cuda_act(const TensorView& t, const char* what) {
  SE_CHECK(t.device == Device::kCuda, "{}: expected a CUDA tensor", what);
  SE_CHECK(t.dtype == DType::kF32 || t.dtype == DType::kBF16, "{}: expected f32 or bf16, got {}", what,
           dtype_name(t.dtype));
}
}  // namespace

void embedding(TensorView out, TensorView table, TensorView ids) {
  if (on_cuda(out, "embedding")) {
    require_cuda_act(out, "embedding.out");
    SE_CHECK(table.device == Device::kCuda && ids.device == Device::kCuda,
             "embedding: table and ids on the GPU");
    SE_CHECK(ids.dtype == DType::kI32 && table.shape.rank() == 2 &&
                 (table.dtype == DType::kF32 || table.dtype == DType::kF16 || table.dtype == DType::kBF16),
             "embedding: ids i32, table 2-d f32/f16/bf16");
    SE_CHECK(out.numel() == ids.numel() * table.shape[1], "embedding: out {} for {} ids of dim {}",
             out.shape.to_string(), ids.numel(), table.shape[1]);
    if constexpr (kCudaBuilt) cuda::embedding(out, table, ids);
    return;
  }
  require_cpu_f32(out, "embedding.out");
  SE_CHECK(ids.dtype == DType::kI32 && table.shape.rank() == 2, "embedding: ids i32, table 2-d");
  SE_CHECK(out.numel() == ids.numel() * table.shape[1], "embedding: out {} for {} ids of dim {}",
           out.shape.to_string(), ids.numel(), table.shape[1]);
  cpu::embedding(out, table, ids);
}

void vocab_shard_embedding(TensorView out, TensorView table, TensorView ids, int64_t first_row) {
  SE_CHECK(ids.dtype == DType::kI32 && table.shape.rank() == 2 && first_row >= 0,
           "vocab_shard_embedding: ids i32, table 2-d, first row {}", first_row);
  SE_CHECK(out.numel() == ids.numel() * table.shape[1], "vocab_shard_embedding: out {} for {} ids of dim {}",
           out.shape.to_string(), ids.numel(), table.shape[1]);
  if (on_cuda(out, "vocab_shard_embedding")) {
    require_cuda_act(out, "vocab_shard_embedding.out");
    SE_CHECK(table.device == Device::kCuda && ids.device == Device::kCuda,
             "vocab_shard_embedding: table and ids on the GPU");
    if constexpr (kCudaBuilt) cuda::vocab_shard_embedding(out, table, ids, first_row);
    return;
  }
  require_cpu_f32(out, "vocab_shard_embedding.out");
  cpu::vocab_shard_embedding(out, table, ids, first_row);
}

void rms_norm(TensorView out, TensorView x, TensorView weight, float eps) {
  if (on_cuda(out, "rms_norm")) {
    require_cuda_act(out, "rms_norm.out");
    require_cuda_act(x, "rms_norm.x");
    require_cuda_act(weight, "rms_norm.weight");
    SE_CHECK(out.numel() == x.numel() && last_dim(x) == weight.numel(), "rms_norm: x {} weight {}",
             x.shape.to_string(), weight.shape.to_string());
    if constexpr (kCudaBuilt) cuda::rms_norm(out, x, weight, eps);
    return;
  }
  require_cpu_f32(out, "rms_norm.out");
  SE_CHECK(out.numel() == x.numel() && last_dim(x) == weight.numel(), "rms_norm: x {} weight {}",
           x.shape.to_string(), weight.shape.to_string());
  cpu::rms_norm(out, x, weight, eps);
}

void add_rms_norm(TensorView out, TensorView residual, TensorView x, TensorView weight, float eps) {
  if (on_cuda(out, "add_rms_norm")) {
    require_cuda_act(out, "add_rms_norm.out");
    require_cuda_act(residual, "add_rms_norm.residual");
    require_cuda_act(x, "add_rms_norm.x");
    require_cuda_act(weight, "add_rms_norm.weight");
    SE_CHECK(out.numel() == x.numel() && residual.numel() == x.numel() && last_dim(x) == weight.numel(),
             "add_rms_norm: x {} residual {} weight {}", x.shape.to_string(), residual.shape.to_string(),
             weight.shape.to_string());
    if constexpr (kCudaBuilt) cuda::add_rms_norm(out, residual, x, weight, eps);
    return;
  }
  require_cpu_f32(out, "add_rms_norm.out");
  SE_CHECK(out.numel() == x.numel() && residual.numel() == x.numel() && last_dim(x) == weight.numel(),
           "add_rms_norm: x {} residual {} weight {}", x.shape.to_string(), residual.shape.to_string(),
           weight.shape.to_string());
  cpu::add_rms_norm(out, residual, x, weight, eps);
}

namespace {
// The shape and dtype checks of linear and linear_add; true when the op runs on the GPU.
bool check_linear(const TensorView& out, const TensorView& x, const TensorView& w, const TensorView* bias,
                  const char* what) {
  SE_CHECK(w.shape.rank() == 2 && last_dim(x) == w.shape[1], "{}: x {} w {}", what, x.shape.to_string(),
           w.shape.to_string());
  SE_CHECK(out.numel() == x.numel() / w.shape[1] * w.shape[0], "{}: out {} for x {} w {}", what,
           out.shape.to_string(), x.shape.to_string(), w.shape.to_string());
  if (on_cuda(out, what)) {
    require_cuda_act(out, what);
    require_cuda_act(x, what);
    require_cuda_act(w, what);
    SE_CHECK(x.dtype == w.dtype && (x.dtype == DType::kBF16 || out.dtype == DType::kF32),
             "{}: x {} w {} out {} (CUDA: bf16 x and w with bf16 or f32 out, or all f32)", what,
             dtype_name(x.dtype), dtype_name(w.dtype), dtype_name(out.dtype));
    SE_CHECK(bias == nullptr || (bias->numel() == w.shape[0] && bias->device == Device::kCuda), "{}: bias", what);
    return true;
  }
  require_cpu_f32(out, what);
  require_cpu_f32(w, what);
  SE_CHECK(bias == nullptr || bias->numel() == w.shape[0], "{}: bias size", what);
  return false;
}
}  // namespace

void linear(TensorView out, TensorView x, TensorView w, const TensorView* bias) {
  if (check_linear(out, x, w, bias, "linear")) {
    if constexpr (kCudaBuilt) cuda::linear(out, x, w, bias);
    return;
  }
  cpu::linear(out, x, w, bias);
}

void linear_add(TensorView out, TensorView x, TensorView w) {
  SE_CHECK(out.dtype == DType::kF32, "linear_add: the residual stream is f32, got {}", dtype_name(out.dtype));
  if (check_linear(out, x, w, nullptr, "linear_add")) {
    if constexpr (kCudaBuilt) cuda::linear_add(out, x, w);
    return;
  }
  cpu::linear_add(out, x, w);
}

namespace {
void check_rope(TensorView x, TensorView positions, const RopeParams& params) {
  SE_CHECK(x.shape.rank() == 3 && positions.numel() == x.shape[0], "rope: x {} positions {}", x.shape.to_string(),
           positions.numel());
  SE_CHECK(params.rotary_dim > 0 && params.rotary_dim % 2 == 0 && params.rotary_dim <= x.shape[2],
           "rope: rotary_dim {} head_dim {}", params.rotary_dim, x.shape[2]);
}
}  // namespace

void rope(TensorView x, TensorView positions, const RopeParams& params) {
  check_rope(x, positions, params);
  if (on_cuda(x, "rope")) {
    require_cuda_act(x, "rope.x");
    SE_CHECK(positions.device == Device::kCuda && positions.dtype == DType::kI32, "rope: positions i32 on the GPU");
    if constexpr (kCudaBuilt) cuda::rope(x, positions, params);
    return;
  }
  require_cpu_f32(x, "rope.x");
  cpu::rope(x, positions, params);
}

void split_qkv_rope(TensorView q, TensorView k, TensorView v, TensorView qkv, TensorView positions,
                    const RopeParams& rope_params, const QkNorm* qk_norm) {
  check_rope(q, positions, rope_params);
  check_rope(k, positions, rope_params);
  const int64_t head_dim = q.shape[2];
  SE_CHECK(qkv.shape.rank() == 2 && qkv.shape[0] == q.shape[0] && k.shape == v.shape && k.shape[0] == q.shape[0] &&
               k.shape[2] == head_dim && qkv.shape[1] == (q.shape[1] + 2 * k.shape[1]) * head_dim,
           "split_qkv_rope: qkv {} into q {}, k {}, v {}", qkv.shape.to_string(), q.shape.to_string(),
           k.shape.to_string(), v.shape.to_string());
  SE_CHECK(q.dtype == qkv.dtype && k.dtype == qkv.dtype && v.dtype == qkv.dtype && q.device == qkv.device &&
               k.device == qkv.device && v.device == qkv.device,
           "split_qkv_rope: q, k, v and qkv must share a dtype and device");
  SE_CHECK(qk_norm == nullptr ||
               (qk_norm->q_weight.numel() == head_dim && qk_norm->k_weight.numel() == head_dim &&
                qk_norm->q_weight.device == qkv.device && qk_norm->k_weight.device == qkv.device),
           "split_qkv_rope: q/k norm weights of {} elements on the activations' device", head_dim);
  if (q.shape[0] == 0) return;
  if (on_cuda(qkv, "split_qkv_rope")) {
    require_cuda_act(qkv, "split_qkv_rope.qkv");
    SE_CHECK(positions.device == Device::kCuda && positions.dtype == DType::kI32,
             "split_qkv_rope: positions i32 on the GPU");
    if constexpr (kCudaBuilt) cuda::split_qkv_rope(q, k, v, qkv, positions, rope_params, qk_norm);
    return;
  }
  require_cpu_f32(qkv, "split_qkv_rope.qkv");
  cpu::split_qkv_rope(q, k, v, qkv, positions, rope_params, qk_norm);
}

void gated_activation(TensorView out, TensorView gate_up, Activation act) {
  if (on_cuda(out, "gated_activation")) {
    require_cuda_act(out, "gated_activation.out");
    require_cuda_act(gate_up, "gated_activation.gate_up");
    SE_CHECK(gate_up.numel() == 2 * out.numel() && last_dim(gate_up) == 2 * last_dim(out),
             "gated_activation: gate_up {} out {}", gate_up.shape.to_string(), out.shape.to_string());
    if constexpr (kCudaBuilt) cuda::gated_activation(out, gate_up, act);
    return;
  }
  require_cpu_f32(out, "gated_activation.out");
  SE_CHECK(gate_up.numel() == 2 * out.numel(), "gated_activation: gate_up {} out {}",
           gate_up.shape.to_string(), out.shape.to_string());
  cpu::gated_activation(out, gate_up, act);
}

void add_inplace(TensorView x, TensorView y) {
  if (on_cuda(x, "add_inplace")) {
    require_cuda_act(x, "add_inplace.x");
    require_cuda_act(y, "add_inplace.y");
    SE_CHECK(x.numel() == y.numel(), "add_inplace: {} vs {}", x.shape.to_string(), y.shape.to_string());
    if constexpr (kCudaBuilt) cuda::add_inplace(x, y);
    return;
  }
  require_cpu_f32(x, "add_inplace.x");
  SE_CHECK(x.numel() == y.numel(), "add_inplace: {} vs {}", x.shape.to_string(), y.shape.to_string());
  cpu::add_inplace(x, y);
}

void scale_inplace(TensorView x, float s) {
  if (on_cuda(x, "scale_inplace")) {
    require_cuda_act(x, "scale_inplace.x");
    if constexpr (kCudaBuilt) cuda::scale_inplace(x, s);
    return;
  }
  require_cpu_f32(x, "scale_inplace.x");
  cpu::scale_inplace(x, s);
}

void softcap_inplace(TensorView x, float cap) {
  if (on_cuda(x, "softcap_inplace")) {
    require_cuda_act(x, "softcap_inplace.x");
    SE_CHECK(cap > 0.0f, "softcap must be positive");
    if constexpr (kCudaBuilt) cuda::softcap_inplace(x, cap);
    return;
  }
  require_cpu_f32(x, "softcap_inplace.x");
  SE_CHECK(cap > 0.0f, "softcap must be positive");
  cpu::softcap_inplace(x, cap);
}

void convert(TensorView dst, TensorView src) {
  const auto f32_or_bf16 = [](DType t) { return t == DType::kF32 || t == DType::kBF16; };
  SE_CHECK(f32_or_bf16(dst.dtype) && f32_or_bf16(src.dtype), "convert: {} to {} (F32 and BF16 only)",
           dtype_name(src.dtype), dtype_name(dst.dtype));
  SE_CHECK(dst.numel() == src.numel() && dst.device == src.device, "convert: {} on {} into {} on {}",
           src.shape.to_string(), device_name(src.device), dst.shape.to_string(), device_name(dst.device));
  if (dst.numel() == 0) return;
  if (on_cuda(dst, "convert")) {
    if constexpr (kCudaBuilt) cuda::convert(dst, src);
    return;
  }
  cpu::convert(dst, src);
}

void scatter_rows_to_bf16(TensorView src, TensorView rows, int64_t dest_offset) {
  SE_CHECK(src.dtype == DType::kF32 && src.shape.rank() >= 1, "scatter_rows_to_bf16: src {} {} (F32 rows)",
           dtype_name(src.dtype), src.shape.to_string());
  SE_CHECK(rows.dtype == DType::kI64 && rows.shape.rank() == 2 && rows.shape[1] == 2 && rows.device == src.device &&
               dest_offset >= 0,
           "scatter_rows_to_bf16: rows {} {} on {} (an [n, 2] I64 table where src lives, {}), offset {}",
           dtype_name(rows.dtype), rows.shape.to_string(), device_name(rows.device), device_name(src.device),
           dest_offset);
  if (rows.shape[0] == 0) return;
  if (on_cuda(src, "scatter_rows_to_bf16")) {
    if constexpr (kCudaBuilt) cuda::scatter_rows_to_bf16(src, rows, dest_offset);
    return;
  }
  const std::span<const RowDestination> entries(rows.ptr<RowDestination>(), static_cast<size_t>(rows.shape[0]));
  for (const RowDestination& row : entries)
    SE_CHECK(row.source_row >= 0 && row.source_row < src.shape[0] && row.dest != nullptr,
             "scatter_rows_to_bf16: source row {} of {} to {}", row.source_row, src.shape[0], row.dest);
  cpu::scatter_rows_to_bf16(src, entries, dest_offset);
}

void argmax_rows(TensorView ids, TensorView logprobs, TensorView x) {
  SE_CHECK(ids.dtype == DType::kI32 && logprobs.dtype == DType::kF32 && x.shape.rank() == 2 &&
               ids.numel() == x.shape[0] && logprobs.numel() == x.shape[0] && x.shape[1] > 0,
           "argmax_rows: ids {} {} logprobs {} for x {}", dtype_name(ids.dtype), ids.shape.to_string(),
           logprobs.shape.to_string(), x.shape.to_string());
  if (on_cuda(ids, "argmax_rows")) {
    require_cuda_act(x, "argmax_rows.x");
    SE_CHECK(logprobs.device == Device::kCuda, "argmax_rows: logprobs on the GPU");
    if constexpr (kCudaBuilt) cuda::argmax_rows(ids, logprobs, x);
    return;
  }
  require_cpu_f32(x, "argmax_rows.x");
  cpu::argmax_rows(ids, logprobs, x);
}

void sample_rows(TensorView ids, TensorView logprobs, TensorView x, std::span<const RowSampling> rows) {
  SE_CHECK(ids.dtype == DType::kI32 && logprobs.dtype == DType::kF32 && x.shape.rank() == 2 &&
               ids.numel() == x.shape[0] && logprobs.numel() == x.shape[0] && x.shape[1] > 0 &&
               static_cast<int64_t>(rows.size()) == x.shape[0],
           "sample_rows: ids {} {} logprobs {} and {} settings for x {}", dtype_name(ids.dtype),
           ids.shape.to_string(), logprobs.shape.to_string(), rows.size(), x.shape.to_string());
  for (const RowSampling& row : rows)
    SE_CHECK(row.temperature > 0.0f && row.top_p > 0.0f && row.top_p <= 1.0f && row.min_p >= 0.0f &&
                 row.min_p <= 1.0f && row.u >= 0.0 && row.u < 1.0,
             "sample_rows: invalid settings (temperature {}, top_p {}, min_p {}, u {})", row.temperature, row.top_p,
             row.min_p, row.u);
  if (on_cuda(ids, "sample_rows")) {
    require_cuda_act(x, "sample_rows.x");
    SE_CHECK(logprobs.device == Device::kCuda, "sample_rows: logprobs on the GPU");
    if constexpr (kCudaBuilt) cuda::sample_rows(ids, logprobs, x, rows);
    return;
  }
  require_cpu_f32(x, "sample_rows.x");
  cpu::sample_rows(ids, logprobs, x, rows);
}

void mask_refused_tokens(TensorView out, TensorView x, TensorView allowed) {
  SE_CHECK(x.shape.rank() == 2 && out.shape == x.shape && out.dtype == x.dtype && allowed.dtype == DType::kI64 &&
               allowed.shape.rank() == 2 && allowed.shape[0] == x.shape[0] &&
               allowed.shape[1] == (x.shape[1] + 63) / 64,
           "mask_refused_tokens: out {} {} x {} {} allowed {} {}", dtype_name(out.dtype), out.shape.to_string(),
           dtype_name(x.dtype), x.shape.to_string(), dtype_name(allowed.dtype), allowed.shape.to_string());
  if (on_cuda(out, "mask_refused_tokens")) {
    require_cuda_act(x, "mask_refused_tokens.x");
    SE_CHECK(allowed.device == Device::kCuda, "mask_refused_tokens: allowed on the GPU");
    if constexpr (kCudaBuilt) cuda::mask_refused_tokens(out, x, allowed);
    return;
  }
  require_cpu_f32(x, "mask_refused_tokens.x");
  cpu::mask_refused_tokens(out, x, allowed);
}

void token_logprobs(TensorView logprobs, TensorView x, TensorView ids) {
  SE_CHECK(ids.dtype == DType::kI32 && logprobs.dtype == DType::kF32 && x.shape.rank() == 2 &&
               ids.numel() == x.shape[0] && logprobs.numel() == x.shape[0] && x.shape[1] > 0,
           "token_logprobs: logprobs {} ids {} {} for x {}", logprobs.shape.to_string(), dtype_name(ids.dtype),
           ids.shape.to_string(), x.shape.to_string());
  if (on_cuda(logprobs, "token_logprobs")) {
    require_cuda_act(x, "token_logprobs.x");
    SE_CHECK(ids.device == Device::kCuda, "token_logprobs: ids on the GPU");
    if constexpr (kCudaBuilt) cuda::token_logprobs(logprobs, x, ids);
    return;
  }
  require_cpu_f32(x, "token_logprobs.x");
  for (int64_t r = 0; r < ids.numel(); ++r)
    SE_CHECK(ids.ptr<int32_t>()[r] >= 0 && ids.ptr<int32_t>()[r] < x.shape[1],
             "token_logprobs: id {} of row {} is not in [0, {})", ids.ptr<int32_t>()[r], r, x.shape[1]);
  cpu::token_logprobs(logprobs, x, ids);
}

namespace {

struct OpEntry {
  OpId id;
  std::string_view name;
  bool cuda_kernel;  // a twin in backend/cuda/cuda_ops.h
};

// Indexed by OpId; a new op adds one row here.
constexpr OpEntry kOps[] = {
    {OpId::kEmbedding, "embedding", true},
    {OpId::kRmsNorm, "rms_norm", true},
    {OpId::kAddRmsNorm, "add_rms_norm", true},
    {OpId::kLinear, "linear", true},
    {OpId::kLinearAdd, "linear_add", true},
    {OpId::kRope, "rope", true},
    {OpId::kGatedActivation, "gated_activation", true},
    {OpId::kSplitQkvRope, "split_qkv_rope", true},
    {OpId::kAddInplace, "add_inplace", true},
    {OpId::kScaleInplace, "scale_inplace", true},
    {OpId::kSoftcapInplace, "softcap_inplace", true},
    {OpId::kArgmaxRows, "argmax_rows", true},
    {OpId::kSampleRows, "sample_rows", true},
    {OpId::kMaskRefusedTokens, "mask_refused_tokens", true},
    {OpId::kTokenLogprobs, "token_logprobs", true},
    {OpId::kAttention, "attention", false},
    {OpId::kWriteKv, "write_kv", true},
    {OpId::kPagedAttention, "paged_attention", true},
    {OpId::kPagedAttentionOverSelection, "paged_attention over a selection", true},
    {OpId::kPagedAttentionOverFp8Pages, "paged_attention over fp8 pages", true},
    {OpId::kPagedAttentionOverKiviPages, "paged_attention over kivi pages", true},
    {OpId::kPagedAttentionOverTurboQuantPages, "paged_attention over turboquant pages", false},
    {OpId::kUpdatePageKeyBounds, "update_page_key_bounds", true},
    {OpId::kPageKeyBoundScores, "page_key_bound_scores", true},
    {OpId::kSelectPagesByKeyBounds, "select_pages_by_key_bounds", true},
    {OpId::kAttentionLogitsMaxOverHeads, "attention_logits_max_over_heads", true},
    {OpId::kTopKeysByLogitsMaxOverHeads, "top_keys_by_logits_max_over_heads", true},
    {OpId::kTokenListsWithTail, "token_lists_with_tail", true},
    {OpId::kAttentionScores, "attention_scores", true},
    {OpId::kCompactKv, "compact_kv", true},
    {OpId::kMoveKvRows, "move_kv_rows", true},
    {OpId::kSubsetAttentionMaxScores, "subset_attention_max_scores", true},
    {OpId::kGatherKeys, "gather_keys", true},
    {OpId::kPagedLatentAttention, "paged_latent_attention", true},
    {OpId::kAbsorbLatentQueries, "absorb_latent_queries", true},
    {OpId::kRopeLatentHeads, "rope_latent_heads", true},
    {OpId::kPagedLowRankAttention, "paged_low_rank_attention", true},
    {OpId::kBidirectionalWindowScores, "bidirectional_window_scores", true},
    {OpId::kGroupMaxAttentionImportance, "group_max_attention_importance", true},
    {OpId::kKeyRedundancy, "key_redundancy", true},
    {OpId::kRedundancyAwareScores, "redundancy_aware_scores", true},
};

constexpr bool rows_follow_ids() {
  for (size_t i = 0; i < std::size(kOps); ++i)
    if (static_cast<size_t>(kOps[i].id) != i) return false;
  return true;
}
static_assert(rows_follow_ids(), "kOps rows must follow the OpId order");

const OpEntry& entry(OpId op) {
  const auto i = static_cast<size_t>(op);
  SE_CHECK(i < std::size(kOps), "OpId {} has no row in the op table", i);
  return kOps[i];
}

}  // namespace

std::string_view op_name(OpId op) { return entry(op).name; }

bool cuda_implements(OpId op) { return kCudaBuilt && entry(op).cuda_kernel; }

void attention(TensorView out, TensorView q, TensorView k, TensorView v, TensorView q_positions,
               TensorView k_positions, const AttentionParams& params) {
  require_cpu_f32(out, "attention.out");
  SE_CHECK(q.shape.rank() == 3 && k.shape.rank() == 3 && v.shape == k.shape, "attention: q {} k {} v {}",
           q.shape.to_string(), k.shape.to_string(), v.shape.to_string());
  SE_CHECK(q.shape[2] == k.shape[2] && q.shape[1] % k.shape[1] == 0, "attention: heads q {} k {}",
           q.shape.to_string(), k.shape.to_string());
  SE_CHECK(q_positions.numel() == q.shape[0] && k_positions.numel() == k.shape[0],
           "attention: positions");
  cpu::attention(out, q, k, v, q_positions, k_positions, params);
}

namespace {
// A KIVI view's residual window as the backend keeps it (f32 rows on the CPU, bf16 on CUDA) and its codes' geometry.
void check_kivi_geometry(const AttentionView& view, std::string_view op) {
  const QuantizedKvView& qv = view.quantized;
  const DType rows = view.kv_device == Device::kCuda ? DType::kBF16 : DType::kF32;
  SE_CHECK(view.kv_dtype == rows, "{}: KIVI residual rows on {} are {}, got {}", op, device_name(view.kv_device),
           dtype_name(rows), dtype_name(view.kv_dtype));
  SE_CHECK(qv.bits == 2 || qv.bits == 4 || qv.bits == 8, "{}: KIVI bits {} (2, 4 or 8)", op, qv.bits);
  SE_CHECK(qv.group_size > 0 && qv.group_size % (32 / qv.bits) == 0,
           "{}: KIVI group size {} is not a positive multiple of {}", op, qv.group_size, 32 / qv.bits);
  SE_CHECK(
      qv.value_group_size > 0 && view.head_dim % qv.value_group_size == 0 && qv.value_group_size % (32 / qv.bits) == 0,
      "{}: KIVI value group size {} does not divide head_dim {} in whole {}-bit code words", op, qv.value_group_size,
      view.head_dim, qv.bits);
  const KiviPageLayout layout = kivi_page_layout(qv.group_size, qv.value_group_size, view.head_dim, qv.bits);
  SE_CHECK(qv.quantized_page_bytes == layout.page_bytes, "{}: KIVI pages of {} bytes, the layout has {}", op,
           qv.quantized_page_bytes, layout.page_bytes);
  SE_CHECK(view.page_size > 0 &&
               2 * static_cast<size_t>(view.page_size) * view.head_dim * dtype_size(view.kv_dtype) <= view.page_bytes,
           "{}: {} residual rows of head_dim {} do not fit a page of {} bytes", op, view.page_size, view.head_dim,
           view.page_bytes);
}

void write_kivi_window(const AttentionView& view, TensorView k, TensorView v) {
  check_kivi_geometry(view, "write_kv");
  SE_CHECK(view.quantized.kivi_seqs != nullptr, "write_kv: KIVI view without its sequences' tables");
  SE_CHECK((k.device == Device::kCuda) == (view.kv_device == Device::kCuda), "write_kv: k on {}, the KV pool on {}",
           device_name(k.device), device_name(view.kv_device));
  SE_CHECK(k.shape.rank() == 3 && k.shape[1] == view.num_kv_heads && k.shape[2] == view.head_dim && v.shape == k.shape,
           "write_kv: k {} v {} for {} KV heads x {}", k.shape.to_string(), v.shape.to_string(), view.num_kv_heads,
           view.head_dim);
  if (on_cuda(k, "write_kv")) {
    // Device tables: the row count is the caller's contract, as for the other stores.
    require_cuda_act(k, "write_kv.k");
    require_cuda_act(v, "write_kv.v");
    SE_CHECK(k.dtype == v.dtype, "write_kv: k is {}, v {}", dtype_name(k.dtype), dtype_name(v.dtype));
    if constexpr (kCudaBuilt) cuda::write_kivi_window(view, k, v);
    return;
  }
  require_cpu_f32(k, "write_kv.k");
  require_cpu_f32(v, "write_kv.v");
  SE_CHECK(k.shape[0] == view.q_indptr[view.num_seqs], "write_kv: k {} for {} rows", k.shape.to_string(),
           view.q_indptr[view.num_seqs]);
  cpu::write_kivi_window(view, k, v);
}
}  // namespace

void quantize_kivi_rows(const AttentionView& pool, const KiviFlushRows& rows) {
  SE_CHECK(is_kivi_view(pool), "quantize_kivi_rows: not a KIVI view of the pool");
  check_kivi_geometry(pool, "quantize_kivi_rows");
  SE_CHECK(rows.key_rows.size() == rows.key_pages.size() * static_cast<size_t>(pool.quantized.group_size) &&
               rows.value_slots.size() == rows.value_pages.size() && rows.value_rows.size() == rows.value_pages.size(),
           "quantize_kivi_rows: {} key rows for {} groups of {}, {} value rows, {} slots and {} pages",
           rows.key_rows.size(), rows.key_pages.size(), pool.quantized.group_size, rows.value_rows.size(),
           rows.value_slots.size(), rows.value_pages.size());
  for (int32_t slot : rows.value_slots)
    SE_CHECK(slot >= 0 && slot < pool.quantized.group_size, "quantize_kivi_rows: value slot {} of a group of {}", slot,
             pool.quantized.group_size);
  if (rows.key_pages.empty() && rows.value_pages.empty()) return;
  if (pool.kv_device == Device::kCuda) {
    SE_CHECK(kCudaBuilt, "quantize_kivi_rows: the KV pool is on the GPU, but this build has no CUDA backend");
    if constexpr (kCudaBuilt) cuda::quantize_kivi_rows(pool, rows);
    return;
  }
  cpu::quantize_kivi_rows(pool, rows);
}

void write_kv(const AttentionView& view, TensorView k, TensorView v) {
  if (is_kivi_view(view)) {
    write_kivi_window(view, k, v);
    return;
  }
  const bool fp8 = is_fp8_pool(view);
  SE_CHECK(view.payload == KvPayload::kExplicit || view.payload == KvPayload::kSharedLatent ||
               view.payload == KvPayload::kLowRankLatent || fp8,
           "write_kv: only explicit and FP8 K/V pages are written by this op, KIVI windows and latent rows");
  if (fp8)
    SE_CHECK(view.quantized.k_scales != nullptr && view.quantized.v_scales != nullptr,
             "write_kv: fp8 pages, no scales");
  SE_CHECK((k.device == Device::kCuda) == (view.kv_device == Device::kCuda), "write_kv: k on {}, the KV pool on {}",
           device_name(k.device), device_name(view.kv_device));
  if (on_cuda(k, "write_kv")) {
    SE_CHECK(view.payload != KvPayload::kLowRankLatent, "write_kv: low-rank latent pages are not written on CUDA yet");
    // The view's tables (and an FP8 view's scales) are device memory here: row counts are the caller's contract,
    // not checked.
    require_cuda_act(k, "write_kv.k");
    require_cuda_act(v, "write_kv.v");
    SE_CHECK(view.kv_dtype == (fp8 ? DType::kU8 : DType::kBF16), "write_kv: CUDA KV pages are bf16 (or fp8), got {}",
             dtype_name(view.kv_dtype));
    SE_CHECK(k.dtype == v.dtype && k.shape.rank() == 3 && k.shape[1] == view.num_kv_heads &&
                 k.shape[2] == view.head_dim && v.shape == k.shape,
             "write_kv: k {} v {} for {} KV heads x {}", k.shape.to_string(), v.shape.to_string(),
             view.num_kv_heads, view.head_dim);
    if constexpr (kCudaBuilt) cuda::write_kv(view, k, v);
    return;
  }
  require_cpu_f32(k, "write_kv.k");
  SE_CHECK(view.kv_dtype == (fp8 ? DType::kU8 : DType::kF32),
           "write_kv: the CPU backend keeps f32 (or fp8) pages, got {}", dtype_name(view.kv_dtype));
  SE_CHECK(k.shape.rank() == 3 && k.shape[1] == view.num_kv_heads && k.shape[2] == view.head_dim &&
               v.shape == k.shape && k.shape[0] == view.q_indptr[view.num_seqs],
           "write_kv: k {} v {} for {} rows of {} KV heads x {}", k.shape.to_string(), v.shape.to_string(),
           view.q_indptr[view.num_seqs], view.num_kv_heads, view.head_dim);
  cpu::write_kv(view, k, v);
}

void fp8_kv_scales(TensorView k_scales, TensorView v_scales, TensorView k, TensorView v) {
  SE_CHECK(k.shape.rank() == 3 && v.shape == k.shape && k.shape[0] > 0 && k_scales.numel() == k.shape[1] &&
               v_scales.numel() == k.shape[1],
           "fp8_kv_scales: k {} v {} k_scales {} v_scales {}", k.shape.to_string(), v.shape.to_string(),
           k_scales.shape.to_string(), v_scales.shape.to_string());
  SE_CHECK(k_scales.dtype == DType::kF32 && v_scales.dtype == DType::kF32 && k_scales.device == k.device &&
               v_scales.device == k.device && v.device == k.device && v.dtype == k.dtype,
           "fp8_kv_scales: f32 scales where k and v live");
  if (on_cuda(k, "fp8_kv_scales")) {
    require_cuda_act(k, "fp8_kv_scales.k");
    if constexpr (kCudaBuilt) cuda::fp8_kv_scales(k_scales, v_scales, k, v);
    return;
  }
  require_cpu_f32(k, "fp8_kv_scales.k");
  cpu::fp8_kv_scales(k_scales, v_scales, k, v);
}

namespace {

// The CPU paged attention's query shape: q [T, H, D], out of as many elements.
void check_paged_attention_q(TensorView out, TensorView q, const AttentionView& view) {
  require_cpu_f32(out, "paged_attention.out");
  SE_CHECK(q.shape.rank() == 3 && q.shape[2] == view.head_dim && q.shape[1] % view.num_kv_heads == 0 &&
               q.shape[0] == view.q_indptr[view.num_seqs] && out.numel() == q.numel(),
           "paged_attention: q {} for {} rows, {} KV heads x {}", q.shape.to_string(),
           view.q_indptr[view.num_seqs], view.num_kv_heads, view.head_dim);
}

// The CUDA paged attention's operands: q [T, H, D] and out on the GPU.
void check_cuda_paged_attention(TensorView out, TensorView q, const AttentionView& view) {
  require_cuda_act(out, "paged_attention.out");
  require_cuda_act(q, "paged_attention.q");
  SE_CHECK(q.shape.rank() == 3 && q.shape[2] == view.head_dim && q.shape[1] % view.num_kv_heads == 0 &&
               out.numel() == q.numel(),
           "paged_attention: q {} out {} for {} KV heads x {}", q.shape.to_string(), out.shape.to_string(),
           view.num_kv_heads, view.head_dim);
}

// The tables of a KIVI view against attention_view.h's invariants (host tables, as the CPU op reads them).
void check_kivi_view(const AttentionView& view) {
  const QuantizedKvView& qv = view.quantized;
  check_kivi_geometry(view, "paged_attention");
  SE_CHECK(qv.kivi_seqs != nullptr, "paged_attention: KIVI view without its sequences' tables");
  for (int32_t s = 0; s < view.num_seqs; ++s) {
    const KiviSeqView& kivi = qv.kivi_seqs[s];
    for (int32_t h = 0; h < view.num_kv_heads; ++h) {
      const int32_t len = view.seqs[s].num_tokens[h], keys = kivi.num_quantized_keys[h];
      const int32_t values = kivi.num_quantized_values[h], first = kivi.residual_first_slot[h];
      SE_CHECK(0 <= values && values <= keys && keys <= len && keys % qv.group_size == 0 &&
                   kivi.residual.num_tokens[h] == len - values && 0 <= first && first < view.page_size,
               "paged_attention: sequence {} KV head {}: {} tokens, {} quantized keys, {} quantized values, {} "
               "residual tokens from slot {} (group {})",
               s, h, len, keys, values, kivi.residual.num_tokens[h], first, qv.group_size);
    }
  }
}

// A TurboQuant view: its slots fill its pages, and MSE keys come with their rotation and codebook (the paper's
// store: its codec and channel orders).
void check_turboquant_view(const AttentionView& view, std::string_view op) {
  const QuantizedKvView& qv = view.quantized;
  if (qv.turboquant_prod != nullptr) {
    const TurboQuantProdKvCodec& codec = *qv.turboquant_prod;
    SE_CHECK(codec.head_dim() == view.head_dim && qv.key_orders != nullptr && qv.value_orders != nullptr,
             "{}: a codec of head_dim {} for head_dim {}, or no channel orders", op, codec.head_dim(), view.head_dim);
    SE_CHECK(view.kv_dtype == DType::kU8 &&
                 view.page_bytes == static_cast<size_t>(view.page_size) * codec.layout().slot_bytes(),
             "{}: pages of {} bytes ({}) for {} slots of {} bytes", op, view.page_bytes, dtype_name(view.kv_dtype),
             view.page_size, codec.layout().slot_bytes());
    return;
  }
  SE_CHECK((qv.bits >= 2 && qv.bits <= 4) || qv.bits == 8, "{}: key bits {} (2..4, or 8 for e4m3)", op, qv.bits);
  SE_CHECK(qv.value_bits >= 2 && qv.value_bits <= 8, "{}: value bits {} (2..8)", op, qv.value_bits);
  const TurboQuantSlotLayout slot =
      turboquant_slot_layout(view.head_dim, TurboQuantKvFormat{qv.bits, qv.value_bits, qv.norm_correction});
  SE_CHECK(view.kv_dtype == DType::kU8 && view.page_bytes == static_cast<size_t>(view.page_size) * slot.slot_bytes(),
           "{}: pages of {} bytes ({}) for {} slots of {} bytes", op, view.page_bytes, dtype_name(view.kv_dtype),
           view.page_size, slot.slot_bytes());
  SE_CHECK(qv.bits == 8 || (qv.rotation != nullptr && qv.centroids != nullptr), "{}: no rotation or codebook", op);
}

OpId quantized_attention_op(KvQuantScheme scheme) {
  switch (scheme) {
    case KvQuantScheme::kFp8E4M3:
      return OpId::kPagedAttentionOverFp8Pages;
    case KvQuantScheme::kKivi:
      return OpId::kPagedAttentionOverKiviPages;
    case KvQuantScheme::kTurboQuant:
      return OpId::kPagedAttentionOverTurboQuantPages;
  }
  return OpId::kPagedAttentionOverFp8Pages;
}

void paged_attention_quantized(TensorView out, TensorView q, const AttentionView& view,
                               const AttentionParams& params) {
  const bool fp8 = view.quantized.scheme == KvQuantScheme::kFp8E4M3;
  const OpId op_id = quantized_attention_op(view.quantized.scheme);
  const std::string_view op = op_name(op_id);
  if (out.device == Device::kCuda || view.kv_device == Device::kCuda)
    SE_CHECK(cuda_implements(op_id), "{}: not implemented on CUDA", op);
  // A selection over FP8 or KIVI pages is read on the CPU (a KIVI page of the selection is a key group).
  SE_CHECK(!view.has_selection || (view.quantized.scheme != KvQuantScheme::kTurboQuant && out.device == Device::kCpu &&
                                   view.kv_device == Device::kCpu),
           "{}: a selection over these quantized pages is not implemented{}", op,
           view.quantized.scheme != KvQuantScheme::kTurboQuant ? " on CUDA" : "");
  if (fp8) {
    SE_CHECK(view.kv_dtype == DType::kU8 &&
                 view.page_bytes == static_cast<size_t>(view.page_size) * fp8_kv_bytes_per_token(view.head_dim),
             "{}: pages of {} bytes ({}) for page size {} x head_dim {}", op, view.page_bytes,
             dtype_name(view.kv_dtype), view.page_size, view.head_dim);
    SE_CHECK(view.quantized.k_scales != nullptr && view.quantized.v_scales != nullptr, "{}: no scales", op);
    if (on_cuda(out, "paged_attention")) {
      check_cuda_paged_attention(out, q, view);
      if constexpr (kCudaBuilt) cuda::paged_attention(out, q, view, params);
      return;
    }
    check_paged_attention_q(out, q, view);
    cpu::paged_attention_fp8(out, q, view, params);
    return;
  }
  if (view.quantized.scheme == KvQuantScheme::kKivi && on_cuda(out, "paged_attention")) {
    // Device tables: the geometry is checked, the tables' invariants are the cache's contract.
    check_kivi_geometry(view, op);
    check_cuda_paged_attention(out, q, view);
    if constexpr (kCudaBuilt) cuda::paged_attention(out, q, view, params);
    return;
  }
  check_paged_attention_q(out, q, view);
  if (view.quantized.scheme == KvQuantScheme::kTurboQuant) {
    check_turboquant_view(view, op);
    cpu::paged_attention_turboquant(out, q, view, params);
    return;
  }
  check_kivi_view(view);
  cpu::paged_attention_kivi(out, q, view, params);
}

}  // namespace

void paged_attention(TensorView out, TensorView q, const AttentionView& view, const AttentionParams& params) {
  if (view.payload == KvPayload::kQuantized) {
    paged_attention_quantized(out, q, view, params);
    return;
  }
  SE_CHECK(view.payload == KvPayload::kExplicit,
           "paged_attention: latent KV payloads are not implemented by this op");
  if (on_cuda(out, "paged_attention")) {
    SE_CHECK(view.kv_dtype == DType::kBF16, "paged_attention: CUDA KV pages are bf16, got {}",
             dtype_name(view.kv_dtype));
    check_cuda_paged_attention(out, q, view);
    if constexpr (kCudaBuilt) cuda::paged_attention(out, q, view, params);
    return;
  }
  SE_CHECK(view.kv_dtype == DType::kF32, "paged_attention: the CPU backend keeps f32 pages");
  check_paged_attention_q(out, q, view);
  cpu::paged_attention(out, q, view, params);
}

void rope_latent_heads(TensorView out, TensorView x, TensorView positions, const RopeParams& rope,
                       const TensorView* norm_weight, float eps) {
  const std::string_view op = op_name(OpId::kRopeLatentHeads);
  SE_CHECK(x.shape.rank() == 3 && out.shape == x.shape && positions.numel() == x.shape[0] &&
               positions.dtype == DType::kI32 && rope.rotary_dim > 0 && rope.rotary_dim % 2 == 0 &&
               rope.rotary_dim < x.shape[2],
           "{}: x {} out {} positions {} rotary_dim {}", op, x.shape.to_string(), out.shape.to_string(),
           positions.numel(), rope.rotary_dim);
  SE_CHECK(norm_weight == nullptr || norm_weight->numel() == x.shape[2] - rope.rotary_dim,
           "{}: a norm of {} elements for heads of {} + {}", op, norm_weight == nullptr ? 0 : norm_weight->numel(),
           x.shape[2] - rope.rotary_dim, rope.rotary_dim);
  if (on_cuda(out, "rope_latent_heads")) {
    require_cuda_act(out, "rope_latent_heads.out");
    SE_CHECK(
        x.device == Device::kCuda && x.dtype == DType::kF32 && positions.device == Device::kCuda &&
            (norm_weight == nullptr || (norm_weight->device == Device::kCuda && norm_weight->dtype == DType::kF32)),
        "{}: x f32, positions and the norm (f32) on the GPU", op);
    if constexpr (kCudaBuilt) cuda::rope_latent_heads(out, x, positions, rope, norm_weight, eps);
    return;
  }
  require_cpu_f32(out, "rope_latent_heads.out");
  require_cpu_f32(x, "rope_latent_heads.x");
  if (norm_weight != nullptr) require_cpu_f32(*norm_weight, "rope_latent_heads.norm_weight");
  cpu::rope_latent_heads(out, x, positions, rope, norm_weight, eps);
}

void absorb_latent_queries(TensorView q_latent, TensorView q, TensorView kv_b) {
  const std::string_view op = op_name(OpId::kAbsorbLatentQueries);
  SE_CHECK(q_latent.shape.rank() == 3 && q.shape.rank() == 3 && kv_b.shape.rank() == 2, "{}: q_latent {} q {} kv_b {}",
           op, q_latent.shape.to_string(), q.shape.to_string(), kv_b.shape.to_string());
  const int64_t rows = q.shape[0], heads = q.shape[1], rank = kv_b.shape[1], rope = q_latent.shape[2] - rank;
  SE_CHECK(q_latent.shape[0] == rows && q_latent.shape[1] == heads && rope > 0 && q.shape[2] > rope &&
               kv_b.shape[0] % heads == 0 && kv_b.shape[0] / heads > q.shape[2] - rope,
           "{}: q_latent {} q {} kv_b {}", op, q_latent.shape.to_string(), q.shape.to_string(), kv_b.shape.to_string());
  if (on_cuda(q_latent, "absorb_latent_queries")) {
    require_cuda_act(q_latent, "absorb_latent_queries.q_latent");
    require_cuda_act(q, "absorb_latent_queries.q");
    require_cuda_act(kv_b, "absorb_latent_queries.kv_b");
    if constexpr (kCudaBuilt) cuda::absorb_latent_queries(q_latent, q, kv_b);
    return;
  }
  require_cpu_f32(q_latent, "absorb_latent_queries.q_latent");
  require_cpu_f32(q, "absorb_latent_queries.q");
  require_cpu_f32(kv_b, "absorb_latent_queries.kv_b");
  cpu::absorb_latent_queries(q_latent, q, kv_b);
}

namespace {
// A latent store's pages as each backend keeps them (bf16 with device tables on CUDA, f32 on the CPU) and, on the
// CPU, one query row per row of the view's q_indptr (a CUDA view's tables are device memory: there the row counts
// are the caller's contract, not checked).
void check_latent_pages(const AttentionView& view, bool on_device, int64_t q_rows, std::string_view op) {
  if (on_device) {
    SE_CHECK(view.kv_dtype == DType::kBF16 && view.tables_device == Device::kCuda,
             "{}: CUDA pages are bf16 with device tables, got {}", op, dtype_name(view.kv_dtype));
    return;
  }
  SE_CHECK(view.kv_dtype == DType::kF32, "{}: the CPU backend keeps f32 pages, got {}", op, dtype_name(view.kv_dtype));
  SE_CHECK(q_rows == view.q_indptr[view.num_seqs], "{}: {} query rows for {} rows", op, q_rows,
           view.q_indptr[view.num_seqs]);
}
}  // namespace

void paged_latent_attention(TensorView out, TensorView q_latent, const AttentionView& view, TensorView kv_b,
                            const AttentionParams& params) {
  const std::string_view op = op_name(OpId::kPagedLatentAttention);
  SE_CHECK(view.payload == KvPayload::kSharedLatent, "{}: the view does not hold a shared latent store", op);
  SE_CHECK(view.num_kv_heads == 1, "{}: pages of one latent head, got {}", op, view.num_kv_heads);
  SE_CHECK(q_latent.shape.rank() == 3 && out.shape.rank() == 3 && kv_b.shape.rank() == 2,
           "{}: q_latent {} out {} kv_b {}", op, q_latent.shape.to_string(), out.shape.to_string(),
           kv_b.shape.to_string());
  const int64_t rows = q_latent.shape[0], heads = q_latent.shape[1], rank = kv_b.shape[1];
  SE_CHECK(out.shape[0] == rows && out.shape[1] == heads && q_latent.shape[2] == view.head_dim &&
               rank < view.head_dim && kv_b.shape[0] % heads == 0 && kv_b.shape[0] / heads > out.shape[2],
           "{}: q_latent {} out {} kv_b {} for latent rows of {}", op, q_latent.shape.to_string(),
           out.shape.to_string(), kv_b.shape.to_string(), view.head_dim);
  SE_CHECK((out.device == Device::kCuda) == (view.kv_device == Device::kCuda), "{}: out on {}, the KV pool on {}", op,
           device_name(out.device), device_name(view.kv_device));
  const bool on_device = on_cuda(out, "paged_latent_attention");
  check_latent_pages(view, on_device, rows, op);
  if (on_device) {
    require_cuda_act(out, "paged_latent_attention.out");
    require_cuda_act(q_latent, "paged_latent_attention.q_latent");
    require_cuda_act(kv_b, "paged_latent_attention.kv_b");
    if constexpr (kCudaBuilt) cuda::paged_latent_attention(out, q_latent, view, kv_b, params);
    return;
  }
  require_cpu_f32(out, "paged_latent_attention.out");
  require_cpu_f32(q_latent, "paged_latent_attention.q_latent");
  require_cpu_f32(kv_b, "paged_latent_attention.kv_b");
  cpu::paged_latent_attention(out, q_latent, view, kv_b, params);
}

void paged_low_rank_attention(TensorView out, TensorView q, const AttentionView& view, const RopeParams& rope,
                              const AttentionParams& params) {
  const std::string_view op = op_name(OpId::kPagedLowRankAttention);
  const LatentKvView& lr = view.latent;
  SE_CHECK(view.payload == KvPayload::kLowRankLatent, "{}: the view does not hold a low-rank latent store", op);
  SE_CHECK(lr.up_k != nullptr && lr.up_v != nullptr && lr.k_rank > 0 && lr.v_rank > 0 && lr.group_heads > 0 &&
               lr.kv_head_dim > 0 && view.head_dim == lr.k_rank + lr.v_rank,
           "{}: latent rows of {} values for ranks {} + {}, {} heads per group of {}", op, view.head_dim, lr.k_rank,
           lr.v_rank, lr.group_heads, lr.kv_head_dim);
  SE_CHECK(!view.has_selection, "{}: the low-rank store takes no selection", op);
  SE_CHECK(rope.rotary_dim <= lr.kv_head_dim && rope.rotary_dim % 2 == 0, "{}: rotary_dim {} for head_dim {}", op,
           rope.rotary_dim, lr.kv_head_dim);
  const int64_t kv_heads = int64_t{view.num_kv_heads} * lr.group_heads;
  SE_CHECK(q.shape.rank() == 3 && q.shape[2] == lr.kv_head_dim && q.shape[1] % kv_heads == 0 && out.shape == q.shape,
           "{}: q {} out {} for {} KV heads x {}", op, q.shape.to_string(), out.shape.to_string(), kv_heads,
           lr.kv_head_dim);
  const bool on_device = on_cuda(out, "paged_low_rank_attention");
  check_latent_pages(view, on_device, q.shape[0], op);
  if (on_device) {
    require_cuda_act(q, "paged_low_rank_attention.q");
    if constexpr (kCudaBuilt) cuda::paged_low_rank_attention(out, q, view, rope, params);
    return;
  }
  require_cpu_f32(out, "paged_low_rank_attention.out");
  require_cpu_f32(q, "paged_low_rank_attention.q");
  cpu::paged_low_rank_attention(out, q, view, rope, params);
}

namespace {
// A KIVI host view as the explicit pages of its windows, for a GPU scoring op over sequence `slice`, whose tokens must
// all be in its window (a compress-after method scores a prompt the store holds at full precision): each sequence
// reads its residual page list, and the slice's window starts at slot 0 of it. `seqs` keeps the views.
AttentionView kivi_windows_as_explicit(const AttentionView& view, int32_t slice, std::vector<SeqKvView>& seqs,
                                       std::string_view op) {
  check_kivi_geometry(view, op);
  const KiviSeqView& kivi = view.quantized.kivi_seqs[slice];
  for (int32_t h = 0; h < view.num_kv_heads; ++h)
    SE_CHECK(kivi.num_quantized_keys[h] == 0 && kivi.num_quantized_values[h] == 0 && kivi.residual_first_slot[h] == 0,
             "{}: sequence {} KV head {} of the KIVI store has {} keys and {} values quantized already; on CUDA it "
             "scores only tokens its window holds at full precision",
             op, slice, h, kivi.num_quantized_keys[h], kivi.num_quantized_values[h]);
  seqs.clear();
  for (int32_t s = 0; s < view.num_seqs; ++s) seqs.push_back(view.quantized.kivi_seqs[s].residual);
  AttentionView window = view;
  window.payload = KvPayload::kExplicit;
  window.quantized = QuantizedKvView{};
  window.seqs = seqs.data();
  return window;
}
}  // namespace

// The sparse-method ops take the cache's host tables on both backends; a GPU pool (view.kv_device) sends them to
// the CUDA twins, with q (and page key bounds) on the device and the scores written to host memory.
void attention_scores(TensorView out, TensorView q, const AttentionView& view, int32_t slice,
                      const AttentionParams& params, ScoreReduce reduce, ScoresReady ready) {
  SE_CHECK(slice >= 0 && slice < view.num_seqs, "attention_scores: sequence {} of {}", slice, view.num_seqs);
  if (is_kivi_view(view) && view.kv_device == Device::kCuda) {
    thread_local std::vector<SeqKvView> windows;
    attention_scores(out, q, kivi_windows_as_explicit(view, slice, windows, "attention_scores"), slice, params, reduce,
                     ready);
    return;
  }
  int32_t max_len = 0;
  for (int32_t h = 0; h < view.num_kv_heads; ++h) max_len = std::max(max_len, view.seqs[slice].num_tokens[h]);
  SE_CHECK(q.shape.rank() == 3 && q.shape[2] == view.head_dim && q.shape[1] % view.num_kv_heads == 0 &&
               q.shape[0] <= max_len && out.shape.rank() == 2 && out.shape[0] == q.shape[1] &&
               out.shape[1] == max_len,
           "attention_scores: q {} out {} for {} stored tokens", q.shape.to_string(), out.shape.to_string(),
           max_len);
  if (pool_on_cuda(view, "attention_scores", /*reads_fp8=*/true)) {
    require_cuda_act(q, "attention_scores.q");
    require_host_scores(out, "attention_scores.out");
    if constexpr (kCudaBuilt) cuda::attention_scores(out, q, view, slice, params, reduce, ready);
    return;
  }
  require_cpu_f32(out, "attention_scores.out");
  require_cpu_f32(q, "attention_scores.q");
  SE_CHECK(cpu_scores_and_moves_read(view), "attention_scores: the CPU backend keeps f32, fp8 or TurboQuant pages");
  if (is_turboquant_view(view)) check_turboquant_view(view, "attention_scores");
  cpu::attention_scores(out, q, view, slice, params, reduce);
}

void compact_kv(const AttentionView& pool, std::span<const StreamCompaction> streams) {
  for (const StreamCompaction& s : streams)
    for (size_t i = 0; i < s.kept.size(); ++i)
      SE_CHECK(s.kept[i] >= 0 && (i == 0 || s.kept[i] > s.kept[i - 1]),
               "compact_kv: kept indices must ascend from 0, got {} at {}", s.kept[i], i);
  if (pool_on_cuda(pool, "compact_kv", /*reads_fp8=*/true, /*moves_latent_rows=*/true)) {
    if constexpr (kCudaBuilt) cuda::compact_kv(pool, streams);
    return;
  }
  SE_CHECK(cpu_scores_and_moves_read(pool), "compact_kv: the CPU backend keeps f32, fp8 or TurboQuant pages");
  if (is_turboquant_view(pool)) check_turboquant_view(pool, "compact_kv");
  cpu::compact_kv(pool, streams);
}

void gather_keys(TensorView out, const AttentionView& view, int32_t slice, int32_t first_slot) {
  const bool on_gpu = pool_on_cuda(view, "gather_keys");
  SE_CHECK(out.dtype == DType::kF32 && out.device == view.kv_device,
           "gather_keys: out must be F32 where the pool lives");
  SE_CHECK(view.payload == KvPayload::kExplicit && view.tables_device == Device::kCpu,
           "gather_keys: host tables over explicit K/V pages only");
  SE_CHECK(on_gpu || view.kv_dtype == DType::kF32, "gather_keys: the CPU backend keeps f32 pages, got {}",
           dtype_name(view.kv_dtype));
  SE_CHECK(slice >= 0 && slice < view.num_seqs, "gather_keys: no sequence {} in a view of {}", slice, view.num_seqs);
  SE_CHECK(out.shape.rank() == 3 && out.shape[1] == view.num_kv_heads && out.shape[2] == view.head_dim,
           "gather_keys: out {} for {} KV heads x {}", out.shape.to_string(), view.num_kv_heads, view.head_dim);
  for (int32_t h = 0; h < view.num_kv_heads; ++h)
    SE_CHECK(first_slot >= 0 && first_slot + out.shape[0] <= view.seqs[slice].num_tokens[h],
             "gather_keys: slots [{}, {}) of KV head {}, which holds {}", first_slot, first_slot + out.shape[0], h,
             view.seqs[slice].num_tokens[h]);
  if (out.shape[0] == 0) return;
  if (on_gpu) {
    if constexpr (kCudaBuilt) cuda::gather_keys(out, view, slice, first_slot);
    return;
  }
  cpu::gather_keys(out, view, slice, first_slot);
}

namespace {

// The decode-time compression scores' shared checks: queries [R, H, D], keys [n, Hkv, D], out [Hkv, n], F32 on
// one device. True when that device is CUDA.
bool check_window_scores(TensorView out, TensorView queries, TensorView keys, const char* what) {
  SE_CHECK(out.dtype == DType::kF32 && queries.dtype == DType::kF32 && keys.dtype == DType::kF32,
           "{}: F32 out, queries and keys", what);
  SE_CHECK(out.device == queries.device && out.device == keys.device, "{}: out, queries and keys on one device", what);
  SE_CHECK(queries.shape.rank() == 3 && keys.shape.rank() == 3 && out.shape.rank() == 2, "{}: ranks", what);
  SE_CHECK(queries.shape[2] == keys.shape[2] && keys.shape[1] > 0 && queries.shape[1] % keys.shape[1] == 0,
           "{}: queries {} for keys {}", what, queries.shape.to_string(), keys.shape.to_string());
  SE_CHECK(out.shape[0] == keys.shape[1] && out.shape[1] == keys.shape[0], "{}: out {} for keys {}", what,
           out.shape.to_string(), keys.shape.to_string());
  SE_CHECK(queries.shape[0] > 0 && keys.shape[0] > 0, "{}: no query rows or no keys", what);
  return on_cuda(out, what);
}

}  // namespace

void bidirectional_window_scores(TensorView out, TensorView queries, TensorView keys) {
  if (check_window_scores(out, queries, keys, "bidirectional_window_scores")) {
    if constexpr (kCudaBuilt) cuda::bidirectional_window_scores(out, queries, keys);
    return;
  }
  cpu::bidirectional_window_scores(out, queries, keys);
}

void group_max_attention_importance(TensorView out, TensorView queries, TensorView keys) {
  if (check_window_scores(out, queries, keys, "group_max_attention_importance")) {
    if constexpr (kCudaBuilt) cuda::group_max_attention_importance(out, queries, keys);
    return;
  }
  cpu::group_max_attention_importance(out, queries, keys);
}

void key_redundancy(TensorView out, TensorView keys, float threshold) {
  SE_CHECK(out.dtype == DType::kF32 && keys.dtype == DType::kF32 && out.device == keys.device,
           "key_redundancy: F32 out and keys on one device");
  SE_CHECK(keys.shape.rank() == 3 && out.shape.rank() == 2 && out.shape[0] == keys.shape[1] &&
               out.shape[1] == keys.shape[0] && keys.shape[0] > 0,
           "key_redundancy: out {} for keys {}", out.shape.to_string(), keys.shape.to_string());
  if (on_cuda(out, "key_redundancy")) {
    if constexpr (kCudaBuilt) cuda::key_redundancy(out, keys, threshold);
    return;
  }
  cpu::key_redundancy(out, keys, threshold);
}

void redundancy_aware_scores(TensorView out, TensorView importance, TensorView redundancy, int32_t kernel,
                             float lambda) {
  SE_CHECK(out.dtype == DType::kF32 && importance.dtype == DType::kF32 && redundancy.dtype == DType::kF32 &&
               out.device == importance.device && out.device == redundancy.device,
           "redundancy_aware_scores: F32 out, importance and redundancy on one device");
  SE_CHECK(out.shape.rank() == 2 && out.shape == importance.shape && redundancy.shape.rank() == 2 &&
               redundancy.shape[0] == out.shape[0] && redundancy.shape[1] >= out.shape[1],
           "redundancy_aware_scores: out {} for importance {} and redundancy {}", out.shape.to_string(),
           importance.shape.to_string(), redundancy.shape.to_string());
  SE_CHECK(kernel > 0 && kernel % 2 == 1, "redundancy_aware_scores: kernel {} must be odd", kernel);
  if (out.numel() == 0) return;
  if (on_cuda(out, "redundancy_aware_scores")) {
    if constexpr (kCudaBuilt) cuda::redundancy_aware_scores(out, importance, redundancy, kernel, lambda);
    return;
  }
  cpu::redundancy_aware_scores(out, importance, redundancy, kernel, lambda);
}

void move_kv_rows(const AttentionView& pool, std::span<const KvRowMove> moves) {
  if (moves.empty()) return;
  // Sources and destinations as one sorted list of (slot, is_destination): equal neighbours must both be sources.
  thread_local std::vector<std::pair<int64_t, int>> slots;
  slots.clear();
  const auto slot_key = [&](int32_t page, int32_t offset) {
    SE_CHECK(page >= 0 && offset >= 0 && offset < pool.page_size, "move_kv_rows: no slot {} of page {}", offset,
             page);
    return int64_t{page} * pool.page_size + offset;
  };
  for (const KvRowMove& m : moves) {
    slots.emplace_back(slot_key(m.source_page, m.source_offset), 0);
    slots.emplace_back(slot_key(m.dest_page, m.dest_offset), 1);
  }
  std::sort(slots.begin(), slots.end());
  for (size_t i = 1; i < slots.size(); ++i)
    SE_CHECK(slots[i].first != slots[i - 1].first || slots[i].second + slots[i - 1].second == 0,
             "move_kv_rows: slot {} of page {} is written by one move and read or written by another",
             slots[i].first % pool.page_size, slots[i].first / pool.page_size);
  if (pool_on_cuda(pool, "move_kv_rows", /*reads_fp8=*/true, /*moves_latent_rows=*/true)) {
    if constexpr (kCudaBuilt) cuda::move_kv_rows(pool, moves);
    return;
  }
  SE_CHECK(cpu_scores_and_moves_read(pool), "move_kv_rows: the CPU backend keeps f32, fp8 or TurboQuant pages");
  if (is_turboquant_view(pool)) check_turboquant_view(pool, "move_kv_rows");
  cpu::move_kv_rows(pool, moves);
}

void update_page_key_bounds(TensorView bounds, const AttentionView& view, int32_t max_new_tokens) {
  SE_CHECK(bounds.shape.rank() == 3 && bounds.shape[1] == 2 && bounds.shape[2] == view.head_dim,
           "update_page_key_bounds: bounds {} for head_dim {}", bounds.shape.to_string(), view.head_dim);
  if (pool_on_cuda(view, "update_page_key_bounds")) {
    SE_CHECK(bounds.device == Device::kCuda && bounds.dtype == DType::kBF16,
             "update_page_key_bounds: a GPU KV pool needs bf16 bounds on the GPU, got {} on {}",
             dtype_name(bounds.dtype), bounds.device == Device::kCuda ? "the GPU" : "the host");
    if constexpr (kCudaBuilt) cuda::update_page_key_bounds(bounds, view, max_new_tokens);
    return;
  }
  require_cpu_f32(bounds, "update_page_key_bounds.bounds");
  SE_CHECK(view.payload == KvPayload::kExplicit || view.payload == KvPayload::kSharedLatent || is_fp8_pool(view),
           "update_page_key_bounds: the CPU backend bounds f32 or fp8 key rows");
  if (is_fp8_pool(view)) SE_CHECK(view.quantized.k_scales != nullptr, "update_page_key_bounds: fp8 pages, no scales");
  cpu::update_page_key_bounds(bounds, view, max_new_tokens);
}

void update_key_group_bounds(TensorView bounds, const AttentionView& view, std::span<const int32_t> first_groups) {
  const std::string_view op = "update_page_key_bounds over kivi groups";
  SE_CHECK(is_kivi_view(view) && view.kv_device == Device::kCpu && view.tables_device == Device::kCpu,
           "{}: takes a KIVI view of a CPU pool with host tables", op);
  check_kivi_view(view);
  SE_CHECK(bounds.shape.rank() == 3 && bounds.shape[1] == 2 && bounds.shape[2] == view.head_dim,
           "{}: bounds {} for head_dim {}", op, bounds.shape.to_string(), view.head_dim);
  require_cpu_f32(bounds, "update_page_key_bounds.bounds");
  SE_CHECK(first_groups.size() == static_cast<size_t>(view.num_seqs) * static_cast<size_t>(view.num_kv_heads),
           "{}: {} first groups for {} sequences of {} KV heads", op, first_groups.size(), view.num_seqs,
           view.num_kv_heads);
  for (int32_t first : first_groups) SE_CHECK(first >= 0, "{}: first group {}", op, first);
  cpu::update_key_group_bounds(bounds, view, first_groups);
}

void page_key_bound_scores(TensorView out, TensorView q, TensorView bounds, const AttentionView& view, int32_t slice) {
  SE_CHECK(slice >= 0 && slice < view.num_seqs, "page_key_bound_scores: sequence {} of {}", slice, view.num_seqs);
  SE_CHECK(view.tables_device == Device::kCpu, "page_key_bound_scores: takes a view with host tables");
  SE_CHECK(q.shape.rank() == 2 && q.shape[1] == view.head_dim && q.shape[0] % view.num_kv_heads == 0 &&
               out.shape.rank() == 2 && out.shape[0] == q.shape[0] && bounds.shape.rank() == 3,
           "page_key_bound_scores: q {} out {} bounds {}", q.shape.to_string(), out.shape.to_string(),
           bounds.shape.to_string());
  if (pool_on_cuda(view, "page_key_bound_scores")) {
    require_host_scores(out, "page_key_bound_scores.out");
    require_cuda_act(q, "page_key_bound_scores.q");
    SE_CHECK(bounds.device == Device::kCuda && bounds.dtype == DType::kBF16 && bounds.shape[1] == 2 &&
                 bounds.shape[2] == view.head_dim,
             "page_key_bound_scores: a GPU KV pool needs bf16 bounds [pages, 2, {}] on the GPU, got {} {} on {}",
             view.head_dim, dtype_name(bounds.dtype), bounds.shape.to_string(),
             bounds.device == Device::kCuda ? "the GPU" : "the host");
    if constexpr (kCudaBuilt) cuda::page_key_bound_scores(out, q, bounds, view, slice);
    return;
  }
  require_cpu_f32(out, "page_key_bound_scores.out");
  require_cpu_f32(q, "page_key_bound_scores.q");
  cpu::page_key_bound_scores(out, q, bounds, view, slice);
}

void select_pages_by_key_bounds(TensorView selected, TensorView num_selected, TensorView q, TensorView bounds,
                                const AttentionView& view, int32_t page_budget, int32_t max_pages_per_stream,
                                GroupReduce reduce) {
  SE_CHECK(q.shape.rank() == 3 && q.shape[2] == view.head_dim && q.shape[1] % view.num_kv_heads == 0 &&
               page_budget >= 1 && selected.dtype == DType::kI32 && num_selected.dtype == DType::kI32 &&
               selected.shape.rank() == 3 && selected.shape[0] >= view.num_seqs &&
               selected.shape[1] == view.num_kv_heads && selected.shape[2] >= page_budget &&
               num_selected.shape.rank() == 2 && num_selected.shape[0] >= view.num_seqs &&
               num_selected.shape[1] == view.num_kv_heads && bounds.shape.rank() == 3 && bounds.shape[1] == 2 &&
               bounds.shape[2] == view.head_dim,
           "select_pages_by_key_bounds: q {} selected {} num_selected {} bounds {} for {} sequences, budget {}",
           q.shape.to_string(), selected.shape.to_string(), num_selected.shape.to_string(),
           bounds.shape.to_string(), view.num_seqs, page_budget);
  SE_CHECK(max_pages_per_stream >= 1, "select_pages_by_key_bounds: max_pages_per_stream {}", max_pages_per_stream);
  const Device pool = view.kv_device;
  SE_CHECK(selected.device == pool && num_selected.device == pool && bounds.device == pool,
           "select_pages_by_key_bounds: the lists and the bounds live where the pool lives");
  // FP8 codes are bounded in f32, the bounds of the keys they decode to.
  const DType bounds_dtype = is_fp8_pool(view) ? DType::kF32 : view.kv_dtype;
  SE_CHECK(bounds.dtype == bounds_dtype, "select_pages_by_key_bounds: bounds of {} for {} pages",
           dtype_name(bounds.dtype), dtype_name(view.kv_dtype));
  if (pool_on_cuda(view, "select_pages_by_key_bounds")) {
    require_cuda_act(q, "select_pages_by_key_bounds.q");
    if constexpr (kCudaBuilt)
      cuda::select_pages_by_key_bounds(selected, num_selected, q, bounds, view, page_budget, max_pages_per_stream,
                                       reduce);
    return;
  }
  require_cpu_f32(q, "select_pages_by_key_bounds.q");
  cpu::select_pages_by_key_bounds(selected, num_selected, q, bounds, view, page_budget, max_pages_per_stream, reduce);
}

namespace {
// The filter logits' shared contract: a sequence of the view, one query row, keys every KV head holds.
void check_filter_logits(TensorView q, const AttentionView& view, int32_t slice, int64_t num_keys, const char* op) {
  SE_CHECK(slice >= 0 && slice < view.num_seqs, "{}: sequence {} of {}", op, slice, view.num_seqs);
  int32_t min_len = view.num_kv_heads > 0 ? view.seqs[slice].num_tokens[0] : 0;
  for (int32_t h = 1; h < view.num_kv_heads; ++h) min_len = std::min(min_len, view.seqs[slice].num_tokens[h]);
  SE_CHECK(q.shape.rank() == 2 && q.shape[1] == view.head_dim && q.shape[0] % view.num_kv_heads == 0 &&
               num_keys >= 0 && num_keys <= min_len,
           "{}: q {} and {} keys for {} stored tokens", op, q.shape.to_string(), num_keys, min_len);
}
}  // namespace

void attention_logits_max_over_heads(TensorView out, TensorView q, const AttentionView& view, int32_t slice,
                                     float scale) {
  const bool on_gpu = pool_on_cuda(view, "attention_logits_max_over_heads");
  if (on_gpu) {
    require_host_scores(out, "attention_logits_max_over_heads.out");
    require_cuda_act(q, "attention_logits_max_over_heads.q");
  } else {
    require_cpu_f32(out, "attention_logits_max_over_heads.out");
    require_cpu_f32(q, "attention_logits_max_over_heads.q");
    SE_CHECK(view.kv_dtype == DType::kF32, "attention_logits_max_over_heads: the CPU backend keeps f32 pages");
  }
  SE_CHECK(out.shape.rank() == 1, "attention_logits_max_over_heads: out {}", out.shape.to_string());
  check_filter_logits(q, view, slice, out.shape[0], "attention_logits_max_over_heads");
  if (on_gpu) {
    if constexpr (kCudaBuilt) cuda::attention_logits_max_over_heads(out, q, view, slice, scale);
    return;
  }
  cpu::attention_logits_max_over_heads(out, q, view, slice, scale);
}

void top_keys_by_logits_max_over_heads(TensorView out_tokens, TensorView q, const AttentionView& view, int32_t slice,
                                       int32_t num_keys, float scale) {
  SE_CHECK(out_tokens.device == view.kv_device && out_tokens.dtype == DType::kI32 && out_tokens.shape.rank() == 1 &&
               out_tokens.shape[0] <= num_keys,
           "top_keys_by_logits_max_over_heads: out_tokens {} {} on {} for {} keys of a pool on {}",
           dtype_name(out_tokens.dtype), out_tokens.shape.to_string(), device_name(out_tokens.device), num_keys,
           device_name(view.kv_device));
  if (pool_on_cuda(view, "top_keys_by_logits_max_over_heads")) {
    require_cuda_act(q, "top_keys_by_logits_max_over_heads.q");
    check_filter_logits(q, view, slice, num_keys, "top_keys_by_logits_max_over_heads");
    if constexpr (kCudaBuilt) cuda::top_keys_by_logits_max_over_heads(out_tokens, q, view, slice, num_keys, scale);
    return;
  }
  thread_local std::vector<float> logits;
  thread_local std::vector<int32_t> kept;
  logits.resize(static_cast<size_t>(num_keys));
  attention_logits_max_over_heads(TensorView{logits.data(), DType::kF32, Shape{num_keys}, Device::kCpu}, q, view, slice,
                                  scale);
  top_k_ascending(logits.data(), num_keys, static_cast<int32_t>(out_tokens.shape[0]), kept);
  std::copy(kept.begin(), kept.end(), out_tokens.ptr<int32_t>());
}

void token_lists_with_tail(TensorView lists, TensorView counts, TensorView tokens, const AttentionView& view,
                           int32_t slice, int32_t tail_begin) {
  SE_CHECK(slice >= 0 && slice < view.num_seqs && view.tables_device == Device::kCpu,
           "token_lists_with_tail: sequence {} of {} with host tables", slice, view.num_seqs);
  for (const TensorView* t : {&lists, &counts, &tokens})
    SE_CHECK(t->dtype == DType::kI32 && t->device == view.kv_device,
             "token_lists_with_tail: {} tensors where the pool lives ({}), got {} on {}", dtype_name(DType::kI32),
             device_name(view.kv_device), dtype_name(t->dtype), device_name(t->device));
  const int64_t k = tokens.numel();
  SE_CHECK(lists.shape.rank() == 2 && lists.shape[0] == view.num_kv_heads && counts.numel() == view.num_kv_heads,
           "token_lists_with_tail: lists {} and counts {} for {} KV heads", lists.shape.to_string(),
           counts.shape.to_string(), view.num_kv_heads);
  for (int32_t h = 0; h < view.num_kv_heads; ++h) {
    const int32_t len = view.seqs[slice].num_tokens[h];
    SE_CHECK(tail_begin >= k && tail_begin <= len && k + (len - tail_begin) <= lists.shape[1],
             "token_lists_with_tail: {} tokens and the tail [{}, {}) of KV head {} in lists of stride {}", k,
             tail_begin, len, h, lists.shape[1]);
  }
  if (pool_on_cuda(view, "token_lists_with_tail")) {
    if constexpr (kCudaBuilt) cuda::token_lists_with_tail(lists, counts, tokens, view, slice, tail_begin);
    return;
  }
  cpu::token_lists_with_tail(lists, counts, tokens, view, slice, tail_begin);
}

void subset_attention_max_scores(TensorView out, TensorView q, const AttentionView& view, int32_t slice,
                                 int32_t num_sink, int32_t begin, const AttentionParams& params) {
  SE_CHECK(slice >= 0 && slice < view.num_seqs, "subset_attention_max_scores: sequence {} of {}", slice, view.num_seqs);
  SE_CHECK(q.shape.rank() == 3 && q.shape[0] >= 1 && q.shape[2] == view.head_dim &&
               q.shape[1] % view.num_kv_heads == 0 && out.shape.rank() == 2 && out.shape[0] == view.num_kv_heads,
           "subset_attention_max_scores: q {} out {} for {} KV heads of dim {}", q.shape.to_string(),
           out.shape.to_string(), view.num_kv_heads, view.head_dim);
  SE_CHECK(num_sink >= 0 && num_sink <= begin, "subset_attention_max_scores: {} sinks before range start {}",
           num_sink, begin);
  for (int32_t h = 0; h < view.num_kv_heads; ++h)
    SE_CHECK(begin + out.shape[1] + q.shape[0] <= view.seqs[slice].num_tokens[h],
             "subset_attention_max_scores: range [{}, {}) and {} new rows exceed the {} tokens of KV head {}", begin,
             begin + out.shape[1], q.shape[0], view.seqs[slice].num_tokens[h], h);
  if (pool_on_cuda(view, "subset_attention_max_scores")) {
    require_cuda_act(q, "subset_attention_max_scores.q");
    require_host_scores(out, "subset_attention_max_scores.out");
    if constexpr (kCudaBuilt) cuda::subset_attention_max_scores(out, q, view, slice, num_sink, begin, params);
    return;
  }
  require_cpu_f32(out, "subset_attention_max_scores.out");
  require_cpu_f32(q, "subset_attention_max_scores.q");
  SE_CHECK(view.kv_dtype == DType::kF32, "subset_attention_max_scores: the CPU backend keeps f32 pages");
  cpu::subset_attention_max_scores(out, q, view, slice, num_sink, begin, params);
}

}  // namespace se
