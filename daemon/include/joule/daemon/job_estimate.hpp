#pragma once
// A job's estimate on each device, typed: the estimate service's answer (EstimateRow: the
// model's estimate, corrected by finished jobs, with its caveats) and the figures the daemon
// decides with (DeviceEstimate: placement, the ledger, the feedback that teaches the models).
// JSON appears only at the edges: the stored form a job keeps in SQLite (and the API shows),
// written from the rows and read back after a restart.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "joule/common/energy_source.hpp"
#include "joule/estimator/device_energy_model.hpp"
#include "joule/estimator/outcome_calibration.hpp"
#include "joule/schedulers/placement.hpp"

namespace joule::daemon {

/// How finished jobs corrected a device's estimate (OutcomeService): what was done, and the
/// model's own figures kept beside the served ones.
struct EstimateCorrection {
  /// "kernel-ridge+conformal" (mean and spread corrected) or "conformal" (spread only).
  std::string method;
  std::size_t rows = 0;  ///< finished jobs it learnt from
  double mean_factor = 1.0;
  double sigma_scale = 1.0;
  std::string note;                   ///< why only the spread was calibrated, where it was
  estimator::Uncertain model_joules;  ///< the model's own ("raw_joules")
  /// The model's own seconds where the served ones include a learnt job overhead ("raw_seconds").
  std::optional<estimator::Uncertain> model_seconds;
  /// The job's cost outside its steps, part of the served joules and seconds.
  struct Overhead {
    double joules = 0.0;
    double seconds = 0.0;
    double per_job_joules = 0.0;
    double per_epoch_joules = 0.0;
    std::size_t learnt_from = 0;
  };
  std::optional<Overhead> overhead;
};

/// One device's answer to an estimate: the model's estimate, corrected where finished jobs taught
/// enough, its warnings carrying the device's caveats; or, with no estimate, why there is none.
struct EstimateRow {
  std::string device;
  std::optional<estimator::Estimate> estimate;  ///< set when the device had a model ("status": "ok")
  std::string detail;                           ///< why there is no estimate ("status": "no-model")
  std::optional<EstimateCorrection> correction;

  bool ok() const { return estimate.has_value(); }
};

/// What the daemon decides with, of one device's estimate.
struct DeviceEstimate {
  std::string device;
  /// Whether the device had a model for it ("status": "ok"); the figures below are set only then.
  bool ok = false;
  /// Of the joules: modelled, simulated, or a meter's once calibrated on one; nothing where the
  /// stored row named none the daemon knows.
  std::optional<EnergySource> source;
  /// The conditions the model was learnt under (its environment fingerprint); empty: unknown (a
  /// simulated device, or an estimate stored before estimates named them).
  std::string environment;
  double joules_mean = 0.0;
  double joules_std = 0.0;
  /// The model's own figure where the served one was corrected from finished jobs (raw_joules).
  double model_joules_mean = 0.0;
  double model_joules_std = 0.0;
  double seconds_mean = 0.0;
  /// The model's own seconds where the served ones include a learnt job overhead (raw_seconds).
  double model_seconds_mean = 0.0;
  std::optional<double> baseline_joules;  ///< the FLOPs baseline's figure, where it has one
  double flops_per_step = 0.0;            ///< summed over the layers
  std::int64_t steps = 0;
  std::int64_t epochs = 1;
  /// Where the step's estimated energy goes, by family of layers (from the row's layers; nothing
  /// where they were left out of the stored row).
  std::optional<estimator::WorkMix> mix;
  /// A digest of its caveats (the row's warnings: a thread count the model was not learnt at...),
  /// to tell that they changed without keeping their text with every queued job; 0: none.
  std::size_t warnings_digest = 0;
  /// What each of the device's knob settings would do to it (the row's `settings`): ratios to
  /// the figures above.
  struct Setting {
    estimator::KnobSetting setting;
    std::string basis;  ///< "measured" or "response"
    double joules_ratio = 1.0;
    double joules_log_std = 0.0;
    double seconds_ratio = 1.0;
    double seconds_log_std = 0.0;
    bool operator==(const Setting& other) const = default;
  };
  std::vector<Setting> settings;
  /// Where the job runs on several GPUs: the one-GPU figures its estimate was made from (the
  /// row's `data_parallel`).
  std::optional<estimator::DataParallelLine> data_parallel;

