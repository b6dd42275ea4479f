#include "joule/daemon/probe_service.hpp"

#include "joule/config/device_names.hpp"

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

ProbeService::ProbeService(asio::io_context& io, adapters::StorageWriter& storage, Metrics& metrics,
                           ModelService& models, const JobDemand& demand, BudgetService& budgets,
                           const DeviceTable& devices, ProbeServiceOptions options, const Clock& clock)
    : io_(io),
      storage_(storage),
      metrics_(metrics),
      models_(models),
      demand_(demand),
      budgets_(budgets),
      table_(devices),
      options_(std::move(options)),
      clock_(clock),
      timer_(io) {}

ProbeService::~ProbeService() {
  *alive_ = false;
  stop();
  if (fitter_.joinable()) fitter_.join();
}

std::pair<int, int> ProbeService::local_minute_and_day() const {
  const std::time_t now = static_cast<std::time_t>(clock_.unix_ms() / 1000);
  std::tm local{};
  localtime_r(&now, &local);
  return {local.tm_hour * 60 + local.tm_min, local.tm_year * 1000 + local.tm_yday};
}

void ProbeService::start(StoredProbeState stored) {
  for (const auto& run : stored.runs) {
    auto row = run;
    if (row.state == "running" || row.state == "queued") {  // the daemon stopped during it
      row.state = "interrupted";
      row.finished_ms = row.finished_ms.value_or(row.started_ms);
      row.message = "jouled stopped during this run";
      runs_[row.id] = row;
      save_run(row.id);
    } else {
      runs_[row.id] = row;
    }
    run_order_.push_back(row.id);
  }
  for (const auto& entry : table_) {
    if (!entry.config || (entry.name != "cpu" && !config::is_gpu_device_name(entry.name))) continue;
    if (worker_for(entry.name).empty()) {
      // A node without the packaged worker may still have a GPU's own (joule-worker-cuda).
      spdlog::warn(
          "device {}: no joule-worker to probe it with ([probing] worker, or [[devices]] worker): it "
          "gets no energy model",
          entry.name);
      continue;
    }
    const auto& config = *entry.config;
    auto device = std::make_unique<Device>();
    device->name = entry.name;
    device->config = &*entry.config;
    device->planner = std::make_unique<estimator::ProbePlanner>(
        std::vector<estimator::WorkloadItem>{}, estimator::CampaignOptions{}, options_.probing.target_sigma);
    for (const auto& snapshot : stored.snapshots) {
      if (snapshot.device != config.name) continue;
      const auto meta = json::parse(snapshot.meta_json, nullptr, false);
      if (!meta.is_object()) continue;
      device->environment = meta.value("environment", "");
      device->source = snapshot.source;
      device->model_saved_ms = meta.value("learnt_ms", snapshot.saved_ms);
      if (meta.contains("last_probe_ms") && meta["last_probe_ms"].is_number())
        device->last_probe_ms = meta["last_probe_ms"].get<std::int64_t>();
      for (const auto& e : meta.value("heldout", json::array())) device->heldout.push_back(e.get<double>());
      device->campaign_reason = "";
    }
    if (auto it = stored.samples.find(config.name);
        device->environment.empty() && it != stored.samples.end() && !it->second.empty()) {
      // Samples learnt before any model was saved: their fingerprint is "<environment>; meter <source>".
      const auto& first = it->second.front();
      const std::string suffix = "; meter " + first.source;
      if (first.fingerprint.size() > suffix.size() &&
          first.fingerprint.compare(first.fingerprint.size() - suffix.size(), suffix.size(), suffix) == 0) {
        device->environment = first.fingerprint.substr(0, first.fingerprint.size() - suffix.size());
        device->source = first.source;
      }
    }
    device->learning = std::make_shared<estimator::DeviceEnergyModel>(config.name, device->source);
    device->learning->set_environment(device->environment);
    if (auto it = stored.samples.find(config.name); it != stored.samples.end() && !device->environment.empty()) {
      for (const auto& row : it->second) {
        if (restore_whole(*device, row)) continue;
        const auto detail = json::parse(row.detail_json, nullptr, false);
        auto key = parse_key(row.layer_key);
        if (!key || !detail.is_object()) continue;
        estimator::LayerSample sample;
        sample.key = *key;
        sample.features = detail.value("features", std::map<std::string, double>{});
        sample.joules_per_step = row.joules_per_step;
        sample.seconds_per_step = row.seconds_per_step;
        auto target = parse_target(detail.value("target", json::object()));
        // The layer's counts (its work, which the kind's prior scales with) follow from its target.
        if (target) {
          if (auto plan = estimator::plan_probe(*target)) sample.cost = plan->analyzed.cost;
        }
        if (device->learning->add_sample(sample)) ++device->samples;
        for (const auto& network : detail.value("networks", json::array()))
          device->learning->add_network(network.value("flops", 0.0), network.value("joules_per_step", 0.0));
        if (target) device->planner->mark_probed(*target);
      }
      device->samples_at_fit = device->samples;
      spdlog::info("device {}: {} stored probe samples resume its model ({})", config.name, device->samples,
                   device->environment);
    }
    if (auto models = models_.models(); models.contains(config.name)) {
      device->fitted = models.at(config.name);
      // Runtimes are measured once per campaign, not stored as samples: the served model has them.
      if (device->fitted && device->fitted->environment() == device->environment)
        for (const auto& [runtime, cost] : device->fitted->runtimes()) device->learning->set_runtime(cost);
      publish_model_state(*device, models_.version(config.name));  // the resumed model, until the next fit
    }
    // The daily cap counts what runs since local midnight metered, across restarts.
    const auto [minute, day] = local_minute_and_day();
    const std::int64_t midnight_ms = now_ms() - static_cast<std::int64_t>(minute) * 60000 - 60000;
    device->day = day;
    for (const auto& [id, run] : runs_) {
      if (run.device != config.name) continue;
      if (run.started_ms >= midnight_ms) device->joules_today += run.joules;
      device->probe_joules += run.joules;
      device->probe_plans += run.probes;
    }
    const std::string name = config.name;
    devices_.emplace(name, std::move(device));
    refresh_workload(*devices_.at(name));
  }
  models_.set_probe_info([this](const std::string& device) { return info(device); });
  if (devices_.empty()) return;
  for (auto& [name, device] : devices_) check_environment(*device);
  schedule_tick();
}

