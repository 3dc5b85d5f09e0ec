#include "engine/teacher_forcing.h"

#include <algorithm>

#include "backend/device_memory.h"
#include "base/check.h"
#include "sparse/low_rank_kv.h"
#include "sparse/method_traits.h"
#include "sparse/method_registry.h"
#include "sparse/step_driver.h"

namespace se {

namespace {
// Device memory left over beside a scratch sequence's pool and workspace (attention scratch, cuBLAS).
constexpr int64_t kDeviceHeadroomBytes = int64_t{256} << 20;
}  // namespace

Result<std::unique_ptr<TeacherForcedSequence>> TeacherForcedSequence::create(const Model& model,
                                                                             const TeacherForcingOptions& options) {
  SE_ASSIGN_OR_RETURN(std::unique_ptr<MethodRuntime> method,
                      create_method(options.method, options.config, options.environment));
  return create(model, std::move(method), options);
}

Result<std::unique_ptr<TeacherForcedSequence>> TeacherForcedSequence::create(const Model& model,
                                                                             std::unique_ptr<MethodRuntime> method,
                                                                             const TeacherForcingOptions& options) {
  if (options.max_tokens < 1) return invalid_argument("teacher forcing: max_tokens must be positive");
  if (options.prefill_chunk < 1) return invalid_argument("teacher forcing: prefill_chunk must be positive");
  SE_RETURN_IF_ERROR(check_method_runs(model.device(), options.store, method->traits(), method->name()));
  const ModelConfig& config = model.config();
  KvLayout layout;
  layout.num_layers = config.num_layers;
  layout.num_kv_heads = config.num_kv_heads;
  layout.head_dim = config.head_dim;
  layout.page_size = options.page_size;
  layout.dtype = kv_page_dtype(model.device());
  const KvLayout dense_layout = layout;
  if (options.store != KvStoreKind::kExplicit)
    layout = make_kv_layout(config.num_layers, config.num_kv_heads, config.head_dim, options.page_size, model.device(),
                            options.store, options.kivi_group_size, options.kivi_residual, options.prefill_chunk);
  if (const LowRankKv* low_rank = method->low_rank_kv()) layout = low_rank->store_layout(layout);
  SE_RETURN_IF_ERROR(layout.validate());
  // The dense sequence or the method's peak (its transient passes included), whichever is larger, plus a page
  // per stream of slack.
  const int64_t num_pages =
      std::max(layout.pages_for_tokens(options.max_tokens), method->peak_pages(layout, options.max_tokens, 1)) +
      layout.num_streams();
  if (num_pages > INT32_MAX)
    return invalid_argument("teacher forcing: {} tokens need too many pages", options.max_tokens);
  if (model.device() == Device::kCuda) {
    // The engine's pool already took most of the device: refuse rather than fail an allocation mid-forward.
    const int64_t needed = num_pages * static_cast<int64_t>(layout.page_bytes()) +
                           ForwardWorkspace::bytes_for(config, model.make_workspace().matmul_dtype(),
                                                       std::min(options.prefill_chunk, options.max_tokens), 1);
    const int64_t free_bytes = static_cast<int64_t>(cuda_memory_info().free_bytes);
    if (needed + kDeviceHeadroomBytes > free_bytes)
      return resource_exhausted("a scratch sequence of {} tokens needs {} MiB of device memory, {} MiB are free",
                                options.max_tokens, needed >> 20, free_bytes >> 20);
  }
  SE_ASSIGN_OR_RETURN(std::unique_ptr<CacheManager> cache,
                      method->create_cache(CacheSpec{layout, static_cast<int32_t>(num_pages),
                                                     device_allocator(model.device()),
                                                     /*enable_prefix_caching=*/false}));
  auto sequence =
      std::unique_ptr<TeacherForcedSequence>(new TeacherForcedSequence(model, std::move(method), std::move(cache)));
  sequence->prefill_chunk_ = options.prefill_chunk;
  sequence->dense_layout_ = dense_layout;
  return sequence;
}

TeacherForcedSequence::TeacherForcedSequence(const Model& model, std::unique_ptr<MethodRuntime> method,
                                             std::unique_ptr<CacheManager> cache)
    : model_(model),
      method_(std::move(method)),
      cache_(std::move(cache)),
      controller_(*method_, *cache_, model.device()),
      workspace_(model.make_workspace()) {
  // As ModelRunner does: methods may run transient passes (context reconstruction) from finish_step.
  controller_.set_pass_forward(
      [this](const ForwardBatch& batch) { (void)model_.forward(batch, controller_, workspace_); });
}

TeacherForcedSequence::~TeacherForcedSequence() {
  if (num_prefill_tokens_ > 0) controller_.close(kSeq);
}

Result<Tensor> TeacherForcedSequence::prefill(std::span<const int32_t> prompt) {
  SE_RETURN_IF_ERROR(start_prefill(prompt));
  Tensor logits;
  while (!prefill_done()) {
    SE_ASSIGN_OR_RETURN(logits, prefill_chunk());
  }
  return logits;
}

Status TeacherForcedSequence::start_prefill(std::span<const int32_t> prompt) {
  if (num_prefill_tokens_ > 0) return failed_precondition("teacher forcing: the prompt is already prefilled");
  if (prompt.empty()) return invalid_argument("teacher forcing: the prompt is empty");
  SE_ASSIGN_OR_RETURN(int32_t num_cached, controller_.open(kSeq, prompt));
  SE_CHECK(num_cached == 0, "the prefix cache is off, yet {} tokens were cached", num_cached);
  tokens_.assign(prompt.begin(), prompt.end());
  num_prefill_tokens_ = static_cast<int32_t>(prompt.size());
  return Status::ok();
}

Result<Tensor> TeacherForcedSequence::prefill_chunk() {
  if (num_prefill_tokens_ == 0 || prefill_done())
    return failed_precondition("teacher forcing: no prompt tokens are left to prefill");
  const int32_t begin = num_prefilled_;
  const int32_t end = std::min(num_prefill_tokens_, begin + prefill_chunk_);
  // Counted only once computed, so a failed chunk is not taken for done.
  SE_ASSIGN_OR_RETURN(Tensor logits, step(begin, end - begin));
  num_prefilled_ = end;
  return logits;
}

Result<Tensor> TeacherForcedSequence::decode(int32_t token) {
  if (!prefill_done()) return failed_precondition("teacher forcing: decode before the prompt is prefilled");
  if (token < 0 || token >= model_.config().vocab_size)
    return invalid_argument("teacher forcing: token id {} is outside the vocabulary", token);
  tokens_.push_back(token);
  Result<Tensor> logits = step(static_cast<int32_t>(tokens_.size()) - 1, 1);
  if (!logits.is_ok()) tokens_.pop_back();  // a failed step fed nothing
  return logits;
}

Result<Tensor> TeacherForcedSequence::step(int32_t begin, int32_t n) {
  SE_RETURN_IF_ERROR(cache_->reserve(kSeq, n));
  clear_batch(batch_);
  const std::span<const int32_t> fed(tokens_.data() + begin, static_cast<size_t>(n));
  append_sequence(batch_, kSeq, fed, begin, num_prefill_tokens_, /*logit_row=*/true);
  // The engine's order (ModelRunner::execute, then MemoryOracle::commit): hooks around the forward, then the
  // cache learns what was computed.
  Tensor logits;
  run_step(controller_, batch_, [this] { return model_.forward(batch_, controller_, workspace_); },
           [&](const Tensor& out) {
             // A host copy: the caller keeps it past the next forward.
             logits = Tensor::empty(out.dtype(), out.shape());
             copy_bytes(out.device(), logits.raw(), out.raw(), out.nbytes());
           });
  cache_->on_computed(kSeq, tokens_, begin + n);
  return logits;
}

int64_t TeacherForcedSequence::num_held_pages() const { return cache_->num_held_pages(kSeq); }

int64_t TeacherForcedSequence::num_dense_pages() const {
  return dense_layout_.pages_for_tokens(static_cast<int64_t>(tokens_.size()));
}

double TeacherForcedSequence::held_bytes_fraction() const {
  return static_cast<double>(num_held_pages()) * static_cast<double>(cache_->layout().page_bytes()) /
         (static_cast<double>(num_dense_pages()) * static_cast<double>(dense_layout_.page_bytes()));
}

}  // namespace se
