#include "joule/adapters/nvml_meter.hpp"

#include <fmt/format.h>

namespace joule::adapters {

Result<std::unique_ptr<NvmlMeter>> NvmlMeter::open(std::shared_ptr<NvmlLibrary> library, unsigned index,
                                                   SecondsClock now_seconds) {
  auto device = library->device(index);
  if (!device) return make_error(device.error().code, fmt::format("GPU {}: {}", index, device.error().message));
  auto name = library->name(*device);
  return std::unique_ptr<NvmlMeter>(new NvmlMeter(std::move(library), index, *device,
                                                  name ? *name : std::string("unnamed GPU"), std::move(now_seconds)));
}

NvmlMeter::NvmlMeter(std::shared_ptr<NvmlLibrary> library, unsigned index, nvml::Device device, std::string name,
                     SecondsClock now_seconds)
    : library_(std::move(library)),
      index_(index),
      device_(device),
      name_(std::move(name)),
      now_seconds_(std::move(now_seconds)) {}

Result<Joules> NvmlMeter::read() {
  if (integrates_power_) return read_power();
  auto energy_mj = library_->total_energy_mj(device_);
  if (!energy_mj) {
    // NOT_SUPPORTED is the only code mapped to unavailable: the counter does not exist here.
    if (energy_mj.error().code == ErrorCode::unavailable && !last_mj_) {
      integrates_power_ = true;
      return read_power();
    }
    return energy_mj.error();
  }
  const std::uint64_t cur = *energy_mj;
  if (last_mj_) total_mj_ += cur >= *last_mj_ ? cur - *last_mj_ : cur;  // decrease: driver reloaded, counter restarted
  last_mj_ = cur;
  return Joules{static_cast<double>(total_mj_) * 1e-3};
}

Result<Joules> NvmlMeter::read_power() {
  auto power_mw = library_->power_usage_mw(device_);
  if (!power_mw) return power_mw.error();
  return integrator_.add(Watts{static_cast<double>(*power_mw) * 1e-3}, now_seconds_());
}

Result<std::pair<double, double>> NvmlMeter::power_limit_range_watts() const {
  auto range = library_->power_limit_constraints(device_);
  if (!range) return range.error();
  return std::pair{range->min_mw / 1000.0, range->max_mw / 1000.0};
}

std::string NvmlMeter::description() const {
  return fmt::format("GPU {} {}, {}", index_, name_, integrates_power_ ? "power integrated" : "total energy counter");
}

}  // namespace joule::adapters
