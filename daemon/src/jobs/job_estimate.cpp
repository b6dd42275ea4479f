#include "joule/daemon/job_estimate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>

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

// A number to 6 significant digits, as a job keeps its estimates: the shortest text that reads
// back the same is then a few characters, not 17 digits.
double rounded(double number) {
  return std::isfinite(number) ? std::strtod(fmt::format("{:.6g}", number).c_str(), nullptr) : number;
}

// Every floating-point number in `value` rounded so.
void round_numbers(json& value) {
  if (value.is_number_float()) {
    value = rounded(value.get<double>());
  } else if (value.is_structured()) {
    for (auto& item : value) round_numbers(item);
  }
}

json uncertain_json(const estimator::Uncertain& figure) { return {{"mean", figure.mean}, {"std", figure.std}}; }

}  // namespace

double flops_per_step(const estimator::Estimate& estimate) {
  double flops = 0.0;
  for (const auto& layer : estimate.layers) flops += layer.flops_per_step;
  return flops;
}

std::optional<estimator::WorkMix> work_mix_of(const estimator::Estimate& estimate) {
  std::vector<std::pair<std::string, double>> joules_by_key;
  joules_by_key.reserve(estimate.layers.size());
  for (const auto& layer : estimate.layers) joules_by_key.emplace_back(layer.key, layer.joules_per_step.mean);
  return estimator::work_mix(joules_by_key);
}

DeviceEstimate DeviceEstimate::of(const EstimateRow& row) {
  DeviceEstimate out;
  out.device = row.device;
  out.ok = row.ok();
  if (!row.estimate) return out;
  const estimator::Estimate& estimate = *row.estimate;
  out.source = energy_source_from_string(estimate.source);
  out.environment = estimate.environment;
  out.joules_mean = rounded(estimate.joules.mean);
  out.joules_std = rounded(estimate.joules.std);
  const auto& model = row.correction ? row.correction->model_joules : estimate.joules;
  out.model_joules_mean = rounded(model.mean);
  out.model_joules_std = rounded(model.std);
  out.seconds_mean = rounded(estimate.seconds.mean);
  out.model_seconds_mean = rounded(row.correction && row.correction->model_seconds ? row.correction->model_seconds->mean
                                                                                   : estimate.seconds.mean);
  if (estimate.flops_baseline_joules > 0.0) out.baseline_joules = rounded(estimate.flops_baseline_joules);
  out.flops_per_step = rounded(daemon::flops_per_step(estimate));
  out.steps = estimate.steps;
  out.epochs = std::max<std::int64_t>(1, estimate.epochs);
  out.mix = work_mix_of(estimate);
  out.warnings_digest = digest_of_warnings(estimate.warnings);
  return out;
}

bool DeviceEstimate::same_figures(const DeviceEstimate& other) const {
  return device == other.device && ok == other.ok && source == other.source && environment == other.environment &&
         joules_mean == other.joules_mean && joules_std == other.joules_std &&
         model_joules_mean == other.model_joules_mean && model_joules_std == other.model_joules_std &&
         seconds_mean == other.seconds_mean && model_seconds_mean == other.model_seconds_mean &&
         baseline_joules == other.baseline_joules && flops_per_step == other.flops_per_step && steps == other.steps &&
         epochs == other.epochs && warnings_digest == other.warnings_digest;
}

std::size_t digest_of_warnings(const std::vector<std::string>& warnings) {
  if (warnings.empty()) return 0;
  std::size_t digest = warnings.size();
  for (const auto& warning : warnings)  // boost::hash_combine's mixing
    digest ^= std::hash<std::string>{}(warning) + 0x9e3779b97f4a7c15ULL + (digest << 6) + (digest >> 2);
  return digest;
}

std::vector<DeviceEstimate> figures_of(const std::vector<EstimateRow>& rows) {
  std::vector<DeviceEstimate> out;
  out.reserve(rows.size());
  for (const auto& row : rows) out.push_back(DeviceEstimate::of(row));
  return out;
}

