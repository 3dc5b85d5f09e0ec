#include "kv/page_table_transfer.h"

#include <algorithm>
#include <vector>

#include "backend/device_memory.h"
#include "base/check.h"

namespace se {
namespace {

int32_t longest_stream(const PageTable& table) {
  const KvLayout& layout = table.layout();
  int32_t longest = 0;
  for (int32_t l = 0; l < layout.num_layers; ++l)
    for (int32_t h = 0; h < layout.num_kv_heads; ++h) longest = std::max(longest, table.num_tokens(l, h));
  return longest;
}

}  // namespace

void copy_storage_pages(const PageStorage& from, const PageStorage& to, std::span<const int32_t> from_pages,
                        std::span<const int32_t> to_pages) {
  SE_CHECK(from_pages.size() == to_pages.size(), "page copy: {} pages into {}", from_pages.size(), to_pages.size());
  std::vector<PageCopy> copies;
  copies.reserve(from_pages.size());
  for (size_t i = 0; i < from_pages.size(); ++i)
    copies.push_back(PageCopy{to.page(to_pages[i]), from.page(from_pages[i])});
  // One side is the device's pool when either is not host memory.
  copy_pages(from.device() == Device::kCpu ? to.device() : from.device(), copies, from.page_bytes());
}

int64_t pages_to_copy_page_table(const PageTable& table) {
  return table.layout().pages_for_tokens(longest_stream(table));
}

Result<PageTable> copy_page_table(const PageTable& src, const BlockPool& src_pool, BlockPool* dst_pool) {
  const PageStorage* from = src_pool.storage();
  const PageStorage* to = dst_pool->storage();
  if (from == nullptr || to == nullptr) return invalid_argument("page copy: a pool without page storage");
  if (from->page_bytes() != to->page_bytes())
    return invalid_argument("page copy: pages of {} bytes into pages of {}", from->page_bytes(), to->page_bytes());
  const int64_t needed = pages_to_copy_page_table(src);
  if (needed > dst_pool->num_free_pages())
    return resource_exhausted("page copy: {} pages needed, {} free of {}", needed, dst_pool->num_free_pages(),
                              dst_pool->num_total_pages());

  const KvLayout& layout = src.layout();
  PageTable dst(dst_pool, layout);
  const int32_t longest = longest_stream(src);
  // The positions before the longest stream's end were appended and then evicted: an empty prefix carries them.
  SE_RETURN_IF_ERROR(dst.attach_prefix({}, 0, src.num_logical_tokens() - longest));
  SE_RETURN_IF_ERROR(dst.append(longest));
  std::vector<int32_t> src_pages, dst_pages;
  for (int32_t l = 0; l < layout.num_layers; ++l) {
    for (int32_t h = 0; h < layout.num_kv_heads; ++h) {
      SE_RETURN_IF_ERROR(dst.shrink_stream(l, h, src.num_tokens(l, h)));
      const std::span<const int32_t> stream = src.pages(l, h);
      src_pages.insert(src_pages.end(), stream.begin(), stream.end());
      const std::span<const int32_t> copy = dst.pages(l, h).first(stream.size());
      dst_pages.insert(dst_pages.end(), copy.begin(), copy.end());
    }
  }
  copy_storage_pages(*from, *to, src_pages, dst_pages);
  return dst;
}

}  // namespace se
