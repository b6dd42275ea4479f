#include "joule/daemon/job_estimate.hpp"

#include <algorithm>

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

}  // namespace

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
      if (const auto layers = row.find("layers"); layers != row.end() && layers->is_array())
        for (const auto& layer : *layers)
          if (layer.is_object()) estimate.flops_per_step += layer.value("flops_per_step", 0.0);
      if (const auto steps = row.find("steps"); steps != row.end() && steps->is_number_integer())
        estimate.steps = steps->get<std::int64_t>();
      // Estimates stored before they named their epochs: one.
      if (const auto epochs = row.find("epochs"); epochs != row.end() && epochs->is_number_integer())
        estimate.epochs = std::max<std::int64_t>(1, epochs->get<std::int64_t>());
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
