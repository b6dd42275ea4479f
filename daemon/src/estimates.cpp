#include "joule/daemon/estimates.hpp"

#include <fmt/format.h>

#include "joule/estimator/layer_analysis.hpp"
#include "joule/schedulers/job.hpp"

namespace joule::daemon {

using nlohmann::json;

Result<json> estimate_request(const json& body, const std::vector<std::string>& devices, const DeviceModels& models) {
  if (!body.is_object()) return make_error(ErrorCode::invalid_argument, "the request must be a JSON object", "");
  for (const auto& [key, value] : body.items()) {
    if (key != "model" && key != "training" && key != "devices")
      return make_error(ErrorCode::invalid_argument, fmt::format("unknown field \"{}\"", key), "/" + key);
  }
  if (!body.contains("model")) return make_error(ErrorCode::invalid_argument, "model is required", "/model");
  if (!body.contains("training")) return make_error(ErrorCode::invalid_argument, "training is required", "/training");
  auto model = estimator::parse_model_spec(body["model"], "/model");
  if (!model) return model.error();
  auto training = estimator::parse_training_config(body["training"], "/training");
  if (!training) return training.error();
  schedulers::Constraints filter;
  if (auto it = body.find("devices"); it != body.end()) {
    if (!it->is_array()) return make_error(ErrorCode::invalid_argument, "devices must be an array of patterns", "/devices");
    for (std::size_t i = 0; i < it->size(); ++i) {
      if (!(*it)[i].is_string())
        return make_error(ErrorCode::invalid_argument, "device patterns are strings", fmt::format("/devices/{}", i));
      filter.devices.push_back((*it)[i].get<std::string>());
    }
  }
  auto layers = estimator::analyze_model(*model, training->batch_size, "/model");
  if (!layers) return layers.error();

  json layer_rows = json::array();
  for (const auto& layer : *layers) {
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
  const auto total = estimator::total_cost(*layers);
  json estimates = json::array();
  for (const auto& device : devices) {
    if (!schedulers::device_allowed(filter, device)) continue;
    const auto it = models.find(device);
    if (it == models.end() || !it->second) {
      estimates.push_back({{"device", device},
                           {"status", "no-model"},
                           {"detail", fmt::format("device {} has no energy model yet: it learns one from probes "
                                                  "when idle, or now with joulectl probe --device {}",
                                                  device, device)}});
      continue;
    }
    auto estimate = it->second->estimate(*model, *training);
    if (!estimate) {
      estimates.push_back({{"device", device}, {"status", "no-model"}, {"detail", estimate.error().message}});
      continue;
    }
    json row = estimator::to_json(*estimate);
    row["device"] = device;  // an agent's model names its own device; here it is "node/device"
    row["status"] = "ok";
    estimates.push_back(std::move(row));
  }
  if (estimates.empty() && !filter.devices.empty())
    return make_error(ErrorCode::invalid_argument, "devices matches no device of this node", "/devices");
  return json{{"model",
               {{"layers", layer_rows},
                {"parameters", total.parameters},
                {"flops_per_step", total.forward_flops + total.backward_flops}}},
              {"steps", estimator::steps_of(*training)},
              {"estimates", estimates}};
}

}  // namespace joule::daemon
