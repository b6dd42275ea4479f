#pragma once
// A grid signal over time: carbon intensity (gCO2e per kWh) or a price per kWh, as forecasts and
// histories publish it: a value per interval, each holding from its start until the next one
// (the last for as long as the one before it). What placement needs of it: the value at a time,
// the mean over a run (the energy drawn evenly), and the start within a window whose run is
// cleanest. Pure: points in, answers out; sources and files are the adapters' and config's.

#include <string>
#include <vector>

#include "joule/common/result.hpp"
#include "joule/schedulers/time_format.hpp"

namespace joule::schedulers {

struct SignalPoint {
  UnixMillis at = 0;  ///< the start of the interval
  double value = 0.0;
};

/// A start and the signal's mean over the run that begins there.
struct SignalWindow {
  UnixMillis start = 0;
  double mean = 0.0;
};

class GridSignal {
 public:
  /// Points in strictly increasing time, values finite and not negative, at least one; `end`
  /// where the last interval ends (0: as long as the one before it; one point alone: an hour).
  /// Errors name the point (its index) and what is wrong.
  static Result<GridSignal> from_points(std::vector<SignalPoint> points, UnixMillis end = 0);

  UnixMillis begin() const { return points_.front().at; }
  UnixMillis end() const { return end_; }
  const std::vector<SignalPoint>& points() const { return points_; }

  /// The value in force at `at`; nullopt outside [begin, end).
  std::optional<double> at(UnixMillis at) const;
  /// The time-weighted mean over [from, to); nullopt unless begin <= from < to <= end.
  std::optional<double> mean_over(UnixMillis from, UnixMillis to) const;
  /// The mean over [from, to) with the first value before the signal and the last after it (a
  /// forecast's edge persisting); from < to.
  double mean_extended(UnixMillis from, UnixMillis to) const;
  /// Among starts in [earliest, latest] whose run of `duration_ms` lies within the signal, the
  /// one with the lowest mean (the earliest of equals); nullopt when none does. Exact: the
  /// mean of a sliding window over steps is lowest with its start or its end on a step.
  std::optional<SignalWindow> lowest_start(UnixMillis earliest, UnixMillis latest, UnixMillis duration_ms) const;

 private:
  // The integral of the signal from begin() to `at` (value × milliseconds), begin <= at <= end.
  double integral_to(UnixMillis at) const;

  std::vector<SignalPoint> points_;
  std::vector<double> prefix_;  // integral_to(points_[i].at)
  UnixMillis end_ = 0;
};

}  // namespace joule::schedulers