void ProbeService::stop() {
  if (stopped_) return;
  stopped_ = true;
  timer_.cancel();
  for (auto& [name, device] : devices_) {
    if (device->probe) {
      device->probe->preempted = true;
      device->probe->worker->kill();
      put_knobs_back(*device->probe);
    }
  }
}

void ProbeService::set_config(const config::ProbingConfig& probing) {
  const bool environment_may_change =
      probing.threads != options_.probing.threads || probing.worker != options_.probing.worker;
  const bool python_changed = probing.python != options_.probing.python;
  options_.probing = probing;
  for (auto& [name, device] : devices_) {
    if (python_changed) device->runtime_tried = false;  // measure the new interpreter
    device->planner->set_target_sigma(device->cycle.requested() ? 0.0 : probing.target_sigma);
    // Other threads (or another worker) make another environment: ask the worker again
    // before the next probe, so a model learnt under the old one is not extended.
    if (environment_may_change) device->cycle.environment_may_have_changed();
    device->cycle.reload();  // a reload retries a worker that failed
  }
}

void ProbeService::schedule_tick() {
  if (stopped_) return;
  timer_.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(options_.tick_seconds)));
  timer_.async_wait([this, alive = alive_](boost::system::error_code ec) {
    if (ec || !*alive) return;
    tick();
    schedule_tick();
  });
}

void ProbeService::tick() {
  for (auto& [name, device] : devices_) consider(*device);
}

void ProbeService::refresh_workload(Device& device) {
  std::vector<estimator::WorkloadItem> workload = demand_.workload(32);
  // The users' networks (not the starter set the layers are seeded from) may be measured whole.
  device.whole_items = workload;
  device.whole_items.insert(device.whole_items.end(), device.requested_models.begin(), device.requested_models.end());
  ++device.whole_items_revision;
  std::vector<std::string> layer_types;
  for (const auto& item : device.whole_items)
    for (const auto& layer : item.model.layers) layer_types.push_back(layer.type);
  device.runtime_kinds_wanted = estimator::runtime_readable_kinds(layer_types);
  for (auto& item : ModelService::starter_workload()) workload.push_back(std::move(item));
  workload.insert(workload.end(), device.requested_models.begin(), device.requested_models.end());
  if (!device.planner) {
    estimator::CampaignOptions options;
    device.planner = std::make_unique<estimator::ProbePlanner>(workload, options, options_.probing.target_sigma);
  } else {
    device.planner->set_workload(std::move(workload));
  }
}

