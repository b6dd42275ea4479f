#pragma once
// How a device's knob setting changes a job's time and energy, learnt from networks measured at
// the setting and at the defaults: per setting, the log of each ratio is fitted linearly (a
// little ridge) in what decides it. For a clock (a frequency cap, a power mode): a network's
// log FLOPs per step, log arithmetic intensity (FLOPs per byte moved: compute-bound networks
// slow, memory- and launch-bound ones barely do) and log power at the defaults. For a power
// limit, only networks drawing more than the limit change, by how far over it they draw
// (h = ln(watts / limit), 0 below it) and h × log intensity, so a network under the limit is
// predicted unchanged (and none faster). Pure: the caller measures; this fits and predicts.

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "joule/common/result.hpp"
#include "joule/estimator/layer_analysis.hpp"

namespace joule::estimator {

/// A setting of one of a device's knobs that a job may run at instead of the device's defaults.
struct KnobSetting {
  std::string knob;    ///< the job's knob field: gpu_power_limit_watts, cpu_max_frequency_mhz, gpu_max_frequency_mhz
  double value = 0.0;  ///< watts or MHz
  std::string label;   ///< "90 W", "1600 MHz"
  /// What measurements at the setting are found by: "cpu_max_frequency_mhz=1600".
  std::string key() const;
  bool is_power_limit() const { return knob == "gpu_power_limit_watts"; }
  bool operator==(const KnobSetting& other) const { return knob == other.knob && value == other.value; }
};
nlohmann::json to_json(const KnobSetting& setting);
/// Errors name the JSON pointer of the bad field (under `pointer`).
Result<KnobSetting> knob_setting_from_json(const nlohmann::json& json, const std::string& pointer = "");

/// What the fit reads of a network.
struct NetworkFeatures {
  double flops = 0.0;      ///< per training step (forward + backward)
  double intensity = 0.0;  ///< FLOPs per byte of activations and parameters moved
  double watts = 0.0;      ///< average power at the defaults (measured, or the estimate's joules / seconds)
};
/// FLOPs and intensity; `watts` is the caller's to fill in.
NetworkFeatures network_features(const std::vector<AnalyzedLayer>& layers);

/// One network measured at a setting and at the defaults.
struct KnobSample {
  NetworkFeatures features;
  double time_ratio = 1.0;    ///< seconds per step at the setting / at the defaults
  double energy_ratio = 1.0;  ///< joules per step likewise
};

/// A predicted ratio with its spread (log space: 0.05 is about ±5 %): the fit's residuals,
/// widened by how far the network lies from those measured (the prediction interval of least
/// squares, σ·√(1 + leverage)), so a job unlike every probe is not predicted with confidence.
struct RatioPrediction {
  double time_ratio = 1.0;
  double time_log_std = 0.0;
  double energy_ratio = 1.0;
  double energy_log_std = 0.0;
};

class KnobResponse {
 public:
  /// Needs at least 4 samples with positive ratios. `power_limit_watts`: the setting is a
  /// power limit of that many watts (see above).
  static Result<KnobResponse> fit(const std::vector<KnobSample>& samples,
                                  std::optional<double> power_limit_watts = std::nullopt);
  RatioPrediction predict(const NetworkFeatures& features) const;
  std::size_t samples() const { return samples_; }

 private:
  // y = c · row(features), for log time and log energy.
  std::optional<double> power_limit_watts_;
  double time_[4] = {0, 0, 0, 0};
  double energy_[4] = {0, 0, 0, 0};
  double inverse_gram_[4][4] = {};  // (XᵀX + ridge)⁻¹, for the leverage of a prediction
  double time_std_ = 0.0;
  double energy_std_ = 0.0;
  std::size_t samples_ = 0;
};

}  // namespace joule::estimator
