#include "chosen_setting.hpp"

#include <nlohmann/json.hpp>

#include "joule/daemon/device_knobs.hpp"
#include "joule/schedulers/job.hpp"

namespace joule::daemon {

namespace {

using nlohmann::json;

json estimate_json(const schedulers::Estimate& estimate) {
  return {{"joules", estimate.joules_mean}, {"joules_std", estimate.joules_std}, {"seconds", estimate.seconds_mean}};
}

schedulers::Estimate read_estimate(const json& value) {
  schedulers::Estimate estimate;
  estimate.joules_mean = value.value("joules", 0.0);
  estimate.joules_std = value.value("joules_std", 0.0);
  estimate.seconds_mean = value.value("seconds", 0.0);
  return estimate;
}

}  // namespace

std::string write_stored_setting(const StoredSetting& setting) {
  const auto& chosen = setting.chosen;
  json out = {{"knob", chosen.setting.knob},
              {"value", chosen.setting.value},
              {"label", chosen.setting.label},
              {"goal", chosen.goal},
              {"at_setting", estimate_json(chosen.at_setting)},
              {"at_default", estimate_json(chosen.at_default)},
              {"in_force", setting.in_force}};
  if (!setting.checked_key.empty()) out["checked_key"] = setting.checked_key;
  if (const auto& check = setting.check)
    out["check"] = {{"setting_epoch", check->setting_epoch},
                    {"default_epoch", check->default_epoch},
                    {"energy_ratio", check->energy_ratio},
                    {"time_ratio", check->time_ratio},
                    {"kept", check->kept},
                    {"why", check->why}};
  return out.dump();
}

std::optional<StoredSetting> read_stored_setting(std::string_view text) {
  if (text.empty()) return std::nullopt;
  const json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!value.is_object() || !value.contains("knob") || !value["knob"].is_string() || !value.contains("value") ||
      !value["value"].is_number())
    return std::nullopt;
  try {
    StoredSetting out;
    out.chosen.setting = estimator::KnobSetting{value["knob"].get<std::string>(), value["value"].get<double>(),
                                                value.value("label", std::string())};
    out.chosen.goal = value.value("goal", std::string());
    out.chosen.at_setting = read_estimate(value.value("at_setting", json::object()));
    out.chosen.at_default = read_estimate(value.value("at_default", json::object()));
    out.in_force = value.value("in_force", false);
    out.checked_key = value.value("checked_key", std::string());
    if (const auto check = value.find("check"); check != value.end() && check->is_object()) {
      schedulers::SettingCheckResult result;
      result.setting_epoch = check->value("setting_epoch", 0);
      result.default_epoch = check->value("default_epoch", 0);
      result.energy_ratio = check->value("energy_ratio", 1.0);
      result.time_ratio = check->value("time_ratio", 1.0);
      result.kept = check->value("kept", false);
      result.why = check->value("why", std::string());
      out.check = std::move(result);
    }
    return out;
  } catch (const json::exception&) {  // a field of the wrong type: not this code's
    return std::nullopt;
  }
}

void restore_chosen_setting(JobRecord& job) {
  auto stored = read_stored_setting(job.row.chosen_setting);
  if (!stored) return;
  job.chosen_setting = std::move(stored->chosen);
  job.stored_check = std::move(stored->check);
  job.setting_was_in_force = stored->in_force;
}

std::optional<DeviceEstimate> estimate_at_setting_ran(DeviceEstimate estimate, const adapters::StoredJob& row) {
  if (const auto stored = read_stored_setting(row.chosen_setting)) {
    if (stored->in_force && !(stored->check && !stored->check->kept))
      if (auto at = estimate.at(stored->chosen.setting)) return at;
    return estimate;
  }
  if (row.spec_json.find("\"knobs\"") != std::string::npos) {
    const auto spec = schedulers::parse_job_spec(json::parse(row.spec_json, nullptr, false));
    if (spec && setting_of(spec->knobs)) return std::nullopt;
  }
  return estimate;
}

}  // namespace joule::daemon
