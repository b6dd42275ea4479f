#include "joule/simulator/world.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "joule/estimator/data_parallel.hpp"
#include "joule/estimator/device_energy_model.hpp"
#include "joule/estimator/knob_response.hpp"
#include "joule/estimator/layer_analysis.hpp"
#include "joule/estimator/probe_campaign.hpp"
#include "joule/estimator/simulated_device.hpp"
#include "joule/estimator/thor_probes.hpp"
#include "joule/schedulers/job.hpp"

namespace joule::simulator {
namespace {

using schedulers::UnixMillis;

// SplitMix64: independent, reproducible streams from one seed.
std::uint64_t mix(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  std::uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (stream * 1000003ULL + index + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

enum Stream : std::uint64_t { kProbeNoise = 1, kCampaign = 2, kJobFactor = 3, kCoresProbe = 4 };

std::string analysis_key(const TraceJob& job) { return fmt::format("{}@{}", job.model_key, job.training.batch_size); }

// log-std of the median of `values` (their spread / sqrt(n), times 1.25 for a median).
double median_log_std(const std::vector<double>& values) {
  if (values.size() < 2) return 0.0;
  double mean = 0.0;
  for (double v : values) mean += std::log(v);
  mean /= static_cast<double>(values.size());
  double square = 0.0;
  for (double v : values) square += (std::log(v) - mean) * (std::log(v) - mean);
  const double spread = std::sqrt(square / static_cast<double>(values.size() - 1));
  return 1.25 * spread / std::sqrt(static_cast<double>(values.size()));
}

// A network's per-step cost at a setting as probes measure it: the median of 5 noisy steps,
// with the log-std of each median.
struct MedianStep {
  double joules = 0.0;
  double seconds = 0.0;
  double joules_log_std = 0.0;
  double seconds_log_std = 0.0;
};

MedianStep median_step(estimator::SimulatedDevice& hardware, const std::vector<estimator::AnalyzedLayer>& layers,
                       const std::string& loss, const std::string& optimizer,
                       const estimator::SimulatedSetting& setting) {
  std::vector<double> joules, seconds;
  for (int i = 0; i < 5; ++i) {
    const auto step = hardware.measure_step(layers, loss, optimizer, setting);
    joules.push_back(step.joules);
    seconds.push_back(step.seconds);
  }
  MedianStep out{0.0, 0.0, median_log_std(joules), median_log_std(seconds)};
  std::nth_element(joules.begin(), joules.begin() + 2, joules.end());
  std::nth_element(seconds.begin(), seconds.begin() + 2, seconds.end());
  out.joules = joules[2];
  out.seconds = seconds[2];
  return out;
}

// A network at `cores` of a device that shares `shared` of them, against the whole device, as
// jouled's probes measure it (estimator/thread_count.hpp): the worker at that many threads on
// the otherwise idle device, metered whole (the slice's dynamic energy, all of the device's
// static power), the median of 5 noisy steps each.
estimator::RatioPrediction measure_at_cores(const estimator::SimulatedProfile& whole, int cores, int shared,
                                            const std::vector<estimator::AnalyzedLayer>& layers,
                                            const std::string& loss, const std::string& optimizer, std::uint64_t seed) {
  const estimator::SimulatedProfile slice = estimator::cores_slice(whole, cores, shared);
  estimator::SimulatedDevice on_slice(slice, seed);
  estimator::SimulatedDevice on_whole(whole, seed + 1);
  MedianStep at = median_step(on_slice, layers, loss, optimizer, estimator::SimulatedSetting{});
  at.joules += (whole.static_watts - slice.static_watts) * at.seconds;
  const MedianStep base = median_step(on_whole, layers, loss, optimizer, estimator::SimulatedSetting{});
  return {at.seconds / base.seconds, std::hypot(at.seconds_log_std, base.seconds_log_std), at.joules / base.joules,
          std::hypot(at.joules_log_std, base.joules_log_std)};
}

// knob_probes = networks: each workload network measured at every setting and at the defaults
// (median of 5 steps each); per network key, per setting index, the ratios and their spread.
std::map<std::string, std::vector<estimator::RatioPrediction>> measure_networks_at_settings(
    estimator::SimulatedDevice& hardware, const std::vector<estimator::WorkloadItem>& workload,
    const std::vector<std::string>& keys) {
  std::map<std::string, std::vector<estimator::RatioPrediction>> out;
  const auto& knob = hardware.profile().knob;
  if (knob.settings.size() < 2) return out;
  for (std::size_t i = 0; i < workload.size(); ++i) {
    auto layers = estimator::analyze_model(workload[i].model, workload[i].batch_size);
    if (!layers) continue;
    const std::string& loss = workload[i].model.loss;
    const std::string& optimizer = workload[i].optimizer;
    const MedianStep base = median_step(hardware, *layers, loss, optimizer, knob.settings[0]);
    std::vector<estimator::RatioPrediction>& ratios = out[keys[i]];
    ratios.resize(knob.settings.size());
    for (std::size_t s = 1; s < knob.settings.size(); ++s) {
      const MedianStep at = median_step(hardware, *layers, loss, optimizer, knob.settings[s]);
      ratios[s] = {at.seconds / base.seconds, std::hypot(at.seconds_log_std, base.seconds_log_std),
                   at.joules / base.joules, std::hypot(at.joules_log_std, base.joules_log_std)};
    }
  }
  return out;
}

// The device's response to each of its knob settings (index as the profile's settings; the
// default's is empty), learnt as jouled would: up to 24 THOR probe networks of its workload,
// spread over the candidate targets, measured at every setting and at the defaults. Not the
// trace's own networks: the response must carry over to networks it never measured.
std::vector<std::optional<estimator::KnobResponse>> learn_knob_response(
    estimator::SimulatedDevice& hardware, const std::vector<estimator::WorkloadItem>& workload) {
  const auto& knob = hardware.profile().knob;
  std::vector<std::optional<estimator::KnobResponse>> responses(knob.settings.size());
  if (knob.settings.size() < 2) return responses;
  constexpr std::size_t kNetworks = 24;
  const auto targets = estimator::candidate_targets(workload, {}, false);
  const std::size_t stride = std::max<std::size_t>(1, targets.size() / kNetworks);
  std::vector<std::pair<std::vector<estimator::AnalyzedLayer>, std::string>> networks;
  for (std::size_t i = 0; i < targets.size() && networks.size() < kNetworks; i += stride) {
    if (!targets[i].optimizer.empty()) continue;
    auto plan = estimator::plan_probe(targets[i]);
    if (!plan || plan->networks.empty()) continue;
    auto layers = estimator::analyze_model(plan->networks[0], targets[i].batch_size);
    if (layers) networks.emplace_back(std::move(layers).value(), plan->networks[0].loss);
  }
  // Each network at the defaults once: its features, power there, and the base of its ratios.
  std::vector<MedianStep> at_default;
  std::vector<estimator::NetworkFeatures> features;
  for (const auto& [layers, loss] : networks) {
    at_default.push_back(median_step(hardware, layers, loss, "sgd", knob.settings[0]));
    features.push_back(estimator::network_features(layers));
    features.back().watts = at_default.back().joules / at_default.back().seconds;
  }
  for (std::size_t s = 1; s < knob.settings.size(); ++s) {
    std::vector<estimator::KnobSample> samples;
    for (std::size_t n = 0; n < networks.size(); ++n) {
      const MedianStep at = median_step(hardware, networks[n].first, networks[n].second, "sgd", knob.settings[s]);
      samples.push_back({features[n], at.seconds / at_default[n].seconds, at.joules / at_default[n].joules});
    }
    if (auto fitted = estimator::KnobResponse::fit(samples, knob.settings[s].power_limit_watts))
      responses[s] = std::move(fitted).value();
  }
  return responses;
}

// A ring all-reduce of a step's gradients (4 bytes a parameter) over `gpus` GPUs: the link figures
// are assumptions (NVLink-class), not calibrated (see world.hpp).
constexpr double kLinkBytesPerSecond = 100e9;
constexpr double kLinkLatencySeconds = 10e-6;
double all_reduce_seconds(const std::vector<estimator::AnalyzedLayer>& layers, int gpus) {
  double bytes = 0.0;
  for (const auto& layer : layers) bytes += layer.cost.parameter_bytes;
  const double hops = 2.0 * (gpus - 1);
  return hops / gpus * bytes / kLinkBytesPerSecond + hops * kLinkLatencySeconds;
}

}  // namespace

Result<World> build_world(const ClusterSpec& cluster, const Trace& trace, const schedulers::Policy& policy,
                          const WorldOptions& options) {
  World world;
  world.start = cluster.start;
  world.carbon = cluster.carbon;
  world.price = cluster.price;
  world.utc_offset_minutes = cluster.utc_offset_minutes;
  for (const auto& node : cluster.nodes) {
    world.nodes.push_back(SimNode{node.name, node.battery, node.solar});
    std::vector<std::string> groups = node.groups;
    for (const auto& group : policy.groups_of(node.name))
      if (std::find(groups.begin(), groups.end(), group) == groups.end()) groups.push_back(group);
    for (const auto& device : node.devices)
      world.devices.push_back(SimDevice{schedulers::DeviceRef{node.name, device.name, groups}, world.nodes.size() - 1,
                                        device.profile, device.idle_watts, device.cores,
                                        device.name.rfind("cuda:", 0) == 0 ? node.name + ": " + device.profile : ""});
  }

  // Jobs in submission order; each job's eligible devices; each network analysed once per batch.
  std::vector<std::size_t> order(trace.jobs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return trace.jobs[a].at_seconds < trace.jobs[b].at_seconds; });
  std::map<std::string, std::vector<estimator::AnalyzedLayer>> analysed;
  std::vector<std::vector<std::size_t>> eligible(trace.jobs.size());
  for (std::size_t j = 0; j < trace.jobs.size(); ++j) {
    const TraceJob& job = trace.jobs[j];
    schedulers::Constraints constraints;
    constraints.devices = job.devices;
    for (std::size_t d = 0; d < world.devices.size(); ++d) {
      const auto& ref = world.devices[d].ref;
      const bool allowed =
          schedulers::device_allowed(constraints, ref.qualified()) || schedulers::device_allowed(constraints, ref.name);
      if (allowed && (job.gpus == 0 || !world.devices[d].group.empty())) eligible[j].push_back(d);
    }
    if (eligible[j].empty())
      return make_error(
          ErrorCode::invalid_argument,
          fmt::format("{}:{}: /constraints/devices: no device of the cluster matches", trace.source, job.line),
          fmt::format("{}:{}", trace.source, job.line));
    const std::string key = analysis_key(job);
    if (analysed.contains(key)) continue;
    auto layers = estimator::analyze_model(job.model, job.training.batch_size, "/model");
    if (!layers)
      return make_error(
          ErrorCode::invalid_argument,
          fmt::format("{}:{}: {}: {}", trace.source, job.line, layers.error().where, layers.error().message),
          fmt::format("{}:{}", trace.source, job.line));
    analysed.emplace(key, std::move(layers).value());
  }

  // Each device's model, learnt from probes planned from the networks it may be asked to run.
  // Campaigns are independent (own simulated hardware, own seeds), so they run on threads and
  // the result does not depend on how many.
  std::vector<estimator::SimulatedDevice> truths;
  std::vector<std::size_t> probes;
  for (const auto& node : cluster.nodes)
    for (const auto& spec : node.devices) probes.push_back(options.probes > 0 ? options.probes : spec.probes);
  for (const auto& device : world.devices) {
    auto profile = estimator::find_simulated_profile(device.profile);
    if (!profile) return profile.error();
    truths.emplace_back(*profile, 0);
  }
  std::vector<std::optional<estimator::DeviceEnergyModel>> models(world.devices.size());
  // Per device, per knob setting (index into the profile's settings; 0, the default, unused).
  std::vector<std::vector<std::optional<estimator::KnobResponse>>> responses(world.devices.size());
  // knob_probes = networks: per device, per workload network (its key), per setting.
  std::vector<std::map<std::string, std::vector<estimator::RatioPrediction>>> measured(world.devices.size());
  std::vector<std::string> failures(world.devices.size());
  auto learn = [&](std::size_t d) {
    const SimDevice& device = world.devices[d];
    std::vector<estimator::WorkloadItem> workload;
    std::vector<std::string> keys;  // of each workload item
    std::set<std::string> seen;
    for (std::size_t j = 0; j < trace.jobs.size(); ++j) {
      if (std::find(eligible[j].begin(), eligible[j].end(), d) == eligible[j].end()) continue;
      const auto& job = trace.jobs[j];
      if (seen.insert(analysis_key(job) + "|" + job.training.optimizer).second) {
        workload.push_back(estimator::WorkloadItem{job.model, job.training.batch_size, job.training.optimizer});
        keys.push_back(analysis_key(job) + "|" + job.training.optimizer);
      }
    }
    if (workload.empty()) return;
    estimator::SimulatedDevice hardware(truths[d].profile(), mix(options.seed, kProbeNoise, d));
    const estimator::NetworkMeter meter = estimator::simulated_network_meter(hardware, 5);
    estimator::DeviceEnergyModel model(device.ref.qualified(), "simulated");
    estimator::CampaignOptions campaign;
    campaign.probes = probes[d];
    campaign.seed = mix(options.seed, kCampaign, d);
    campaign.gp.restarts = options.gp_restarts;
    campaign.refit_every = std::max<std::size_t>(1, options.refit_every);
    auto report = estimator::run_campaign(model, workload, meter, campaign);
    if (!report)
      failures[d] = report.error().message;
    else
      models[d] = std::move(model);
    if (options.knob_probes == WorldOptions::KnobProbes::networks)
      measured[d] = measure_networks_at_settings(hardware, workload, keys);
    else
      responses[d] = learn_knob_response(hardware, workload);
  };
  const std::size_t threads =
      std::clamp<std::size_t>(options.threads, 1, std::max<std::size_t>(1, world.devices.size()));
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (std::size_t d = next++; d < world.devices.size(); d = next++) learn(d);
  };
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& thread : pool) thread.join();
  for (std::size_t d = 0; d < world.devices.size(); ++d)
    if (!failures[d].empty())
      world.notes.push_back(fmt::format("{}: probe campaign failed ({}); its jobs have no estimate",
                                        world.devices[d].ref.qualified(), failures[d]));