  /// What placement weighs it by.
  schedulers::Estimate placement() const { return {joules_mean, joules_std, seconds_mean}; }
  /// What placement may choose instead of the defaults: the figures above times each setting's
  /// ratios, the spreads of both.
  std::vector<schedulers::SettingOption> setting_options() const;
  /// The figures at `setting` (a job that ran there is compared with these); nothing where the
  /// estimate has no such setting.
  std::optional<DeviceEstimate> at(const estimator::KnobSetting& setting) const;
  /// The figures of `row`, each to the 6 significant digits a job keeps (stored_estimates): the
  /// same as read back from the stored form after a restart.
  static DeviceEstimate of(const EstimateRow& row);
  /// Whether two estimates decide the same (every figure and warning; the work mix follows the
  /// figures): a job whose estimate did not move is not stored again.
  bool same_figures(const DeviceEstimate& other) const;
};

/// The digest DeviceEstimate keeps of a row's warnings.
std::size_t digest_of_warnings(const std::vector<std::string>& warnings);

/// The figures of every row (DeviceEstimate::of).
std::vector<DeviceEstimate> figures_of(const std::vector<EstimateRow>& rows);

/// A row as POST /v1/estimate shows it and a job stores it (the estimator's to_json, with the
/// device, its status, and the correction's "raw_joules", "raw_seconds", "overhead" and
/// "calibration").
nlohmann::json estimate_row_json(const EstimateRow& row);
/// The same, with or without the per-layer breakdown.
nlohmann::json estimate_row_json(const EstimateRow& row, bool with_layers);
/// How many of a job's rows, the cheapest, keep their per-layer breakdown where it is stored.
inline constexpr std::size_t kDetailedRows = 8;
/// The rows as a job keeps them (stored with it in SQLite, shown by GET /v1/jobs/{id}; "" where
/// there are none): each row's JSON with every number to 6 significant digits, its summed
/// `flops_per_step`, and the per-layer breakdown only in the rows of the kDetailedRows cheapest
/// devices; the other rows have an empty `layers` and `layers_left_out` (POST /v1/estimate gives
/// them whole). The breakdowns left out are never written: at 1,500 devices they were most of a
/// submission's time, and megabytes of JSON before that.
std::string stored_estimates(const std::vector<EstimateRow>& rows);

/// An estimate's FLOPs per step, summed over its layers.
double flops_per_step(const estimator::Estimate& estimate);
/// An estimate's work mix, from its layers' models and joules per step (the model's own:
/// corrections scale the whole estimate).
std::optional<estimator::WorkMix> work_mix_of(const estimator::Estimate& estimate);

/// A stored row's FLOPs per step: its summed figure, else (rows stored before they kept one) the
/// sum over its layers.
double flops_per_step(const nlohmann::json& row);
/// A stored row's work mix, as work_mix_of(Estimate); nothing for a row without layers.
std::optional<estimator::WorkMix> work_mix_of(const nlohmann::json& row);

/// Reads stored rows (a JSON array of per-device rows) back into figures; rows without a device
/// are skipped, and anything but an array gives none.
std::vector<DeviceEstimate> read_estimates(const nlohmann::json& rows);
/// The same from the stored text ("" or text that does not parse: none).
std::vector<DeviceEstimate> read_estimates(const std::string& stored);
/// The estimate on `device` among `estimates`, or nullptr.
const DeviceEstimate* find_estimate(const std::vector<DeviceEstimate>& estimates, const std::string& device);
/// A job's estimate at the count of cores placement chose for it (`chosen_cores`, its row's;
/// 0: none chosen), from its estimate at `device_threads`: the same where it is that count or
/// none was chosen, the measured count's figures otherwise; nullopt where that count has none.
std::optional<DeviceEstimate> at_chosen_cores(const DeviceEstimate& estimate, int chosen_cores, int device_threads);

}  // namespace joule::daemon
