#include "joule/adapters/ina3221_meter.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace joule::adapters {

std::vector<Ina3221Meter::Rail> Ina3221Meter::find_rails(const Ina3221Options& options) {
  std::vector<Rail> rails;
  for (const auto& dir : sorted_entries(options.sys_root / "class" / "hwmon")) {
    auto name = read_trimmed(options.reader, dir / "name");
    if (!name || *name != "ina3221") continue;
    for (int ch = 1; ch <= 3; ++ch) {
      auto label = read_trimmed(options.reader, dir / fmt::format("in{}_label", ch));
      if (label && !label->empty() && *label != "NC") rails.push_back(Rail{*label, true, dir, ch});
    }
  }
  for (const auto& device : sorted_entries(options.sys_root / "bus" / "i2c" / "drivers" / "ina3221x")) {
    for (const auto& dir : sorted_entries(device)) {
      if (dir.filename().string().rfind("iio:device", 0) != 0) continue;
      for (int ch = 0; ch <= 2; ++ch) {
        auto label = read_trimmed(options.reader, dir / fmt::format("rail_name_{}", ch));
        if (label && !label->empty() && *label != "NC") rails.push_back(Rail{*label, false, dir, ch});
      }
    }
  }
  return rails;
}

Result<std::unique_ptr<Ina3221Meter>> Ina3221Meter::open(Ina3221Options options) {
  const std::vector<Rail> rails = find_rails(options);
  if (rails.empty())
    return make_error(ErrorCode::unavailable,
                      fmt::format("no INA3221: no hwmon named ina3221 under {} and no ina3221x IIO device under {}",
                                  (options.sys_root / "class" / "hwmon").string(),
                                  (options.sys_root / "bus" / "i2c" / "drivers" / "ina3221x").string()));
  for (const auto& wanted : options.rails) {
    const auto found = std::find_if(rails.begin(), rails.end(), [&](const Rail& r) { return r.label == wanted; });
    if (found != rails.end()) {
      Rail rail = *found;
      return std::unique_ptr<Ina3221Meter>(new Ina3221Meter(std::move(options), std::move(rail)));
    }
  }
  std::vector<std::string> labels;
  for (const auto& rail : rails) labels.push_back(rail.label);
  return make_error(ErrorCode::unavailable,
                    fmt::format("INA3221 has no rail {} (rails: {}); rails overlap and are never summed: configure one",
                                fmt::join(options.rails, " or "), fmt::join(labels, ", ")));
}

Result<Watts> Ina3221Meter::read_power() const {
  if (!rail_.hwmon) {
    auto power_mw = read_signed(options_.reader, rail_.dir / fmt::format("in_power{}_input", rail_.channel));
    if (!power_mw) return power_mw.error();
    return Watts{static_cast<double>(*power_mw) * 1e-3};
  }
  auto bus_mv = read_signed(options_.reader, rail_.dir / fmt::format("in{}_input", rail_.channel));
  if (!bus_mv) return bus_mv.error();
  auto current_ma = read_signed(options_.reader, rail_.dir / fmt::format("curr{}_input", rail_.channel));
  if (!current_ma) return current_ma.error();
  return Watts{static_cast<double>(*bus_mv) * static_cast<double>(*current_ma) * 1e-6};
}

Result<Joules> Ina3221Meter::read() {
  auto power = read_power();
  if (!power) return power.error();
  return integrator_.add(*power, options_.now_seconds());
}

std::string Ina3221Meter::description() const {
  return fmt::format("{} ({} channel {}, {})", rail_.label, rail_.hwmon ? "hwmon ina3221" : "IIO ina3221x",
                     rail_.channel, rail_.dir.string());
}

}  // namespace joule::adapters
