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

struct BatteryOptions {
  std::filesystem::path sys_root = "/sys";
  /// One supply ("BAT0"); empty: every `<sys>/class/power_supply/*` whose `type` is Battery
  /// (laptops with two batteries drain them one after the other: their decreases add up).
  std::string name;
  FileReader reader = read_sysfs_file;
  SecondsClock now_seconds = monotonic_seconds;
};

/// The `battery` meter: the node's consumption read from its batteries while it runs on them.
///
/// Per battery, the first of: `energy_now` (µWh; consumption = its decrease, 1 µWh = 3.6 mJ),
/// `power_now` (µW) integrated by the trapezoid rule, `voltage_now` (µV) × `current_now` (µA)
/// integrated (magnitudes: some drivers sign discharge negative).
/// Consumption is only measurable while discharging: read() fails (unavailable) while a
/// battery is `Charging`, or when none is `Discharging` (on external power: `Full`,
/// `Not charging`), instead of inventing a figure; the interval of a failed read is not counted.
class BatteryMeter final : public EnergyMeter, public BatteryGauge {
 public:
  /// Finds the batteries and how each is read; fails (unavailable) when there is none, or one
  /// has none of the three ways.
  static Result<std::unique_ptr<BatteryMeter>> open(BatteryOptions options = {});

  std::string_view source() const override { return "battery"; }
  /// Joules consumed since the first read() (which returns 0).
  Result<Joules> read() override;
  /// State of charge, percent (`capacity`; the mean over several batteries), for battery floors.
  Result<double> capacity_percent() const override;
  const BatteryGauge* battery_gauge() const override { return this; }
  /// "BAT0 energy_now".
  std::string description() const;

 private:
  enum class Mode { energy, power, voltage_current };
  struct Battery {
    std::string name;
    std::filesystem::path dir;
    Mode mode = Mode::energy;
    std::optional<std::uint64_t> last_energy_uwh;
  };
  BatteryMeter(BatteryOptions options, std::vector<Battery> batteries)
      : options_(std::move(options)), batteries_(std::move(batteries)) {}
  Status check_discharging();
  Result<double> power_watts(const Battery& battery) const;
  void restart();

  BatteryOptions options_;
  std::vector<Battery> batteries_;
  double energy_total_uwh_ = 0.0;
  PowerIntegrator integrator_;
};

}  // namespace joule::adapters
