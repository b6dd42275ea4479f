#pragma once
// How one meter's reading is split among the jobs that shared its device over a sample: by the
// CPU time each used (Kepler's rule for processes on a shared node), evenly where none used any.

#include <span>
#include <vector>

namespace joule::daemon {

/// Each job's share of a sample, from the CPU seconds it used over it (negative counts as 0):
/// shares sum to 1, so the jobs' joules add up to the meter's, idle power included.
inline std::vector<double> shares_by_cpu_time(std::span<const double> cpu_seconds) {
  std::vector<double> shares(cpu_seconds.size(), 0.0);
  if (cpu_seconds.empty()) return shares;
  double total = 0.0;
  for (const double used : cpu_seconds) total += used > 0.0 ? used : 0.0;
  for (std::size_t i = 0; i < cpu_seconds.size(); ++i)
    shares[i] = total > 0.0 ? (cpu_seconds[i] > 0.0 ? cpu_seconds[i] : 0.0) / total
                            : 1.0 / static_cast<double>(cpu_seconds.size());
  return shares;
}

}  // namespace joule::daemon
