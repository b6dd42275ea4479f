#pragma once
// A device meter for daemon tests: every read adds one joule, so energy flows without hardware.

#include "joule/adapters/energy_meter.hpp"

namespace joule::testing {

class CountingMeter final : public adapters::EnergyMeter {
 public:
  std::string_view source() const override { return "simulated"; }
  Result<Joules> read() override { return Joules{total_ += 1.0}; }

 private:
  double total_ = 0.0;
};

}  // namespace joule::testing
