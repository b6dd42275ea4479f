#include "joule/daemon/grid_signal_feed.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace joule::daemon {

using schedulers::GridSignal;
using schedulers::UnixMillis;
using json = nlohmann::json;

std::string_view to_string(SignalState state) {
  switch (state) {
    case SignalState::none:
      return "none";
    case SignalState::fresh:
      return "fresh";
    case SignalState::stale:
      return "stale";
    case SignalState::constant:
      return "constant";
  }
  return "none";
}

GridSignalFeed::GridSignalFeed(std::string source, std::optional<double> constant, std::string currency)
    : source_(std::move(source)), currency_(std::move(currency)), constant_value_(constant) {
  // One point: the placer extends a signal's edges (mean_extended) and never defers inside a
  // flat one (lowest_start needs a cleaner window), so a constant holds at every time.
  if (constant)
    if (auto flat = GridSignal::from_points({{0, *constant}})) constant_ = std::move(flat).value();
}

void GridSignalFeed::loaded(GridSignal signal, UnixMillis now) {
  signal_ = std::move(signal);
  loaded_at_ = now;
  last_error_.clear();
}

bool GridSignalFeed::failed(std::string error, UnixMillis now) {
  ++failures_;
  failed_at_ = now;
  const bool news = error != last_error_;
  last_error_ = std::move(error);
  return news;
}

SignalInForce GridSignalFeed::in_force(UnixMillis now) const {
  if (signal_ && now < signal_->end()) return {&*signal_, SignalState::fresh, source_};
  if (constant_)
    return {&*constant_, SignalState::constant,
            fmt::format("constant {:g} {}", *constant_value_, is_price() ? unit() : std::string("g/kWh"))};
  if (signal_) return {&*signal_, SignalState::stale, source_};
  return {};
}

std::optional<double> GridSignalFeed::value_at(UnixMillis now) const {
  const auto force = in_force(now);
  if (!force.signal) return std::nullopt;
  return force.signal->mean_extended(now, now + 1);
}

SignalInForce GridSignalFeed::over(UnixMillis from, UnixMillis to) const {
  if (signal_ && signal_->begin() <= std::max(from, to - 1) && from < signal_->end())
    return {&*signal_, to <= signal_->end() ? SignalState::fresh : SignalState::stale, source_};
  return in_force(to);
}

std::string GridSignalFeed::unit() const { return is_price() ? currency_ + "/kWh" : "gCO2e/kWh"; }

std::optional<double> GridSignalFeed::mean_over(UnixMillis from, UnixMillis to) const {
  const auto force = over(from, to);
  if (!force.signal) return std::nullopt;
  return to > from ? force.signal->mean_extended(from, to) : force.signal->mean_extended(from, from + 1);
}

std::optional<double> GridSignalFeed::amount(double joules, UnixMillis from, UnixMillis to) const {
  const auto mean = mean_over(from, to);
  if (!mean) return std::nullopt;
  return joules / 3.6e6 * *mean;
}

json GridSignalFeed::estimate(UnixMillis start, double joules_mean, double joules_std, double seconds) const {
  const auto force = in_force(start);
  if (!force.signal) return nullptr;
  const UnixMillis end = start + std::max<UnixMillis>(1, static_cast<UnixMillis>(std::llround(seconds * 1000.0)));
  const double mean = force.signal->mean_extended(start, end);
  if (is_price())
    return {{"cost", joules_mean / 3.6e6 * mean},
            {"cost_std", joules_std / 3.6e6 * mean},
            {"price_per_kwh", mean},
            {"currency", currency_},
            {"signal", force.label()}};
  return {{"grams", joules_mean / 3.6e6 * mean},
          {"grams_std", joules_std / 3.6e6 * mean},
          {"intensity", mean},
          {"signal", force.label()}};
}

void GridSignalFeed::add_estimates(json& rows, UnixMillis start) const {
  if (!rows.is_array()) return;
  for (auto& row : rows) {
    if (!row.is_object() || row.value("status", "") != "ok" || !row.contains("joules") || !row.contains("seconds"))
      continue;
    json figure = estimate(start, row["joules"].value("mean", 0.0), row["joules"].value("std", 0.0),
                           row["seconds"].value("mean", 0.0));
    if (!figure.is_null()) row[is_price() ? "cost" : "carbon"] = std::move(figure);
  }
}

json GridSignalFeed::describe(UnixMillis now) const {
  const auto force = in_force(now);
  const auto time = [](std::optional<UnixMillis> at) {
    return at ? json(schedulers::format_rfc3339(*at)) : json(nullptr);
  };
  json out = {{"state", to_string(force.state)},
              {"in_force", force.signal ? json(force.source) : json(nullptr)},
              {"value_now", force.signal ? json(force.signal->mean_extended(now, now + 1)) : json(nullptr)},
              {"unit", unit()},
              {"source", source_.empty() ? json(nullptr) : json(source_)},
              {"constant", constant_value_ ? json(*constant_value_) : json(nullptr)},
              {"loaded_at", time(loaded_at_)},
              {"last_error", last_error_.empty() ? json(nullptr) : json(last_error_)},
              {"last_error_at", last_error_.empty() ? json(nullptr) : time(failed_at_)},
              {"failures", failures_}};
  if (signal_) {
    out["begins"] = schedulers::format_rfc3339(signal_->begin());
    out["ends"] = schedulers::format_rfc3339(signal_->end());
    out["points"] = signal_->points().size();
    // Placement looks ahead for cleaner windows: the lowest and when, from now to the end.
    if (now < signal_->end()) {
      const auto& points = signal_->points();
      std::optional<std::pair<UnixMillis, double>> lowest;
      for (std::size_t i = 0; i < points.size(); ++i) {
        const UnixMillis until = i + 1 < points.size() ? points[i + 1].at : signal_->end();
        if (until <= now) continue;
        if (!lowest || points[i].value < lowest->second) lowest = {std::max(points[i].at, now), points[i].value};
      }
      if (lowest) out["lowest_ahead"] = {{"at", schedulers::format_rfc3339(lowest->first)}, {"value", lowest->second}};
    }
  }
  return out;
}

}  // namespace joule::daemon
