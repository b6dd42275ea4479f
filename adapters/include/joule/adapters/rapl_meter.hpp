#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "joule/adapters/energy_meter.hpp"
#include "joule/adapters/sysfs.hpp"

namespace joule::adapters {

/// Where the RAPL meter reads from: fixture trees and a fake reader in tests.
struct RaplOptions {
  std::filesystem::path sys_root = "/sys";
  std::filesystem::path proc_root = "/proc";
  FileReader reader = read_sysfs_file;
};

/// The `rapl` meter: Intel RAPL (and AMD Fam17h/19h, same driver) through powercap,
/// `<sys>/class/powercap/intel-rapl:N[:M]`.
///
/// Zones counted: every package (`intel-rapl:N`, name `package-N`) plus its `dram` sub-zone
/// when there is one (DRAM is outside the package domain); `core`/`uncore` sub-zones are inside
/// the package and not added. `psys` (the whole SoC) is used only when there is no package zone.
/// `intel-rapl-mmio:*` zones duplicate package-0 and are never counted.
///
/// `energy_uj` (µJ) wraps at `max_energy_range_uj`: delta = cur >= prev ? cur − prev
/// : cur + (max − prev). Sample at least every 30 s (AMD wraps in ~4 min at 250 W).
/// A change of `<proc>/sys/kernel/random/boot_id` means the counters restarted: the interval
/// then counts the energy since the restart (a lower bound) instead of a bogus wrap.
/// The meter never writes (writing 0 to energy_uj resets it).
///
/// `energy_uj` is root-only since CVE-2020-8694: EACCES is a permission_denied error whose
/// message says how to grant read access.
class RaplMeter final : public EnergyMeter {
 public:
  /// Finds the zones and reads their ranges (world-readable); `energy_uj` is first read by
  /// read(). Fails (unavailable) when there is no powercap RAPL zone.
  static Result<std::unique_ptr<RaplMeter>> open(RaplOptions options = {});

  std::string_view source() const override { return "rapl"; }
  /// Joules since the first read() (which returns 0).
  Result<Joules> read() override;

  /// "intel-rapl:0 package-0 + intel-rapl:0:0 dram; intel-rapl:1 package-1".
  std::string description() const;
  /// The boot the baselines belong to ("" when `boot_id` is unreadable): persisted baselines
  /// must be keyed with it.
  const std::string& boot_id() const { return boot_id_; }

 private:
  struct Zone {
    std::string entry;  ///< "intel-rapl:0:0"
    std::string name;   ///< "dram"
    std::filesystem::path energy_uj_path;
    std::uint64_t max_energy_range_uj = 0;
    std::optional<std::uint64_t> last_uj;
  };
  explicit RaplMeter(RaplOptions options) : options_(std::move(options)) {}
  Result<std::uint64_t> read_energy_uj(const Zone& zone) const;
  std::string read_boot_id() const;

  RaplOptions options_;
  std::vector<Zone> zones_;
  std::string boot_id_;
  double total_uj_ = 0.0;
};

/// The message for an unreadable energy_uj: what failed and how to grant read access.
std::string rapl_permission_hint(const std::filesystem::path& energy_uj_path);

}  // namespace joule::adapters
