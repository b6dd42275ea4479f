#pragma once
// A device's knobs for one run (a job at its settings, or a probe measuring a network at one):
// the settings jouled may choose there, and setting them and putting them back.
//
// The power mode goes first, since nvpmodel rewrites the CPU and GPU limits the other knobs then
// narrow, and comes back last. Each original is saved (and journalled, for a kill -9) before its
// first write; a knob the hardware refuses, or that reads back different, is an error and what
// was set is put back: nothing stays half set.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "joule/adapters/control_journal.hpp"
#include "joule/adapters/frequency_limits.hpp"
#include "joule/adapters/jetson_power_mode.hpp"
#include "joule/adapters/job_controls.hpp"
#include "joule/common/result.hpp"
#include "joule/daemon/device_table.hpp"
#include "joule/estimator/knob_response.hpp"
#include "joule/schedulers/job.hpp"

namespace joule::daemon {

/// The settings placement may choose for a job on `device` (policy knobs.goal), and which
/// probing measures the workload's networks at: a few caps below the top of each knob the
/// device offers (a GPU's power limit at 85, 70 and 55 % of its highest; a CPU's or a Jetson
/// GPU's clock at 80, 60 and 45 %, a table driver's frequency at or below that). None on an
/// agent's device, and no power modes: a mode is the whole module's, so choosing one for one
/// device's job would change the other's.
std::vector<estimator::KnobSetting> knob_choices(const Device& device);
/// A setting as a job's knobs.
schedulers::Knobs knobs_of(const estimator::KnobSetting& setting);
/// A job's knobs as one setting a device may have measured networks at (one power limit or
/// clock cap, nothing else); nothing for other combinations.
std::optional<estimator::KnobSetting> setting_of(const schedulers::Knobs& knobs);

/// Whether each CPU has a cpufreq policy of its own (affected_cpus names one CPU), as
/// intel_pstate and amd-pstate lay them out: a cap on a job's own cores then reaches no other
/// job's. A table driver's policy for a whole cluster (cpufreq-dt on a Pi) does not.
bool clocks_per_cpu(const adapters::CpuFrequencyKnob& knob);
/// `knob` narrowed to the policies that clock `cpus` (a job's own cores), its range the device's. An
/// error names the policy where one also clocks a CPU not among them, or a CPU that has none.
Result<adapters::CpuFrequencyKnob> clocks_of_cpus(const adapters::CpuFrequencyKnob& knob, const std::vector<int>& cpus);

/// A control of `device`'s GPU power limit (its meter is NVML on a cuda:N device), noting its
/// original in `journal` before the first write; null where the device has none.
std::unique_ptr<adapters::GpuPowerLimit> gpu_power_limit_of(const Device& device, adapters::ControlJournal* journal);

class DeviceKnobs {
 public:
  /// `journal`: where originals are noted first (null: none); `run_tool` runs nvpmodel.
  DeviceKnobs(adapters::ControlJournal* journal, adapters::CommandRunner run_tool);
  DeviceKnobs(const DeviceKnobs&) = delete;
  DeviceKnobs& operator=(const DeviceKnobs&) = delete;

  /// Sets `knobs` on `device`. The GPU power limit goes through `gpu_limit()` (the caller's
  /// control, shared with a power cap; null: the device has none) unless `skip_gpu_limit` (a cap
  /// holds it). CPU knobs go to the policies of `cpus` alone where given (a job on cores of its
  /// own; clocks_of_cpus), to every policy otherwise. A refusal puts back what was set and is the
  /// error. Returns what is in force, a line per knob ("cpu_max_frequency_mhz 1600 (policy0 1600
  /// MHz)").
  Result<std::vector<std::string>> apply(const schedulers::Knobs& knobs, const Device& device,
                                         const std::function<adapters::GpuPowerLimit*()>& gpu_limit,
                                         bool skip_gpu_limit = false, const std::vector<int>& cpus = {});
  /// Puts back what apply set (and `gpu_limit`, where given), the power mode last. Returns a
  /// message per control that could not be (it stays journalled for the next start).
  std::vector<std::string> restore(adapters::RestorableControl* gpu_limit = nullptr);

 private:
  adapters::ControlJournal* journal_;
  adapters::CommandRunner run_tool_;
  std::unique_ptr<adapters::CpuFrequencyLimit> cpu_frequency_;
  std::unique_ptr<adapters::DevfreqLimit> gpu_frequency_;
  std::unique_ptr<adapters::JetsonPowerMode> power_mode_;
};

}  // namespace joule::daemon
