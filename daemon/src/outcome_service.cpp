#include "joule/daemon/outcome_service.hpp"

#include <spdlog/spdlog.h>

namespace joule::daemon {

using nlohmann::json;

namespace {

json optional_number(const std::optional<double>& value) { return value ? json(*value) : json(nullptr); }

double flops_per_step(const json& estimate) {
  double flops = 0.0;
  if (const auto layers = estimate.find("layers"); layers != estimate.end() && layers->is_array())
    for (const auto& layer : *layers)
      if (layer.is_object()) flops += layer.value("flops_per_step", 0.0);
  return flops;
}

// A figure {"mean", "std"} of an estimate row; the model's own when the row was corrected.
const json& model_joules(const json& estimate) {
  if (const auto raw = estimate.find("raw_joules"); raw != estimate.end() && raw->is_object()) return *raw;
  static const json kNone = json::object();
  const auto joules = estimate.find("joules");
  return joules != estimate.end() && joules->is_object() ? *joules : kNone;
}

}  // namespace

std::optional<estimator::OutcomeRow> OutcomeService::row_of(const JobService::Feedback& feedback) {
  const DeviceEstimate& estimate = feedback.estimate;
  if (feedback.partial || !estimate.ok) return std::nullopt;
  // Like with like: a modelled estimate says nothing about what a hardware meter reads.
  if (estimate.source != feedback.source) return std::nullopt;
  estimator::OutcomeRow row;
  row.job_id = feedback.job_id;
  row.finished_ms = feedback.finished_ms;
  // The model's own figure: the calibration learns what the model gets wrong.
  row.estimated_joules = estimate.model_joules_mean;
  row.estimated_std = estimate.model_joules_std;
  row.estimated_seconds = estimate.seconds_mean;
  row.flops_per_step = estimate.flops_per_step;
  row.steps = estimate.steps;
  row.metered_joules = feedback.joules;
  if (!row.usable()) return std::nullopt;
  return row;
}

bool OutcomeService::record(const JobService::Feedback& feedback) {
  auto row = row_of(feedback);
  if (!row) return false;
  auto& calibration = devices_[feedback.device];
  if (!calibration.add(std::move(*row))) return false;
  const auto& summary = calibration.summary();
  if (summary.raw_error && summary.corrected_error)
    spdlog::debug("device {}: {} finished jobs; estimate error {:.1f} % raw, {:.1f} % corrected ({}); sigma x{:.2f}",
                  feedback.device, summary.rows, 100.0 * *summary.raw_error, 100.0 * *summary.corrected_error,
                  summary.correction_active ? "applied" : "not applied", summary.sigma_scale);
  return true;
}

std::size_t OutcomeService::record_all(const std::vector<JobService::Feedback>& history) {
  std::map<std::string, std::vector<estimator::OutcomeRow>> rows;
  for (const auto& feedback : history)
    if (auto row = row_of(feedback)) rows[feedback.device].push_back(std::move(*row));
  std::size_t kept = 0;
  for (auto& [device, device_rows] : rows) kept += devices_[device].add_all(std::move(device_rows));
  return kept;
}

std::map<std::string, estimator::CalibrationSummary> OutcomeService::summaries() const {
  std::map<std::string, estimator::CalibrationSummary> out;
  for (const auto& [device, calibration] : devices_) out.emplace(device, calibration.summary());
  return out;
}

void OutcomeService::apply(json& estimates) const {
  if (!estimates.is_array()) return;
  for (auto& row : estimates) {
    if (!row.is_object() || row.value("status", "") != "ok") continue;
    const auto device = devices_.find(row.value("device", ""));
    if (device == devices_.end()) continue;
    const auto& calibration = device->second;
    if (calibration.rows().size() < estimator::OutcomeCalibration::kMinRows) continue;
    const json raw = model_joules(row);
    const double seconds = row.contains("seconds") && row["seconds"].is_object() ? row["seconds"].value("mean", 0.0) : 0.0;
    const auto calibrated = calibration.apply(raw.value("mean", 0.0), raw.value("std", 0.0), seconds,
                                              flops_per_step(row), row.value("steps", std::int64_t{0}));
    const auto& summary = calibration.summary();
    row["raw_joules"] = raw;
    row["joules"] = {{"mean", calibrated.joules.mean}, {"std", calibrated.joules.std}};
    row["calibration"] = {{"method", summary.correction_active ? "kernel-ridge+conformal" : "conformal"},
                          {"rows", summary.rows},
                          {"mean_factor", calibrated.mean_factor},
                          {"sigma_scale", calibrated.sigma_scale}};
  }
}

json OutcomeService::view(const std::string& device) const {
  const auto it = devices_.find(device);
  if (it == devices_.end())
    return {{"rows", 0}, {"min_rows", estimator::OutcomeCalibration::kMinRows}, {"correction", "none"}};
  const auto& summary = it->second.summary();
  return {{"rows", summary.rows},
          {"min_rows", estimator::OutcomeCalibration::kMinRows},
          {"correction", summary.rows < estimator::OutcomeCalibration::kMinRows ? "none"
                         : summary.correction_active                             ? "mean and spread"
                                                                                 : "spread only"},
          {"error_raw", optional_number(summary.raw_error)},
          {"error_corrected_leave_one_out", optional_number(summary.corrected_error)},
          {"coverage_2sigma_raw", optional_number(summary.raw_coverage)},
          {"coverage_2sigma_calibrated_leave_one_out", optional_number(summary.calibrated_coverage)},
          {"sigma_scale", summary.sigma_scale}};
}

}  // namespace joule::daemon
