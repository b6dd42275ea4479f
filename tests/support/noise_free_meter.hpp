#pragma once
// A probe meter for estimator tests: a simulated device's exact per-step cost, without noise.

#include "joule/estimator/layer_analysis.hpp"
#include "joule/estimator/probe_campaign.hpp"
#include "joule/estimator/simulated_device.hpp"

namespace joule::testing {

/// Meters a network by the simulator's noise-free step cost (`device` must outlive it).
inline estimator::NetworkMeter noise_free_meter(const estimator::SimulatedDevice& device) {
  return [&device](const estimator::ModelSpec& network, std::int64_t batch,
                   const std::string& optimizer) -> joule::Result<estimator::NetworkMeasurement> {
    auto layers = estimator::analyze_model(network, batch, "/probe");
    if (!layers) return layers.error();
    const auto cost = device.step_cost(*layers, network.loss, optimizer);
    return estimator::NetworkMeasurement{cost.joules, cost.seconds};
  };
}

}  // namespace joule::testing
