#pragma once
// POST /v1/estimate: a model spec and training config, estimated on each device of the node
// that has an energy model, with the layer-by-layer counts every estimate is built from. A
// device without a model says so and how to get one; no number is invented.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "joule/common/result.hpp"
#include "joule/estimator/device_energy_model.hpp"

namespace joule::daemon {

/// Immutable model snapshots by device name; a refit swaps in a new snapshot.
using DeviceModels = std::map<std::string, std::shared_ptr<const estimator::DeviceEnergyModel>>;

/// Answers an estimate request `{"model": ..., "training": ..., "devices": ["pattern"...],
/// "runtime": "python" | "none"}` (runtime: what the job's training loop runs in; "python" adds
/// the device's measured interpreter start-up and per-step cost, estimator/runtime_cost.hpp);
/// errors name the field by JSON pointer.
Result<nlohmann::json> estimate_request(const nlohmann::json& body, const std::vector<std::string>& devices,
                                        const DeviceModels& models);

/// POST /v1/advise: `{"model", "training", "target", "device"?, "min_multiplier"?}`, energy-aware
/// pruning advice (estimator/pruning_advice.hpp) from one device's model (the one named, or
/// the first of `devices` that has a model), with the advised network's saving estimated on
/// every device that has a model. Errors name the field by JSON pointer; no device with a model
/// is a 503 that says how to get one.
Result<nlohmann::json> advise_request(const nlohmann::json& body, const std::vector<std::string>& devices,
                                      const DeviceModels& models);

}  // namespace joule::daemon
