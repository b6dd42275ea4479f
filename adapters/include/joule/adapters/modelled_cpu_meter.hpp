#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>

#include "joule/adapters/energy_meter.hpp"
#include "joule/adapters/meter_clocks.hpp"

namespace joule::adapters {

/// Coefficients of the modelled CPU power: P = idle_watts + watts_per_busy_core × busy cores.
/// The defaults describe a small desktop-class x86 CPU (about 10 W idle, 12 W per fully busy
/// core); they are a model, not a measurement: set them per node for anything better than a
/// rough figure.
struct ModelledCpuParams {
  double idle_watts = 10.0;
  double watts_per_busy_core = 12.0;
};

/// The `modelled` CPU meter: energy from the CPU time in procfs (`<proc_root>/stat`).
///
/// Busy time is user+nice+system+irq+softirq+steal of the aggregate "cpu" line; elapsed wall
/// time is the sum of all fields over the number of CPUs, so no clock is read and fixture files
/// drive it completely. E = idle_watts × elapsed + watts_per_busy_core × busy core-seconds.
/// Its source is always "modelled": these joules are never a measurement.
class ModelledCpuMeter final : public EnergyMeter, public CpuTimeModel {
 public:
  /// `ticks_per_second` is the kernel's USER_HZ (sysconf(_SC_CLK_TCK), 100 on Linux).
  explicit ModelledCpuMeter(ModelledCpuParams params, std::filesystem::path proc_root = "/proc",
                            long ticks_per_second = 100);

  std::string_view source() const override { return "modelled"; }
  Result<Joules> read() override;

  const ModelledCpuParams& params() const { return params_; }
  void set_params(ModelledCpuParams params) { params_ = params; }

  const CpuTimeModel* cpu_time_model() const override { return this; }
  /// idle_watts × wall seconds + watts_per_busy_core × CPU seconds.
  double joules(double wall_seconds, double cpu_seconds) const override;
  std::string describe() const override;

 private:
  struct CpuTicks {
    std::uint64_t busy = 0;
    std::uint64_t total = 0;
    int cpus = 0;
  };
  Result<CpuTicks> read_ticks() const;

  ModelledCpuParams params_;
  std::filesystem::path stat_path_;
  long ticks_per_second_;
  std::optional<CpuTicks> last_;
  Joules total_{};
};

/// The process-scoped `modelled` meter of joule-worker: a probe must not count other
/// processes' CPU, so busy time is this process's CPU time (all its threads), not the node's.
/// E = idle_watts × wall seconds + watts_per_busy_core × process CPU seconds.
/// The CPU clock defaults to CLOCK_PROCESS_CPUTIME_ID (nanoseconds: procfs ticks of 10 ms are
/// too coarse for 100 ms probe readings), the wall clock to CLOCK_MONOTONIC; both are injected.
/// Its source is always "modelled": these joules are never a measurement.
class ProcessModelledMeter final : public EnergyMeter {
 public:
  /// Starts the interval now: read() returns the energy since construction.
  explicit ProcessModelledMeter(ModelledCpuParams params, SecondsClock cpu_seconds = process_cpu_seconds,
                                SecondsClock wall_seconds = monotonic_seconds);

  std::string_view source() const override { return "modelled"; }
  Result<Joules> read() override;

  const ModelledCpuParams& params() const { return params_; }

 private:
  ModelledCpuParams params_;
  SecondsClock cpu_seconds_;
  SecondsClock wall_seconds_;
  double cpu_start_;
  double wall_start_;
};

}  // namespace joule::adapters
