#pragma once
// Carbon-intensity and price signals from the files and answers users have: a CSV of
// "time,value" rows, or JSON in the shapes of the public APIs (the UK National Grid
// carbon-intensity API, ElectricityMaps' carbon-intensity history and forecast, WattTime's
// signal data). Text in, a schedulers::GridSignal out; every error names the source and the line
// (CSV) or JSON pointer, and nothing is half-read.

#include <string>
#include <string_view>

#include "joule/common/result.hpp"
#include "joule/schedulers/grid_signal.hpp"

namespace joule::config {

/// The signal in `text`; `source` names it in errors ("forecast.csv", "https://api...").
/// CSV: one "time,value" row per line (RFC 3339 time, a number), a header line and lines
/// starting with '#' skipped. JSON, recognised by its keys:
///  - UK National Grid: {"data": [{"from", "to", "intensity": {"forecast", "actual"}}]}; the
///    actual where there is one, else the forecast; the signal ends at the last "to".
///  - ElectricityMaps: {"forecast" | "history": [{"datetime", "carbonIntensity"}]}.
///  - WattTime: {"data": [{"point_time", "value"}]}.
Result<schedulers::GridSignal> parse_grid_signal(std::string_view text, const std::string& source);

}  // namespace joule::config
