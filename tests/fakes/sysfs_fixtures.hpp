#pragma once
// Fixture sysfs trees laid out as the kernel does (class entries are symlinks to the device
// directories), and a file reader that denies access the way the kernel does for non-root.

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "joule/adapters/frequency_limits.hpp"
#include "joule/adapters/sysfs.hpp"
#include "temp_dir.hpp"

namespace joule::testing {

/// `max_energy_range_uj` of a typical Intel package (≈ 2^32 × 61.04 µJ) and DRAM domain.
inline constexpr std::uint64_t kIntelPackageMaxUj = 262143328850ULL;
inline constexpr std::uint64_t kIntelDramMaxUj = 65712999613ULL;

/// A powercap zone: `entry` is "intel-rapl:0", "intel-rapl:0:2" or "intel-rapl-mmio:0". The real
/// directory is `sys/devices/virtual/powercap/<type>/<zone>[/<sub-zone>]`; `sys/class/powercap/<entry>`
/// links to it. Returns the class entry path.
inline std::filesystem::path write_rapl_zone(const TempDir& root, const std::string& entry, const std::string& name,
                                             std::uint64_t energy_uj, std::uint64_t max_uj = kIntelPackageMaxUj) {
  const std::string type = entry.substr(0, entry.find(':'));
  const auto second_colon = entry.find(':', entry.find(':') + 1);
  std::string relative = "devices/virtual/powercap/" + type + "/";
  if (second_colon != std::string::npos) relative += entry.substr(0, second_colon) + "/";
  relative += entry;
  const std::string dir = "sys/" + relative + "/";
  root.write(dir + "name", name + "\n");
  root.write(dir + "energy_uj", std::to_string(energy_uj) + "\n");
  root.write(dir + "max_energy_range_uj", std::to_string(max_uj) + "\n");
  root.write(dir + "enabled", "1\n");
  root.write(dir + "constraint_0_name", "long_term\n");
  root.write(dir + "constraint_0_power_limit_uw", "65000000\n");
  std::filesystem::create_directories(root / "sys/class/powercap");
  const auto link = root / ("sys/class/powercap/" + entry);
  if (!std::filesystem::is_symlink(link)) std::filesystem::create_directory_symlink("../../" + relative, link);
  return link;
}

/// Sets a zone's counter, written through its class symlink.
inline void set_rapl_energy(const TempDir& root, const std::string& entry, std::uint64_t energy_uj) {
  root.write("sys/class/powercap/" + entry + "/energy_uj", std::to_string(energy_uj) + "\n");
}

inline void write_boot_id(const TempDir& root, const std::string& id) {
  root.write("proc/sys/kernel/random/boot_id", id + "\n");
}

/// A JetPack 5/6 hwmon `ina3221` at `sys/bus/i2c/drivers/ina3221/<i2c>/hwmon/hwmon<N>`, linked from
/// `sys/class/hwmon/hwmon<N>`. Returns the device directory (for writing readings).
inline std::filesystem::path write_ina3221_hwmon(const TempDir& root, const std::string& i2c, int hwmon_number) {
  const std::string relative = "bus/i2c/drivers/ina3221/" + i2c + "/hwmon/hwmon" + std::to_string(hwmon_number);
  root.write("sys/" + relative + "/name", "ina3221\n");
  root.write("sys/" + relative + "/update_interval", "1100\n");
  std::filesystem::create_directories(root / "sys/class/hwmon");
  std::filesystem::create_directory_symlink("../../" + relative,
                                            root / ("sys/class/hwmon/hwmon" + std::to_string(hwmon_number)));
  return root / ("sys/" + relative);
}

/// One cpufreq policy as its driver lays it out: `sys/devices/system/cpu/cpufreq/policy<N>/` with
/// the limits in force at the hardware's range, linked from `sys/devices/system/cpu/cpu<M>/cpufreq`
/// for each of its CPUs.
struct CpufreqPolicy {
  int number = 0;
  std::vector<int> cpus = {0};
  std::string driver = "intel_pstate";
  std::string governor = "powersave";
  std::uint64_t min_khz = 400000;
  std::uint64_t max_khz = 4700000;
  /// scaling_available_frequencies as the kernel lists it (descending); empty: none (intel_pstate).
  std::vector<std::uint64_t> available_khz;
  /// energy_performance_preference's value; empty: the driver has no EPP.
  std::string energy_preference;
};

/// The policy of each preset: Intel with HWP (intel_pstate active), AMD with amd-pstate in EPP
/// mode, and acpi-cpufreq's P-state table (older Intel and AMD, and most VMs that have cpufreq).
inline CpufreqPolicy intel_pstate_policy(int number) {
  return {number, {number}, "intel_pstate", "powersave", 400000, 4700000, {}, "balance_performance"};
}
inline CpufreqPolicy amd_pstate_epp_policy(int number) {
  return {number, {number}, "amd-pstate-epp", "powersave", 400000, 5132000, {}, "balance_performance"};
}
inline CpufreqPolicy acpi_cpufreq_policy(int number) {
  return {number, {number}, "acpi-cpufreq", "schedutil", 1200000, 3000000, {3000000, 2400000, 1800000, 1200000}, ""};
}

/// Writes the policy; returns its directory.
inline std::filesystem::path write_cpufreq_policy(const TempDir& root, const CpufreqPolicy& policy) {
  const std::string dir = "sys/devices/system/cpu/cpufreq/policy" + std::to_string(policy.number) + "/";
  std::string cpus;
  for (const int cpu : policy.cpus) cpus += (cpus.empty() ? "" : " ") + std::to_string(cpu);
  root.write(dir + "affected_cpus", cpus + "\n");
  root.write(dir + "related_cpus", cpus + "\n");
  root.write(dir + "cpuinfo_min_freq", std::to_string(policy.min_khz) + "\n");
  root.write(dir + "cpuinfo_max_freq", std::to_string(policy.max_khz) + "\n");
  root.write(dir + "cpuinfo_transition_latency", "0\n");
  root.write(dir + "scaling_min_freq", std::to_string(policy.min_khz) + "\n");
  root.write(dir + "scaling_max_freq", std::to_string(policy.max_khz) + "\n");
  root.write(dir + "scaling_cur_freq", std::to_string(policy.max_khz) + "\n");
  root.write(dir + "scaling_driver", policy.driver + "\n");
  root.write(dir + "scaling_governor", policy.governor + "\n");
  root.write(dir + "scaling_available_governors",
             policy.available_khz.empty() ? "performance powersave\n"
                                          : "conservative ondemand userspace powersave performance schedutil\n");
  if (!policy.available_khz.empty()) {
    std::string table;
    for (const auto khz : policy.available_khz) table += std::to_string(khz) + " ";
    root.write(dir + "scaling_available_frequencies", table + "\n");
  }
  if (!policy.energy_preference.empty()) {
    root.write(dir + "energy_performance_preference", policy.energy_preference + "\n");
    root.write(dir + "energy_performance_available_preferences",
               "default performance balance_performance balance_power power \n");
  }
  for (const int cpu : policy.cpus) {
    const auto link = root / ("sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/cpufreq");
    std::filesystem::create_directories(link.parent_path());
    if (!std::filesystem::is_symlink(link))
      std::filesystem::create_directory_symlink("../cpufreq/policy" + std::to_string(policy.number), link);
  }
  return root / dir;
}

/// A Jetson GPU's devfreq device as JetPack lays it out: the device's directory
/// `sys/devices/platform/<name>/devfreq/<name>/` with `available_frequencies` (Hz, ascending),
/// `min_freq`, `max_freq` (the table's ends) and `governor`, linked from `sys/class/devfreq/<name>`.
/// Returns the class entry.
inline std::filesystem::path write_devfreq_gpu(const TempDir& root, const std::string& name,
                                               const std::vector<std::uint64_t>& available_hz) {
  const std::string relative = "devices/platform/" + name + "/devfreq/" + name;
  std::string table;
  for (const auto hz : available_hz) table += std::to_string(hz) + " ";
  root.write("sys/" + relative + "/available_frequencies", table + "\n");
  root.write("sys/" + relative + "/min_freq", std::to_string(available_hz.front()) + "\n");
  root.write("sys/" + relative + "/max_freq", std::to_string(available_hz.back()) + "\n");
  root.write("sys/" + relative + "/cur_freq", std::to_string(available_hz.back()) + "\n");
  root.write("sys/" + relative + "/governor", "nvhost_podgov\n");
  std::filesystem::create_directories(root / "sys/class/devfreq");
  const auto link = root / ("sys/class/devfreq/" + name);
  std::filesystem::create_directory_symlink("../../" + relative, link);
  return link;
}

/// Reads real files, except that files named `denied` fail as EACCES does for non-root.
inline adapters::FileReader denying_reader(std::string denied) {
  return [denied](const std::filesystem::path& path) -> Result<std::string> {
    if (path.filename() == denied)
      return make_error(ErrorCode::permission_denied, path.string() + ": Permission denied");
    return adapters::read_sysfs_file(path);
  };
}

/// An intel_pstate CPU (one policy, 400-4700 MHz) written under `root`, as jouled discovers its
/// frequency knob; the tree's cpufreq directory is root / "sys/devices/system/cpu/cpufreq".
inline adapters::CpuFrequencyKnob intel_pstate_knob(const TempDir& root) {
  write_cpufreq_policy(root, intel_pstate_policy(0));
  auto knob = adapters::CpuFrequencyKnob::discover(root / "sys/devices/system/cpu/cpufreq");
  if (!knob) throw std::runtime_error(knob.error().message);
  return *knob;
}

}  // namespace joule::testing
