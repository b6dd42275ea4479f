#include "joule/daemon/job_estimate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

namespace joule::daemon {

using nlohmann::json;

namespace {

// {"mean": m, "std": s} of a row, or nothing.
std::optional<std::pair<double, double>> figure(const json& row, const char* key) {
  const auto it = row.find(key);
  if (it == row.end() || !it->is_object()) return std::nullopt;
  const auto number = [&](const char* name) {
    const auto value = it->find(name);
    return value != it->end() && value->is_number() ? value->get<double>() : 0.0;
  };
  return std::pair{number("mean"), number("std")};
}

// Every floating-point number in `value` rounded to 6 significant digits: the shortest text
// that reads back the same is then a few characters, not 17 digits.
void round_numbers(json& value) {
  if (value.is_number_float()) {
    const double number = value.get<double>();
    if (std::isfinite(number)) value = std::strtod(fmt::format("{:.6g}", number).c_str(), nullptr);
  } else if (value.is_structured()) {
    for (auto& item : value) round_numbers(item);
  }
}

}  // namespace

double flops_per_step(const json& row) {
  if (const auto flops = row.find("flops_per_step"); flops != row.end() && flops->is_number())
    return flops->get<double>();
  double flops = 0.0;
  if (const auto layers = row.find("layers"); layers != row.end() && layers->is_array())
    for (const auto& layer : *layers)
      if (layer.is_object()) flops += layer.value("flops_per_step", 0.0);
  return flops;
}

std::optional<estimator::WorkMix> work_mix_of(const json& row) {
  const auto layers = row.find("layers");
  if (layers == row.end() || !layers->is_array()) return std::nullopt;
  std::vector<std::pair<std::string, double>> joules_by_key;
  for (const auto& layer : *layers) {
    if (!layer.is_object()) continue;
    const auto key = layer.find("model");
    if (key == layer.end() || !key->is_string()) continue;
    joules_by_key.emplace_back(key->get<std::string>(),
                               figure(layer, "joules_per_step").value_or(std::pair{0.0, 0.0}).first);
  }
  return estimator::work_mix(joules_by_key);
}

json compact_estimates(const json& rows, std::size_t detailed) {
  if (!rows.is_array()) return rows;
  // The cheapest devices (by estimated joules) keep their breakdown: where the job will likely run.
  std::vector<std::pair<double, std::size_t>> cost;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    if (row.is_object() && row.value("status", "") == "ok")
      cost.emplace_back(figure(row, "joules").value_or(std::pair{0.0, 0.0}).first, i);
  }
  std::sort(cost.begin(), cost.end());
  std::vector<bool> keep(rows.size(), false);
  for (std::size_t k = 0; k < cost.size() && k < detailed; ++k) keep[cost[k].second] = true;
  json out = json::array();
  for (std::size_t i = 0; i < rows.size(); ++i) {
    json row = rows[i];
    if (row.is_object() && row.contains("layers") && !keep[i]) {
      row["flops_per_step"] = flops_per_step(row);
      row["layers"] = json::array();
      row["layers_left_out"] = true;
    }
    round_numbers(row);
    out.push_back(std::move(row));
  }
  return out;
}

std::vector<DeviceEstimate> read_estimates(const json& rows) {
  std::vector<DeviceEstimate> out;
  if (!rows.is_array()) return out;
  for (const auto& row : rows) {
    if (!row.is_object() || !row.contains("device") || !row["device"].is_string()) continue;
    DeviceEstimate estimate;
    estimate.device = row["device"].get<std::string>();
    estimate.ok = row.value("status", "") == "ok";
    if (estimate.ok) {
      estimate.source = row.value("source", "");
      estimate.environment = row.value("environment", "");
      const auto joules = figure(row, "joules").value_or(std::pair{0.0, 0.0});
      estimate.joules_mean = joules.first;
      estimate.joules_std = joules.second;
      const auto model = figure(row, "raw_joules").value_or(joules);
      estimate.model_joules_mean = model.first;
      estimate.model_joules_std = model.second;
      const auto seconds = figure(row, "seconds").value_or(std::pair{0.0, 0.0});
      estimate.seconds_mean = seconds.first;
      estimate.model_seconds_mean = figure(row, "raw_seconds").value_or(seconds).first;
      if (const auto baseline = row.find("baseline"); baseline != row.end() && baseline->is_object())
        estimate.baseline_joules = baseline->value("joules", 0.0);
      estimate.flops_per_step = flops_per_step(row);
      if (const auto steps = row.find("steps"); steps != row.end() && steps->is_number_integer())
        estimate.steps = steps->get<std::int64_t>();
      // Estimates stored before they named their epochs: one.
      if (const auto epochs = row.find("epochs"); epochs != row.end() && epochs->is_number_integer())
        estimate.epochs = std::max<std::int64_t>(1, epochs->get<std::int64_t>());
      estimate.mix = work_mix_of(row);
    }
    out.push_back(std::move(estimate));
  }
  return out;
}

std::vector<DeviceEstimate> read_estimates(const std::string& stored) {
  if (stored.empty()) return {};
  return read_estimates(json::parse(stored, nullptr, false));
}

const DeviceEstimate* find_estimate(const std::vector<DeviceEstimate>& estimates, const std::string& device) {
  for (const auto& estimate : estimates)
    if (estimate.device == device) return &estimate;
  return nullptr;
}

}  // namespace joule::daemon
