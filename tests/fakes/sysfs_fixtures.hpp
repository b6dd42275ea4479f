#pragma once
// Fixture sysfs trees laid out as the kernel does (class entries are symlinks to the device
// directories), and a file reader that denies access the way the kernel does for non-root.

#include <cstdint>
#include <filesystem>
#include <string>

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

/// Reads real files, except that files named `denied` fail as EACCES does for non-root.
inline adapters::FileReader denying_reader(std::string denied) {
  return [denied](const std::filesystem::path& path) -> Result<std::string> {
    if (path.filename() == denied)
      return make_error(ErrorCode::permission_denied, path.string() + ": Permission denied");
    return adapters::read_sysfs_file(path);
  };
}

}  // namespace joule::testing
