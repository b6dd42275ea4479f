#pragma once
// Frequency limits as knobs, through the kernel's files: the CPU's (cpufreq) and a Jetson GPU's
// (devfreq). What a node offers is read at start (CpuFrequencyKnob::discover,
// DevfreqKnob::discover); a job's setting (CpuFrequencyLimit, DevfreqLimit) writes the caps,
// reads them back, and is put back when the job lets go, after a jouled killed with -9 too
// (ControlJournal), each file's bytes saved before its first write (SavedFileWrites).
//
// cpufreq, under /sys/devices/system/cpu/cpufreq/policy<N>/: cpuinfo_min_freq and
// cpuinfo_max_freq (the hardware's range, kHz), scaling_min_freq and scaling_max_freq (the
// limits in force, kHz), scaling_driver (intel_pstate, intel_cpufreq, amd-pstate, amd-pstate-epp,
// acpi-cpufreq, cppc_cpufreq, cpufreq-dt...), scaling_governor, affected_cpus; acpi-cpufreq and
// the table drivers list scaling_available_frequencies (a write is resolved down to one of them:
// it reads back as the table's frequency); intel_pstate (HWP) and amd-pstate-epp add
// energy_performance_preference and energy_performance_available_preferences.
//
// devfreq, under /sys/class/devfreq/<device>/ (a link to the device's devfreq directory):
// available_frequencies (Hz, the OPP table), min_freq and max_freq (the limits in force, Hz,
// resolved to the table on read), cur_freq, governor. A Jetson's GPU is the device named
// "<address>.gpu", ".ga10b" (Orin), ".gv11b" (Xavier), ".gp10b" (TX2) or ".gm20b" (Nano, TX1).

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "joule/adapters/control_journal.hpp"
#include "joule/adapters/job_controls.hpp"
#include "joule/common/result.hpp"

namespace joule::adapters {

/// Kernel files written for a job: each file's bytes are saved before its first write (and noted
/// in the journal when there is one), and restore() writes them back, last written first.
class SavedFileWrites {
 public:
  /// `write_hint` ends the message of a write refused for want of permission.
  SavedFileWrites(ControlJournal* journal, ControlFiles files, std::string write_hint);
  /// Saves `file` once, writes `text`, and returns what the file reads back (trimmed).
  Result<std::string> write(const std::filesystem::path& file, const std::string& text);
  /// Writes back every saved original; stops at the first refusal (kept for a later try, and
  /// in the journal for the next start). A file that is gone counts as restored.
  Status restore();
  const ControlFiles& files() const { return files_; }

 private:
  ControlJournal* journal_;
  ControlFiles files_;
  std::string write_hint_;
  std::vector<std::pair<std::filesystem::path, std::string>> originals_;  ///< in the order first written
};

/// Caps a frequency through `limit_file` at `target` (in the files' unit), lowering `floor_file`
/// first where it is above (older kernels refuse a maximum below the minimum). The read-back must
/// be `target` or, where the hardware has a table (`available`, ascending, same unit), the
/// highest entry not above it (its lowest where none is): conflict otherwise, since something
/// else holds the limit. Returns the limit in force.
Result<std::uint64_t> cap_frequency(SavedFileWrites& writes, const std::filesystem::path& floor_file,
                                    const std::filesystem::path& limit_file, std::uint64_t target,
                                    const std::vector<std::uint64_t>& available);

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
  CpuFrequencyKnob knob_;
  SavedFileWrites writes_;
};

/// A Jetson GPU's devfreq device.
struct DevfreqKnob {
  std::filesystem::path directory;  ///< /sys/class/devfreq/17000000.ga10b
  std::string name;                 ///< "17000000.ga10b"
  std::string governor;
  std::vector<std::uint64_t> available_hz;  ///< ascending; empty where it lists none
  double min_mhz = 0;                       ///< its lowest frequency (the table's, else min_freq)
  double max_mhz = 0;                       ///< its highest (the table's, else max_freq)

  /// "17000000.ga10b (governor nvhost_podgov), 306-1020 MHz, 9 frequencies".
  std::string describe() const;
  /// Finds the GPU among `directory`'s devfreq devices (by the names above). unavailable, with
  /// the reason, where there is none (not a Jetson) or its max_freq is not writable.
  static Result<DevfreqKnob> discover_gpu(const std::filesystem::path& directory = "/sys/class/devfreq",
                                          ControlFiles files = ControlFiles::system());
};

/// A job's cap on a Jetson GPU's clock: its devfreq max_freq (min_freq lowered first where it is
/// above), read back, saved and restored as CpuFrequencyLimit does.
class DevfreqLimit final : public RestorableControl {
 public:
  explicit DevfreqLimit(DevfreqKnob knob, ControlJournal* journal = nullptr,
                        ControlFiles files = ControlFiles::system());
  ~DevfreqLimit() override;
  DevfreqLimit(const DevfreqLimit&) = delete;
  DevfreqLimit& operator=(const DevfreqLimit&) = delete;

  /// invalid_argument outside [knob.min_mhz, knob.max_mhz]. Returns "17000000.ga10b 612 MHz".
  Result<std::string> set_max_mhz(double mhz);

  std::string describe() const override;
  Status restore() override;

 private:
  DevfreqKnob knob_;
  SavedFileWrites writes_;
};

}  // namespace joule::adapters
