#include "http/routes/estimate_json.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "joule/estimator/pruning_advice.hpp"

namespace joule::daemon::routes {

using nlohmann::json;

Result<EstimateRequest> parse_estimate_request(const json& body) {
  if (!body.is_object()) return make_error(ErrorCode::invalid_argument, "the request must be a JSON object", "");
  for (const auto& [key, value] : body.items()) {
    if (key != "model" && key != "training" && key != "devices" && key != "runtime")
      return make_error(ErrorCode::invalid_argument, fmt::format("unknown field \"{}\"", key), "/" + key);
  }
  if (!body.contains("model")) return make_error(ErrorCode::invalid_argument, "model is required", "/model");
  if (!body.contains("training")) return make_error(ErrorCode::invalid_argument, "training is required", "/training");
  auto model = estimator::parse_model_spec(body["model"], "/model");
  if (!model) return model.error();
  auto training = estimator::parse_training_config(body["training"], "/training");
  if (!training) return training.error();
  EstimateRequest request{std::move(*model), std::move(*training), {}, {}};
  // What the job's loop runs in: "python" adds the device's measured interpreter start-up and
  // per-step cost; "none" (or no field: a built-in job, a compiled trainer) adds nothing.
  if (auto it = body.find("runtime"); it != body.end()) {
    if (!it->is_string() || (*it != "python" && *it != "none"))
      return make_error(ErrorCode::invalid_argument, "runtime must be \"python\" or \"none\"", "/runtime");
    if (*it == "python") request.runtime = "python";
  }
  if (auto it = body.find("devices"); it != body.end()) {
    if (!it->is_array())
      return make_error(ErrorCode::invalid_argument, "devices must be an array of patterns", "/devices");
    for (std::size_t i = 0; i < it->size(); ++i) {
      if (!(*it)[i].is_string())
        return make_error(ErrorCode::invalid_argument, "device patterns are strings", fmt::format("/devices/{}", i));
      request.devices.push_back((*it)[i].get<std::string>());
    }
  }
  return request;
}

json estimate_answer_json(const EstimateAnswer& answer) {
  json layer_rows = json::array();
  for (const auto& layer : answer.layers) {
    json row = {{"index", layer.index},
                {"type", layer.type},
                {"input_shape", layer.input_shape},
                {"output_shape", layer.output_shape},
                {"parameters", layer.cost.parameters},
                {"flops_per_step", layer.cost.forward_flops + layer.cost.backward_flops},
                {"activation_bytes_per_step", layer.cost.activation_bytes}};
    if (!layer.name.empty()) row["name"] = layer.name;
    if (layer.input_shapes.size() > 1) row["input_shapes"] = layer.input_shapes;
    layer_rows.push_back(std::move(row));
  }
  json estimates = json::array();
  for (const auto& row : answer.rows) estimates.push_back(estimate_row_json(row));
  const auto total = estimator::total_cost(answer.layers);
  return json{{"model",
               {{"layers", layer_rows},
                {"parameters", total.parameters},
                {"flops_per_step", total.forward_flops + total.backward_flops}}},
              {"steps", answer.steps},
              {"estimates", estimates}};
}

namespace {

json uncertain_json(const estimator::Uncertain& value) { return {{"mean", value.mean}, {"std", value.std}}; }

}  // namespace

Result<json> advise_request(const json& body, const std::vector<std::string>& devices, const DeviceModels& models) {
  if (!body.is_object()) return make_error(ErrorCode::invalid_argument, "the request must be a JSON object", "");
  for (const auto& [key, value] : body.items()) {
    if (key != "model" && key != "training" && key != "target" && key != "device" && key != "min_multiplier")
      return make_error(ErrorCode::invalid_argument, fmt::format("unknown field \"{}\"", key), "/" + key);
  }
  if (!body.contains("model")) return make_error(ErrorCode::invalid_argument, "model is required", "/model");
  if (!body.contains("training")) return make_error(ErrorCode::invalid_argument, "training is required", "/training");
  const auto target = body.find("target");
  if (target == body.end() || !target->is_number() || !(target->get<double>() > 0.0 && target->get<double>() < 1.0))
    return make_error(ErrorCode::invalid_argument,
                      "target is the share of the estimated energy to save, a number between 0 and 1 (0.5: half)",
                      "/target");
  double smallest = 0.5;
  if (const auto it = body.find("min_multiplier"); it != body.end()) {
    if (!it->is_number() || !(it->get<double>() >= 0.125 && it->get<double>() < 1.0))
      return make_error(ErrorCode::invalid_argument,
                        "min_multiplier is the smallest width multiplier, from 0.125 up to (not including) 1",
                        "/min_multiplier");
    smallest = it->get<double>();
  }
  auto model = estimator::parse_model_spec(body["model"], "/model");
  if (!model) return model.error();
  auto training = estimator::parse_training_config(body["training"], "/training");
  if (!training) return training.error();
  const auto original_layers = estimator::analyze_model(*model, training->batch_size, "/model");
  if (!original_layers) return original_layers.error();

  // The device whose model advises: the one named, or the first with a model.
  std::string device;
  if (const auto it = body.find("device"); it != body.end()) {
    if (!it->is_string()) return make_error(ErrorCode::invalid_argument, "device is a device name", "/device");
    device = it->get<std::string>();
    if (std::find(devices.begin(), devices.end(), device) == devices.end())
      return make_error(ErrorCode::invalid_argument, fmt::format("this node has no device {}", device), "/device");
    if (const auto m = models.find(device); m == models.end() || !m->second)
      return make_error(ErrorCode::unavailable,
                        fmt::format("device {} has no energy model yet: it learns one from probes when idle, or "
                                    "now with joulectl probe --device {}",
                                    device, device));
  } else {
    for (const auto& name : devices)
      if (const auto m = models.find(name); m != models.end() && m->second) {
        device = name;
        break;
      }
    if (device.empty())
      return make_error(ErrorCode::unavailable,
                        "no device of this node has an energy model yet: they learn one from probes when idle, or "
                        "now with joulectl probe --device DEVICE");
  }
  auto advice = estimator::advise_pruning(*model, *training, *models.at(device), target->get<double>(),
                                          estimator::PruningOptions::down_to(smallest));
  if (!advice) {
    auto error = advice.error();
    if (error.where == "target") error.where = "/target";
    return error;
  }

  json layers = json::array();
  for (const auto& layer : advice->layers) {
    json row = {{"index", layer.index}, {"type", layer.type}, {"energy_share", layer.energy_share}};
    if (!layer.name.empty()) row["name"] = layer.name;
    if (!layer.width_argument.empty()) {
      row["width_argument"] = layer.width_argument;
      row["width"] = layer.width;
      row["advised_width"] = layer.advised_width;
      row["multiplier"] = layer.multiplier;
      if (!layer.fixed_because.empty()) row["fixed_because"] = layer.fixed_because;
    }
    layers.push_back(std::move(row));
  }
  // The advised network on every device with a model: the same widths save differently where
  // the costly layers differ.
  json per_device = json::array();
  const auto advised_layers = estimator::analyze_model(advice->model, training->batch_size);
  for (const auto& name : devices) {
    const auto m = models.find(name);
    if (m == models.end() || !m->second) {
      per_device.push_back({{"device", name}, {"status", "no-model"}});
      continue;
    }
    auto before = m->second->estimate(*original_layers, *training);
    auto after = advised_layers ? m->second->estimate(*advised_layers, *training)
                                : Result<estimator::Estimate>(advised_layers.error());
    if (!before || !after) {
      per_device.push_back(
          {{"device", name}, {"status", "no-model"}, {"detail", (!before ? before : after).error().message}});
      continue;
    }
    per_device.push_back({{"device", name},
                          {"status", "ok"},
                          {"source", m->second->source()},
                          {"original_joules", uncertain_json(before->joules)},
                          {"advised_joules", uncertain_json(after->joules)},
                          {"saving", 1.0 - after->joules.mean / before->joules.mean}});
  }
  json out = {{"device", device},
              {"source", advice->original.source},
              {"target", advice->target},
              {"min_multiplier", smallest},
              {"reached", advice->reached},
              {"saving", advice->saving},
              {"original",
               {{"joules", uncertain_json(advice->original.joules)},
                {"seconds", uncertain_json(advice->original.seconds)},
                {"parameters", advice->original_parameters}}},
              {"advised",
               {{"joules", uncertain_json(advice->advised.joules)},
                {"seconds", uncertain_json(advice->advised.seconds)},
                {"parameters", advice->advised_parameters},
                {"warnings", advice->advised.warnings}}},
              {"layers", layers},
              {"model", estimator::to_json(advice->model)},
              {"devices", per_device}};
  if (!advice->detail.empty()) out["detail"] = advice->detail;
  return out;
}

void add_policy_choices(nlohmann::json& answer, const EstimateAnswer& estimated, const schedulers::Policy& policy) {
  if (policy.knobs.goal == schedulers::KnobGoal::off || !answer.contains("estimates")) return;
  for (auto& row : answer["estimates"]) {
    const auto device = row.value("device", "");
    const auto found = std::find_if(estimated.rows.begin(), estimated.rows.end(),
                                    [&](const EstimateRow& r) { return r.device == device; });
    if (found == estimated.rows.end() || !found->estimate || found->estimate->settings.empty()) continue;
    const DeviceEstimate figures = DeviceEstimate::of(*found);
    const auto options = figures.setting_options();
    const auto* chosen = schedulers::preferred_setting(policy.knobs, policy.risk, policy.knobs.max_slowdown,
                                                       figures.placement(), options);
    row["policy_choice"] = {
        {"goal", schedulers::to_string(policy.knobs.goal)},
        {"setting", chosen ? nlohmann::json{{"knob", chosen->knob}, {"value", chosen->value}, {"label", chosen->label}}
                           : nlohmann::json(nullptr)}};
  }
}

}  // namespace joule::daemon::routes
