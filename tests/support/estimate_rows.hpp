#pragma once
// Estimates as the estimate service answers them (daemon::EstimateRow), built by tests from the
// few figures they decide with.

#include <cstdint>
#include <string>

#include "joule/daemon/job_estimate.hpp"

namespace joule::testing {

/// An estimate on `device` from a model learnt under `source`: `joules` J (σ `std`), `seconds` s,
/// over `steps` steps, with no layers and no FLOPs baseline unless a test adds them.
inline daemon::EstimateRow estimate_row(const std::string& device, const std::string& source, double joules, double std,
                                        double seconds, std::int64_t steps = 0) {
  estimator::Estimate estimate;
  estimate.device = device;
  estimate.source = source;
  estimate.steps = steps;
  estimate.joules = {joules, std};
  estimate.seconds = {seconds, 0.0};
  return daemon::EstimateRow{device, std::move(estimate), {}, std::nullopt};
}

/// A device with no model for it.
inline daemon::EstimateRow no_model_row(const std::string& device) {
  return daemon::EstimateRow{device, std::nullopt, "no energy model yet", std::nullopt};
}

/// A layer of `flops` FLOPs a step, estimated by the model `key` ("lstm@hidden") at `joules` a step.
inline estimator::LayerEstimate layer_of(const std::string& key, double flops, double joules) {
  estimator::LayerEstimate layer;
  layer.type = key.substr(0, key.find('@'));
  layer.key = key;
  layer.flops_per_step = flops;
  layer.joules_per_step = {joules, 0.0};
  return layer;
}

}  // namespace joule::testing
