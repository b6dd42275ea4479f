#include "knob_check.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace joule::daemon {

namespace {

Error invalid(std::string message, std::string where) {
  return make_error(ErrorCode::invalid_argument, std::move(message), std::move(where));
}

}  // namespace

std::optional<Error> knob_problem(const Device& device, const schedulers::Knobs& knobs) {
  if (!device.node.empty())
    return invalid(fmt::format("{} is on another node: knobs are set on the coordinator's own devices only in this "
                               "version",
                               device.name),
                   "/knobs");
  const auto cpu_missing = [&](const char* field) {
    return invalid(fmt::format("{} has no CPU frequency knob ({})", device.name,
                               device.name == "cpu" ? device.knob_note : "CPU knobs are the cpu device's"),
                   std::string("/knobs/") + field);
  };
  if (knobs.cpu_max_frequency_mhz) {
    if (!device.cpu_frequency) return cpu_missing("cpu_max_frequency_mhz");
    const auto& knob = *device.cpu_frequency;
    if (*knobs.cpu_max_frequency_mhz < knob.min_mhz || *knobs.cpu_max_frequency_mhz > knob.max_mhz)
      return invalid(fmt::format("{:g} MHz is outside {}'s range, {:g}-{:g} MHz ({})", *knobs.cpu_max_frequency_mhz,
                                 device.name, knob.min_mhz, knob.max_mhz, knob.driver),
                     "/knobs/cpu_max_frequency_mhz");
  }
  if (knobs.cpu_energy_preference) {
    if (!device.cpu_frequency) return cpu_missing("cpu_energy_preference");
    const auto& offered = device.cpu_frequency->energy_preferences;
    if (offered.empty())
      return invalid(
          fmt::format("{}'s {} driver has no energy-performance preference", device.name, device.cpu_frequency->driver),
          "/knobs/cpu_energy_preference");
    if (std::find(offered.begin(), offered.end(), *knobs.cpu_energy_preference) == offered.end())
      return invalid(fmt::format("\"{}\" is not one of {}'s energy preferences ({})", *knobs.cpu_energy_preference,
                                 device.name, fmt::join(offered, ", ")),
                     "/knobs/cpu_energy_preference");
  }
  if (knobs.power_mode) {
    if (!device.power_modes)
      return invalid(fmt::format("{} has no power modes (a Jetson's nvpmodel sets them)", device.name),
                     "/knobs/power_mode");
    if (!device.power_modes->find(*knobs.power_mode)) {
      std::vector<std::string> modes;
      for (const auto& mode : device.power_modes->table.modes)
        modes.push_back(fmt::format("{} {}", mode.id, mode.name));
      return invalid(fmt::format("\"{}\" is not one of {}'s power modes ({})", *knobs.power_mode, device.name,
                                 fmt::join(modes, ", ")),
                     "/knobs/power_mode");
    }
  }
  if (knobs.gpu_max_frequency_mhz) {
    if (!device.gpu_frequency)
      return invalid(fmt::format("{} has no GPU clock limit ({})", device.name,
                                 device.knob_note.empty() ? "a Jetson GPU's devfreq is one" : device.knob_note),
                     "/knobs/gpu_max_frequency_mhz");
    const auto& knob = *device.gpu_frequency;
    if (*knobs.gpu_max_frequency_mhz < knob.min_mhz || *knobs.gpu_max_frequency_mhz > knob.max_mhz)
      return invalid(fmt::format("{:g} MHz is outside {}'s clock range, {:g}-{:g} MHz", *knobs.gpu_max_frequency_mhz,
                                 device.name, knob.min_mhz, knob.max_mhz),
                     "/knobs/gpu_max_frequency_mhz");
  }
  if (knobs.gpu_power_limit_watts) {
    if (!device.can_limit_gpu)
      return invalid(
          fmt::format("{} has no settable GPU power limit (an NVIDIA GPU metered by NVML has one)", device.name),
          "/knobs/gpu_power_limit_watts");
    if (*knobs.gpu_power_limit_watts < device.gpu_min_watts || *knobs.gpu_power_limit_watts > device.gpu_max_watts)
      return invalid(fmt::format("{:g} W is outside {}'s power limit range, {:g}-{:g} W", *knobs.gpu_power_limit_watts,
                                 device.name, device.gpu_min_watts, device.gpu_max_watts),
                     "/knobs/gpu_power_limit_watts");
  }
  return std::nullopt;
}

}  // namespace joule::daemon