  std::map<std::string, std::size_t> no_model;  // by device
  // How well the knob responses predict what a setting does to a job's energy, by device:
  // |predicted ratio to the default - true ratio| / true ratio, summed, and how many.
  struct KnobError {
    double energy = 0.0;
    double time = 0.0;
    std::size_t count = 0;
  };
  std::map<std::string, KnobError> knob_errors;
  for (const std::size_t j : order) {
    const TraceJob& job = trace.jobs[j];
    SimJob sim;
    sim.id = fmt::format("{}:{}", job.line, job.name);
    sim.name = job.name;
    sim.submit = world.start + static_cast<UnixMillis>(std::llround(job.at_seconds * 1000.0));
    sim.priority = job.priority;
    sim.owner = job.owner;
    sim.project = job.project;
    if (job.deadline_seconds)
      sim.deadline = sim.submit + static_cast<UnixMillis>(std::llround(*job.deadline_seconds * 1000.0));
    if (job.not_before_seconds)
      sim.not_before = sim.submit + static_cast<UnixMillis>(std::llround(*job.not_before_seconds * 1000.0));
    sim.max_energy_joules = job.max_energy_joules;
    sim.max_slowdown = job.max_slowdown;
    sim.epochs = static_cast<int>(std::min<std::int64_t>(job.training.epochs, 1'000'000));
    sim.cores = job.cores;
    sim.gpus = job.gpus;
    sim.cores_max = job.cores_max;

    std::mt19937_64 rng(mix(options.seed, kJobFactor, j));
    std::normal_distribution<double> normal(0.0, options.truth_sigma);
    const double factor = options.truth_sigma > 0.0 ? std::exp(normal(rng)) : 1.0;
    const auto& layers = analysed.at(analysis_key(job));
    const double steps = static_cast<double>(estimator::steps_of(job.training));
    const estimator::NetworkFeatures features = estimator::network_features(layers);
    for (const std::size_t d : eligible[j]) {
      JobCost cost;
      cost.device = d;
      const int shared = world.devices[d].cores;
      const bool on_slice = shared > 0 && job.cores > 0 && job.cores < shared;
      // The job on `cores` of this device: its cores' slice (dynamic energy and time there, the
      // whole device's static power over its run, as a meter would read it alone), or the whole.
      // A step on a slice of the cores, as the whole run: the slice's dynamic energy and time,
      // the whole device's static power over it.
      auto on_cores = [&](const estimator::StepCost& step, const estimator::SimulatedProfile& slice) {
        const double dynamic = std::max(0.0, step.joules - slice.static_watts * step.seconds);
        return TrueCost{(dynamic + truths[d].profile().static_watts * step.seconds) * steps * factor,
                        step.seconds * steps * factor};
      };
      auto truth_at = [&](int cores) {
        if (shared > 0 && cores > 0 && cores < shared) {
          const estimator::SimulatedProfile slice = estimator::cores_slice(truths[d].profile(), cores, shared);
          return on_cores(
              estimator::SimulatedDevice(slice, 0).step_cost(layers, job.model.loss, job.training.optimizer), slice);
        }
        const estimator::StepCost step = truths[d].step_cost(layers, job.model.loss, job.training.optimizer);
        return TrueCost{step.joules * steps * factor, step.seconds * steps * factor};
      };
      // jouled's estimate at `cores`: the whole device's, scaled by the network measured there
      // and whole.
      auto estimate_at = [&](int cores, estimator::Estimate estimate) {
        if (!(shared > 0 && cores > 0 && cores < shared)) return estimate;
        const auto ratio =
            measure_at_cores(truths[d].profile(), cores, shared, layers, job.model.loss, job.training.optimizer,
                             mix(options.seed, kCoresProbe, j * 4096 + d) + (cores == job.cores ? 0 : cores));
        const double joules_relative = estimate.joules.mean > 0 ? estimate.joules.std / estimate.joules.mean : 0;
        estimate.joules = {
            estimate.joules.mean * ratio.energy_ratio,
            estimate.joules.mean * ratio.energy_ratio * std::hypot(joules_relative, ratio.energy_log_std)};
        estimate.seconds = {estimate.seconds.mean * ratio.time_ratio, estimate.seconds.std * ratio.time_ratio};
        return estimate;
      };
      cost.truth = truth_at(job.cores);
      // A range: placement weighs the job at each end (the counts jouled measures while it waits).
      const bool ranged = shared > 0 && job.cores_max > job.cores;
      if (ranged)
        for (const int cores : {job.cores, std::min(job.cores_max, shared)})
          cost.cores_options.push_back(CoresOption{cores, truth_at(cores), std::nullopt});
      if (shared > 0) cost.static_watts = truths[d].profile().static_watts;
      const bool data_parallel = job.gpus > 1;
      // A step on each of its GPUs, as the whole run on all of them: 1/N of the steps each, every
      // step followed by the all-reduce, link-bound, at the GPU's static power (a setting does
      // not bind there).
      auto across_gpus = [&](const estimator::StepCost& step) {
        const double comm = all_reduce_seconds(layers, job.gpus);
        const double per_gpu_steps = steps / job.gpus;
        return TrueCost{job.gpus * (step.joules + truths[d].profile().static_watts * comm) * per_gpu_steps * factor,
                        (step.seconds + comm) * per_gpu_steps * factor};
      };
      if (data_parallel) {
        cost.alone_truth = cost.truth;
        cost.truth = across_gpus(truths[d].step_cost(layers, job.model.loss, job.training.optimizer));
      }
      const estimator::SimulatedKnob& knob = truths[d].profile().knob;
      // A job on a slice of the cores runs at a setting only where each core is clocked alone.
      for (std::size_t s = 1; (!on_slice || knob.per_core) && s < knob.settings.size(); ++s) {
        const auto& setting = knob.settings[s];
        const estimator::StepCost at = truths[d].step_cost(layers, job.model.loss, job.training.optimizer, setting);
        SettingCost at_setting{knob.name,
                               setting.value,
                               setting.label,
                               std::nullopt,
                               0.0,
                               0.0,
                               TrueCost{at.joules * steps * factor, at.seconds * steps * factor}};
        if (on_slice) {
          // Its own cores at the setting (their share of the static power at its clock too), the
          // rest of the device's static power as at the defaults.
          const estimator::SimulatedProfile slice = estimator::cores_slice(truths[d].profile(), job.cores, shared);
          at_setting.truth = on_cores(
              estimator::SimulatedDevice(slice, 0).step_cost(layers, job.model.loss, job.training.optimizer, setting),
              slice);
        }
        if (data_parallel) {
          // Every GPU of the job at the setting; the all-reduce saves nothing.
          at_setting.alone_truth = at_setting.truth;
          at_setting.truth = across_gpus(at);
        }
        cost.settings.push_back(std::move(at_setting));
      }
      if (models[d]) {
        auto estimate = models[d]->estimate(layers, job.training);
        if (estimate)
          for (auto& option : cost.cores_options) {
            const auto at = estimate_at(option.cores, *estimate);
            option.estimate = schedulers::Estimate{at.joules.mean, at.joules.std, at.seconds.mean};
          }
        if (estimate && on_slice) *estimate = estimate_at(job.cores, std::move(*estimate));
        if (estimate && data_parallel) {
          cost.alone_estimate =
              schedulers::Estimate{estimate->joules.mean, estimate->joules.std, estimate->seconds.mean};
          *estimate = estimator::across_gpus(std::move(*estimate), job.gpus, job.training.batch_size);
        }
        if (estimate) {
          cost.estimate = schedulers::Estimate{estimate->joules.mean, estimate->joules.std, estimate->seconds.mean};
          if (estimate->flops_baseline_joules > 0.0) cost.flops_joules = estimate->flops_baseline_joules;
          const auto own = measured[d].find(analysis_key(job) + "|" + job.training.optimizer);
          for (std::size_t s = 0; s < cost.settings.size(); ++s) {
            const schedulers::Estimate& base = *cost.estimate;
            estimator::RatioPrediction ratio;
            if (own != measured[d].end() && s + 1 < own->second.size()) {
              ratio = own->second[s + 1];
            } else {
              if (s + 1 >= responses[d].size() || !responses[d][s + 1]) continue;
              estimator::NetworkFeatures at_default = features;
              // One GPU's draw (a job on several draws it on each): how far over a limit it goes.
              const schedulers::Estimate& one = cost.alone_estimate ? *cost.alone_estimate : base;
              at_default.watts = one.seconds_mean > 0 ? one.joules_mean / one.seconds_mean : 0.0;
              ratio = responses[d][s + 1]->predict(at_default);
            }
            const double relative = base.joules_mean > 0 ? base.joules_std / base.joules_mean : 0.0;
            cost.settings[s].estimate =
                schedulers::Estimate{base.joules_mean * ratio.energy_ratio,
                                     base.joules_mean * ratio.energy_ratio * std::hypot(relative, ratio.energy_log_std),
                                     base.seconds_mean * ratio.time_ratio};
            cost.settings[s].slowdown_log_std = ratio.time_log_std;
            cost.settings[s].saving_log_std = ratio.energy_log_std;
            const double true_energy = cost.settings[s].truth.joules / cost.truth.joules;
            const double true_time = cost.settings[s].truth.seconds / cost.truth.seconds;
            KnobError& error = knob_errors[world.devices[d].ref.qualified()];
            error.energy += std::abs(ratio.energy_ratio - true_energy) / true_energy;
            error.time += std::abs(ratio.time_ratio - true_time) / true_time;
            ++error.count;
          }
        } else {
          ++no_model[world.devices[d].ref.qualified()];
        }
      } else {
        ++no_model[world.devices[d].ref.qualified()];
      }
      sim.costs.push_back(cost);
    }
    world.jobs.push_back(std::move(sim));
  }
  for (const auto& [device, error] : knob_errors) {
    const auto n = static_cast<double>(error.count);
    world.notes.push_back(
        fmt::format("{}: what knob settings do to energy and time predicted within {:.1f} % and "
                    "{:.1f} % on average ({} job-settings)",
                    device, 100.0 * error.energy / n, 100.0 * error.time / n, error.count));
  }
  for (const auto& [device, count] : no_model)
    world.notes.push_back(
        fmt::format("{}: no estimate for {} job(s) (no model for some layer kind): placed without one", device, count));
  return world;
}

}  // namespace joule::simulator
