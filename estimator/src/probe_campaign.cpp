#include "joule/estimator/probe_campaign.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "joule/estimator/layer_analysis.hpp"

namespace joule::estimator {
namespace {

// The width argument of each layer type that variations scale.
const char* width_argument(const std::string& type) {
  if (type == "conv2d") return "out_channels";
  if (type == "linear") return "out_features";
  if (type == "lstm" || type == "gru") return "hidden_size";
  if (type == "transformer_encoder_layer") return "dim_feedforward";
  return nullptr;
}

std::string target_id(const ProbeTarget& target) {
  return fmt::format("{}|{}|{}|{}|{}", target.layer.type, target.layer.args.dump(), format_shape(target.input_shape),
                     target.batch_size, static_cast<int>(target.position));
}

}  // namespace

NetworkMeter simulated_network_meter(SimulatedDevice& device, int repetitions) {
  return [&device, repetitions](const ModelSpec& network, std::int64_t batch) -> Result<NetworkMeasurement> {
    auto layers = analyze_model(network, batch, "/probe");
    if (!layers) return layers.error();
    std::vector<double> joules, seconds;
    for (int rep = 0; rep < std::max(1, repetitions); ++rep) {
      const auto step = device.measure_step(*layers, network.loss);
      joules.push_back(step.joules);
      seconds.push_back(step.seconds);
    }
    // The median resists the upward outliers real probes show.
    const auto middle = joules.size() / 2;
    std::nth_element(joules.begin(), joules.begin() + static_cast<std::ptrdiff_t>(middle), joules.end());
    std::nth_element(seconds.begin(), seconds.begin() + static_cast<std::ptrdiff_t>(middle), seconds.end());
    return NetworkMeasurement{joules[middle], seconds[middle]};
  };
}

std::vector<ProbeTarget> candidate_targets(const std::vector<WorkloadItem>& workload,
                                           const std::vector<std::int64_t>& batch_sizes) {
  std::vector<ProbeTarget> out;
  std::set<std::string> seen;
  auto add = [&](ProbeTarget target) {
    if (!plan_probe(target)) return;  // the variation does not fit its input
    if (seen.insert(target_id(target)).second) out.push_back(std::move(target));
  };
  for (const auto& item : workload) {
    auto layers = analyze_model(item.model, item.batch_size);
    if (!layers) continue;
    const auto keys = layer_keys(*layers);
    for (std::size_t i = 0; i < layers->size(); ++i) {
      if (keys[i].position != LayerPosition::output && is_free_layer((*layers)[i])) continue;
      ProbeTarget base;
      base.layer = item.model.layers[i];
      base.input_shape = (*layers)[i].input_shape;
      base.input_dtype = i == 0 ? item.model.input_dtype : "float";
      base.position = keys[i].position;
      base.loss = item.model.loss;
      std::vector<std::int64_t> batches = batch_sizes;
      batches.push_back(item.batch_size);
      for (auto batch : batches) {
        ProbeTarget target = base;
        target.batch_size = batch;
        add(target);
        const char* width = width_argument(base.layer.type);
        // The output layer's width is the number of classes: keep it.
        if (!width || base.position == LayerPosition::output || !base.layer.args.contains(width)) continue;
        const auto value = base.layer.args[width].get<std::int64_t>();
        for (double factor : {0.5, 0.75, 1.5, 2.0}) {
          ProbeTarget varied = target;
          varied.layer.args[width] = std::max<std::int64_t>(1, std::llround(static_cast<double>(value) * factor));
          add(varied);
        }
      }
    }
  }
  return out;
}

Result<CampaignReport> run_campaign(DeviceEnergyModel& model, const std::vector<WorkloadItem>& workload,
                                    const NetworkMeter& meter, const CampaignOptions& options) {
  const auto candidates = candidate_targets(workload, options.batch_sizes);
  if (candidates.empty()) return make_error(ErrorCode::invalid_argument, "the workload gives nothing to probe");
  // How often each (kind, position) occurs in the workload: the weight of its uncertainty.
  std::map<std::string, double> weight;
  for (const auto& item : workload) {
    if (auto layers = analyze_model(item.model, item.batch_size)) {
      const auto keys = layer_keys(*layers);
      for (std::size_t i = 0; i < keys.size(); ++i)
        if (keys[i].position == LayerPosition::output || !is_free_layer((*layers)[i])) weight[keys[i].name()] += 1.0;
    }
  }
  std::vector<ProbePlan> plans;
  plans.reserve(candidates.size());
  for (const auto& target : candidates) plans.push_back(*plan_probe(target));

  std::mt19937_64 rng(options.seed);
  std::vector<bool> used(plans.size(), false);
  std::map<std::string, std::size_t> probed;
  CampaignReport report;
  std::size_t since_fit = 0;

  auto run_probe = [&](std::size_t index) -> Status {
    used[index] = true;
    const ProbePlan& plan = plans[index];
    std::vector<NetworkMeasurement> measured;
    for (const auto& network : plan.networks) {
      auto result = meter(network, plan.target.batch_size);
      ++report.networks_measured;
      if (!result) {
        ++report.failed_measurements;
        return result.error();
      }
      measured.push_back(*result);
      if (auto layers = analyze_model(network, plan.target.batch_size))
        model.add_network(total_flops(*layers), result->joules_per_step);
    }
    auto sample = decompose(plan, measured);
    if (!sample) return sample.error();
    model.add_sample(*sample);
    ++probed[sample->key.name()];
    ++report.probes;
    return {};
  };

  // Seed: a few probes per needed (kind, position), picked at random among its candidates.
  std::vector<std::size_t> order(plans.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  for (std::size_t round = 0; round < options.seed_samples && report.probes < options.probes; ++round) {
    std::set<std::string> done_this_round;
    for (std::size_t index : order) {
      if (report.probes >= options.probes) break;
      const std::string key = LayerKey{plans[index].target.layer.type, plans[index].target.position}.name();
      if (used[index] || done_this_round.contains(key) || probed[key] > round) continue;
      done_this_round.insert(key);
      (void)run_probe(index);  // a failed measurement is counted and skipped
    }
  }
  if (auto fitted = model.fit(options.gp); !fitted) return fitted.error();

  // Then where the model is least sure, weighted by how much the workload needs it.
  while (report.probes < options.probes) {
    double best_score = -1.0;
    std::size_t best = plans.size();
    for (std::size_t i = 0; i < plans.size(); ++i) {
      if (used[i]) continue;
      const auto& plan = plans[i];
      const LayerKey key{plan.target.layer.type, plan.target.position};
      double sigma = model.uncertainty(key, plan.analyzed, plan.target.batch_size);
      if (!std::isfinite(sigma)) sigma = 10.0;
      const double score = sigma * std::sqrt(weight[key.name()]);
      if (score > best_score) {
        best_score = score;
        best = i;
      }
    }
    if (best == plans.size()) break;  // every candidate probed
    (void)run_probe(best);
    if (++since_fit >= options.refit_every) {
      if (auto fitted = model.fit(options.gp); !fitted) return fitted.error();
      since_fit = 0;
    }
  }
  if (auto fitted = model.fit(options.gp); !fitted) return fitted.error();
  return report;
}

}  // namespace joule::estimator
