#pragma once
// Planning and running THOR probes (ARCHITECTURE.md, Estimation step 3): which layer
// configurations to measure next so the device model learns what the workload needs.
//
// Candidates come from the workload (queued and recent jobs): every layer in its position at
// its batch size, and variations of it (widths ×½, ×¾, ×1½, ×2; other batch sizes), so the GP
// sees the neighbourhood of what users run and not only the exact points. The plan first gives
// every (kind, position) the workload needs `seed_samples` probes, then repeatedly probes the
// candidate whose energy model is least sure (highest latent σ), weighted by how often its
// (kind, position) occurs in the workload.

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "joule/common/result.hpp"
#include "joule/estimator/device_energy_model.hpp"
#include "joule/estimator/simulated_device.hpp"
#include "joule/estimator/thor_probes.hpp"

namespace joule::estimator {

/// A network the device is expected to train, with its batch size.
struct WorkloadItem {
  ModelSpec model;
  std::int64_t batch_size = 32;
};

/// Measures one probe network on the device: the median per-step cost of its repetitions.
using NetworkMeter = std::function<Result<NetworkMeasurement>(const ModelSpec& network, std::int64_t batch_size)>;

/// A meter for a simulated device: the median of `repetitions` noisy steps of the network
/// (`repetitions` = 1 and a noise-free profile give the exact cost). The device must outlive it.
NetworkMeter simulated_network_meter(SimulatedDevice& device, int repetitions = 5);

struct CampaignOptions {
  std::size_t probes = 100;         ///< probe plans to run (each measures 1-4 networks)
  std::size_t seed_samples = 3;     ///< first probes per (kind, position) before variance-driven picks
  std::size_t refit_every = 10;     ///< refit the GPs after this many probes
  std::uint64_t seed = 1;
  std::vector<std::int64_t> batch_sizes = {16, 32, 64, 128};
  GpFitOptions gp;
};

struct CampaignReport {
  std::size_t probes = 0;
  std::size_t networks_measured = 0;
  std::size_t failed_measurements = 0;
};

/// Candidate probe targets for a workload (deduplicated, deterministic for a seed).
std::vector<ProbeTarget> candidate_targets(const std::vector<WorkloadItem>& workload,
                                           const std::vector<std::int64_t>& batch_sizes);

/// Runs `options.probes` probes against `meter`, adding every decomposed sample and every
/// measured network to `model`, and leaves the model fitted.
Result<CampaignReport> run_campaign(DeviceEnergyModel& model, const std::vector<WorkloadItem>& workload,
                                    const NetworkMeter& meter, const CampaignOptions& options);

}  // namespace joule::estimator
