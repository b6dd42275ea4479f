#include "joule/daemon/device_table.hpp"

#include <algorithm>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "joule/daemon/reported_meter.hpp"

namespace joule::daemon {

namespace {

// What the meter offers beyond joules, read once: a GPU's power limit range.
void read_meter_capabilities(Device& device) {
  if (const auto* gpu = device.meter->gpu_power_control()) {
    if (auto range = gpu->power_limit_range_watts()) {
      device.can_limit_gpu = range->second > 0;
      device.gpu_min_watts = range->first;
      device.gpu_max_watts = range->second;
    }
  }
}

}  // namespace

double Device::average_power(double seconds) const {
  if (history.size() < 2) return power_watts;
  const auto newest = history.back();
  const auto since = newest.first - std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                        std::chrono::duration<double>(seconds));
  // The history is in time order (an hour of samples): a binary search, not a walk, since every
  // placement pass asks this of every device (a coordinator's thousands).
  const auto first = std::lower_bound(history.begin(), history.end(), since,
                                      [](const auto& entry, const auto& time) { return entry.first < time; });
  const auto oldest = first == history.end() ? history.front() : *first;
  const double span = std::chrono::duration<double>(newest.first - oldest.first).count();
  return span > 0 ? (newest.second - oldest.second) / span : power_watts;
}

bool Device::holds_job(const std::string& id) const {
  return std::any_of(holds.begin(), holds.end(), [&](const DeviceHold& hold) { return hold.job == id; });
}

bool Device::can_hold(int cores) const {
  if (holds.empty()) return true;
  return cores > 0 && !held_whole() && cores_held() + cores <= shared_cores;
}

void Device::hold(const std::string& id, int cores) {
  if (!holds_job(id)) holds.push_back(DeviceHold{id, cores});
}

void Device::release(const std::string& id) {
  std::erase_if(holds, [&](const DeviceHold& hold) { return hold.job == id; });
}

int Device::cores_held() const {
  int held = 0;
  for (const DeviceHold& hold : holds) held += hold.cores;
  return held;
}

bool Device::held_whole() const {
  return std::any_of(holds.begin(), holds.end(), [](const DeviceHold& hold) { return hold.cores == 0; });
}

DeviceTable::DeviceTable(std::vector<Device> devices) {
  for (auto& device : devices) add(std::move(device));
}

Device& DeviceTable::add(Device device) {
  const std::size_t index = devices_.size();
  read_meter_capabilities(device);
  if (!device.on_agent() && !device.config) {
    device.config.emplace();
    device.config->name = device.name;
  }
  index_[device.name] = index;
  if (device.on_agent()) by_node_[device.node].push_back(index);
  devices_.push_back(std::move(device));
  return devices_.back();
}

Device& DeviceTable::add_agent_device(const std::string& node, const std::string& agent_device,
                                      const std::string& source) {
  Device device;
  device.name = node + "/" + agent_device;
  device.node = node;
  device.agent_device = agent_device;
  auto meter = std::make_unique<ReportedMeter>(source);
  if (source.empty()) {
    // Known from the stored state only: not placeable until its agent is heard from.
    meter->silence(fmt::format("node {} not heard from since jouled started", node));
    device.meter_note = fmt::format("metered on agent {}", node);
    device.node_ready = false;
  } else {
    device.meter_note = fmt::format("metered on agent {} by its {} meter", node, source);
  }
  device.meter = std::move(meter);
  return add(std::move(device));
}

std::optional<std::size_t> DeviceTable::index_of(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

const Device* DeviceTable::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &devices_[it->second];
}

Device* DeviceTable::find(const std::string& name) {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &devices_[it->second];
}

const std::vector<std::size_t>& DeviceTable::of_node(const std::string& node) const {
  static const std::vector<std::size_t> kNone;
  const auto it = by_node_.find(node);
  return it == by_node_.end() ? kNone : it->second;
}

std::vector<unsigned> DeviceTable::gpus_not_of(const std::vector<std::string>& own) const {
  std::set<unsigned> held, others;
  for (const auto& name : own)
    if (const Device* device = find(name); device && device->gpu_minor) held.insert(*device->gpu_minor);
  for (const auto& device : devices_)
    if (!device.on_agent() && device.gpu_minor && !held.contains(*device.gpu_minor)) others.insert(*device.gpu_minor);
  return {others.begin(), others.end()};
}

std::vector<std::string> DeviceTable::names() const {
  std::vector<std::string> names;
  names.reserve(devices_.size());
  for (const auto& device : devices_) names.push_back(device.name);
  return names;
}

std::vector<DeviceSample> DeviceTable::sample(std::chrono::steady_clock::time_point now) {
  std::vector<DeviceSample> samples;
  samples.reserve(devices_.size());
  for (auto& device : devices_) {
    const double before = device.energy_joules;
    auto reading = device.meter->read();
    if (!reading) {
      if (device.meter_error != reading.error().message)
        spdlog::warn("device {}: meter {} failed: {}", device.name, device.meter->source(), reading.error().message);
      device.meter_error = reading.error().message;
      continue;
    }
    device.meter_error.reset();
    device.energy_joules = reading->value;
    DeviceSample sample{&device, device.energy_joules - before, 0.0, false};
    if (device.last_sample) sample.seconds = std::chrono::duration<double>(now - *device.last_sample).count();
    if (device.on_agent()) {
      device.power_watts = device.reported_power_watts;
    } else if (device.last_sample) {
      device.power_watts = sample.seconds > 0 ? sample.joules / sample.seconds : 0.0;
      sample.power_known = true;
    }
    device.last_sample = now;
    device.history.emplace_back(now, device.energy_joules);
    if (const auto* battery = device.meter->battery_gauge()) {
      auto percent = battery->capacity_percent();
      device.battery_percent = percent ? std::optional(*percent) : std::nullopt;
    }
    // Enough history for the longest averaging period a cap may use (an hour).
    while (device.history.size() > 2 && now - device.history.front().first > std::chrono::hours(1))
      device.history.pop_front();
    samples.push_back(sample);
  }
  return samples;
}

}  // namespace joule::daemon
