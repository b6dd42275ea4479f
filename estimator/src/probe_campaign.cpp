#include "joule/estimator/probe_campaign.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include <fmt/format.h>

#include "joule/estimator/layer_analysis.hpp"

namespace joule::estimator {
namespace {

// The width argument of each layer type that variations scale.
const char* width_argument(const std::string& type) {
  if (type == "conv2d" || type == "conv1d") return "out_channels";
  if (type == "linear") return "out_features";
  if (type == "lstm" || type == "gru") return "hidden_size";
  if (type == "transformer_encoder_layer") return "dim_feedforward";
  return nullptr;
}

}  // namespace

std::string target_id(const ProbeTarget& target) {
  return fmt::format("{}|{}|{}|{}|{}|{}{}", target.layer.type, target.layer.args.dump(),
                     format_shape(target.input_shape), target.batch_size, static_cast<int>(target.position),
                     target.layer.inputs.size(), target.optimizer.empty() ? "" : "|" + target.optimizer);
}

NetworkMeter simulated_network_meter(SimulatedDevice& device, int repetitions) {
  return [&device, repetitions](const ModelSpec& network, std::int64_t batch,
                                const std::string& optimizer) -> Result<NetworkMeasurement> {
    auto layers = analyze_model(network, batch, "/probe");
    if (!layers) return layers.error();
    std::vector<double> joules, seconds;
    for (int rep = 0; rep < std::max(1, repetitions); ++rep) {
      const auto step = device.measure_step(*layers, network.loss, optimizer);
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
                                           const std::vector<std::int64_t>& batch_sizes, bool variations) {
  std::vector<ProbeTarget> out;
  std::set<std::string> seen;
  auto add = [&](ProbeTarget target) {
    if (!plan_probe(target)) return;  // the variation does not fit its input
    if (seen.insert(target_id(target)).second) out.push_back(std::move(target));
  };
  for (const auto& item : workload) {
    auto layers = analyze_model(item.model, item.batch_size);
    if (!layers) continue;
    if (item.optimizer != "sgd" && is_known_optimizer(item.optimizer)) {
      // The optimizer's step over the network's parameters, and over half and twice as many.
      const std::int64_t parameters = total_cost(*layers).parameters;
      add(optimizer_target(item.optimizer, parameters));
      if (variations) {
        add(optimizer_target(item.optimizer, std::max<std::int64_t>(1, parameters / 2)));
        add(optimizer_target(item.optimizer, 2 * parameters));
      }
    }
    const auto keys = layer_keys(*layers);
    for (std::size_t i = 0; i < layers->size(); ++i) {
      if (keys[i].position != LayerPosition::output && is_free_layer((*layers)[i])) continue;
      ProbeTarget base;
      base.layer = item.model.layers[i];
      base.layer.name.clear();  // the graph's wiring is not the probe's (plan_probe)
      if (!is_join_layer(base.layer.type)) base.layer.inputs.clear();
      base.input_shape = (*layers)[i].input_shape;
      const auto& reads = (*layers)[i].inputs;
      const bool reads_input = std::find(reads.begin(), reads.end(), -1) != reads.end();
      base.input_dtype = reads_input ? item.model.input_dtype : "float";
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
        if (!variations || !width || base.position == LayerPosition::output || !base.layer.args.contains(width))
          continue;
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

namespace {

// Each workload item's (kind, position)s and their shares of its step's work (layer_work). An
// estimate's error in joules is a kind's error times its share, so a kind that is half of every
// step matters 50 times more than one that is 1 %: weighted by how often a kind occurs instead,
// a run spent 38 of 94 probes on residual adds and activations and 3 on the convolutions that
// carry the energy. (Weighting by FLOPs share without the cost below was tried first and spent
// the time on the costliest probes: 16.5 % against 9.0 % GP MAPE per second on the CPU,
// probe_accuracy.) Work is what the planner knows before the model can estimate the item; then
// the item's estimated energy takes its place (ProbePlanner::weights).
std::map<std::string, double> work_shares(const std::vector<AnalyzedLayer>& layers, const std::string& optimizer) {
  const auto keys = layer_keys(layers);
  std::map<std::string, double> work;
  double total = 0.0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].position != LayerPosition::output && is_free_layer(layers[i])) continue;
    const double w = layer_work(layers[i].cost);
    work[keys[i].name()] += w;
    total += w;
  }
  if (optimizer != "sgd") {
    const double w = layer_work(optimizer_step(total_cost(layers).parameters).cost);
    work[LayerKey{optimizer_kind(optimizer), LayerPosition::output}.name()] += w;
    total += w;
  }
  for (auto& [key, w] : work) w = total > 0.0 ? w / total : 0.0;
  return work;
}

// The seed design's coordinates of a plan: its GP inputs on their log scale.
Eigen::VectorXd design_point(const ProbePlan& plan) {
  auto features = plan.analyzed.features;
  features["batch_size"] = static_cast<double>(plan.target.batch_size);
  return DeviceEnergyModel::feature_vector(features, DeviceEnergyModel::feature_names(features));
}

double distance_to_nearest(const Eigen::VectorXd& point, const std::vector<Eigen::VectorXd>& others) {
  double nearest = std::numeric_limits<double>::infinity();
  for (const auto& other : others)
    if (other.size() == point.size()) nearest = std::min(nearest, (other - point).norm());
  return nearest;
}

// What a plan costs to measure, in units of one small network: the worker times each network
// for a fixed span (its readings last at least [probing] reading_seconds), longer where one step
// takes longer than that, so a network costs max(1, its FLOPs / kFlopsPerReading); plus the
// worker's start.
double plan_cost(const ProbePlan& plan) {
  constexpr double kFlopsPerReading = 2e9;
  constexpr double kWorkerStart = 0.5;
  double cost = kWorkerStart;
  for (const auto& network : plan.networks) {
    double flops = 0.0;
    if (auto layers = analyze_model(network, plan.target.batch_size)) flops = total_flops(*layers);
    cost += std::max(1.0, flops / kFlopsPerReading);
  }
  return cost;
}

}  // namespace

LayerKey planned_key(const ProbePlan& plan) {
  if (!plan.target.optimizer.empty()) return LayerKey{optimizer_kind(plan.target.optimizer), LayerPosition::output};
  return LayerKey{model_kind(plan.analyzed), plan.target.position};
}

ProbePlanner::ProbePlanner(std::vector<WorkloadItem> workload, const CampaignOptions& options, double target_sigma)
    : batch_sizes_(options.batch_sizes), seed_samples_(options.seed_samples), target_sigma_(target_sigma) {
  set_workload(std::move(workload));
}

void ProbePlanner::set_workload(std::vector<WorkloadItem> workload) {
  ++revision_;
  items_.clear();
  for (const auto& item : workload) {
    auto layers = analyze_model(item.model, item.batch_size);
    if (!layers) continue;
    TrainingConfig training;
    training.batch_size = item.batch_size;
    training.samples_per_epoch = item.batch_size;  // one step: shares, not totals
    training.optimizer = item.optimizer;
    items_.push_back({*layers, training, work_shares(*layers, item.optimizer)});
  }
  workload_items_ = workload.size();
  plans_.clear();
  ids_.clear();
  exact_.clear();
  keys_.clear();
  costs_.clear();
  // The workload's own configurations: each item's layers at the item's batch size.
  std::set<std::string> exact;
  for (const auto& target : candidate_targets(workload, {}, /*variations=*/false)) exact.insert(target_id(target));
  for (const auto& target : candidate_targets(workload, batch_sizes_)) {
    auto plan = plan_probe(target);
    if (!plan) continue;
    ids_.push_back(target_id(target));
    exact_.push_back(exact.contains(ids_.back()));
    keys_.push_back(planned_key(*plan).name());
    costs_.push_back(plan_cost(*plan));
    plans_.push_back(std::move(plan).value());
  }
  // Targets probed before (by id) keep their design points under the new plans.
  probed_points_.clear();
  for (std::size_t i = 0; i < plans_.size(); ++i)
    if (probed_.contains(ids_[i])) probed_points_[keys_[i]].push_back(design_point(plans_[i]));
}

void ProbePlanner::mark_probed(const ProbeTarget& target) {
  const std::string id = target_id(target);
  if (!probed_.insert(id).second) return;
  ++revision_;
  for (std::size_t i = 0; i < plans_.size(); ++i) {
    if (ids_[i] == id) {
      ++per_key_[keys_[i]];
      probed_points_[keys_[i]].push_back(design_point(plans_[i]));
      return;
    }
  }
  // Not a candidate of this workload (an earlier one's): count it under its own key.
  if (auto plan = plan_probe(target)) ++per_key_[planned_key(*plan).name()];
}

void ProbePlanner::unmark_probed(const ProbeTarget& target) {
  const std::string id = target_id(target);
  if (probed_.erase(id) == 0) return;
  ++revision_;
  const auto forget = [&](const std::string& key) {
    if (auto it = per_key_.find(key); it != per_key_.end() && it->second > 0) --it->second;
  };
  for (std::size_t i = 0; i < plans_.size(); ++i) {
    if (ids_[i] != id) continue;
    forget(keys_[i]);
    auto& points = probed_points_[keys_[i]];
    const Eigen::VectorXd point = design_point(plans_[i]);
    for (auto it = points.begin(); it != points.end(); ++it) {
      if (it->size() == point.size() && *it == point) {
        points.erase(it);
        break;
      }
    }
    return;
  }
  if (auto plan = plan_probe(target)) forget(planned_key(*plan).name());
}

std::set<std::string> ProbePlanner::keys_with_unprobed_exact() const {
  std::set<std::string> keys;
  for (std::size_t i = 0; i < plans_.size(); ++i)
    if (exact_[i] && !probed_.contains(ids_[i])) keys.insert(keys_[i]);
  return keys;
}

std::size_t ProbePlanner::probes_of(const std::string& key) const {
  const auto it = per_key_.find(key);
  return it == per_key_.end() ? 0 : it->second;
}

bool ProbePlanner::seeding() const {
  for (std::size_t i = 0; i < plans_.size(); ++i) {
    if (probed_.contains(ids_[i])) continue;
    if (probes_of(keys_[i]) < seed_samples_) return true;
  }
  return false;
}

std::optional<ProbePlan> ProbePlanner::next(const DeviceEnergyModel& model) const {
  auto planned = next_planned(model);
  if (!planned) return std::nullopt;
  return std::move(planned->plan);
}

std::optional<PlannedProbe> ProbePlanner::next_planned(const DeviceEnergyModel& model) const {
  // Model revisions are unique across models, so a stamp equal to the last one is the same
  // model (or an unchanged copy of it).
  if (last_ && last_->model_revision == model.revision() && last_->planner_revision == revision_) return last_->planned;
  last_ = LastAnswer{model.revision(), revision_, plan_next(model)};
  return last_->planned;
}

std::optional<PlannedProbe> ProbePlanner::plan_next(const DeviceEnergyModel& model) const {
  constexpr double kAlways = std::numeric_limits<double>::infinity();
  // Seed phase, breadth first: the key with the fewest probes below seed_samples gets a probe,
  // so every kind the workload needs has one sample (and its prior: an estimate) before any has
  // two. Seeds are the workload's own configurations while the key has unprobed ones, then its
  // variations: the first the medoid of them (the one nearest all the others), the next ones
  // the farthest from what the key has (maximin). Seeds drawn from the variations from the
  // start went to the extremes (twice the width at batch 128), costing minutes each and pulling
  // the model towards configurations nobody runs.
  const auto with_exact = keys_with_unprobed_exact();
  auto seed_candidate = [&](std::size_t i) { return exact_[i] || !with_exact.contains(keys_[i]); };
  std::optional<std::size_t> seed_pick;
  std::size_t fewest = seed_samples_;
  double best_seed = -std::numeric_limits<double>::infinity();
  std::map<std::string, std::vector<Eigen::VectorXd>> exact_points;  // per key, for medoids
  for (std::size_t i = 0; i < plans_.size(); ++i) {
    if (probed_.contains(ids_[i]) || !seed_candidate(i)) continue;
    const std::size_t have = probes_of(keys_[i]);
    if (have >= seed_samples_ || have > fewest) continue;
    const auto points = probed_points_.find(keys_[i]);
    double score = 0.0;
    if (points == probed_points_.end() || points->second.empty()) {
      auto& others = exact_points[keys_[i]];
      if (others.empty()) {
        for (std::size_t j = 0; j < plans_.size(); ++j)
          if (keys_[j] == keys_[i] && seed_candidate(j) && !probed_.contains(ids_[j]))
            others.push_back(design_point(plans_[j]));
      }
      const auto here = design_point(plans_[i]);
      double total = 0.0;
      for (const auto& other : others)
        if (other.size() == here.size()) total += (other - here).norm();
      score = -total;
    } else {
      score = distance_to_nearest(design_point(plans_[i]), points->second);
    }
    if (have < fewest || score > best_seed) {
      fewest = have;
      best_seed = score;
      seed_pick = i;
    }
  }
  if (seed_pick) return PlannedProbe{plans_[*seed_pick], kAlways, costs_[*seed_pick]};

  // Then the most valuable probe per unit of cost: its expected fall of the workload's error,
  // its key's share of the workload (weights) × σ × (1 − √(n / (n + 1))), × the bonus of an exact
  // configuration, over sqrt(cost) (a probe twice as long must be worth more than one cheap one,
  // but not twice: the costly configurations are the workload's big layers, which carry most of
  // its energy). σ is the model's latent σ, but never less than a prior's shrunk by the key's
  // samples, kSparseSigma × sqrt(seed_samples / n): a GP on three samples can claim to be sure
  // everywhere (measured: a collapsed fit left a kind with most of the workload's energy at its
  // 3 seeds while cheap kinds got 11-15 probes).
  // The fall, not σ alone: with σ × share the greedy choice gives a key probes in proportion to
  // its share squared, so the kind with most of the work took 57 of 104 probes while the
  // recurrent and linear kinds of the same workload kept their 3 seeds and erred by 40-85 %
  // (run 5 of e2e_accuracy, its tuning networks). Minimising Σ share × σ(n) for a budget of
  // probes gives each key samples in proportion to share^(2/3), which is what the fall does.
  const auto weights = this->weights(model);
  double best_score = -1.0;
  double best_reduction = 0.0;
  std::optional<std::size_t> best;
  for (std::size_t i = 0; i < plans_.size(); ++i) {
    if (probed_.contains(ids_[i])) continue;
    const auto& plan = plans_[i];
    double sigma = model.uncertainty(planned_key(plan), plan.analyzed, plan.target.batch_size);
    if (!std::isfinite(sigma)) {
      // No model at all (its seeds failed or their subtraction came out negative and was
      // dropped): every network with this kind lacks an estimate, whatever its share.
      const double score = 1e9 * (exact_[i] ? kExactBonus : 1.0) / std::sqrt(costs_[i]);
      if (score > best_score) {
        best_score = score;
        best_reduction = kAlways;
        best = i;
      }
      continue;
    }
    if (sigma < target_sigma_) continue;
    const double n = static_cast<double>(std::max<std::size_t>(1, probes_of(keys_[i])));
    sigma = std::max(sigma, kSparseSigma * std::sqrt(static_cast<double>(seed_samples_) / n));
    const auto weight = weights.find(keys_[i]);
    const double share = weight == weights.end() ? 0.0 : weight->second;
    const double reduction = share * sigma * (1.0 - std::sqrt(n / (n + 1.0)));
    const double score = reduction * (exact_[i] ? kExactBonus : 1.0) / std::sqrt(costs_[i]);
    if (score > best_score) {
      best_score = score;
      best_reduction = workload_items_ > 0 ? reduction / static_cast<double>(workload_items_) : 0.0;
      best = i;
    }
  }
  if (!best) return std::nullopt;
  return PlannedProbe{plans_[*best], best_reduction, costs_[*best]};
}

std::map<std::string, double> ProbePlanner::weights(const DeviceEnergyModel& model) const {
  std::map<std::string, double> weights;
  for (const auto& item : items_) {
    std::map<std::string, double> shares;
    double total = 0.0;
    if (auto estimate = model.estimate(item.layers, item.training)) {
      for (const auto& layer : estimate->layers) {
        if (!(layer.joules_per_step.mean > 0.0)) continue;
        shares[layer.key] += layer.joules_per_step.mean;
        total += layer.joules_per_step.mean;
      }
    }
    if (total > 0.0) {
      for (const auto& [key, joules] : shares) weights[key] += joules / total;
    } else {
      for (const auto& [key, share] : item.work_shares) weights[key] += share;
    }
  }
  return weights;
}

double ProbePlanner::worst_uncertainty(const DeviceEnergyModel& model) const {
  double worst = 0.0;
  for (std::size_t i = 0; i < plans_.size(); ++i) {
    if (probed_.contains(ids_[i])) continue;
    const auto& plan = plans_[i];
    worst = std::max(worst, model.uncertainty(planned_key(plan), plan.analyzed, plan.target.batch_size));
  }
  return worst;
}

Result<CampaignReport> run_campaign(DeviceEnergyModel& model, const std::vector<WorkloadItem>& workload,
                                    const NetworkMeter& meter, const CampaignOptions& options) {
  ProbePlanner planner(workload, options);
  if (planner.candidate_count() == 0)
    return make_error(ErrorCode::invalid_argument, "the workload gives nothing to probe");
  CampaignReport report;
  std::size_t since_fit = 0;
  bool fitted_after_seeds = false;
  while (report.probes < options.probes) {
    // The variance-driven phase needs fitted models: fit as soon as the seeds are in.
    if (!fitted_after_seeds && !planner.seeding()) {
      if (auto fitted = model.fit(options.gp); !fitted) return fitted.error();
      fitted_after_seeds = true;
      since_fit = 0;
    }
    auto plan = planner.next(model);
    if (!plan) break;  // every candidate probed
    planner.mark_probed(plan->target);
    std::vector<NetworkMeasurement> measured;
    bool failed = false;
    for (std::size_t i = 0; i < plan->networks.size(); ++i) {
      const auto& network = plan->networks[i];
      auto result = meter(network, plan->target.batch_size, plan->optimizers.empty() ? "sgd" : plan->optimizers[i]);
      ++report.networks_measured;
      if (!result) {
        ++report.failed_measurements;  // counted and skipped
        failed = true;
        break;
      }
      measured.push_back(*result);
      if (auto layers = analyze_model(network, plan->target.batch_size))
        model.add_network(total_flops(*layers), result->joules_per_step);
    }
    if (failed) continue;
    if (auto sample = decompose(*plan, measured)) {
      model.add_sample(*sample);
      ++report.probes;
    }
    if (fitted_after_seeds && ++since_fit >= options.refit_every) {
      if (auto fitted = model.fit(options.gp); !fitted) return fitted.error();
      since_fit = 0;
    }
  }
  if (auto fitted = model.fit(options.gp); !fitted) return fitted.error();
  return report;
}

}  // namespace joule::estimator
