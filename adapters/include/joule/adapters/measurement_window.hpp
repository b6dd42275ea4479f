#pragma once
// A stretch of a meter's counter: it begins on a reading and ends with the joules, the seconds,
// the meter's source and whether it saw only part of what it is about. What a job's run, a
// probe's repetition and `joule-worker meters` each measure, instead of a bare "energy at start"
// subtracted by hand at every site.

#include <algorithm>
#include <chrono>
#include <string>

#include "joule/adapters/energy_meter.hpp"
#include "joule/common/energy_source.hpp"
#include "joule/common/result.hpp"

namespace joule::adapters {

/// What a window measured. `source` says whether the joules are a measurement.
struct Measurement {
  double joules = 0.0;
  double seconds = 0.0;
  std::string source;
  /// It began after what it is about had begun (a job adopted after a restart): the joules
  /// are a lower bound.
  bool partial = false;
  bool is_measurement() const { return joule::is_measurement(source); }
  double mean_watts() const { return seconds > 0.0 ? joules / seconds : 0.0; }
};

class MeasurementWindow {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  /// Opens a window on the meter's reading now; fails if the meter cannot be read.
  static Result<MeasurementWindow> begin(EnergyMeter& meter, TimePoint now, bool partial = false) {
    auto reading = meter.read();
    if (!reading) return reading.error();
    return MeasurementWindow(std::string(meter.source()), reading->value, now, partial);
  }

  /// The window as of a reading of the same meter taken for something else (a periodic
  /// sample): no second read. A counter that went back (a meter reopened) counts as nothing.
  Measurement at(double counter_joules, TimePoint now) const {
    return Measurement{std::max(0.0, counter_joules - start_joules_),
                       std::max(0.0, std::chrono::duration<double>(now - start_).count()), source_, partial_};
  }

  /// Reads the meter: what the window holds so far (it stays open; a window has no end state,
  /// the last read is its end).
  Result<Measurement> read(EnergyMeter& meter, TimePoint now) const {
    auto reading = meter.read();
    if (!reading) return reading.error();
    return at(reading->value, now);
  }

  const std::string& source() const { return source_; }
  bool partial() const { return partial_; }
  TimePoint began() const { return start_; }

 private:
  MeasurementWindow(std::string source, double start_joules, TimePoint start, bool partial)
      : source_(std::move(source)), start_joules_(start_joules), start_(start), partial_(partial) {}

  std::string source_;
  double start_joules_ = 0.0;
  TimePoint start_;
  bool partial_ = false;
};

}  // namespace joule::adapters
