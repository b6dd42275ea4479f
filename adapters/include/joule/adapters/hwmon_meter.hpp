#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "joule/adapters/energy_meter.hpp"
#include "joule/adapters/meter_clocks.hpp"
#include "joule/adapters/sysfs.hpp"

namespace joule::adapters {

struct HwmonOptions {
  std::filesystem::path sys_root = "/sys";
  /// The hwmon device's `name` ("amd_energy"); empty: the first device (by hwmonN) that has an
  /// energy or power channel. hwmonN numbers change across boots: name the device to be sure.
  std::string device_name;
  /// The channel's label ("Esocket0"); empty: see HwmonMeter.
  std::string label;
  FileReader reader = read_sysfs_file;
  SecondsClock now_seconds = monotonic_seconds;
};

/// The generic `hwmon` meter (forced only, never chosen by "auto"): `energy<N>_input` (µJ,
/// cumulative; a decrease is a counter restart, counted from the restart) or, when the device
/// has no energy channel, `power<N>_input` (µW) integrated by the trapezoid rule.
/// Without a configured label it meters the `Esocket*` channels summed (the out-of-tree
/// amd_energy driver: per-socket counters are disjoint, `Ecore*` ones lie inside them), else
/// the lowest-numbered energy channel, else the lowest-numbered power channel.
class HwmonMeter final : public EnergyMeter {
 public:
  static Result<std::unique_ptr<HwmonMeter>> open(HwmonOptions options = {});

  std::string_view source() const override { return "hwmon"; }
  /// Joules since the first read() (which returns 0).
  Result<Joules> read() override;
  /// "amd_energy energy2_input (Esocket0) + ... in <dir>".
  std::string description() const;

 private:
  struct Channel {
    std::filesystem::path input;  ///< energyN_input or powerN_input
    std::string label;
    std::optional<std::uint64_t> last_uj;
  };
  HwmonMeter(HwmonOptions options, std::string name, bool energy, std::vector<Channel> channels)
      : options_(std::move(options)), name_(std::move(name)), energy_(energy), channels_(std::move(channels)) {}

  HwmonOptions options_;
  std::string name_;
  bool energy_;
  std::vector<Channel> channels_;
  double total_uj_ = 0.0;
  PowerIntegrator integrator_;
};

}  // namespace joule::adapters
