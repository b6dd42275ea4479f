#include "joule/config/grid_signal_file.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "joule/common/text.hpp"

namespace joule::config {
namespace {

using nlohmann::json;
using schedulers::SignalPoint;
using schedulers::UnixMillis;

// Beyond these a value is a mistake, not a grid: the dirtiest grids average about 1,000 gCO2e/kWh
// (coal); no currency's electricity costs 100,000 a kWh (the rupiah's is about 1,500).
constexpr double kMaxCarbon = 5000.0;
constexpr double kMaxPrice = 100000.0;

// "0-5000 (gCO2e/kWh)", the range of a kind's values, for messages.
std::string range_of(SignalKind kind) {
  return kind == SignalKind::carbon ? fmt::format("0-{:g} (gCO2e/kWh)", kMaxCarbon)
                                    : fmt::format("up to {:g} (a price per kWh)", kMaxPrice);
}

bool in_range(double value, SignalKind kind) {
  if (!std::isfinite(value)) return false;
  return kind == SignalKind::carbon ? value >= 0.0 && value <= kMaxCarbon : value <= kMaxPrice;
}

// An interval's start must be where the one before ended: a gap or an overlap would leave a
// time with no value, or two.
Status joins(UnixMillis start, std::optional<UnixMillis> previous_end, const std::string& source,
             const std::string& pointer) {
  if (!previous_end || start == *previous_end) return {};
  return make_error(ErrorCode::invalid_argument,
                    fmt::format("{}: {}: starts at {} but the row before ends at {}: {} between rows", source, pointer,
                                schedulers::format_rfc3339(start), schedulers::format_rfc3339(*previous_end),
                                start > *previous_end ? "a gap" : "an overlap"));
}

// RFC 3339, and the minute-precision "2026-11-28T12:30Z" the UK National Grid API writes.
std::optional<UnixMillis> parse_time(const std::string& text) {
  if (auto parsed = schedulers::parse_rfc3339(text)) return parsed;
  if (text.size() == 17 && text[13] == ':' && text[16] == 'Z')
    return schedulers::parse_rfc3339(text.substr(0, 16) + ":00Z");
  return std::nullopt;
}

Result<schedulers::GridSignal> finish(std::vector<SignalPoint> points, UnixMillis end, const std::string& source) {
  auto signal = schedulers::GridSignal::from_points(std::move(points), end);
  if (!signal) return make_error(ErrorCode::invalid_argument, fmt::format("{}: {}", source, signal.error().message));
  return signal;
}

Result<schedulers::GridSignal> parse_csv(std::string_view text, const std::string& source, SignalKind kind) {
  std::vector<SignalPoint> points;
  std::istringstream in{std::string(text)};
  std::string line;
  int number = 0;
  bool header_seen = false;
  while (std::getline(in, line)) {
    ++number;
    const std::string row(joule::trim(line));
    if (row.empty() || row[0] == '#') continue;
    const auto comma = row.find(',');
    const std::string time_text(joule::trim(std::string_view(row).substr(0, comma)));
    const auto time = parse_time(time_text);
    if (!time && !header_seen && points.empty()) {  // a header line
      header_seen = true;
      continue;
    }
    if (!time)
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("{}:{}: \"{}\" is not an RFC 3339 time", source, number, time_text));
    if (comma == std::string::npos)
      return make_error(ErrorCode::invalid_argument, fmt::format("{}:{}: expected time,value", source, number));
    const std::string value_text(joule::trim(std::string_view(row).substr(comma + 1)));
    double value = 0.0;
    const auto [end, error] = std::from_chars(value_text.data(), value_text.data() + value_text.size(), value);
    if (error != std::errc{} || end != value_text.data() + value_text.size() || !in_range(value, kind))
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("{}:{}: \"{}\" is not a number {}", source, number, value_text, range_of(kind)));
    value = std::max(0.0, value);  // a negative price counts as free
    if (!points.empty() && *time <= points.back().at)
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("{}:{}: {} is not after the row before ({}): times must increase", source, number,
                                    time_text, schedulers::format_rfc3339(points.back().at)));
    points.push_back({*time, value});
  }
  if (points.empty()) return make_error(ErrorCode::invalid_argument, fmt::format("{}: no time,value rows", source));
  return finish(std::move(points), 0, source);
}

// A row's value: carbon >= 0; a price any finite number, counted from 0 up.
Result<double> json_value(const json* value, SignalKind kind, const std::string& source,
                          const std::string& value_pointer) {
  if (!value || !value->is_number() || !in_range(value->get<double>(), kind))
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("{}: {}: expected a number {}", source, value_pointer, range_of(kind)));
  return std::max(0.0, value->get<double>());
}

