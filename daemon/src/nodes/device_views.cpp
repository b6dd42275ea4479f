#include "device_views.hpp"

#include "joule/common/energy_source.hpp"

namespace joule::daemon {

using nlohmann::json;

namespace {

// A device's energy model as the estimate service describes it, or `none` where there is none.
json model_view(const EstimateService* estimates, const std::string& device, json none) {
  if (!estimates) return none;
  auto info = estimates->model_info(device);
  return info ? std::move(*info) : none;
}

// The jobs placed or running on it, with the cores each holds (null: the whole device).
json jobs_view(const Device& device) {
  json out = json::array();
  for (const DeviceHold& hold : device.holds)
    out.push_back({{"id", hold.job}, {"cores", hold.cores > 0 ? json(hold.cores) : json(nullptr)}});
  return out;
}

}  // namespace

json device_knobs(const Device& device) {
  json knobs = json::object();
  if (device.cpu_frequency) {
    const auto& knob = *device.cpu_frequency;
    json available = json::array();
    if (!knob.policies.empty())
      for (const double mhz : knob.policies.front().available_mhz) available.push_back(mhz);
    knobs["cpu_max_frequency_mhz"] = {{"min", knob.min_mhz},
                                      {"max", knob.max_mhz},
                                      {"driver", knob.driver},
                                      {"governor", knob.governor},
                                      {"policies", knob.policies.size()},
                                      {"available", available}};
    if (!knob.energy_preferences.empty()) knobs["cpu_energy_preference"] = {{"values", knob.energy_preferences}};
  }
  if (device.can_limit_gpu)
    knobs["gpu_power_limit_watts"] = {{"min", device.gpu_min_watts}, {"max", device.gpu_max_watts}};
  if (device.gpu_frequency) {
    json available = json::array();
    for (const auto hz : device.gpu_frequency->available_hz) available.push_back(static_cast<double>(hz) / 1e6);
    knobs["gpu_max_frequency_mhz"] = {{"min", device.gpu_frequency->min_mhz},
                                      {"max", device.gpu_frequency->max_mhz},
                                      {"devfreq", device.gpu_frequency->name},
                                      {"available", available}};
  }
  if (device.power_modes) {
    json modes = json::array();
    for (const auto& mode : device.power_modes->table.modes) modes.push_back({{"id", mode.id}, {"name", mode.name}});
    knobs["power_mode"] = {{"modes", modes}, {"default", device.power_modes->table.default_id}};
  }
  json out = {{"offered", knobs}};
  if (!device.knob_note.empty()) out["note"] = device.knob_note;
  return out;
}

json devices_view(const DeviceTable& devices, const EstimateService* estimates) {
  json out = json::array();
  for (const auto& device : devices) {
    const std::string source(device.meter->source());
    const bool measured = is_measurement(source);
    out.push_back(
        {{"name", device.name},
         {"meter", {{"source", source}, {"measured", measured}, {"note", device.meter_note}}},
         {"energy_joules", device.energy_joules},
         {"power_watts", device.power_watts},
         {"meter_error", device.meter_error ? json(*device.meter_error) : json(nullptr)},
         {"job", device.idle() ? json(nullptr) : json(device.holds.front().job)},
         {"jobs", jobs_view(device)},
         {"cores", device.shared_cores > 0 ? json{{"shared", device.shared_cores}, {"held", device.cores_held()}}
                                           : json(nullptr)},
         {"runs_jobs", device.runs_jobs},
         {"threads", device.threads > 0 ? nlohmann::json(device.threads) : nlohmann::json(nullptr)},
         {"knobs", device_knobs(device)},
         {"model", model_view(estimates, device.name, json{{"state", "none"}, {"samples", 0}})}});
    if (!device.worker.empty()) out.back()["worker"] = device.worker.string();
    if (!device.board_note.empty())
      out.back()["board"] = {{"model", device.board_model},
                             {"figures", device.board_figures_published ? "published" : "generic"},
                             {"note", device.board_note}};
  }
  return json{{"devices", out}};
}

json node_devices_view(const DeviceTable& devices, const std::string& node, const EstimateService* estimates) {
  json out = json::array();
  for (const std::size_t index : devices.of_node(node)) {
    const Device& device = devices[index];
    const std::string source(device.meter->source());
    out.push_back({{"name", device.agent_device},
                   {"source", source},
                   {"measured", is_measurement(source)},
                   {"power_watts", device.power_watts},
                   {"energy_joules", device.energy_joules},
                   {"runs_jobs", device.runs_jobs},
                   {"job", device.idle() ? json(nullptr) : json(device.holds.front().job)},
                   {"battery_percent", device.battery_percent ? json(*device.battery_percent) : json(nullptr)},
                   {"model", model_view(estimates, device.name, json{{"state", "none"}})}});
  }
  return out;
}

}  // namespace joule::daemon
