#include "joule/estimator/thread_count.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace joule::estimator {

KnobSetting threads_setting(int threads) {
  return KnobSetting{kThreadsKnob, static_cast<double>(threads),
                     fmt::format("{} thread{}", threads, threads == 1 ? "" : "s")};
}

namespace {
// The estimate's lines but the thread counts' (a job at a count of its own has no other).
std::vector<SettingLine> without_thread_counts(std::vector<SettingLine> lines) {
  std::erase_if(lines, [](const SettingLine& line) { return line.setting.knob == kThreadsKnob; });
  return lines;
}
}  // namespace

bool at_thread_count(Estimate& estimate, int threads, int device_threads) {
  const KnobSetting wanted = threads_setting(threads);
  std::optional<SettingLine> line;
  for (const auto& candidate : estimate.settings)
    if (candidate.setting == wanted) line = candidate;
  estimate.settings = without_thread_counts(std::move(estimate.settings));
  if (threads <= 0 || device_threads <= 0 || threads == device_threads) return false;
  if (!line) {
    estimate.warnings.push_back(fmt::format(
        "resources.cores = {} runs it at {} thread{}, but this device's model is learnt at {} thread{} and no "
        "network was measured at {} yet: the estimate is outside what was probed",
        threads, threads, threads == 1 ? "" : "s", device_threads, device_threads == 1 ? "" : "s", threads));
    return false;
  }
  const SettingLine found = *line;
  estimate.joules = found.joules;
  estimate.seconds = found.seconds;
  estimate.warnings.push_back(
      found.basis == "measured"
          ? fmt::format("at {} (resources.cores): this network was measured whole at {} and at the device's {} "
                        "thread{}, and scaled by their ratio ({:.2f}x the joules, {:.2f}x the time)",
                        found.setting.label, found.setting.label, device_threads, device_threads == 1 ? "" : "s",
                        found.joules_ratio, found.seconds_ratio)
          : fmt::format("at {} (resources.cores): scaled by what {} networks measured at {} and at {} thread{} "
                        "predict for this one ({:.2f}x the joules, {:.2f}x the time)",
                        found.setting.label, found.samples, found.setting.label, device_threads,
                        device_threads == 1 ? "" : "s", found.joules_ratio, found.seconds_ratio));
  return true;
}

std::vector<int> over_core_range(Estimate& estimate, int low, int high, int device_threads) {
  std::vector<int> counts;
  if (device_threads >= low && device_threads <= high) counts.push_back(device_threads);
  std::vector<SettingLine> kept;
  for (auto& line : estimate.settings) {
    if (line.setting.knob != kThreadsKnob) continue;
    const int count = static_cast<int>(line.setting.value);
    if (count < low || count > high || count == device_threads) continue;
    counts.push_back(count);
    kept.push_back(std::move(line));
  }
  estimate.settings = std::move(kept);
  std::sort(counts.begin(), counts.end());
  if (counts.empty()) {
    estimate.warnings.push_back(fmt::format(
        "resources.cores {}-{}: no count in the range has been measured on this device yet (its model is learnt at "
        "{} thread{}): it runs at {}, its estimate outside what was probed",
        low, high, device_threads, device_threads == 1 ? "" : "s", low));
    return counts;
  }
  estimate.warnings.push_back(fmt::format(
      "resources.cores {}-{}: placement chooses among the counts measured in the range ({}); the figures above are "
      "at {} thread{}",
      low, high, fmt::join(counts, ", "), device_threads, device_threads == 1 ? "" : "s"));
  return counts;
}

}  // namespace joule::estimator
