#pragma once
#include <functional>

#include "joule/adapters/energy_meter.hpp"

namespace joule::adapters {

/// The meter of a simulated device (`sim:<profile>`): it idles at the profile's static power
/// and, while a job runs on a device that runs jobs, adds the job's simulated power; read
/// against an injected clock. Its source is "simulated": never a measurement.
class SimulatedMeter final : public EnergyMeter, public ModelledLoad {
 public:
  /// `now_seconds` is a monotonic clock in seconds (injected so tests drive it).
  SimulatedMeter(double idle_watts, std::function<double()> now_seconds)
      : idle_watts_(idle_watts), now_seconds_(std::move(now_seconds)), since_(now_seconds_()) {}

  std::string_view source() const override { return "simulated"; }
  Result<Joules> read() override { return Joules{joules_ + (idle_watts_ + load_watts_) * (now_seconds_() - since_)}; }
  ModelledLoad* modelled_load() override { return this; }
  /// The power a job adds from now on (0 when it ends).
  void set_load_watts(double watts) override {
    const double now = now_seconds_();
    joules_ += (idle_watts_ + load_watts_) * (now - since_);
    since_ = now;
    load_watts_ = watts;
  }
  double idle_watts() const { return idle_watts_; }

 private:
  double idle_watts_;
  std::function<double()> now_seconds_;
  double since_;
  double joules_ = 0.0;
  double load_watts_ = 0.0;
};

}  // namespace joule::adapters