// One JSON row's time and value; `pointer` names the row in errors.
Result<SignalPoint> json_point(const json& row, const char* time_key, const json* value, const std::string& source,
                               const std::string& pointer, const std::string& value_pointer,
                               SignalKind kind = SignalKind::carbon) {
  if (!row.is_object() || !row.contains(time_key) || !row[time_key].is_string())
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("{}: {}/{}: expected a time string", source, pointer, time_key));
  const auto time = parse_time(row[time_key].get<std::string>());
  if (!time)
    return make_error(ErrorCode::invalid_argument, fmt::format("{}: {}/{}: \"{}\" is not an RFC 3339 time", source,
                                                               pointer, time_key, row[time_key].get<std::string>()));
  auto number = json_value(value, kind, source, value_pointer);
  if (!number) return number.error();
  return SignalPoint{*time, *number};
}

// aWATTar's market data: hours as milliseconds since the epoch, prices per MWh.
Result<schedulers::GridSignal> parse_awattar(const json& rows, const std::string& source) {
  std::vector<SignalPoint> points;
  UnixMillis end = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::string pointer = fmt::format("/data/{}", i);
    const json& row = rows[i];
    if (!row.is_object() || !row.contains("start_timestamp") || !row["start_timestamp"].is_number_integer())
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("{}: {}/start_timestamp: expected milliseconds since 1970", source, pointer));
    if (row.contains("unit") && row["unit"].is_string()) {
      std::string unit = row["unit"].get<std::string>();
      std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::tolower(c); });
      if (!unit.ends_with("/mwh"))
        return make_error(ErrorCode::invalid_argument, fmt::format("{}: {}/unit: expected a price per MWh, got \"{}\"",
                                                                   source, pointer, row["unit"].get<std::string>()));
    }
    auto price = json_value(row.contains("marketprice") ? &row["marketprice"] : nullptr, SignalKind::price, source,
                            pointer + "/marketprice");
    if (!price) return price.error();
    const UnixMillis at = row["start_timestamp"].get<UnixMillis>();
    if (!points.empty() && at <= points.back().at)
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("{}: {}: {} is not after the row before: times must increase", source, pointer,
                                    schedulers::format_rfc3339(at)));
    if (auto joined = joins(at, points.empty() || end == 0 ? std::nullopt : std::optional(end), source,
                            pointer + "/start_timestamp");
        !joined)
      return joined.error();
    points.push_back({at, *price / 1000.0});
    end = row.contains("end_timestamp") && row["end_timestamp"].is_number_integer()
              ? row["end_timestamp"].get<UnixMillis>()
              : 0;
  }
  if (points.empty()) return make_error(ErrorCode::invalid_argument, fmt::format("{}: /data is empty", source));
  return finish(std::move(points), end, source);
}

// Octopus Energy's unit rates: half hours, newest first, pence per kWh including VAT.
Result<schedulers::GridSignal> parse_octopus(const json& rows, const std::string& source) {
  std::vector<std::pair<SignalPoint, UnixMillis>> spans;  // each rate and where it ends (0: unknown)
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::string pointer = fmt::format("/results/{}", i);
    const json& row = rows[i];
    const json* value = row.is_object() && row.contains("value_inc_vat") ? &row["value_inc_vat"] : nullptr;
    auto point = json_point(row, "valid_from", value, source, pointer, pointer + "/value_inc_vat", SignalKind::price);
    if (!point) return point.error();
    point->value /= 100.0;
    UnixMillis to = 0;
    if (row.contains("valid_to") && row["valid_to"].is_string())
      if (auto parsed = parse_time(row["valid_to"].get<std::string>())) to = *parsed;
    spans.emplace_back(*point, to);
  }
  if (spans.empty()) return make_error(ErrorCode::invalid_argument, fmt::format("{}: /results is empty", source));
  std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) { return a.first.at < b.first.at; });
  std::vector<SignalPoint> points;
  std::optional<UnixMillis> previous_end;
  for (const auto& [point, to] : spans) {
    if (!points.empty() && point.at == points.back().at)
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("{}: two rates from {}", source, schedulers::format_rfc3339(point.at)));
    if (auto joined = joins(point.at, previous_end, source,
                            "/results (the rate from " + schedulers::format_rfc3339(point.at) + ")");
        !joined)
      return joined.error();
    points.push_back(point);
    previous_end = to == 0 ? std::nullopt : std::optional(to);
  }
  return finish(std::move(points), spans.back().second, source);
}