bool ProbeService::needs_probing(Device& device) {
  if (!device.campaign_reason.empty() || runtime_due(device) || reference_due(device)) return true;
  const double age_hours = static_cast<double>(now_ms() - device.model_saved_ms) / 3.6e6;
  if (device.model_saved_ms > 0 && age_hours > options_.probing.max_model_age_hours) {
    begin_campaign(device, "age");
    return true;
  }
  const auto next = next_probe(device);
  if (!next) return false;
  if (device.cycle.requested()) return true;  // a requested run probes for its time
  const bool pays = probe_pays(device, next->error_reduction);
  if (pays) device.not_paying.clear();
  return pays;
}

std::optional<ProbeService::NextProbe> ProbeService::next_probe(Device& device) {
  const auto& model = device.fitted ? *device.fitted : *device.learning;
  const auto layer = device.planner->next_planned(model);
  auto whole = next_whole(device);
  // Seeds and kinds without a model come first: without them some network has no estimate.
  const bool layer_first = layer && !std::isfinite(layer->error_reduction);
  if (whole && !layer_first &&
      (!layer || whole->error_reduction / std::sqrt(whole->cost) > layer->error_reduction / std::sqrt(layer->cost)))
    return whole;
  if (layer) return NextProbe{layer->error_reduction, layer->cost, std::nullopt, std::nullopt};
  return std::nullopt;
}

bool ProbeService::probe_pays(Device& device, double error_reduction) {
  // A seed, or a kind with no model at all: without it the workload has no estimate.
  if (!std::isfinite(error_reduction) || device.probe_plans == 0) return true;
  const std::int64_t day_ago = now_ms() - 86'400'000;
  while (!device.job_joules.empty() && device.job_joules.front().first < day_ago) device.job_joules.pop_front();
  double jobs_joules = 0.0;
  for (const auto& [finished, joules] : device.job_joules) jobs_joules += joules;
  // The estimates serve until the model is re-probed for its age (at least a day).
  const double days = std::max(options_.probing.max_model_age_hours / 24.0, 1.0);
  const double worth = error_reduction * jobs_joules * days;
  const double cost = device.probe_joules / static_cast<double>(device.probe_plans);
  if (worth >= cost) return true;
  std::string note = fmt::format(
      "probing no longer pays: the best next probe would cut the estimates' expected error by {:.2g} % of the "
      "{:.4g} J that jobs estimated here used in the last day (over the model's {:.0f} days: {:.3g} J), less than "
      "the {:.3g} J a probe costs",
      100.0 * error_reduction, jobs_joules, days, worth, cost);
  if (device.not_paying.empty())
    spdlog::info("device {}: {}; background probing waits for more jobs (a requested run still probes)", device.name,
                 note);
  device.not_paying = std::move(note);
  return false;
}

bool ProbeService::siblings_busy(const std::string& name) const {
  const daemon::Device* entry = table_.find(name);
  if (!entry || !entry->mig_gpu) return false;
  for (const auto& other : table_)
    if (other.name != name && other.mig_gpu == entry->mig_gpu && (!other.idle() || probing(other.name))) return true;
  return false;
}

void ProbeService::consider(Device& device) {
  if (device.cycle.worker_running()) {
    // Its end is what moves the device on; meanwhile each plan it finishes is learnt from.
    if (device.probe && !device.probe->environment_only && !device.probe->runtime_only && !device.probe->whole &&
        take_results(device, *device.probe))
      save_run(device.probe->run_id);
    return;
  }
  const auto [minute, day] = local_minute_and_day();
  if (day != device.day) {
    device.day = day;
    device.joules_today = 0.0;
  }
  const std::string& name = device.name;
  ProbeConditions conditions;
  const daemon::Device* entry = table_.find(name);
  const bool idle = entry && entry->runs_jobs && entry->idle();
  conditions.device_busy = !idle || demand_.work_waiting_for(name);
  if (!conditions.device_busy && siblings_busy(name)) {
    conditions.device_busy = true;
    conditions.busy_reason = "another MIG device of its GPU has work (a probe reads the GPU's counter whole)";
  }
  conditions.refusal = probing_refusal(options_.probing, ProbeMoment{false, minute, device.joules_today});
  conditions.refusal_when_requested = probing_refusal(options_.probing, ProbeMoment{true, minute, device.joules_today});
  conditions.idle_seconds = options_.probing.idle_seconds;
  conditions.needs_probing = [this, &device] { return needs_probing(device); };
  const ProbeStep step = device.cycle.step(clock_.steady(), conditions);
  if (step.request_over) {
    device.planner->set_target_sigma(options_.probing.target_sigma);
    close_run(device, "done", "the requested time is over");
  }
  if (step.end_background_run && device.active_run)
    close_run(device, "done",
              device.cycle.state() == ProbeState::converged && !device.not_paying.empty() ? device.not_paying
                                                                                          : *step.end_background_run);
  if (step.newly_converged && device.not_paying.empty())
    spdlog::info("device {}: energy model is as sure as [probing] target_sigma asks where the workload needs it", name);
  switch (step.action) {
    case ProbeStep::Action::check_environment:
      check_environment(device);
      break;
    case ProbeStep::Action::start_probe:
      start_probe(device);
      break;
    case ProbeStep::Action::none:
      break;
  }
}

