#include "sparse/method_runtime.h"

#include <algorithm>

#include "sparse/kivi_cache_manager.h"
#include "sparse/paged_cache_manager.h"
#include "sparse/tiered_cache_manager.h"

namespace se {

Result<std::unique_ptr<CacheManager>> MethodRuntime::create_cache(const CacheSpec& spec) {
  if (spec.partitions) {
    if (!partition_config()) return unimplemented("{} cannot run its decode as Spin's partitions", name());
    SE_ASSIGN_OR_RETURN(std::unique_ptr<TieredCacheManager> cache,
                        TieredCacheManager::create(spec.layout, spec.num_pages, spec.allocator, spec.num_host_pages,
                                                   spec.host_allocator, *spec.partitions, spec.max_num_batched_tokens));
    return std::unique_ptr<CacheManager>(std::move(cache));
  }
  if (spec.layout.kivi()) {
    if (spec.num_host_pages > 0) return unimplemented("the KIVI store keeps no host tier yet");
    SE_ASSIGN_OR_RETURN(std::unique_ptr<KiviCacheManager> cache,
                        KiviCacheManager::create(spec.layout, spec.num_pages, spec.allocator,
                                                 traits().prefill_policy == PrefillPolicy::kCompressAfter));
    return std::unique_ptr<CacheManager>(std::move(cache));
  }
  SE_ASSIGN_OR_RETURN(
      std::unique_ptr<PagedCacheManager> cache,
      PagedCacheManager::create(spec.layout, spec.num_pages, spec.allocator,
                                spec.enable_prefix_caching && traits().keeps_full_history, spec.num_host_pages,
                                spec.host_allocator, spec.fp8_scales ? &*spec.fp8_scales : nullptr));
  return std::unique_ptr<CacheManager>(std::move(cache));
}

void MethodRuntime::build_layer_selection(LayerContext& ctx, Selection& selection) {
  for (int32_t i = 0; i < ctx.view.num_seqs; ++i) {
    if (ctx.batch.sequences[static_cast<size_t>(i)].is_decode(ctx.batch.positions)) {
      build_decode_selection(ctx, i, selection);
    } else {
      build_prefill_selection(ctx, i, selection);
    }
  }
}

int64_t MethodRuntime::resident_pages(const KvLayout& layout, int32_t /*num_prefill_tokens*/,
                                      int32_t num_tokens) const {
  return layout.pages_for_tokens(num_tokens);
}

int64_t MethodRuntime::peak_pages(const KvLayout& layout, int32_t num_prompt_tokens, int32_t max_new_tokens) const {
  const int64_t prompt = int64_t{num_prompt_tokens} + transient_extra_tokens(num_prompt_tokens);
  // A compress-after method's prompt is whole until it compresses, held at full precision by a KIVI store.
  const bool held = layout.kivi() && traits_.prefill_policy == PrefillPolicy::kCompressAfter;
  return std::max(held ? KiviCacheManager::held_prompt_pages(layout, prompt) : layout.pages_for_tokens(prompt),
                  resident_pages(layout, num_prompt_tokens, num_prompt_tokens + max_new_tokens));
}

}  // namespace se
