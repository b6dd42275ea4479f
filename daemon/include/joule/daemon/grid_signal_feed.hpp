#pragma once
// What jouled knows of its grid's carbon intensity, or of its electricity price, at any moment:
// the last signal its source gave that parsed, and what stands in when it has none or has run
// past its end (the configured constant, else the last signal's final value). Every answer says
// which of these it is, so a job's grams or cost and a deferral can be traced to their data.
// Pure: loads and times are passed in; SignalService reads the file or URL on its timer.

#include <cstddef>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "joule/schedulers/grid_signal.hpp"

namespace joule::daemon {

/// What a signal in force is.
enum class SignalState {
  none,      ///< nothing loaded and no constant: no carbon signal
  fresh,     ///< the source's signal covers now
  stale,     ///< the source's signal ended before now: its last value stands in (no deferral)
  constant,  ///< the configured constant stands in (nothing loaded, or what was loaded ended)
};
std::string_view to_string(SignalState state);

/// The signal in force and where it came from, for placement and accounting.
struct SignalInForce {
  const schedulers::GridSignal* signal = nullptr;  ///< nullptr: no signal
  SignalState state = SignalState::none;
  std::string source;  ///< "file /etc/joule/carbon.csv", "constant 250 g/kWh"
  /// The source as jobs are labelled with it: ", stale" added past the signal's end.
  std::string label() const { return state == SignalState::stale ? source + ", stale" : source; }
};

class GridSignalFeed {
 public:
  /// `source` names where loads come from ("" when only the constant is configured);
  /// `constant`: the value per kWh standing in where the source says nothing for now;
  /// `currency`: empty for a carbon signal (gCO2e/kWh), a price signal's currency ("EUR") else.
  GridSignalFeed(std::string source, std::optional<double> constant, std::string currency = {});

  bool is_price() const { return !currency_.empty(); }
  const std::string& currency() const { return currency_; }
  /// "gCO2e/kWh", "EUR/kWh".
  std::string unit() const;

  /// A load that parsed replaces the signal, whole.
  void loaded(schedulers::GridSignal signal, schedulers::UnixMillis now);
  /// A load that did not: the signal stays as it was. Returns true when the error differs from
  /// the last one (worth a log line; the same one each period is not).
  bool failed(std::string error, schedulers::UnixMillis now);

  SignalInForce in_force(schedulers::UnixMillis now) const;
  /// The signal to account a run over [from, to) with: the source's while it covers any of the
  /// run (stale where the run goes past its end), else what is in force at `to`.
  SignalInForce over(schedulers::UnixMillis from, schedulers::UnixMillis to) const;
  /// The value at `now` of the signal in force; nullopt when there is none.
  std::optional<double> value_at(schedulers::UnixMillis now) const;
  /// The mean value (intensity or price) over [from, to) (the value at `from` when they are
  /// equal) under over(from, to), a forecast's edges persisting; nullopt when there is no signal.
  std::optional<double> mean_over(schedulers::UnixMillis from, schedulers::UnixMillis to) const;
  /// Grams of CO2e, or the cost, of `joules` drawn evenly over [from, to), at mean_over.
  std::optional<double> amount(double joules, schedulers::UnixMillis from, schedulers::UnixMillis to) const;

  /// What a run of `seconds` drawing `joules_mean` ± `joules_std` evenly from `start` would emit
  /// or cost under the signal in force: {grams, grams_std, intensity, signal} or {cost,
  /// cost_std, price_per_kwh, currency, signal}; null without a signal. The spread is the
  /// energy's only: the sources publish no forecast error.
  nlohmann::json estimate(schedulers::UnixMillis start, double joules_mean, double joules_std, double seconds) const;
  /// The same for every row of an estimate answer whose status is "ok" (a "carbon" or "cost"
  /// member, as if started at `start`).
  void add_estimates(nlohmann::json& rows, schedulers::UnixMillis start) const;

  std::size_t failures() const { return failures_; }
  const std::string& last_error() const { return last_error_; }
  /// GET /v1/signals: the source, its state, the value now, the span loaded, the last load and
  /// the last error.
  nlohmann::json describe(schedulers::UnixMillis now) const;

 private:
  std::string source_;
  std::string currency_;
  std::optional<double> constant_value_;
  std::optional<schedulers::GridSignal> constant_;
  std::optional<schedulers::GridSignal> signal_;
  std::optional<schedulers::UnixMillis> loaded_at_;
  std::optional<schedulers::UnixMillis> failed_at_;
  std::string last_error_;
  std::size_t failures_ = 0;
};

/// The node's signals, either absent: what job views and estimates read.
struct SignalFeeds {
  const GridSignalFeed* carbon = nullptr;
  const GridSignalFeed* price = nullptr;
};

}  // namespace joule::daemon
