#pragma once
// Learning from finished jobs: every job that ended with an estimate and metered joules of the
// same source is a row, and each device's rows correct that device's next estimates twice.
//   - The mean (PRE, seed 003: a regression on measured runs): kernel ridge regression of
//     y = ln(metered / estimated) on the job's features (log estimated joules and seconds, log
//     FLOPs per step, log steps, standardised), plus the rows' mean ratio. The work mix (where
//     the step's estimated energy goes, by family of layer kinds) joins them where that lowers
//     the leave-one-out error by at least 5 %: a device whose model misjudges one family (its recurrent layers,
//     say) is then corrected for the jobs made of it, not for every job alike. It is applied only
//     while its leave-one-out error beats the raw estimate's, and both errors are reported.
//   - The spread (split-conformal calibration): a row's score is its leave-one-out residual in
//     log space over the estimate's own log-space σ; the σ of new estimates is scaled by the
//     conformal quantile of the scores over 2, so that ±2σ covers about 95 % of jobs whether the
//     model was over- or under-confident. Coverage is reported leave-one-out, before and after.
//   - What jobs cost outside their steps (job_overhead.hpp: start-up per job, data and
//     evaluation per epoch) is fitted first and shown as a line of its own; the regression then
//     learns what the steps' estimates miss, so a corrected estimate is
//     estimated steps × the correction's factor + the overhead. Seconds get the overhead line
//     and its fitted scale, applied while that beats the raw seconds in leave-one-out error.
// Pure: rows in, corrections and figures out; no clock, no I/O.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "joule/estimator/device_energy_model.hpp"
#include "joule/estimator/job_overhead.hpp"

namespace joule::estimator {

/// Where an estimate's step energy goes: each family's share of the estimated joules per step,
/// in [0, 1]. What the five leave is the rest (activations, norms, pooling, joins, embeddings).
struct WorkMix {
  double convolution = 0.0;
  double linear = 0.0;
  double recurrent = 0.0;
  double attention = 0.0;
  double optimizer = 0.0;

  static constexpr std::size_t kFamilies = 5;
  std::vector<double> shares() const { return {convolution, linear, recurrent, attention, optimizer}; }
};

/// The work mix of an estimate's layers, given each layer's model key ("conv2d@hidden",
/// "optimizer:adam@output", as estimates name them) and its estimated joules per step. Nothing
/// when the layers hold no positive joules.
std::optional<WorkMix> work_mix(const std::vector<std::pair<std::string, double>>& joules_by_key);

/// One finished job on one device: what was estimated at submission and what was metered.
struct OutcomeRow {
  std::string job_id;
  std::int64_t finished_ms = 0;
  double estimated_joules = 0.0;  ///< the raw (uncorrected) estimate's mean
  double estimated_std = 0.0;     ///< and its standard deviation
  double estimated_seconds = 0.0;
  double flops_per_step = 0.0;
  std::int64_t steps = 0;
  std::int64_t epochs = 1;
  double metered_joules = 0.0;
  std::optional<double> metered_seconds;  ///< how long the run lasted, where that is known
  /// The estimate's work mix; nothing for estimates stored without their layers (the rows' mean
  /// mix stands in).
  std::optional<WorkMix> mix;

  /// Whether the row can be learnt from (every figure positive and finite).
  bool usable() const;
};

/// What the rows say, for GET /v1/devices and the metrics.
struct CalibrationSummary {
  std::size_t rows = 0;
  /// Mean |estimate − metered| / metered of the raw estimates, and of the corrected ones with
  /// each row left out of the correction it is scored by; null below kMinRows.
  std::optional<double> raw_error;
  std::optional<double> corrected_error;
  bool correction_active = false;  ///< corrected_error < raw_error: new estimates are corrected
  /// Whether the correction uses the work mix (it did better leave-one-out than without it).
  bool uses_work_mix = false;
  /// Share of rows whose metered joules fell inside the raw estimate's ±2σ, and inside the
  /// calibrated ±2σ (the scale from the other rows only).
  std::optional<double> raw_coverage;
  std::optional<double> calibrated_coverage;
  double sigma_scale = 1.0;  ///< applied to the log-space σ of new estimates
  /// The jobs' cost outside their steps, in joules (from every row; applied with the mean
  /// correction) and in seconds (from the rows with a metered duration).
  std::optional<JobOverhead> overhead_joules;
  std::optional<JobOverhead> overhead_seconds;
  /// Mean |estimate − metered| / metered of the seconds, raw and with the overhead line (leave-
  /// one-out); the line is applied to new estimates' seconds while it is the lower.
  std::optional<double> seconds_raw_error;
  std::optional<double> seconds_corrected_error;
  bool seconds_correction_active = false;
};

/// A correction applied to one estimate.
struct Calibrated {
  Uncertain joules;
  double mean_factor = 1.0;  ///< corrected mean / raw mean
  double sigma_scale = 1.0;
  double overhead_joules = 0.0;  ///< part of joules.mean: the job's cost outside its steps
  double seconds = 0.0;          ///< the estimated seconds, with their overhead where it is applied
  double overhead_seconds = 0.0;
  /// The job lies far from every row (a size or shape no finished job had): its mean is the
  /// model's own, and only its spread is calibrated.
  bool far_from_rows = false;
};

class OutcomeCalibration {
 public:
  /// Rows needed before anything is corrected or calibrated.
  static constexpr std::size_t kMinRows = 5;
  /// Rows kept: the most recent, so the correction follows a device that changes.
  static constexpr std::size_t kMaxRows = 200;
  /// The target coverage of the calibrated ±2σ interval.
  static constexpr double kCoverage = 0.95;

  /// Adds a finished job (an unusable row is ignored; returns whether it was kept) and refits.
  bool add(OutcomeRow row);
  /// Adds many rows in order and refits once (a refit is O(rows³), ~10 ms at kMaxRows): for
  /// rebuilding from history at start. Returns how many were kept.
  std::size_t add_all(std::vector<OutcomeRow> rows);
  const std::vector<OutcomeRow>& rows() const { return rows_; }
  const CalibrationSummary& summary() const { return summary_; }

  /// A new estimate corrected by what the rows say: its mean (while the correction is active)
  /// and its spread (once there are kMinRows rows), and its seconds (while their overhead line
  /// is active). Unchanged below kMinRows.
  Calibrated apply(double estimated_joules, double estimated_std, double estimated_seconds, double flops_per_step,
                   std::int64_t steps, std::int64_t epochs = 1, const std::optional<WorkMix>& mix = std::nullopt) const;

 private:
  void refit();
  void refit_seconds();

  std::vector<OutcomeRow> rows_;
  CalibrationSummary summary_;
  // The fitted correction: standardisation of the features, the training inputs and the dual
  // weights of the kernel ridge regression (empty while the correction is not active).
  std::vector<double> feature_mean_;
  std::vector<double> feature_scale_;
  std::vector<std::vector<double>> inputs_;
  std::vector<double> weights_;
  double lambda_ = 1.0;  ///< the ridge penalty leave-one-out chose
  std::size_t features_used_ = 0;  ///< the leading features the kernel reads (with the mix or not)
  std::vector<double> mean_mix_;   ///< the rows' mean WorkMix::shares(), for a job whose estimate has no layers
};

}  // namespace joule::estimator
