#include "sparse/quest_two_level_index.h"

#include <algorithm>
#include <numeric>

#include "base/check.h"

namespace se {
namespace {

// Quest's bound of q.k over one bound row [2, D], reduced over the query group, in the arithmetic order of the page
// ranking op (so that with every group kept the choice is the op's, bit for bit).
float group_score(std::span<const float> q, int32_t group_heads, const float* bound, int32_t head_dim,
                  GroupReduce reduce) {
  const float* lo = bound;
  const float* hi = bound + head_dim;
  float acc = 0.0f;
  for (int32_t g = 0; g < group_heads; ++g) {
    const float* qv = q.data() + static_cast<size_t>(g) * static_cast<size_t>(head_dim);
    float sum = 0.0f;
    for (int32_t d = 0; d < head_dim; ++d) sum += std::max(qv[d] * lo[d], qv[d] * hi[d]);
    acc = g == 0 ? sum : reduce == GroupReduce::kMax ? std::max(acc, sum) : acc + sum;
  }
  return reduce == GroupReduce::kMean ? acc / static_cast<float>(group_heads) : acc;
}

// The `count` best of `ids` by score (higher first, lower id on a tie).
std::vector<int32_t> best(std::vector<int32_t> ids, const std::vector<float>& score, size_t count) {
  const auto better = [&](int32_t a, int32_t b) {
    const float sa = score[static_cast<size_t>(a)], sb = score[static_cast<size_t>(b)];
    return sa > sb || (sa == sb && a < b);
  };
  count = std::min(count, ids.size());
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(count), ids.end(), better);
  ids.resize(count);
  return ids;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

void summarize_page_groups(std::span<const float> fine, int32_t num_candidates, int32_t head_dim, int32_t group_size,
                           std::span<float> coarse) {
  const auto row = 2 * static_cast<size_t>(head_dim);
  const auto num_groups = static_cast<size_t>(ceil_div(num_candidates, group_size));
  SE_CHECK(
      group_size > 0 && fine.size() >= static_cast<size_t>(num_candidates) * row && coarse.size() >= num_groups * row,
      "two-level index: {} fine and {} coarse values for {} pages in groups of {}", fine.size(), coarse.size(),
      num_candidates, group_size);
  for (size_t g = 0; g < num_groups; ++g) {
    float* out = coarse.data() + g * row;
    const size_t first = g * static_cast<size_t>(group_size);
    const size_t end = std::min(first + static_cast<size_t>(group_size), static_cast<size_t>(num_candidates));
    std::copy_n(fine.data() + first * row, row, out);
    for (size_t p = first + 1; p < end; ++p) {
      const float* page = fine.data() + p * row;
      for (int32_t d = 0; d < head_dim; ++d) {
        out[d] = std::min(out[d], page[d]);
        out[head_dim + d] = std::max(out[head_dim + d], page[head_dim + d]);
      }
    }
  }
}

std::vector<int32_t> select_pages_two_level(std::span<const float> q, int32_t group_heads,
                                            std::span<const float> coarse, std::span<const float> fine,
                                            int32_t num_pages, int32_t head_dim, int32_t page_budget,
                                            GroupReduce reduce, const TwoLevelConfig& config, int64_t* num_fine_read) {
  std::vector<int32_t> pages(static_cast<size_t>(num_pages));
  std::iota(pages.begin(), pages.end(), 0);
  if (num_pages <= page_budget) return pages;
  const auto row = 2 * static_cast<size_t>(head_dim);
  const int32_t num_candidates = num_pages - 1;
  const auto num_groups = static_cast<int32_t>(ceil_div(num_candidates, config.group_size));
  // Level one: the best groups, enough of them to hold the budget.
  std::vector<float> scores(static_cast<size_t>(num_groups));
  for (int32_t g = 0; g < num_groups; ++g)
    scores[static_cast<size_t>(g)] =
        group_score(q, group_heads, coarse.data() + static_cast<size_t>(g) * row, head_dim, reduce);
  std::vector<int32_t> groups(static_cast<size_t>(num_groups));
  std::iota(groups.begin(), groups.end(), 0);
  const auto num_kept =
      static_cast<size_t>(std::max<int64_t>(config.num_groups_kept, ceil_div(page_budget - 1, config.group_size)));
  groups = best(std::move(groups), scores, num_kept);
  // Level two: the kept groups' pages by their own bounds.
  std::vector<int32_t> candidates;
  scores.assign(static_cast<size_t>(num_candidates), 0.0f);
  for (int32_t g : groups) {
    for (int32_t p = g * config.group_size; p < std::min((g + 1) * config.group_size, num_candidates); ++p) {
      scores[static_cast<size_t>(p)] =
          group_score(q, group_heads, fine.data() + static_cast<size_t>(p) * row, head_dim, reduce);
      candidates.push_back(p);
    }
  }
  if (num_fine_read != nullptr) *num_fine_read += static_cast<int64_t>(candidates.size());
  pages = best(std::move(candidates), scores, static_cast<size_t>(page_budget - 1));
  pages.push_back(num_pages - 1);
  std::sort(pages.begin(), pages.end());
  return pages;
}

PageBoundBytes flat_page_bound_bytes(const KvLayout& layout, int64_t num_tokens) {
  const int64_t row_bytes = 2 * int64_t{layout.head_dim} * static_cast<int64_t>(dtype_size(layout.dtype));
  return {layout.num_streams() * ceil_div(num_tokens, layout.page_size) * row_bytes, 0};
}

PageBoundBytes two_level_page_bound_bytes(const KvLayout& layout, int64_t num_tokens, int32_t group_size) {
  const PageBoundBytes flat = flat_page_bound_bytes(layout, num_tokens);
  const int64_t row_bytes = 2 * int64_t{layout.head_dim} * static_cast<int64_t>(dtype_size(layout.dtype));
  const int64_t num_pages = ceil_div(num_tokens, layout.page_size);
  return {layout.num_streams() * ceil_div(num_pages, group_size) * row_bytes, flat.device};
}

}  // namespace se
