#pragma once
// Checking a knob setting placement chose, in the job's own first epochs (Zeus's just-in-time
// profiling, over the job's epoch reports instead of its iterations): after its warm-up epochs
// at the setting, one epoch at the setting and the next at the device's defaults are metered,
// and the policy's goal, judged on what the job itself measured, says which it keeps for the
// rest. A job too short to spare the epochs is not checked. Pure: the caller switches the
// settings when told and feeds the reports.

#include <optional>
#include <string>

#include "joule/schedulers/policy.hpp"
#include "joule/schedulers/step_projection.hpp"

namespace joule::schedulers {

/// What the job measured at the setting against the defaults, and what it kept.
struct SettingCheckResult {
  int setting_epoch = 0;      ///< the epoch metered at the setting
  int default_epoch = 0;      ///< the epoch metered at the defaults
  double energy_ratio = 1.0;  ///< joules per epoch at the setting / at the defaults
  double time_ratio = 1.0;    ///< seconds per epoch likewise
  bool kept = false;          ///< the setting serves the goal better within the allowed slowdown
  std::string why;            ///< "0.82× the joules, 1.21× the time: kept"
};

class SettingCheck {
 public:
  /// What the caller is to do after a report.
  enum class Step {
    none,         ///< nothing changes
    to_defaults,  ///< put the device's defaults in force (the next epoch is metered there)
    to_setting,   ///< set the chosen setting again: the check kept it
  };

  /// `max_slowdown`: the job's own, else the policy's (nullopt: none). `warmup_epochs`: epochs
  /// at the setting left unmetered first (at least 1: loading and warm-up).
  SettingCheck(KnobPolicy knobs, std::optional<double> max_slowdown, int warmup_epochs);

  /// A report of the job (its metered joules since it started, and when). Reports that skip
  /// epochs measure per epoch over what they span.
  Step on_report(const EpochReport& report);
  /// Set once the check decided (or decided not to check: a job with too few epochs left).
  const std::optional<SettingCheckResult>& result() const { return result_; }
  /// Whether the defaults are in force for the epoch being metered there.
  bool metering_defaults() const { return phase_ == Phase::at_defaults; }

 private:
  enum class Phase { warming, at_setting, at_defaults, done };
  KnobPolicy knobs_;
  std::optional<double> max_slowdown_;
  int warmup_epochs_;
  Phase phase_ = Phase::warming;
  std::optional<EpochReport> mark_;  // where the epoch being metered began
  double setting_joules_ = 0.0;      // per epoch at the setting
  double setting_seconds_ = 0.0;
  int setting_epoch_ = 0;
  std::optional<SettingCheckResult> result_;
};

}  // namespace joule::schedulers
