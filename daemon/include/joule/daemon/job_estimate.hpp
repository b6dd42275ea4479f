#pragma once
// A job's estimate on one device, as the daemon decides with it: read once from the stored
// estimate (the estimator's JSON rows, which stay the form kept in SQLite and shown by the API),
// then passed around typed, to placement, the ledger and the feedback that teaches the models.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "joule/estimator/outcome_calibration.hpp"
#include "joule/schedulers/placement.hpp"

namespace joule::daemon {

struct DeviceEstimate {
  std::string device;
  /// Whether the device had a model for it ("status": "ok"); the figures below are set only then.
  bool ok = false;
  std::string source;  ///< of the joules: "modelled", "simulated", or a meter's once calibrated on one
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
  std::optional<double> baseline_joules;  ///< the FLOPs baseline's figure
  double flops_per_step = 0.0;            ///< summed over the layers
  std::int64_t steps = 0;
  std::int64_t epochs = 1;
  /// Where the step's estimated energy goes, by family of layers (from the row's layers; nothing
  /// where they were left out of the stored row).
  std::optional<estimator::WorkMix> mix;

  /// What placement weighs it by.
  schedulers::Estimate placement() const { return {joules_mean, joules_std, seconds_mean}; }
};

/// The rows as a job keeps them (stored, shown): every number to 6 significant digits, and the
/// per-layer breakdown only in the rows of the `detailed` cheapest devices; the other rows keep
/// their summed `flops_per_step`, an empty `layers` and `layers_left_out` (POST /v1/estimate gives
/// them whole). A job with 1,500 candidate devices kept megabytes of JSON before.
nlohmann::json compact_estimates(const nlohmann::json& rows, std::size_t detailed = 8);

/// A row's FLOPs per step: the summed figure of a compact row, else the sum over its layers.
double flops_per_step(const nlohmann::json& row);
/// A row's work mix, from its layers' models and joules per step (the model's own, "raw_" or
/// not: corrections scale the whole row); nothing for a row without layers.
std::optional<estimator::WorkMix> work_mix_of(const nlohmann::json& row);

/// Reads the estimator's rows (a JSON array of per-device rows); rows without a device are
/// skipped, and anything but an array gives none.
std::vector<DeviceEstimate> read_estimates(const nlohmann::json& rows);
/// The same from the stored text ("" or text that does not parse: none).
std::vector<DeviceEstimate> read_estimates(const std::string& stored);
/// The estimate on `device` among `estimates`, or nullptr.
const DeviceEstimate* find_estimate(const std::vector<DeviceEstimate>& estimates, const std::string& device);

}  // namespace joule::daemon
