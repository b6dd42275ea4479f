// Accuracy of the THOR estimate on simulated devices, against the FLOPs baseline.
//
// For every simulated profile and probe budget: a fresh device model learns from that many
// THOR probes (planned from the workload: the held-out networks, as queued jobs), then
// estimates each whole network's energy for one epoch. The truth is the simulator's noise-free
// cost of the whole network; no whole network is ever measured by the probes.
// Usage: estimator_accuracy MODELS_DIR [budgets...]   (default budgets 50 100 200 400)

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "joule/estimator/device_energy_model.hpp"
#include "joule/estimator/layer_analysis.hpp"
#include "joule/estimator/probe_campaign.hpp"
#include "joule/estimator/simulated_device.hpp"
#include "model_files.hpp"

using namespace joule::estimator;

namespace {

struct HeldOut {
  ModelSpec model;
  TrainingConfig training;
};

std::vector<HeldOut> load_models(const std::filesystem::path& dir) {
  std::vector<HeldOut> out;
  for (const auto& spec : joule::bench::load_model_specs(dir)) {
    for (std::int64_t batch : {32, 64}) {
      TrainingConfig training;
      training.batch_size = batch;
      training.epochs = 1;
      training.samples_per_epoch = 10000;
      out.push_back(HeldOut{spec, training});
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: estimator_accuracy MODELS_DIR [budgets...]\n");
    return 2;
  }
  const auto held_out = load_models(argv[1]);
  std::vector<std::size_t> budgets;
  for (int i = 2; i < argc; ++i) budgets.push_back(static_cast<std::size_t>(std::stoul(argv[i])));
  if (budgets.empty()) budgets = {50, 100, 200, 400};
  std::vector<WorkloadItem> workload;
  for (const auto& item : held_out) workload.push_back(WorkloadItem{item.model, item.training.batch_size});

  fmt::print("{} held-out (network, batch) pairs; truth = the simulator's noise-free cost; joules source: simulated\n",
             held_out.size());
  fmt::print("{:<16} {:>7} {:>10} {:>10} {:>10} {:>8} {:>9} {:>8}\n", "profile", "probes", "GP MAPE", "GP worst",
             "FLOPs MAPE", "ratio", "in 2σ", "seconds");
  for (const auto& profile : simulated_profiles()) {
    for (std::size_t budget : budgets) {
      const auto started = std::chrono::steady_clock::now();
      SimulatedDevice device(profile, 7);
      DeviceEnergyModel model(profile.name, "simulated");
      const NetworkMeter meter = simulated_network_meter(device, 5);
      CampaignOptions options;
      options.probes = budget;
      options.seed = 11;
      options.gp.restarts = 2;
      auto report = run_campaign(model, workload, meter, options);
      if (!report) {
        fmt::print("{:<16} {:>7}  campaign failed: {}\n", profile.name, budget, report.error().message);
        continue;
      }
      double gp_sum = 0, gp_worst = 0, flops_sum = 0;
      int covered = 0, counted = 0, missing = 0;
      for (const auto& item : held_out) {
        auto estimate = model.estimate(item.model, item.training);
        if (!estimate) {
          ++missing;
          continue;
        }
        auto layers = analyze_model(item.model, item.training.batch_size);
        const double truth = device.step_cost(*layers, item.model.loss).joules * static_cast<double>(estimate->steps);
        const double gp_error = std::abs(estimate->joules.mean - truth) / truth;
        gp_sum += gp_error;
        gp_worst = std::max(gp_worst, gp_error);
        flops_sum += std::abs(estimate->flops_baseline_joules - truth) / truth;
        covered += std::abs(estimate->joules.mean - truth) <= 2 * estimate->joules.std ? 1 : 0;
        ++counted;
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      if (counted == 0) {
        fmt::print("{:<16} {:>7}  no estimate: {} networks lack a model\n", profile.name, budget, missing);
        continue;
      }
      const double gp_mape = 100 * gp_sum / counted, flops_mape = 100 * flops_sum / counted;
      fmt::print("{:<16} {:>7} {:>9.1f}% {:>9.1f}% {:>9.1f}% {:>7.1f}x {:>5}/{:<3} {:>8.1f}{}\n", profile.name, budget,
                 gp_mape, 100 * gp_worst, flops_mape, flops_mape / std::max(gp_mape, 1e-9), covered, counted, seconds,
                 missing ? fmt::format("  ({} without a model)", missing) : "");
    }
  }
  return 0;
}
