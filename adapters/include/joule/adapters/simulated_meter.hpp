#pragma once
#include <functional>

#include "joule/adapters/energy_meter.hpp"

namespace joule::adapters {

/// The meter of a simulated device (`sim:<profile>`): it idles at the profile's static power,
/// read against an injected clock. Its source is "simulated": never a measurement.
class SimulatedMeter final : public EnergyMeter {
 public:
  /// `now_seconds` is a monotonic clock in seconds (injected so tests drive it).
  SimulatedMeter(double idle_watts, std::function<double()> now_seconds)
      : idle_watts_(idle_watts), now_seconds_(std::move(now_seconds)), start_(now_seconds_()) {}

  std::string_view source() const override { return "simulated"; }
  Result<Joules> read() override { return Watts{idle_watts_} * Seconds{now_seconds_() - start_}; }

 private:
  double idle_watts_;
  std::function<double()> now_seconds_;
  double start_;
};

}  // namespace joule::adapters
