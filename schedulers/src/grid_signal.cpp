#include "joule/schedulers/grid_signal.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace joule::schedulers {

Result<GridSignal> GridSignal::from_points(std::vector<SignalPoint> points, UnixMillis end) {
  if (points.empty()) return make_error(ErrorCode::invalid_argument, "a signal needs at least one point");
  for (std::size_t i = 0; i < points.size(); ++i) {
    if (!std::isfinite(points[i].value) || points[i].value < 0.0)
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("point {} ({}): the value must be a finite number >= 0, got {}", i,
                                    format_rfc3339(points[i].at), points[i].value));
    if (i > 0 && points[i].at <= points[i - 1].at)
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("point {} ({}) is not after point {} ({}): times must increase", i,
                                    format_rfc3339(points[i].at), i - 1, format_rfc3339(points[i - 1].at)));
  }
  const UnixMillis last = points.back().at;
  if (end == 0) end = points.size() > 1 ? last + (last - points[points.size() - 2].at) : last + 3'600'000;
  if (end <= last)
    return make_error(ErrorCode::invalid_argument, fmt::format("the signal ends at {}, not after its last point ({})",
                                                               format_rfc3339(end), format_rfc3339(last)));
  GridSignal signal;
  signal.points_ = std::move(points);
  signal.end_ = end;
  signal.prefix_.resize(signal.points_.size(), 0.0);
  for (std::size_t i = 1; i < signal.points_.size(); ++i)
    signal.prefix_[i] =
        signal.prefix_[i - 1] +
        signal.points_[i - 1].value * static_cast<double>(signal.points_[i].at - signal.points_[i - 1].at);
  return signal;
}

std::optional<double> GridSignal::at(UnixMillis at) const {
  if (at < begin() || at >= end_) return std::nullopt;
  const auto after =
      std::upper_bound(points_.begin(), points_.end(), at, [](UnixMillis t, const SignalPoint& p) { return t < p.at; });
  return std::prev(after)->value;
}

double GridSignal::integral_to(UnixMillis at) const {
  const auto after =
      std::upper_bound(points_.begin(), points_.end(), at, [](UnixMillis t, const SignalPoint& p) { return t < p.at; });
  const auto i = static_cast<std::size_t>(std::distance(points_.begin(), after)) - 1;
  return prefix_[i] + points_[i].value * static_cast<double>(at - points_[i].at);
}

std::optional<double> GridSignal::mean_over(UnixMillis from, UnixMillis to) const {
  if (from < begin() || to > end_ || from >= to) return std::nullopt;
  return (integral_to(to) - integral_to(from)) / static_cast<double>(to - from);
}

double GridSignal::mean_extended(UnixMillis from, UnixMillis to) const {
  if (to <= from) return at(from).value_or(from < begin() ? points_.front().value : points_.back().value);
  // Wholly before or after the signal: its edge value as it is (a ratio of equal spans can be an
  // ulp off it).
  if (from >= end_) return points_.back().value;
  if (to <= begin()) return points_.front().value;
  // Before, within and after the signal summed apart: integrals from its begin to times far
  // past its end (a constant's one point, a stale forecast) would cancel to noise over a short
  // run (a price of 0.3 read as 0.30005 over a millisecond).
  double sum = 0.0;
  if (from < begin()) sum += points_.front().value * static_cast<double>(std::min(to, begin()) - from);
  if (to > end_) sum += points_.back().value * static_cast<double>(to - std::max(from, end_));
  const UnixMillis inside_from = std::max(from, begin()), inside_to = std::min(to, end_);
  if (inside_from < inside_to) sum += integral_to(inside_to) - integral_to(inside_from);
  return sum / static_cast<double>(to - from);
}

std::optional<SignalWindow> GridSignal::lowest_start(UnixMillis earliest, UnixMillis latest,
                                                     UnixMillis duration_ms) const {
  if (duration_ms <= 0) return std::nullopt;
  earliest = std::max(earliest, begin());
  latest = std::min(latest, end_ - duration_ms);
  if (earliest > latest) return std::nullopt;
  std::vector<UnixMillis> starts{earliest, latest};
  for (const auto& point : points_) {
    for (const UnixMillis start : {point.at, point.at - duration_ms})
      if (start >= earliest && start <= latest) starts.push_back(start);
  }
  if (end_ - duration_ms >= earliest && end_ - duration_ms <= latest) starts.push_back(end_ - duration_ms);
  std::sort(starts.begin(), starts.end());
  std::optional<SignalWindow> best;
  for (const UnixMillis start : starts) {
    const double mean = *mean_over(start, start + duration_ms);
    if (!best || mean < best->mean - 1e-12) best = SignalWindow{start, mean};
  }
  return best;
}

}  // namespace joule::schedulers