void ProbeService::begin_campaign(Device& device, const std::string& reason) {
  spdlog::info("device {}: re-probing ({})", device.name, reason);
  device.campaign_reason = reason;
  device.replacing = device.fitted;
  device.learning = std::make_shared<estimator::DeviceEnergyModel>(device.name, device.source);
  device.learning->set_environment(device.environment);
  device.fitted.reset();
  device.samples = 0;
  device.samples_at_fit = 0;
  device.planner.reset();
  device.drift.reset();
  device.runtime_tried = false;  // the new model measures its runtime again
  device.runtime_problem.clear();
  device.runtime_kinds_unread.clear();
  device.wholes_tried.clear();  // and its networks whole
  device.whole_answer.reset();
  // The device's speed moved as much before the new campaign as it does now.
  if (device.replacing) device.learning->set_speed_spread(device.replacing->speed_spread());
  refresh_workload(device);
}

std::string ProbeService::open_run(Device& device, const std::string& reason, std::optional<double> seconds) {
  adapters::StoredProbeRun run;
  run.id = fmt::format("p{}-{}", now_ms(), next_run_++);
  run.device = device.name;
  run.reason = reason;
  run.state = "running";
  run.requested_seconds = seconds;
  run.started_ms = now_ms();
  runs_[run.id] = run;
  run_order_.push_back(run.id);
  while (run_order_.size() > kRunsKept) {
    runs_.erase(run_order_.front());
    run_order_.pop_front();
  }
  device.active_run = run.id;
  save_run(run.id);
  return run.id;
}

void ProbeService::close_run(Device& device, const std::string& state, const std::string& message) {
  if (!device.active_run) return;
  auto it = runs_.find(*device.active_run);
  device.active_run.reset();
  if (it == runs_.end()) return;
  it->second.state = state;
  it->second.finished_ms = now_ms();
  it->second.message = message;
  save_run(it->first);
  maybe_fit(device, true);
}

void ProbeService::save_run(const std::string& id) {
  const auto it = runs_.find(id);
  if (it == runs_.end()) return;
  storage_.submit([run = it->second](adapters::Database& db) { return db.save_probe_run(run); },
                  [id](Status s) {
                    if (!s) spdlog::error("probe run {}: not saved: {}", id, s.error().message);
                  });
}

void ProbeService::feedback(const JobFeedback& feedback) {
  const auto it = devices_.find(feedback.device);
  if (it == devices_.end()) return;
  Device& device = *it->second;
  // Several GPUs' joules say nothing of one GPU's model.
  if (feedback.partial || !feedback.estimate.ok || feedback.gpus > 1) return;
  remember_job_energy(device, feedback);
  // Only like with like: a job metered by another source than the model learnt from says
  // nothing about the model's error.
  if (feedback.estimate.source != feedback.source) return;
  const double mean = feedback.estimate.joules_mean;
  const double std = feedback.estimate.joules_std;
  if (!(mean > 0.0) || !(feedback.joules > 0.0)) return;
  const auto verdict = device.drift.observe(feedback.joules, mean, std);
  metrics_.observe_estimate_error(feedback.device, verdict.relative_error);
  if (verdict.drift && device.campaign_reason.empty()) {
    spdlog::warn(
        "device {}: {} of the last jobs' metered energy fell outside their estimates' 2-sigma band "
        "(last: {:.4g} J metered vs {:.4g} +- {:.2g} J estimated); re-probing",
        feedback.device, device.drift.misses(), feedback.joules, mean, std);
    begin_campaign(device, "drift");
  }
}

