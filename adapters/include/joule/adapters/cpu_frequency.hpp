#pragma once
// The CPU's frequency knob through cpufreq sysfs: what a node offers (CpuFrequencyKnob::discover,
// read-only) and a job's setting of it (CpuFrequencyLimit: every policy's scaling_max_freq
// capped, and the energy-performance preference where the driver has one), put back when the job
// lets go, after a jouled killed with -9 too (ControlJournal).
//
// Layout, as the kernel has it under /sys/devices/system/cpu/cpufreq/policy<N>/: cpuinfo_min_freq
// and cpuinfo_max_freq (the hardware's range, kHz), scaling_min_freq and scaling_max_freq (the
// limits in force, kHz), scaling_driver (intel_pstate, intel_cpufreq, amd-pstate, amd-pstate-epp,
// acpi-cpufreq, cppc_cpufreq, cpufreq-dt...), scaling_governor, affected_cpus; acpi-cpufreq and
// the table drivers list scaling_available_frequencies (a write is resolved down to one of them:
// it reads back as the table's frequency); intel_pstate (HWP) and amd-pstate-epp add
// energy_performance_preference and energy_performance_available_preferences.

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "joule/adapters/control_journal.hpp"
#include "joule/adapters/job_controls.hpp"
#include "joule/common/result.hpp"

namespace joule::adapters {

/// One cpufreq policy (a group of CPUs that share a clock).
struct CpuFrequencyPolicy {
  std::filesystem::path directory;  ///< .../cpufreq/policy0
  std::string cpus;                 ///< affected_cpus: "0 1"
  double min_mhz = 0;               ///< cpuinfo_min_freq
  double max_mhz = 0;               ///< cpuinfo_max_freq
  /// scaling_available_frequencies, ascending; empty where the driver sets any frequency.
  std::vector<double> available_mhz;
};

/// What the node's cpufreq lets jouled set.
struct CpuFrequencyKnob {
  std::filesystem::path directory;  ///< the cpufreq directory, /sys/devices/system/cpu/cpufreq
  std::string driver;               ///< scaling_driver of the first policy
  std::string governor;             ///< scaling_governor of the first policy
  std::vector<CpuFrequencyPolicy> policies;
  double min_mhz = 0;  ///< the lowest any policy allows
  double max_mhz = 0;  ///< the highest any policy allows
  /// energy_performance_available_preferences; empty where the driver has none.
  std::vector<std::string> energy_preferences;

  /// "intel_pstate (governor powersave), 2 policies, 400-4700 MHz, energy preferences default
  /// performance balance_performance balance_power power".
  std::string describe() const;

  /// Reads the policies under `directory`. unavailable, with the reason, where there is no
  /// cpufreq (most VMs and containers), a policy cannot be read, or scaling_max_freq is not
  /// writable by this process (jouled needs root, or write access granted by a udev rule).
  static Result<CpuFrequencyKnob> discover(const std::filesystem::path& directory = "/sys/devices/system/cpu/cpufreq",
                                           ControlFiles files = ControlFiles::system());
};

/// A job's CPU frequency setting. The limit is the node's, not a job's: it holds for every
/// process until restored, which is why a device runs one job with knobs at a time. Each file is
/// saved (in memory, and in the journal when there is one) before its first write; restore()
/// writes the saved bytes back, last written first. A write the kernel refuses, or one that reads
/// back as something else, is an error, and the caller restores: nothing stays half set.
class CpuFrequencyLimit final : public RestorableControl {
 public:
  explicit CpuFrequencyLimit(CpuFrequencyKnob knob, ControlJournal* journal = nullptr,
                             ControlFiles files = ControlFiles::system());
  ~CpuFrequencyLimit() override;
  CpuFrequencyLimit(const CpuFrequencyLimit&) = delete;
  CpuFrequencyLimit& operator=(const CpuFrequencyLimit&) = delete;

  /// Caps every policy at `mhz` (clamped into each policy's range; lowering scaling_min_freq
  /// first where it is above). invalid_argument outside [knob.min_mhz, knob.max_mhz]. Returns
  /// what is in force, read back: "policy0 1600 MHz, policy1 1600 MHz".
  Result<std::string> set_max_mhz(double mhz);
  /// Writes `preference` to every policy's energy_performance_preference. invalid_argument when
  /// the driver does not list it (or has none); the kernel refuses some with EBUSY (intel_pstate
  /// under the performance governor takes only "performance").
  Status set_energy_preference(const std::string& preference);

  const CpuFrequencyKnob& knob() const { return knob_; }
  std::string describe() const override;
  Status restore() override;

 private:
  /// Saves `file`'s bytes (once), writes `text`, reads it back into `*read_back`.
  Status write_saved(const std::filesystem::path& file, const std::string& text, std::string* read_back = nullptr);

  CpuFrequencyKnob knob_;
  ControlJournal* journal_;
  ControlFiles files_;
  std::vector<std::pair<std::filesystem::path, std::string>> originals_;  ///< in the order first written
};

}  // namespace joule::adapters
