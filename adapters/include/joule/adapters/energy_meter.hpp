#pragma once
#include <string_view>

#include "joule/common/result.hpp"
#include "joule/common/units.hpp"

namespace joule::adapters {

/// A cumulative energy counter of one device (RAPL package, GPU, INA3221 rail, a model...).
/// Readings are monotonic joules since the meter was opened; wraparound and resets of the
/// underlying counter are handled inside. Not thread-safe: each meter is sampled from one
/// strand.
class EnergyMeter {
 public:
  virtual ~EnergyMeter() = default;
  /// Where the joules come from: "rapl", "nvml", "ina3221", "battery", "modelled", "simulated".
  /// Only the first four are measurements; callers must show the source beside every figure.
  virtual std::string_view source() const = 0;
  /// Total energy since the meter was opened.
  virtual Result<Joules> read() = 0;
};

}  // namespace joule::adapters