void ProbeService::remember_job_energy(Device& device, const JobFeedback& feedback) {
  if (!(feedback.joules > 0.0)) return;
  device.job_joules.emplace_back(feedback.finished_ms, feedback.joules);
  if (device.job_joules.size() > 100'000) device.job_joules.pop_front();  // bounded; a day is what counts
}

void ProbeService::remember_jobs(const std::vector<JobFeedback>& history) {
  for (const auto& feedback : history) {
    const auto it = devices_.find(feedback.device);
    if (it != devices_.end() && !feedback.partial && feedback.estimate.ok) remember_job_energy(*it->second, feedback);
  }
}

Result<json> ProbeService::request(const json& body) {
  if (!body.is_object()) return make_error(ErrorCode::invalid_argument, "the request must be a JSON object", "");
  for (const auto& [key, value] : body.items())
    if (key != "device" && key != "seconds" && key != "models")
      return make_error(ErrorCode::invalid_argument, fmt::format("unknown field \"{}\"", key), "/" + key);
  // Optional: models to learn for (a job about to be submitted), as {"model": ..., "training": ...}.
  std::vector<estimator::WorkloadItem> extra;
  if (auto models = body.find("models"); models != body.end()) {
    if (!models->is_array())
      return make_error(ErrorCode::invalid_argument, "models must be an array of {\"model\", \"training\"}", "/models");
    for (std::size_t i = 0; i < models->size(); ++i) {
      const auto& entry = (*models)[i];
      const std::string where = fmt::format("/models/{}", i);
      if (!entry.is_object() || !entry.contains("model"))
        return make_error(ErrorCode::invalid_argument, "each entry needs a model", where + "/model");
      auto model = estimator::parse_model_spec(entry["model"], where + "/model");
      if (!model) return model.error();
      // Only the batch size and the optimizer matter to probing: {"batch_size": B} is enough.
      estimator::TrainingConfig training;
      if (entry.contains("training")) {
        const auto& given = entry["training"];
        if (!given.is_object() || !given.contains("batch_size") || !given["batch_size"].is_number_integer() ||
            given["batch_size"].get<std::int64_t>() < 1)
          return make_error(ErrorCode::invalid_argument, "training.batch_size must be a positive integer",
                            where + "/training/batch_size");
        training.batch_size = given["batch_size"].get<std::int64_t>();
        if (given.contains("optimizer")) {
          if (!given["optimizer"].is_string() || !estimator::is_known_optimizer(given["optimizer"].get<std::string>()))
            return make_error(ErrorCode::invalid_argument,
                              fmt::format("training.optimizer must be one of {}", estimator::known_optimizer_list()),
                              where + "/training/optimizer");
          training.optimizer = given["optimizer"].get<std::string>();
        }
      }
      if (auto layers = estimator::analyze_model(*model, training.batch_size, where + "/model"); !layers)
        return layers.error();
      extra.push_back(estimator::WorkloadItem{*model, training.batch_size, training.optimizer});
    }
  }
  if (!body.contains("device") || !body["device"].is_string())
    return make_error(ErrorCode::invalid_argument, "device is required (a string such as \"cpu\")", "/device");
  const std::string name = body["device"].get<std::string>();
  const auto it = devices_.find(name);
  if (it == devices_.end()) {
    std::string names;
    for (const auto& [known, device] : devices_) names += (names.empty() ? "" : ", ") + known;
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("device {} is not probed by joule-worker on this node (probed devices: {})", name,
                                  names.empty() ? "none" : names),
                      "/device");
  }
  double seconds = 60.0;
  if (body.contains("seconds")) {
    if (!body["seconds"].is_number() || body["seconds"].get<double>() <= 0.0 || body["seconds"].get<double>() > 86400.0)
      return make_error(ErrorCode::invalid_argument, "seconds must be a number in (0, 86400]", "/seconds");
    seconds = body["seconds"].get<double>();
  }
  Device& device = *it->second;
  // A run on a device that cannot probe would wait out its seconds and learn nothing.
  if (device.cycle.state() == ProbeState::unavailable)
    return make_error(ErrorCode::conflict,
                      fmt::format("device {} cannot be probed: {}; fix [probing] worker or the device, then reload "
                                  "jouled (systemctl reload jouled)",
                                  name, device.cycle.waiting()),
                      "/device");
  if (device.active_run) close_run(device, "done", "superseded by a requested run");
  const std::string id = open_run(device, "requested", seconds);
  device.cycle.request(clock_.steady() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                             std::chrono::duration<double>(seconds)));
  // A requested run goes on where the model is already sure (σ target 0) and learns the
  // models it names besides the queued and recent jobs'.
  device.requested_models = std::move(extra);
  refresh_workload(device);
  device.planner->set_target_sigma(0.0);
  asio::post(io_, [this, alive = alive_, name] {
    if (*alive && devices_.contains(name)) consider(*devices_.at(name));
  });
  return run_json(runs_.at(id));
}

