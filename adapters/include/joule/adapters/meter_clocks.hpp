#pragma once
// Clocks and the power integrator shared by the meters that only see power (NVML fallback,
// INA3221, hwmon power, batteries without energy_now) and by the process-scoped model.

#include <functional>
#include <optional>

#include "joule/common/units.hpp"

namespace joule::adapters {

/// A clock in seconds, injected into meters so that tests drive time instead of sleeping.
using SecondsClock = std::function<double()>;

/// CLOCK_MONOTONIC in seconds (nanosecond resolution).
double monotonic_seconds();
/// CLOCK_PROCESS_CPUTIME_ID in seconds: CPU time of all threads of this process, nanosecond
/// resolution (procfs ticks are 10 ms, too coarse for 100 ms probe readings).
double process_cpu_seconds();

/// Energy from power samples by the trapezoid rule: each new sample adds
/// (p_prev + p_now) / 2 × (t_now − t_prev). The first sample adds nothing; a sample whose time
/// does not advance adds nothing and replaces the previous power. Negative power counts as 0.
class PowerIntegrator {
 public:
  /// Adds a sample and returns the energy integrated so far.
  Joules add(Watts power, double now_seconds) {
    const double watts = power.value > 0.0 ? power.value : 0.0;
    if (last_ && now_seconds > last_->time_seconds)
      total_ += Watts{(last_->watts + watts) / 2.0} * Seconds{now_seconds - last_->time_seconds};
    if (!last_ || now_seconds >= last_->time_seconds) last_ = Sample{watts, now_seconds};
    return total_;
  }
  /// Forgets the last sample: the next one starts a new interval (used after a gap that must
  /// not be integrated, e.g. a battery that was charging).
  void restart() { last_.reset(); }
  Joules total() const { return total_; }

 private:
  struct Sample {
    double watts;
    double time_seconds;
  };
  std::optional<Sample> last_;
  Joules total_{};
};

}  // namespace joule::adapters
