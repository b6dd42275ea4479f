// Estimate latency: a 100-layer model (and a 3-layer one) on 16 devices (4 simulated profiles x 4 seeds), each
// device model trained by a probe campaign first. Google Benchmark reports the time of one
// full estimate across all 16 devices; p50/p99 come from --benchmark_repetitions.

#include <benchmark/benchmark.h>

#include <memory>

#include "joule/estimator/device_energy_model.hpp"
#include "joule/estimator/layer_analysis.hpp"
#include "joule/estimator/probe_campaign.hpp"
#include "joule/estimator/simulated_device.hpp"

using namespace joule::estimator;

namespace {

// 100 layers: 33 blocks of linear + relu + dropout on [256] features, then the classifier.
ModelSpec deep_mlp() {
  ModelSpec spec;
  spec.name = "mlp-100";
  spec.input_shape = {256};
  for (int block = 0; block < 33; ++block) {
    spec.layers.push_back(LayerSpec{"linear", {{"out_features", 256}}, {}, {}});
    spec.layers.push_back(LayerSpec{"relu", nlohmann::json::object(), {}, {}});
    spec.layers.push_back(LayerSpec{"dropout", {{"p", 0.1}}, {}, {}});
  }
  spec.layers.push_back(LayerSpec{"linear", {{"out_features", 10}}, {}, {}});
  return spec;
}

std::vector<std::unique_ptr<DeviceEnergyModel>>& trained_devices() {
  static std::vector<std::unique_ptr<DeviceEnergyModel>> devices = [] {
    std::vector<std::unique_ptr<DeviceEnergyModel>> out;
    const ModelSpec spec = deep_mlp();
    for (int seed = 0; seed < 4; ++seed) {
      for (const auto& profile : simulated_profiles()) {
        SimulatedDevice device(profile, static_cast<std::uint64_t>(seed));
        auto model = std::make_unique<DeviceEnergyModel>("sim:" + profile.name, "simulated");
        const NetworkMeter meter = simulated_network_meter(device, 1);
        CampaignOptions options;
        options.probes = 40;
        options.gp.restarts = 1;
        options.seed = static_cast<std::uint64_t>(seed);
        (void)run_campaign(*model, {WorkloadItem{spec, 64}}, meter, options);
        out.push_back(std::move(model));
      }
    }
    return out;
  }();
  return devices;
}

// As the daemon does: analyse and prepare the network once, estimate it on every device.
void estimate_on_every_device(benchmark::State& state, const ModelSpec& spec) {
  TrainingConfig training;
  training.batch_size = 64;
  training.samples_per_epoch = 60000;
  auto& devices = trained_devices();
  for (auto _ : state) {
    auto layers = analyze_model(spec, training.batch_size);
    const PreparedNetwork network(*layers, training.batch_size);
    for (const auto& device : devices) {
      auto estimate = device->estimate(network, training);
      benchmark::DoNotOptimize(estimate);
    }
  }
}

void BM_estimate_100_layers_on_16_devices(benchmark::State& state) { estimate_on_every_device(state, deep_mlp()); }
BENCHMARK(BM_estimate_100_layers_on_16_devices)->Unit(benchmark::kMicrosecond);

// A small network (linear, relu, linear): what a device's estimate costs beyond its layers'
// predictions, which is most of a coordinator's work estimating a job on a thousand devices.
void BM_estimate_3_layers_on_16_devices(benchmark::State& state) {
  ModelSpec spec;
  spec.name = "mlp-3";
  spec.input_shape = {256};
  spec.layers.push_back(LayerSpec{"linear", {{"out_features", 256}}, {}, {}});
  spec.layers.push_back(LayerSpec{"relu", nlohmann::json::object(), {}, {}});
  spec.layers.push_back(LayerSpec{"linear", {{"out_features", 10}}, {}, {}});
  estimate_on_every_device(state, spec);
}
BENCHMARK(BM_estimate_3_layers_on_16_devices)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
