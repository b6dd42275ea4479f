#pragma once
// An estimate request (POST /v1/estimate, and every job the book estimates): a model spec and
// training config, estimated on each device of the node that has an energy model, with the
// layer-by-layer counts every estimate is built from. A device without a model says so and how
// to get one; no number is invented. Typed: the routes parse requests and write answers.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "joule/common/result.hpp"
#include "joule/daemon/job_estimate.hpp"
#include "joule/estimator/device_energy_model.hpp"
#include "joule/estimator/layer_analysis.hpp"
#include "joule/estimator/model_spec.hpp"

namespace joule::daemon {

/// Immutable model snapshots by device name; a refit swaps in a new snapshot.
using DeviceModels = std::map<std::string, std::shared_ptr<const estimator::DeviceEnergyModel>>;

struct EstimateRequest {
  estimator::ModelSpec model;
  estimator::TrainingConfig training;
  /// What the job's training loop runs in: "python" adds the device's measured interpreter
  /// start-up and per-step cost (estimator/runtime_cost.hpp); "" (a built-in job, a compiled
  /// trainer) adds nothing.
  std::string runtime;
  /// Patterns of the devices to estimate on (schedulers::device_allowed); none: every device.
  std::vector<std::string> devices;
};

struct EstimateAnswer {
  std::vector<estimator::AnalyzedLayer> layers;  ///< the network's layers, counted
  std::int64_t steps = 0;
  std::vector<EstimateRow> rows;  ///< one per device the request covers, in the node's order
};

/// Estimates `request` on each of `devices` its patterns allow, with `models`; errors name the
/// request's field by JSON pointer ("/model/layers/3", "/devices" when it matches no device).
Result<EstimateAnswer> estimate_on(const EstimateRequest& request, const std::vector<std::string>& devices,
                                   const DeviceModels& models);

}  // namespace joule::daemon
