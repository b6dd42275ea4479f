// Does THOR's decomposition hold on this device? For each model: every layer is probed in its
// own position (1-, 2- and 4-network plans), the decomposed layer energies are summed
// (THOR equation 1), and the sum is compared with the whole model measured in the same
// joule-worker run (all networks interleaved, so drift and temperature hit them alike).
//
// Usage: joule_additivity_bench WORKER DEVICE BATCH MODEL.json... > result.json
// The table goes to stderr; the JSON (every network's reading) to stdout.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "joule/estimator/layer_analysis.hpp"
#include "joule/estimator/thor_probes.hpp"
#include "joule/worker/protocol.hpp"

using nlohmann::json;
namespace est = joule::estimator;

namespace {

struct ModelPlans {
  est::ModelSpec model;
  std::vector<est::ProbePlan> plans;
  std::vector<std::size_t> first_network;  // index of each plan's first network in the request
  std::size_t whole = 0;                   // index of the whole model in the request
};

int fail(const std::string& message) {
  std::cerr << "joule_additivity_bench: " << message << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) return fail("usage: joule_additivity_bench WORKER DEVICE BATCH MODEL.json...");
  const std::string worker = argv[1];
  const std::string device = argv[2];
  const std::int64_t batch = std::stoll(argv[3]);

  joule::worker::ProbeRequest request;
  request.device = device;
  request.batch_size = batch;
  request.warmup_steps = 10;
  request.steps_per_repetition = 10;
  request.repetitions = 3;
  request.min_reading_seconds = 0.5;
  std::vector<ModelPlans> models;
  for (int i = 4; i < argc; ++i) {
    std::ifstream in(argv[i]);
    auto spec = est::parse_model_spec(json::parse(in), "/model");
    if (!spec) return fail(fmt::format("{}: {}", argv[i], spec.error().message));
    auto layers = est::analyze_model(*spec, batch);
    if (!layers) return fail(fmt::format("{}: {}", argv[i], layers.error().message));
    ModelPlans entry{*spec, {}, {}, 0};
    const auto keys = est::layer_keys(*layers);
    for (std::size_t l = 0; l < layers->size(); ++l) {
      if (keys[l].position != est::LayerPosition::output && est::is_free_layer((*layers)[l])) continue;
      est::ProbeTarget target{spec->layers[l], (*layers)[l].input_shape, l == 0 ? spec->input_dtype : "float", batch,
                              keys[l].position, spec->loss};
      auto plan = est::plan_probe(target);
      if (!plan) return fail(fmt::format("{} layer {}: {}", argv[i], l, plan.error().message));
      entry.first_network.push_back(request.networks.size());
      for (const auto& network : plan->networks) request.networks.push_back(network);
      entry.plans.push_back(std::move(plan).value());
    }
    entry.whole = request.networks.size();
    request.networks.push_back(*spec);
    models.push_back(std::move(entry));
  }

  const std::string request_path = "/tmp/joule_additivity_request.json";
  std::ofstream(request_path) << joule::worker::to_json(request).dump();
  FILE* pipe = popen(fmt::format("'{}' probe --request '{}'", worker, request_path).c_str(), "r");
  if (!pipe) return fail("cannot run the worker");
  std::string output;
  char buffer[65536];
  while (std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  if (pclose(pipe) != 0) return fail("the worker failed (see its stderr above)");
  auto result = joule::worker::parse_probe_result(json::parse(output));
  if (!result) return fail(result.error().message);

  std::cerr << fmt::format("device {} ({}), batch {}, meter {} ({}), {:.0f} s\n", device,
                           result->environment.device_name, batch, result->meter_source,
                           result->measured ? "measured" : "NOT measured", result->wall_seconds);
  std::cerr << fmt::format("{:<20} {:>12} {:>12} {:>8} {:>10}\n", "model", "whole J/step", "sum J/step", "error",
                           "layers");
  json rows = json::array();
  for (const auto& entry : models) {
    double sum = 0.0;
    json layers = json::array();
    for (std::size_t p = 0; p < entry.plans.size(); ++p) {
      std::vector<est::NetworkMeasurement> measured;
      for (std::size_t n = 0; n < entry.plans[p].networks.size(); ++n) {
        const auto& network = result->networks[entry.first_network[p] + n];
        measured.push_back({network.joules_per_step, network.seconds_per_step});
      }
      auto sample = est::decompose(entry.plans[p], measured);
      if (!sample) return fail(sample.error().message);
      sum += sample->joules_per_step;
      layers.push_back({{"key", sample->key.name()}, {"joules_per_step", sample->joules_per_step}});
    }
    const double whole = result->networks[entry.whole].joules_per_step;
    const double error = (sum - whole) / whole;
    std::cerr << fmt::format("{:<20} {:>12.4f} {:>12.4f} {:>7.1f}% {:>10}\n", entry.model.name, whole, sum,
                             100.0 * error, entry.plans.size());
    rows.push_back({{"model", entry.model.name},
                    {"whole_joules_per_step", whole},
                    {"sum_of_layers_joules_per_step", sum},
                    {"relative_error", error},
                    {"layers", layers}});
  }
  std::cout << json{{"device", device}, {"batch_size", batch}, {"models", rows}, {"worker", json::parse(output)}}
                   .dump()
            << "\n";
  return 0;
}
