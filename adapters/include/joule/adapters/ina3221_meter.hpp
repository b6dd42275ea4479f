#pragma once
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "joule/adapters/energy_meter.hpp"
#include "joule/adapters/meter_clocks.hpp"
#include "joule/adapters/sysfs.hpp"

namespace joule::adapters {

/// The module input rails, in preference order: what the `cpu` device of a Jetson meters.
inline const std::vector<std::string> kJetsonInputRails = {"VDD_IN", "POM_5V_IN"};
/// GPU rails (Orin's VDD_GPU_SOC includes the SoC: last resort). Xavier NX's VDD_CPU_GPU_CV
/// includes the CPU and is not a GPU rail.
inline const std::vector<std::string> kJetsonGpuRails = {"VDD_GPU", "POM_5V_GPU", "GPU", "VDD_GPU_SOC"};

struct Ina3221Options {
  std::filesystem::path sys_root = "/sys";
  /// Rail names in preference order; the first present is metered. A configured rail goes here
  /// alone. Rails overlap (VDD_IN includes the others), so they are never summed.
  std::vector<std::string> rails = kJetsonInputRails;
  FileReader reader = read_sysfs_file;
  SecondsClock now_seconds = monotonic_seconds;
};

/// The `ina3221` meter: one power rail of a Jetson's INA3221 monitors, integrated over time
/// (trapezoid; sample at >= 1 Hz), since the chip has no energy counter.
///
/// JetPack 5/6 (upstream hwmon `ina3221`, channels 1..3): hwmon directories found by their
/// `name` file (hwmonN numbers change across boots); `in<ch>_label` (rail, `NC` = not
/// connected), `in<ch>_input` (mV), `curr<ch>_input` (mA); P[mW] = mV × mA / 1000.
/// JetPack 4 (NVIDIA IIO `ina3221x`, channels 0..2):
/// `<sys>/bus/i2c/drivers/ina3221x/<bus>-<addr>/iio:device<N>/rail_name_<ch>`, `in_power<ch>_input` (mW).
class Ina3221Meter final : public EnergyMeter {
 public:
  /// Finds the rails and picks one; fails (unavailable) with no INA3221 or none of the rails.
  static Result<std::unique_ptr<Ina3221Meter>> open(Ina3221Options options = {});

  std::string_view source() const override { return "ina3221"; }
  /// Joules since the first read() (which returns 0).
  Result<Joules> read() override;
  /// The rail's power now.
  Result<Watts> read_power() const;

  /// The metered rail: "VDD_IN".
  const std::string& rail() const { return rail_.label; }
  /// "VDD_IN (hwmon ina3221 channel 1, <dir>)".
  std::string description() const;

 private:
  struct Rail {
    std::string label;
    bool hwmon = true;          ///< JetPack 5/6 hwmon, else JetPack 4 IIO
    std::filesystem::path dir;  ///< hwmonN or iio:deviceN
    int channel = 0;            ///< 1..3 (hwmon) or 0..2 (IIO)
  };
  Ina3221Meter(Ina3221Options options, Rail rail) : options_(std::move(options)), rail_(std::move(rail)) {}
  static std::vector<Rail> find_rails(const Ina3221Options& options);

  Ina3221Options options_;
  Rail rail_;
  PowerIntegrator integrator_;
};

}  // namespace joule::adapters
