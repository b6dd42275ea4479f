#include "joule/schedulers/setting_check.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace joule::schedulers {

SettingCheck::SettingCheck(KnobPolicy knobs, std::optional<double> max_slowdown, int warmup_epochs)
    : knobs_(knobs), max_slowdown_(max_slowdown), warmup_epochs_(std::max(1, warmup_epochs)) {}

SettingCheck::Step SettingCheck::on_report(const EpochReport& report) {
  auto per_epoch = [&](double& joules, double& seconds) {
    const int epochs = std::max(1, report.epoch - mark_->epoch);
    joules = (report.joules - mark_->joules) / epochs;
    seconds = static_cast<double>(report.at - mark_->at) / 1000.0 / epochs;
  };
  switch (phase_) {
    case Phase::warming:
      if (report.epoch < warmup_epochs_) return Step::none;
      // Two epochs to meter and at least one left to gain from what they say.
      if (report.epochs - report.epoch < 3) {
        phase_ = Phase::done;
        result_ = SettingCheckResult{0,
                                     0,
                                     1.0,
                                     1.0,
                                     true,
                                     fmt::format("not checked: {} of its {} epochs were left after its warm-up",
                                                 report.epochs - report.epoch, report.epochs)};
        return Step::none;
      }
      mark_ = report;
      phase_ = Phase::at_setting;
      return Step::none;
    case Phase::at_setting:
      per_epoch(setting_joules_, setting_seconds_);
      setting_epoch_ = report.epoch;
      mark_ = report;
      phase_ = Phase::at_defaults;
      return Step::to_defaults;
    case Phase::at_defaults: {
      double joules = 0.0, seconds = 0.0;
      per_epoch(joules, seconds);
      phase_ = Phase::done;
      SettingCheckResult result;
      result.setting_epoch = setting_epoch_;
      result.default_epoch = report.epoch;
      if (!(joules > 0.0) || !(seconds > 0.0) || !(setting_joules_ > 0.0) || !(setting_seconds_ > 0.0)) {
        result.why = "the epochs read no energy or time: the defaults kept";
        result_ = result;
        return Step::none;
      }
      result.energy_ratio = setting_joules_ / joules;
      result.time_ratio = setting_seconds_ / seconds;
      double cost = result.energy_ratio;
      if (knobs_.goal == KnobGoal::zeus)
        cost = knobs_.eta * result.energy_ratio + (1.0 - knobs_.eta) * result.time_ratio;
      if (knobs_.goal == KnobGoal::min_edp) cost = result.energy_ratio * result.time_ratio;
      const bool too_slow = max_slowdown_ && result.time_ratio - 1.0 > *max_slowdown_;
      result.kept = cost < 1.0 && !too_slow;
      result.why = fmt::format(
          "{:.2f}× the joules and {:.2f}× the time of the defaults: {}", result.energy_ratio, result.time_ratio,
          result.kept ? "the setting kept"
          : too_slow  ? fmt::format("slower than the {:.0f} % allowed, the defaults kept", 100.0 * *max_slowdown_)
                      : "no better for the goal, the defaults kept");
      result_ = result;
      return result.kept ? Step::to_setting : Step::none;
    }
    case Phase::done:
      return Step::none;
  }
  return Step::none;
}

}  // namespace joule::schedulers