json estimate_row_json(const EstimateRow& row) { return estimate_row_json(row, true); }

json estimate_row_json(const EstimateRow& row, bool with_layers) {
  if (!row.estimate) return {{"device", row.device}, {"status", "no-model"}, {"detail", row.detail}};
  json out = estimator::to_json(*row.estimate, with_layers);
  out["device"] = row.device;  // an agent's model names its own device; here it is "node/device"
  out["status"] = "ok";
  if (const auto& correction = row.correction) {
    out["raw_joules"] = uncertain_json(correction->model_joules);
    if (correction->model_seconds) out["raw_seconds"] = uncertain_json(*correction->model_seconds);
    if (const auto& overhead = correction->overhead)
      out["overhead"] = {{"joules", overhead->joules},
                         {"seconds", overhead->seconds},
                         {"per_job_joules", overhead->per_job_joules},
                         {"per_epoch_joules", overhead->per_epoch_joules},
                         {"learnt_from", overhead->learnt_from}};
    out["calibration"] = {{"method", correction->method},
                          {"rows", correction->rows},
                          {"mean_factor", correction->mean_factor},
                          {"sigma_scale", correction->sigma_scale}};
    if (!correction->note.empty()) out["calibration"]["note"] = correction->note;
  }
  return out;
}

std::string stored_estimates(const std::vector<EstimateRow>& rows) {
  if (rows.empty()) return {};
  // The cheapest rows keep their breakdown (where the job will likely run); the others' are not
  // written at all.
  std::vector<std::pair<double, std::size_t>> cost;
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i].estimate) cost.emplace_back(rows[i].estimate->joules.mean, i);
  const std::size_t detailed = std::min<std::size_t>(kDetailedRows, cost.size());
  std::partial_sort(cost.begin(), cost.begin() + static_cast<std::ptrdiff_t>(detailed), cost.end());
  std::vector<bool> keep(rows.size(), false);
  for (std::size_t k = 0; k < detailed; ++k) keep[cost[k].second] = true;
  json out = json::array();
  for (std::size_t i = 0; i < rows.size(); ++i) {
    json row = estimate_row_json(rows[i], keep[i]);
    if (rows[i].estimate) {
      row["flops_per_step"] = flops_per_step(*rows[i].estimate);  // before the rounding, as read back
      if (!keep[i]) row["layers_left_out"] = true;
    }
    round_numbers(row);
    out.push_back(std::move(row));
  }
  return out.dump();
}

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

std::vector<DeviceEstimate> read_estimates(const json& rows) {
  std::vector<DeviceEstimate> out;
  if (!rows.is_array()) return out;
  for (const auto& row : rows) {
    if (!row.is_object() || !row.contains("device") || !row["device"].is_string()) continue;
    DeviceEstimate estimate;
    estimate.device = row["device"].get<std::string>();
    estimate.ok = row.value("status", "") == "ok";
    if (estimate.ok) {
      estimate.source = energy_source_from_string(row.value("source", ""));
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
      // A baseline of no joules is none (a model without the figure).
      if (const auto baseline = row.find("baseline"); baseline != row.end() && baseline->is_object())
        if (const double joules = baseline->value("joules", 0.0); joules > 0.0) estimate.baseline_joules = joules;
      estimate.flops_per_step = flops_per_step(row);
      if (const auto steps = row.find("steps"); steps != row.end() && steps->is_number_integer())
        estimate.steps = steps->get<std::int64_t>();
      // Estimates stored before they named their epochs: one.
      if (const auto epochs = row.find("epochs"); epochs != row.end() && epochs->is_number_integer())
        estimate.epochs = std::max<std::int64_t>(1, epochs->get<std::int64_t>());
      estimate.mix = work_mix_of(row);
      std::vector<std::string> warnings;
      if (const auto listed = row.find("warnings"); listed != row.end() && listed->is_array())
        for (const auto& warning : *listed)
          if (warning.is_string()) warnings.push_back(warning.get<std::string>());
      estimate.warnings_digest = digest_of_warnings(warnings);
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
