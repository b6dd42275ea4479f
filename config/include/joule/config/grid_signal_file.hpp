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

/// What a signal gives: grams CO2e per kWh, or a price per kWh.
enum class SignalKind { carbon, price };

/// The signal in `text`; `source` names it in errors ("forecast.csv", "https://api...").
/// CSV: one "time,value" row per line (RFC 3339 time, a number), a header line and lines
/// starting with '#' skipped. JSON, recognised by its keys:
///  - carbon, UK National Grid: {"data": [{"from", "to", "intensity": {"forecast", "actual"}}]};
///    the actual where there is one, else the forecast; the signal ends at the last "to".
///  - carbon, ElectricityMaps: {"forecast" | "history": [{"datetime", "carbonIntensity"}]}.
///  - carbon, WattTime: {"data": [{"point_time", "value"}]}.
///  - price, aWATTar's market data: {"data": [{"start_timestamp", "end_timestamp",
///    "marketprice", "unit": "Eur/MWh"}]}, read per kWh (÷ 1000).
///  - price, Octopus Energy's unit rates: {"results": [{"valid_from", "valid_to",
///    "value_inc_vat"}]} in pence per kWh, newest first, read in pounds (÷ 100) oldest first.
/// Carbon values must be >= 0. A negative price (a spot market paying for load) counts as 0:
/// Joule plans and budgets as if power were free then, never as if drawing it earned money.
Result<schedulers::GridSignal> parse_grid_signal(std::string_view text, const std::string& source,
                                                 SignalKind kind = SignalKind::carbon);

/// Whether `text` is a currency code as prices and money budgets name it: three capital
/// letters, as ISO 4217 writes them ("EUR", "GBP", "USD").
bool is_currency_code(std::string_view text);

}  // namespace joule::config
