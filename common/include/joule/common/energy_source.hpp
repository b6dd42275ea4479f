#pragma once
// Where a joule figure comes from, and whether it is a measurement: the label every joule in
// Joule carries. Stored and sent as its text ("rapl", "modelled"...).

#include <array>
#include <optional>
#include <string_view>

namespace joule {

/// `slurm`: a Slurm job's energy as the cluster's acct_gather_energy plugin metered it (sacct
/// ConsumedEnergyRaw): its nodes' meters over its run.
enum class EnergySource { rapl, nvml, ina3221, hwmon, battery, slurm, modelled, simulated };

constexpr std::array<std::string_view, 8> kEnergySourceNames = {"rapl",    "nvml",  "ina3221",  "hwmon",
                                                                "battery", "slurm", "modelled", "simulated"};

constexpr std::string_view to_string(EnergySource source) { return kEnergySourceNames[static_cast<int>(source)]; }

constexpr std::optional<EnergySource> energy_source_from_string(std::string_view text) {
  for (std::size_t i = 0; i < kEnergySourceNames.size(); ++i)
    if (kEnergySourceNames[i] == text) return static_cast<EnergySource>(i);
  return std::nullopt;
}

/// Read off a meter on the hardware, as opposed to computed from a model or a simulation.
constexpr bool is_measurement(EnergySource source) {
  return source != EnergySource::modelled && source != EnergySource::simulated;
}

/// For a label stored or received as text: an empty or unknown label is not a measurement
/// (a figure is shown as measured only when its source says so).
constexpr bool is_measurement(std::string_view source) {
  const auto known = energy_source_from_string(source);
  return known && is_measurement(*known);
}

}  // namespace joule