json ProbeService::run_json(const adapters::StoredProbeRun& run) const {
  return {{"id", run.id},
          {"device", run.device},
          {"reason", run.reason},
          {"state", run.state},
          {"requested_seconds", run.requested_seconds ? json(*run.requested_seconds) : json(nullptr)},
          {"started_ms", run.started_ms},
          {"finished_ms", run.finished_ms ? json(*run.finished_ms) : json(nullptr)},
          {"probes", run.probes},
          {"preempted", run.preempted},
          {"failed", run.failed},
          {"energy", {{"joules", run.joules}, {"source", run.source}, {"measured", is_measurement(run.source)}}},
          {"probe_seconds", run.probe_seconds},
          {"message", run.message}};
}

json ProbeService::runs() const {
  json out = json::array();
  for (const auto& id : run_order_)
    if (auto it = runs_.find(id); it != runs_.end()) out.push_back(run_json(it->second));
  return out;
}

Result<json> ProbeService::run(const std::string& id) const {
  const auto it = runs_.find(id);
  if (it == runs_.end()) return make_error(ErrorCode::not_found, fmt::format("no probe run {}", id), "id");
  return run_json(it->second);
}

json ProbeService::info(const std::string& name) const {
  const auto it = devices_.find(name);
  if (it == devices_.end()) return json::object();
  const Device& device = *it->second;
  json heldout = nullptr;
  if (auto median = median_error(device.heldout))
    heldout = {{"median_abs_relative_error", *median}, {"networks", device.heldout.size()}};
  json probing = {{"state", std::string(to_string(device.cycle.state()))},
                  {"samples_learning", device.samples},
                  {"environment", device.environment},
                  {"campaign", device.campaign_reason.empty() ? json(nullptr) : json(device.campaign_reason)},
                  {"probes_today_joules", device.joules_today}};
  if (!device.cycle.waiting().empty()) probing["waiting"] = device.cycle.waiting();
  if (device.cycle.state() == ProbeState::converged && !device.not_paying.empty())
    probing["waiting"] = device.not_paying;
  if (device.active_run) probing["run"] = *device.active_run;
  if (!options_.probing.python.empty()) {
    const bool measured = device.learning->runtimes().contains("python");
    json runtime = {{"interpreter", options_.probing.python},
                    {"state", measured                                     ? "measured"
                              : !device.runtime_problem.empty()            ? "failed"
                              : device.probe && device.probe->runtime_only ? "measuring"
                                                                           : "pending"}};
    if (!device.runtime_problem.empty()) runtime["problem"] = device.runtime_problem;
    if (measured) runtime["runs"] = device.learning->runtimes().at("python").runs();
    // The workload's layer kinds read on their own networks, and those still to read.
    json kinds = json::array(), unread = json::array();
    for (const auto& kind : device.runtime_kinds_wanted) {
      if (measured && device.learning->runtimes().at("python").kinds.contains(kind))
        kinds.push_back(kind);
      else
        unread.push_back(kind);
    }
    runtime["kinds_read"] = std::move(kinds);
    runtime["kinds_not_read"] = std::move(unread);
    probing["runtime"] = std::move(runtime);
  }
  probing["whole_networks"] = whole_info(device);
  if (auto& reference = probing["whole_networks"]; reference.contains("reference"))
    reference["reference"]["noisy"] =
        options_.probing.max_speed_spread > 0.0 &&
        reference["reference"]["spread"].get<double>() > options_.probing.max_speed_spread;
  return {{"last_probe_ms", device.last_probe_ms ? json(*device.last_probe_ms) : json(nullptr)},
          {"heldout_error", heldout},
          {"probing", probing}};
}

}  // namespace joule::daemon
