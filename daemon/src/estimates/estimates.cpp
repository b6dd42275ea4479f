#include "joule/daemon/estimates.hpp"

#include <fmt/format.h>

#include "joule/estimator/layer_analysis.hpp"
#include "joule/schedulers/job.hpp"

namespace joule::daemon {

Result<EstimateAnswer> estimate_on(const EstimateRequest& request, const std::vector<std::string>& devices,
                                   const DeviceModels& models) {
  auto layers = estimator::analyze_model(request.model, request.training.batch_size, "/model");
  if (!layers) return layers.error();
  // Once, for every device; its signature finds a device's measurement of this network whole.
  const estimator::PreparedNetwork network(*layers, request.training.batch_size,
                                           estimator::network_signature(request.model));
  schedulers::Constraints filter;
  filter.devices = request.devices;
  EstimateAnswer answer;
  answer.steps = estimator::steps_of(request.training);
  for (const auto& device : devices) {
    if (!schedulers::device_allowed(filter, device)) continue;
    EstimateRow row;
    row.device = device;
    const auto it = models.find(device);
    if (it == models.end() || !it->second) {
      row.detail = fmt::format(
          "device {} has no energy model yet: it learns one from probes when idle, or now with joulectl probe "
          "--device {}",
          device, device);
      answer.rows.push_back(std::move(row));
      continue;
    }
    auto estimate = it->second->estimate(network, request.training, request.runtime);
    if (!estimate) {
      row.detail = estimate.error().message;
      answer.rows.push_back(std::move(row));
      continue;
    }
    if (request.training.eat)
      estimate->warnings.push_back(
          "training.eat adds its penalty (a few elementwise passes over every activation) and a firing count per "
          "epoch, which probes do not run: the estimate leaves them out");
    row.estimate = std::move(*estimate);
    answer.rows.push_back(std::move(row));
  }
  if (answer.rows.empty() && !filter.devices.empty())
    return make_error(ErrorCode::invalid_argument, "devices matches no device of this node", "/devices");
  answer.layers = std::move(*layers);
  return answer;
}

}  // namespace joule::daemon