Result<schedulers::GridSignal> parse_json(const json& doc, const std::string& source, SignalKind kind) {
  if (kind == SignalKind::price) {
    if (doc.is_object() && doc.contains("data") && doc["data"].is_array()) return parse_awattar(doc["data"], source);
    if (doc.is_object() && doc.contains("results") && doc["results"].is_array())
      return parse_octopus(doc["results"], source);
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("{}: not a price signal: expected aWATTar's \"data\" with \"start_timestamp\" and "
                                  "\"marketprice\", or Octopus Energy's \"results\" with \"valid_from\" and "
                                  "\"value_inc_vat\" (or a CSV of time,price rows)",
                                  source));
  }
  std::vector<SignalPoint> points;
  UnixMillis end = 0;
  auto add = [&](Result<SignalPoint> point, const std::string& pointer) -> Status {
    if (!point) return point.error();
    if (!points.empty() && point->at <= points.back().at)
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("{}: {}: {} is not after the row before: times must increase", source, pointer,
                                    schedulers::format_rfc3339(point->at)));
    points.push_back(*point);
    return {};
  };
  if (doc.is_object() && doc.contains("data") && doc["data"].is_array() && !doc["data"].empty() &&
      doc["data"][0].is_object() && doc["data"][0].contains("intensity")) {
    const json& rows = doc["data"];
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const std::string pointer = fmt::format("/data/{}", i);
      const json& row = rows[i];
      const json* value = nullptr;
      std::string which = "forecast";
      if (row.is_object() && row.contains("intensity") && row["intensity"].is_object()) {
        const json& intensity = row["intensity"];
        if (intensity.contains("actual") && intensity["actual"].is_number()) {
          value = &intensity["actual"];
          which = "actual";
        } else if (intensity.contains("forecast")) {
          value = &intensity["forecast"];
        }
      }
      const std::size_t before = points.size();
      if (auto added = add(json_point(row, "from", value, source, pointer, pointer + "/intensity/" + which), pointer);
          !added)
        return added.error();
      if (auto joined = joins(points.back().at, before == 0 || end == 0 ? std::nullopt : std::optional(end), source,
                              pointer + "/from");
          !joined)
        return joined.error();
      end = 0;
      if (row.contains("to") && row["to"].is_string())
        if (auto to = parse_time(row["to"].get<std::string>())) end = *to;
    }
    return finish(std::move(points), end, source);
  }
  for (const char* key : {"forecast", "history"}) {
    if (!doc.is_object() || !doc.contains(key) || !doc[key].is_array()) continue;
    const json& rows = doc[key];
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const std::string pointer = fmt::format("/{}/{}", key, i);
      const json* value =
          rows[i].is_object() && rows[i].contains("carbonIntensity") ? &rows[i]["carbonIntensity"] : nullptr;
      if (auto added =
              add(json_point(rows[i], "datetime", value, source, pointer, pointer + "/carbonIntensity"), pointer);
          !added)
        return added.error();
    }
    if (points.empty()) return make_error(ErrorCode::invalid_argument, fmt::format("{}: /{} is empty", source, key));
    return finish(std::move(points), 0, source);
  }
  if (doc.is_object() && doc.contains("data") && doc["data"].is_array()) {
    const json& rows = doc["data"];
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const std::string pointer = fmt::format("/data/{}", i);
      const json* value = rows[i].is_object() && rows[i].contains("value") ? &rows[i]["value"] : nullptr;
      if (auto added = add(json_point(rows[i], "point_time", value, source, pointer, pointer + "/value"), pointer);
          !added)
        return added.error();
    }
    if (points.empty()) return make_error(ErrorCode::invalid_argument, fmt::format("{}: /data is empty", source));
    return finish(std::move(points), 0, source);
  }
  return make_error(ErrorCode::invalid_argument,
                    fmt::format("{}: not a signal: expected the UK National Grid's \"data\" with \"intensity\", "
                                "ElectricityMaps' \"forecast\" or \"history\", or WattTime's \"data\" with "
                                "\"point_time\"",
                                source));
}

}  // namespace

Result<schedulers::GridSignal> parse_grid_signal(std::string_view text, const std::string& source, SignalKind kind) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && (text[first] == '{' || text[first] == '[')) {
    const json doc = json::parse(text, nullptr, false);
    if (doc.is_discarded()) return make_error(ErrorCode::invalid_argument, fmt::format("{}: not valid JSON", source));
    return parse_json(doc, source, kind);
  }
  return parse_csv(text, source, kind);
}

bool is_currency_code(std::string_view text) {
  return text.size() == 3 && std::all_of(text.begin(), text.end(), [](char c) { return c >= 'A' && c <= 'Z'; });
}

}  // namespace joule::config
