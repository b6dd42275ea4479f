#include "joule/daemon/outcome_service.hpp"

#include <spdlog/spdlog.h>

namespace joule::daemon {

using nlohmann::json;

namespace {

json optional_number(const std::optional<double>& value) { return value ? json(*value) : json(nullptr); }

json overhead_json(const estimator::JobOverhead& line) {
  return {{"per_job", line.per_job},
          {"per_epoch", line.per_epoch},
          {"steps_scale", line.scale},
          {"separable", line.separable}};
}

}  // namespace

std::optional<estimator::OutcomeRow> OutcomeService::row_of(const JobFeedback& feedback) {
  const DeviceEstimate& estimate = feedback.estimate;
  if (feedback.partial || !estimate.ok || feedback.gpus > 1) return std::nullopt;
  // Like with like: a modelled estimate says nothing about what a hardware meter reads.
  if (estimate.source != feedback.source) return std::nullopt;
  estimator::OutcomeRow row;
  row.job_id = feedback.job_id;
  row.finished_ms = feedback.finished_ms;
  // The model's own figure: the calibration learns what the model gets wrong.
  row.estimated_joules = estimate.model_joules_mean;
  row.estimated_std = estimate.model_joules_std;
  row.estimated_seconds = estimate.model_seconds_mean;
  row.flops_per_step = estimate.flops_per_step;
  row.steps = estimate.steps;
  row.epochs = estimate.epochs;
  row.metered_joules = feedback.joules;
  row.metered_seconds = feedback.seconds;
  row.mix = estimate.mix;
  if (!row.usable()) return std::nullopt;
  return row;
}

const estimator::OutcomeCalibration* OutcomeService::calibration_for(const DeviceRows& rows,
                                                                     const std::string& environment) {
  if (const auto own = rows.by_environment.find(environment); own != rows.by_environment.end()) return &own->second;
  if (const auto unnamed = rows.by_environment.find(""); unnamed != rows.by_environment.end()) return &unnamed->second;
  return nullptr;
}

estimator::OutcomeCalibration& OutcomeService::calibration_of(DeviceRows& rows, const std::string& environment) {
  auto [it, created] = rows.by_environment.try_emplace(environment);
  if (created && !environment.empty()) it->second.add_all(rows.unnamed);
  return it->second;
}

bool OutcomeService::record_data_parallel(const JobFeedback& feedback) {
  const DeviceEstimate& estimate = feedback.estimate;
  if (feedback.gpus <= 1 || feedback.partial || !estimate.ok || !estimate.data_parallel || feedback.gpu_group.empty())
    return false;
  // Like with like, as for one device's rows: a modelled one-GPU figure against a meter's joules
  // would teach the meter's offset from the model, not the overhead.
  if (estimate.source != feedback.source) return false;
  if (!data_parallel_[feedback.gpu_group].add(feedback.gpus, feedback.joules, feedback.seconds,
                                              *estimate.data_parallel))
    return false;
  const auto learnt = data_parallel_overhead(feedback.gpu_group, feedback.gpus);
  spdlog::debug("{} GPUs of {}: overhead {:.1f} % ± {:.1f} % energy, {:.1f} % ± {:.1f} % time ({})", feedback.gpus,
                feedback.gpu_group, 100.0 * learnt.joules.mean, 100.0 * learnt.joules.std, 100.0 * learnt.seconds.mean,
                100.0 * learnt.seconds.std, learnt.basis);
  return true;
}

estimator::DataParallelOverhead OutcomeService::data_parallel_overhead(const std::string& gpu_group, int gpus) const {
  const auto found = data_parallel_.find(gpu_group);
  return found == data_parallel_.end() ? estimator::DataParallelOverhead{} : found->second.overhead(gpus, gpu_group);
}

json OutcomeService::data_parallel_view(const std::string& gpu_group) const {
  json out = json::object();
  const auto found = data_parallel_.find(gpu_group);
  if (found == data_parallel_.end()) return out;
  for (const auto& [gpus, overhead] : found->second.learnt(gpu_group))
    out[std::to_string(gpus)] = {{"jobs", overhead.jobs},
                                 {"joules_overhead", {{"mean", overhead.joules.mean}, {"std", overhead.joules.std}}},
                                 {"seconds_overhead", {{"mean", overhead.seconds.mean}, {"std", overhead.seconds.std}}},
                                 {"basis", overhead.basis}};
  return out;
}

bool OutcomeService::record(const JobFeedback& feedback) {
  if (feedback.gpus > 1) return record_data_parallel(feedback);
  auto row = row_of(feedback);
  if (!row) return false;
  auto& rows = devices_[feedback.device];
  const std::string& environment = feedback.estimate.environment;
  if (environment.empty()) {
    rows.unnamed.push_back(*row);
    if (rows.unnamed.size() > estimator::OutcomeCalibration::kMaxRows) rows.unnamed.erase(rows.unnamed.begin());
    for (auto& [other, calibration] : rows.by_environment)
      if (!other.empty()) calibration.add(*row);
  }
  auto& calibration = calibration_of(rows, environment);
  if (!calibration.add(std::move(*row))) return false;
  ++rows.own_rows[environment];
  const auto& summary = calibration.summary();
  if (summary.raw_error && summary.corrected_error)
    spdlog::debug("device {}: {} finished jobs; estimate error {:.1f} % raw, {:.1f} % corrected ({}); sigma x{:.2f}",
                  feedback.device, summary.rows, 100.0 * *summary.raw_error, 100.0 * *summary.corrected_error,
                  summary.correction_active ? "applied" : "not applied", summary.sigma_scale);
  return true;
}

std::size_t OutcomeService::record_all(const std::vector<JobFeedback>& history) {
  // By device and environment, each calibration refitted once.
  std::map<std::string, std::map<std::string, std::vector<estimator::OutcomeRow>>> rows;
  std::size_t kept = 0;
  for (const auto& feedback : history) {
    if (feedback.gpus > 1) {
      kept += record_data_parallel(feedback) ? 1 : 0;
      continue;
    }
    if (auto row = row_of(feedback)) rows[feedback.device][feedback.estimate.environment].push_back(std::move(*row));
  }
  for (auto& [device, by_environment] : rows) {
    auto& device_rows = devices_[device];
    if (const auto unnamed = by_environment.find(""); unnamed != by_environment.end()) {
      auto& kept_unnamed = device_rows.unnamed;
      kept_unnamed.insert(kept_unnamed.end(), unnamed->second.begin(), unnamed->second.end());
      if (kept_unnamed.size() > estimator::OutcomeCalibration::kMaxRows)
        kept_unnamed.erase(kept_unnamed.begin(),
                           kept_unnamed.begin() + static_cast<std::ptrdiff_t>(kept_unnamed.size() -
                                                                              estimator::OutcomeCalibration::kMaxRows));
      for (auto& [environment, calibration] : device_rows.by_environment)
        if (!environment.empty()) calibration.add_all(unnamed->second);
    }
    for (auto& [environment, environment_rows] : by_environment) {
      const std::size_t added = calibration_of(device_rows, environment).add_all(std::move(environment_rows));
      device_rows.own_rows[environment] += added;
      kept += added;
    }
  }
  return kept;
}

void OutcomeService::set_environment(const std::string& device, const std::string& environment) {
  devices_[device].current = environment;
}

std::map<std::string, estimator::CalibrationSummary> OutcomeService::summaries() const {
  std::map<std::string, estimator::CalibrationSummary> out;
  // A device whose model's environment has no rows yet reports none (not the old environment's).
  for (const auto& [device, rows] : devices_) {
    const auto* calibration = calibration_for(rows, rows.current);
    out.emplace(device, calibration ? calibration->summary() : estimator::CalibrationSummary{});
  }
  return out;
}

void OutcomeService::apply(std::vector<EstimateRow>& rows) const {
  for (auto& row : rows) {
    if (!row.estimate) continue;
    estimator::Estimate& estimate = *row.estimate;
    const auto device = devices_.find(row.device);
    if (device == devices_.end()) continue;
    const auto* found = calibration_for(device->second, estimate.environment);
    if (!found) continue;
    const auto& calibration = *found;
    if (calibration.rows().size() < estimator::OutcomeCalibration::kMinRows) continue;
    // The model's own figures, also where the row was corrected already.
    const estimator::Uncertain raw = row.correction ? row.correction->model_joules : estimate.joules;
    const estimator::Uncertain raw_seconds =
        row.correction && row.correction->model_seconds ? *row.correction->model_seconds : estimate.seconds;
    const auto calibrated = calibration.apply(raw.mean, raw.std, raw_seconds.mean, flops_per_step(estimate),
                                              estimate.steps, estimate.epochs, work_mix_of(estimate));
    const auto& summary = calibration.summary();
    const bool mean_corrected = summary.correction_active && !calibrated.far_from_rows;
    EstimateCorrection correction;
    correction.model_joules = raw;
    estimate.joules = {calibrated.joules.mean, calibrated.joules.std};
    if (summary.seconds_correction_active) {
      correction.model_seconds = raw_seconds;
      // The overhead's seconds are learnt as a figure, not a distribution: the spread stays the model's.
      estimate.seconds = {calibrated.seconds, raw_seconds.std};
    } else {
      estimate.seconds = raw_seconds;
    }
    // The job's cost outside its steps, as a line of its own: part of the joules (and of the
    // seconds) when applied.
    if (calibrated.overhead_joules > 0.0 || calibrated.overhead_seconds > 0.0)
      correction.overhead = EstimateCorrection::Overhead{
          calibrated.overhead_joules, calibrated.overhead_seconds,
          summary.overhead_joules ? summary.overhead_joules->per_job : 0.0,
          summary.overhead_joules ? summary.overhead_joules->per_epoch : 0.0, summary.rows};
    correction.method = mean_corrected ? "kernel-ridge+conformal" : "conformal";
    correction.rows = summary.rows;
    correction.mean_factor = calibrated.mean_factor;
    correction.sigma_scale = calibrated.sigma_scale;
    if (calibrated.far_from_rows)
      correction.note =
          "this job lies far from every finished job (its size, length or work per step): its mean is the model's "
          "own, only its spread is calibrated";
    row.correction = std::move(correction);
  }
}

json OutcomeService::view(const std::string& device) const {
  const auto it = devices_.find(device);
  const auto* calibration = it == devices_.end() ? nullptr : calibration_for(it->second, it->second.current);
  // Rows learnt under another environment than the model's: kept, not used.
  std::size_t elsewhere = 0;
  if (it != devices_.end())
    for (const auto& [environment, count] : it->second.own_rows)
      if (!environment.empty() && environment != it->second.current) elsewhere += count;
  if (!calibration)
    return {{"rows", 0},
            {"min_rows", estimator::OutcomeCalibration::kMinRows},
            {"correction", "none"},
            {"rows_other_environments", elsewhere}};
  const auto& summary = calibration->summary();
  return {{"rows", summary.rows},
          {"rows_other_environments", elsewhere},
          {"min_rows", estimator::OutcomeCalibration::kMinRows},
          {"correction", summary.rows < estimator::OutcomeCalibration::kMinRows ? "none"
                         : summary.correction_active                            ? "mean and spread"
                                                                                : "spread only"},
          {"error_raw", optional_number(summary.raw_error)},
          {"error_corrected_leave_one_out", optional_number(summary.corrected_error)},
          {"coverage_2sigma_raw", optional_number(summary.raw_coverage)},
          {"coverage_2sigma_calibrated_leave_one_out", optional_number(summary.calibrated_coverage)},
          {"sigma_scale", summary.sigma_scale},
          {"uses_work_mix", summary.uses_work_mix},
          {"overhead",
           {{"joules", summary.overhead_joules ? overhead_json(*summary.overhead_joules) : json(nullptr)},
            {"seconds", summary.overhead_seconds ? overhead_json(*summary.overhead_seconds) : json(nullptr)},
            {"seconds_error_raw", optional_number(summary.seconds_raw_error)},
            {"seconds_error_corrected_leave_one_out", optional_number(summary.seconds_corrected_error)},
            {"seconds_applied", summary.seconds_correction_active}}}};
}

}  // namespace joule::daemon
