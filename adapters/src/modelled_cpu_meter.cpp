#include "joule/adapters/modelled_cpu_meter.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>

namespace joule::adapters {

ModelledCpuMeter::ModelledCpuMeter(ModelledCpuParams params, std::filesystem::path proc_root, long ticks_per_second)
    : params_(params),
      stat_path_(std::move(proc_root) / "stat"),
      ticks_per_second_(ticks_per_second > 0 ? ticks_per_second : 100) {}

Result<ModelledCpuMeter::CpuTicks> ModelledCpuMeter::read_ticks() const {
  std::ifstream in(stat_path_);
  if (!in) {
    const int err = errno;
    return make_error(err == EACCES ? ErrorCode::permission_denied : ErrorCode::unavailable,
                      fmt::format("cannot read {}: {}", stat_path_.string(), std::strerror(err)));
  }
  CpuTicks ticks;
  bool have_aggregate = false;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cpu", 0) != 0) continue;
    if (line.size() > 3 && line[3] != ' ') {  // "cpuN ...": one logical CPU
      ++ticks.cpus;
      continue;
    }
    std::istringstream fields(line.substr(3));
    // user nice system idle iowait irq softirq steal [guest guest_nice: already in user/nice]
    std::uint64_t value[8] = {};
    int count = 0;
    while (count < 8 && fields >> value[count]) ++count;
    if (count < 4)
      return make_error(ErrorCode::io, fmt::format("{}: malformed cpu line \"{}\"", stat_path_.string(), line));
    ticks.busy = value[0] + value[1] + value[2] + value[5] + value[6] + value[7];
    ticks.total = ticks.busy + value[3] + value[4];
    have_aggregate = true;
  }
  if (!have_aggregate)
    return make_error(ErrorCode::io, fmt::format("{}: no aggregate \"cpu\" line", stat_path_.string()));
  if (ticks.cpus == 0) ticks.cpus = 1;
  return ticks;
}

double ModelledCpuMeter::joules(double wall_seconds, double cpu_seconds) const {
  return params_.idle_watts * std::max(wall_seconds, 0.0) + params_.watts_per_busy_core * std::max(cpu_seconds, 0.0);
}

std::string ModelledCpuMeter::describe() const {
  return fmt::format(
      "the job's own, modelled: {:.4g} W idle over its run time + {:.4g} W per CPU-second of its processes",
      params_.idle_watts, params_.watts_per_busy_core);
}

Result<Joules> ModelledCpuMeter::read() {
  auto now = read_ticks();
  if (!now) return now.error();
  if (last_ && now->total >= last_->total && now->busy >= last_->busy) {
    const double hz = static_cast<double>(ticks_per_second_);
    const double busy_core_seconds = static_cast<double>(now->busy - last_->busy) / hz;
    const double elapsed_seconds = static_cast<double>(now->total - last_->total) / hz / static_cast<double>(now->cpus);
    total_ += Watts{params_.idle_watts} * Seconds{elapsed_seconds} +
              Watts{params_.watts_per_busy_core} * Seconds{busy_core_seconds};
  }
  // A counter that went backwards (CPU hot-unplug, a new fixture) restarts the interval
  // instead of producing negative energy.
  last_ = *now;
  return total_;
}

ProcessModelledMeter::ProcessModelledMeter(ModelledCpuParams params, SecondsClock cpu_seconds,
                                           SecondsClock wall_seconds)
    : params_(params),
      cpu_seconds_(std::move(cpu_seconds)),
      wall_seconds_(std::move(wall_seconds)),
      cpu_start_(cpu_seconds_()),
      wall_start_(wall_seconds_()) {}

Result<Joules> ProcessModelledMeter::read() {
  // Clamped at zero so a clock that steps back (a fake, a bug) never gives negative energy.
  const double wall = std::max(0.0, wall_seconds_() - wall_start_);
  const double cpu = std::max(0.0, cpu_seconds_() - cpu_start_);
  return Watts{params_.idle_watts} * Seconds{wall} + Watts{params_.watts_per_busy_core} * Seconds{cpu};
}

}  // namespace joule::adapters
