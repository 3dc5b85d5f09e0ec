// Admission: when the scheduler lets a waiting request start (SchedulerConfig::admission, --admission).
#pragma once

#include <array>
#include <string_view>
#include <utility>

namespace se {

// When a waiting request may start. kOptimistic (vLLM's): as soon as its next chunk fits; a running request that later
// runs short preempts the newest, which recomputes its tokens (or, on the host tier, resumes). kPeak: only when it
// and every running request fit in the pool together at their peak lengths (MemoryOracle::fits_at_peak), so no
// request is ever preempted for room the running ones were bound to need; fewer may run at once. Preemption by
// recompute costs a method that compresses what it decodes all it compressed: the recomputed tokens come back
// whole, as prompt.
enum class Admission { kOptimistic, kPeak };

// Each policy under the name --admission takes and reports give it.
inline constexpr std::array<std::pair<std::string_view, Admission>, 2> kAdmissionNames{
    {{"optimistic", Admission::kOptimistic}, {"peak", Admission::kPeak}}};

constexpr std::string_view admission_name(Admission admission) {
  for (const auto& [name, policy] : kAdmissionNames)
    if (policy == admission) return name;
  return "?";
}

}  // namespace se
