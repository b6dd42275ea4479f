#include "joule/adapters/battery_meter.hpp"

#include <cmath>

#include <fmt/format.h>

namespace joule::adapters {

Result<std::unique_ptr<BatteryMeter>> BatteryMeter::open(BatteryOptions options) {
  const auto class_dir = options.sys_root / "class" / "power_supply";
  std::vector<Battery> batteries;
  for (const auto& dir : sorted_entries(class_dir)) {
    const std::string name = dir.filename().string();
    if (!options.name.empty() && name != options.name) continue;
    auto type = read_trimmed(options.reader, dir / "type");
    if (!type || *type != "Battery") continue;
    const auto has = [&](const char* file) { return options.reader(dir / file).ok(); };
    Battery battery{name, dir, Mode::energy, std::nullopt};
    if (has("energy_now"))
      battery.mode = Mode::energy;
    else if (has("power_now"))
      battery.mode = Mode::power;
    else if (has("voltage_now") && has("current_now"))
      battery.mode = Mode::voltage_current;
    else
      return make_error(ErrorCode::unavailable,
                        fmt::format("{}: no energy_now, power_now or voltage_now and current_now", dir.string()));
    batteries.push_back(std::move(battery));
  }
  if (batteries.empty())
    return make_error(
        ErrorCode::unavailable,
        fmt::format("no battery{} under {}", options.name.empty() ? "" : " named " + options.name, class_dir.string()));
  return std::unique_ptr<BatteryMeter>(new BatteryMeter(std::move(options), std::move(batteries)));
}

void BatteryMeter::restart() {
  for (auto& battery : batteries_) battery.last_energy_uwh.reset();
  integrator_.restart();
}

Status BatteryMeter::check_discharging() {
  bool discharging = false;
  std::string states;
  for (const auto& battery : batteries_) {
    auto status = read_trimmed(options_.reader, battery.dir / "status");
    const std::string state = status ? *status : "Unknown";
    if (state == "Charging") {
      restart();
      return make_error(
          ErrorCode::unavailable,
          fmt::format("{} is charging: consumption cannot be measured from a battery on charge", battery.name));
    }
    discharging = discharging || state == "Discharging";
    states += fmt::format("{}{}: {}", states.empty() ? "" : ", ", battery.name, state);
  }
  if (!discharging) {
    restart();
    return make_error(ErrorCode::unavailable,
                      fmt::format("no battery is discharging ({}): on external power, consumption cannot be measured "
                                  "from the battery",
                                  states));
  }
  return {};
}

Result<double> BatteryMeter::power_watts(const Battery& battery) const {
  if (battery.mode == Mode::power) {
    auto power_uw = read_signed(options_.reader, battery.dir / "power_now");
    if (!power_uw) return power_uw.error();
    return std::abs(static_cast<double>(*power_uw)) * 1e-6;
  }
  auto voltage_uv = read_signed(options_.reader, battery.dir / "voltage_now");
  if (!voltage_uv) return voltage_uv.error();
  auto current_ua = read_signed(options_.reader, battery.dir / "current_now");
  if (!current_ua) return current_ua.error();
  return std::abs(static_cast<double>(*voltage_uv) * static_cast<double>(*current_ua)) * 1e-12;
}

Result<Joules> BatteryMeter::read() {
  if (auto discharging = check_discharging(); !discharging) return discharging.error();
  std::vector<std::uint64_t> energy_uwh(batteries_.size(), 0);
  double power = 0.0;
  bool any_power = false;
  for (std::size_t i = 0; i < batteries_.size(); ++i) {
    const Battery& battery = batteries_[i];
    if (battery.mode == Mode::energy) {
      auto value = read_unsigned(options_.reader, battery.dir / "energy_now");
      if (!value) return value.error();
      energy_uwh[i] = *value;
    } else {
      auto watts = power_watts(battery);
      if (!watts) return watts.error();
      power += *watts;
      any_power = true;
    }
  }
  for (std::size_t i = 0; i < batteries_.size(); ++i) {
    Battery& battery = batteries_[i];
    if (battery.mode != Mode::energy) continue;
    // An increase means it charged between reads, unseen: that interval counts nothing.
    if (battery.last_energy_uwh && energy_uwh[i] <= *battery.last_energy_uwh)
      energy_total_uwh_ += static_cast<double>(*battery.last_energy_uwh - energy_uwh[i]);
    battery.last_energy_uwh = energy_uwh[i];
  }
  const Joules integrated = any_power ? integrator_.add(Watts{power}, options_.now_seconds()) : integrator_.total();
  return Joules{energy_total_uwh_ * 3.6e-3} + integrated;
}

Result<double> BatteryMeter::capacity_percent() const {
  double sum = 0.0;
  for (const auto& battery : batteries_) {
    auto percent = read_unsigned(options_.reader, battery.dir / "capacity");
    if (!percent) return percent.error();
    sum += static_cast<double>(*percent);
  }
  return sum / static_cast<double>(batteries_.size());
}

std::string BatteryMeter::description() const {
  std::string text;
  for (const auto& battery : batteries_) {
    if (!text.empty()) text += " + ";
    text += battery.name + (battery.mode == Mode::energy  ? " energy_now"
                            : battery.mode == Mode::power ? " power_now integrated"
                                                          : " voltage_now × current_now integrated");
  }
  return text;
}

}  // namespace joule::adapters
