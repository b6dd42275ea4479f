// ProbeService learning from a probe's results: each checked and stored as a layer sample, the
// device's model refitted off the loop and installed, its snapshot saved.
#include "joule/daemon/probe_service.hpp"

#include "probe_parts.hpp"

#include "joule/common/energy_source.hpp"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <deque>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>

#include "joule/daemon/probe_policy.hpp"
#include "joule/estimator/drift.hpp"
#include "joule/estimator/layer_analysis.hpp"
#include "joule/worker/protocol.hpp"

namespace joule::daemon {

namespace asio = boost::asio;
using nlohmann::json;
using namespace probe_parts;

std::optional<std::pair<double, std::string>> ProbeService::accept_result(Device& device, const std::string& run_id,
                                                                          const estimator::ProbePlan& plan,
                                                                          const json& result_json) {
  const std::string& name = device.name;
  auto result = worker::parse_probe_result(result_json);
  auto run = runs_.find(run_id);
  if (!result || result->networks.size() != plan.networks.size()) {
    spdlog::error("device {}: unreadable probe result: {}", name,
                  result ? "wrong number of networks" : result.error().message);
    if (run != runs_.end()) ++run->second.failed;
    device.planner->mark_probed(plan.target);
    return std::nullopt;
  }
  const std::string environment = result->environment.fingerprint();
  if (device.source.empty()) device.source = result->meter_source;
  if ((!device.environment.empty() && environment != device.environment) || result->meter_source != device.source) {
    spdlog::warn("device {}: probes now run under \"{}\" metered by {} (the model has \"{}\" by {}); re-probing", name,
                 environment, result->meter_source, device.environment, device.source);
    device.environment = environment;
    device.source = result->meter_source;
    models_.withdraw(name);
    begin_campaign(device, "environment");
    device.replacing.reset();
  }
  device.environment = environment;
  if (device.learning->source().empty()) device.learning->set_source(device.source);
  if (device.learning->environment().empty()) device.learning->set_environment(environment);

  // Held-out error: the model in use predicts each probe network before its measurement joins
  // (not an optimizer probe's: its networks train with another optimizer than the prediction's).
  const auto& models = models_.models();
  if (auto in_use = models.find(name); in_use != models.end() && in_use->second && plan.target.optimizer.empty()) {
    for (std::size_t i = 0; i < plan.networks.size(); ++i) {
      estimator::TrainingConfig one_step{plan.target.batch_size, 1, plan.target.batch_size, "sgd", std::nullopt};
      auto predicted = in_use->second->estimate(plan.networks[i], one_step);
      const double measured = result->networks[i].joules_per_step;
      if (predicted && measured > 0.0) {
        device.heldout.push_back(std::abs(predicted->joules_per_step.mean - measured) / measured);
        if (device.heldout.size() > kHeldOutWindow) device.heldout.pop_front();
      }
    }
  }

  std::vector<estimator::NetworkMeasurement> measured;
  json networks = json::array();
  double joules = 0.0;
  for (std::size_t i = 0; i < plan.networks.size(); ++i) {
    const auto& network = result->networks[i];
    measured.push_back({network.joules_per_step, network.seconds_per_step});
    double flops = 0.0;
    if (auto layers = estimator::analyze_model(plan.networks[i], plan.target.batch_size))
      flops = estimator::total_flops(*layers);
    device.learning->add_network(flops, network.joules_per_step);
    networks.push_back({{"flops", flops},
                        {"joules_per_step", network.joules_per_step},
                        {"seconds_per_step", network.seconds_per_step},
                        {"joules_spread", network.joules_spread}});
    for (const auto& repetition : network.repetitions) {
      const int steps = repetition.steps > 0               ? repetition.steps
                        : network.steps_per_repetition > 0 ? network.steps_per_repetition
                                                           : options_.probing.steps_per_repetition;
      joules += repetition.joules_per_step * steps;
    }
  }
  device.planner->mark_probed(plan.target);
  // The energy was spent whether or not the sample decomposes: the day's cap, the run and the
  // budgets (the caller's, for the whole worker run) count it.
  const std::pair<double, std::string> metered{joules, result->meter_source};
  device.last_probe_ms = now_ms();
  device.joules_today += joules;
  device.probe_joules += joules;
  ++device.probe_plans;
  metrics_.add_probe_runs(name, 1.0);
  metrics_.count_probe_outcome(name, "completed");
  metrics_.add_probe_energy(name, result->meter_source, joules);
  if (run != runs_.end()) {
    ++run->second.probes;
    run->second.joules += joules;
    run->second.source = result->meter_source;
  }
  auto sample = estimator::decompose(plan, measured);
  if (!sample) {
    spdlog::warn("device {}: probe not decomposable: {}", name, sample.error().message);
    return metered;
  }
  if (device.learning->add_sample(*sample)) ++device.samples;
  adapters::StoredProbeSample row;
  row.device = name;
  row.fingerprint = device.environment + "; meter " + device.source;
  row.at_ms = *device.last_probe_ms;
  row.layer_key = sample->key.name();
  row.joules_per_step = sample->joules_per_step;
  row.seconds_per_step = sample->seconds_per_step;
  row.source = result->meter_source;
  row.detail_json = json{
      {"features", sample->features},
      {"target", target_json(plan.target)},
      {"networks", networks},
      {"run", run_id}}.dump();
  storage_.submit([row](adapters::Database& db) { return db.insert_probe_sample(row); },
                  [name](Status s) {
                    if (!s) spdlog::error("device {}: probe sample not saved: {}", name, s.error().message);
                  });
  spdlog::debug("device {}: probe {} -> {:.4g} J/step ({})", name, sample->key.name(), sample->joules_per_step,
                result->meter_source);
  maybe_fit(device, false);
  return metered;
}

void ProbeService::maybe_fit(Device& device, bool force) {
  const std::size_t fresh = device.samples - device.samples_at_fit;
  const bool seeds_just_done = !device.fitted && device.planner && !device.planner->seeding();
  if (fresh == 0 || (!force && !seeds_just_done && fresh < options_.probing.refit_every)) return;
  if (fitting_) {
    device.fit_pending = true;
    return;
  }
  fitting_ = true;
  device.fit_pending = false;
  if (fitter_.joinable()) fitter_.join();
  auto copy = std::make_shared<estimator::DeviceEnergyModel>(*device.learning);
  const std::size_t samples = device.samples;
  device.samples_at_fit = samples;
  fitter_ = std::thread([this, alive = alive_, copy, samples, name = device.name] {
    const auto started = std::chrono::steady_clock::now();  // how long the fit computes: real time
    estimator::GpFitOptions gp;
    gp.restarts = 1;
    auto fitted = copy->fit(gp);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    asio::post(io_, [this, alive, copy, samples, name, seconds, ok = static_cast<bool>(fitted),
                     message = fitted ? std::string() : fitted.error().message] {
      if (!*alive) return;
      fitting_ = false;
      if (!ok) {
        spdlog::error("device {}: fitting its energy model failed: {}", name, message);
      } else {
        on_fitted(name, copy, samples, seconds);
      }
      for (auto& [other, device] : devices_)
        if (device->fit_pending) maybe_fit(*device, true);
    });
  });
}

void ProbeService::on_fitted(const std::string& name, std::shared_ptr<estimator::DeviceEnergyModel> model,
                             std::size_t samples, double seconds) {
  Device& device = *devices_.at(name);
  if (model->device() != name || samples > device.samples) return;  // a campaign restarted meanwhile
  // A runtime measured while the fit ran is not in the copy it fitted.
  for (const auto& [runtime, cost] : device.learning->runtimes())
    if (!model->runtimes().contains(runtime) || model->runtimes().at(runtime).measured_ms != cost.measured_ms)
      model->set_runtime(cost);
  model->set_speed_spread(device.learning->speed_spread());
  // So is a network measured whole meanwhile (or measured again: the reference).
  bool wholes_changed = false;
  for (const auto& sample : device.learning->whole_networks()) {
    const auto* kept = model->whole_network(sample.signature, sample.batch_size, sample.optimizer);
    if (kept && kept->measured_ms == sample.measured_ms) continue;
    model->add_whole_network(sample);
    wholes_changed = true;
  }
  if (wholes_changed) model->learn_whole_network_gaps();
  device.fitted = model;
  // A re-probe keeps serving the model it replaces until the new one covers the same layers.
  if (device.replacing) {
    const auto old_keys = device.replacing->sample_counts();
    const auto new_keys = model->sample_counts();
    for (const auto& [key, count] : old_keys) {
      const auto it = new_keys.find(key);
      if (count >= 3 && (it == new_keys.end() || it->second < 3)) return;
    }
    device.replacing.reset();
  }
  device.campaign_reason.clear();
  device.model_saved_ms = now_ms();
  install_model(device, model);
  spdlog::info("device {}: energy model version {} fitted from {} probe samples in {:.2f} s ({})", name,
               models_.version(name), samples, seconds, device.source);
}

void ProbeService::install_model(Device& device, const std::shared_ptr<const estimator::DeviceEnergyModel>& model) {
  const std::string& name = device.name;
  const std::int64_t version = models_.version(name) + 1;
  models_.install(name, model, version);
  publish_model_state(device, version);
  adapters::StoredModelSnapshot snapshot{
      name, version, now_ms(), device.source, model->save().dump(), snapshot_meta(device).dump()};
  storage_.submit([snapshot](adapters::Database& db) { return db.save_model_snapshot(snapshot); },
                  [name](Status s) {
                    if (!s) spdlog::error("device {}: saving its model failed: {}", name, s.error().message);
                  });
}

void ProbeService::publish_model_state(const Device& device, std::int64_t version) {
  metrics_.set_model_state(device.name, static_cast<double>(version), median_error(device.heldout).value_or(0.0),
                           device.last_probe_ms ? static_cast<double>(*device.last_probe_ms) / 1000.0 : 0.0);
}

json ProbeService::snapshot_meta(const Device& device) const {
  return {{"environment", device.environment},
          {"learnt_ms", device.model_saved_ms},
          {"last_probe_ms", device.last_probe_ms ? json(*device.last_probe_ms) : json(nullptr)},
          {"samples", device.samples},
          {"heldout", std::vector<double>(device.heldout.begin(), device.heldout.end())}};
}

}  // namespace joule::daemon
