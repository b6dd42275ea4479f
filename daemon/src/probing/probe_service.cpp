#include "joule/daemon/probe_service.hpp"

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
using SteadyTime = std::chrono::steady_clock::time_point;

namespace {

constexpr std::size_t kHeldOutWindow = 50;
constexpr std::size_t kRunsKept = 200;

// The held-out error shown and exported: the upper median of the recent |relative errors|.
std::optional<double> median_error(const std::deque<double>& errors) {
  if (errors.empty()) return std::nullopt;
  std::vector<double> sorted(errors.begin(), errors.end());
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2), sorted.end());
  return sorted[sorted.size() / 2];
}

std::string read_file(const std::filesystem::path& path, std::size_t limit = 1 << 20) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > limit) text = text.substr(text.size() - limit);
  return text;
}

std::string last_line(const std::string& text) {
  auto end = text.find_last_not_of("\n ");
  if (end == std::string::npos) return "";
  auto start = text.rfind('\n', end);
  return text.substr(start == std::string::npos ? 0 : start + 1,
                     end - (start == std::string::npos ? 0 : start + 1) + 1);
}

std::optional<estimator::LayerKey> parse_key(const std::string& name) {
  const auto at = name.find('@');
  if (at == std::string::npos) return std::nullopt;
  const std::string position = name.substr(at + 1);
  estimator::LayerKey key{name.substr(0, at)};
  if (position == "input")
    key.position = estimator::LayerPosition::input;
  else if (position == "hidden")
    key.position = estimator::LayerPosition::hidden;
  else if (position == "output")
    key.position = estimator::LayerPosition::output;
  else
    return std::nullopt;
  return key;
}

json target_json(const estimator::ProbeTarget& target) {
  return {{"layer", estimator::to_json(target.layer)},
          {"input_shape", target.input_shape},
          {"input_dtype", target.input_dtype},
          {"batch_size", target.batch_size},
          {"position", std::string(estimator::to_string(target.position))},
          {"loss", target.loss},
          {"optimizer", target.optimizer}};
}

std::optional<estimator::ProbeTarget> parse_target(const json& j) {
  try {
    estimator::ProbeTarget target;
    json layer = j.at("layer");
    target.layer.type = layer.at("type").get<std::string>();
    if (layer.contains("inputs")) target.layer.inputs = layer.at("inputs").get<std::vector<std::string>>();
    if (layer.contains("name")) target.layer.name = layer.at("name").get<std::string>();
    for (const char* wiring : {"type", "inputs", "name"}) layer.erase(wiring);
    target.layer.args = layer;
    target.input_shape = j.at("input_shape").get<std::vector<std::int64_t>>();
    target.input_dtype = j.at("input_dtype").get<std::string>();
    target.batch_size = j.at("batch_size").get<std::int64_t>();
    auto key = parse_key(target.layer.type + "@" + j.at("position").get<std::string>());
    if (!key) return std::nullopt;
    target.position = key->position;
    target.loss = j.at("loss").get<std::string>();
    target.optimizer = j.value("optimizer", "");  // absent in rows from before optimizer probes
    return target;
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

}  // namespace

struct ProbeService::Running {
  std::string run_id;
  std::vector<estimator::ProbePlan> plans;  // measured in this order, one result line each
  std::size_t taken = 0;                    // result lines learnt from so far
  SteadyTime taken_at;                      // when they were (the budgets' energy use starts there)
  std::unique_ptr<ChildProcess> worker;
  std::filesystem::path directory;
  SteadyTime started;
  bool preempted = false;
  bool environment_only = false;  // `joule-worker env`, not a probe
  bool runtime_only = false;      // `joule-worker runtime`: the interpreter's cost, not a layer
};

struct ProbeService::Device {
  std::string name;
  const config::DeviceConfig* config = nullptr;  // its [[devices]] table, in the device table
  std::string environment;                       // worker environment fingerprint of the samples in `learning`
  std::string source;                            // meter source of those samples
  std::shared_ptr<estimator::DeviceEnergyModel> learning;      // every sample so far (loop thread only)
  std::shared_ptr<const estimator::DeviceEnergyModel> fitted;  // latest fit of `learning`
  std::unique_ptr<estimator::ProbePlanner> planner;
  std::size_t samples = 0;
  std::size_t samples_at_fit = 0;
  bool fit_pending = false;
  std::int64_t model_saved_ms = 0;
  std::optional<std::int64_t> last_probe_ms;
  std::deque<double> heldout;  // |relative error| of probe networks predicted before measuring
  estimator::DriftDetector drift;
  std::string campaign_reason = "initial";                        // why the current samples are being gathered
  std::shared_ptr<const estimator::DeviceEnergyModel> replacing;  // the model a re-probe replaces
  ProbeCycle cycle;  // checking, busy, settling, probing, converged...: when it probes
  std::optional<Running> probe;
  std::optional<std::string> active_run;
  std::vector<estimator::WorkloadItem> requested_models;  // named by the latest POST /v1/probes
  double joules_today = 0.0;
  int day = -1;
  // What deciding whether a probe pays needs: what probe plans have cost here, and the energy
  // of the jobs whose estimates this model makes, over the last day (finished ms, joules).
  double probe_joules = 0.0;
  std::size_t probe_plans = 0;
  std::deque<std::pair<std::int64_t, double>> job_joules;
  std::string not_paying;       // why background probing stopped before the model converged, if it did
  bool runtime_tried = false;   // the runtime probe ended (either way) since the campaign began
  std::string runtime_problem;  // why it stored nothing, when it did not
};

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
    if (!entry.config || (entry.name != "cpu" && entry.name.rfind("cuda:", 0) != 0)) continue;
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
  if (!device.campaign_reason.empty() || runtime_due(device)) return true;
  const double age_hours = static_cast<double>(now_ms() - device.model_saved_ms) / 3.6e6;
  if (device.model_saved_ms > 0 && age_hours > options_.probing.max_model_age_hours) {
    begin_campaign(device, "age");
    return true;
  }
  const auto& model = device.fitted ? *device.fitted : *device.learning;
  const auto planned = device.planner->next_planned(model);
  if (!planned) return false;
  if (device.cycle.requested()) return true;  // a requested run probes for its time
  const bool pays = probe_pays(device, *planned);
  if (pays) device.not_paying.clear();
  return pays;
}

bool ProbeService::probe_pays(Device& device, const estimator::PlannedProbe& planned) {
  // A seed, or a kind with no model at all: without it the workload has no estimate.
  if (!std::isfinite(planned.error_reduction) || device.probe_plans == 0) return true;
  const std::int64_t day_ago = now_ms() - 86'400'000;
  while (!device.job_joules.empty() && device.job_joules.front().first < day_ago) device.job_joules.pop_front();
  double jobs_joules = 0.0;
  for (const auto& [finished, joules] : device.job_joules) jobs_joules += joules;
  // The estimates serve until the model is re-probed for its age (at least a day).
  const double days = std::max(options_.probing.max_model_age_hours / 24.0, 1.0);
  const double worth = planned.error_reduction * jobs_joules * days;
  const double cost = device.probe_joules / static_cast<double>(device.probe_plans);
  if (worth >= cost) return true;
  std::string note = fmt::format(
      "probing no longer pays: the best next probe would cut the estimates' expected error by {:.2g} % of the "
      "{:.4g} J that jobs estimated here used in the last day (over the model's {:.0f} days: {:.3g} J), less than "
      "the {:.3g} J a probe costs",
      100.0 * planned.error_reduction, jobs_joules, days, worth, cost);
  if (device.not_paying.empty())
    spdlog::info("device {}: {}; background probing waits for more jobs (a requested run still probes)", device.name,
                 note);
  device.not_paying = std::move(note);
  return false;
}

void ProbeService::consider(Device& device) {
  if (device.cycle.worker_running()) {
    // Its end is what moves the device on; meanwhile each plan it finishes is learnt from.
    if (device.probe && !device.probe->environment_only && !device.probe->runtime_only &&
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
  const bool idle = entry && entry->runs_jobs && !entry->job;
  conditions.device_busy = !idle || demand_.work_waiting_for(name);
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

void ProbeService::check_environment(Device& device) {
  // `joule-worker env` says which LibTorch, BLAS and threads probes would run under now; a
  // model learnt under others is withdrawn before it estimates anything.
  const auto directory = options_.state_directory / "probes" / fmt::format("env-{}", device.name);
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  adapters::LaunchSpec spec;
  spec.argv = {options_.worker.string(),
               "env",
               "--device",
               device.name,
               "--threads",
               std::to_string(config::device_threads(*device.config, options_.probing))};
  spec.workdir = directory;
  spec.env = {"PATH=/usr/local/bin:/usr/bin:/bin", fmt::format("TMPDIR={}", directory.string())};
  spec.stdout_path = directory / "stdout";
  spec.stderr_path = directory / "stderr";
  spec.status_path = directory / "status";
  spec.runner = options_.runner;
  std::filesystem::remove(spec.stdout_path, ec);
  std::filesystem::remove(spec.status_path, ec);
  auto worker = launch_worker(device, spec, "joule-worker env");
  if (!worker) {
    spdlog::error("device {}: cannot start {}: {}", device.name, options_.worker.string(), worker.error().message);
    device.cycle.environment_failed("joule-worker env failed: cannot start it: " + worker.error().message);
    return;
  }
  Running running;
  running.worker = std::move(*worker);
  running.directory = directory;
  running.started = clock_.steady();
  running.environment_only = true;
  device.probe = std::move(running);
  device.cycle.environment_check_started();
}

Result<std::unique_ptr<ChildProcess>> ProbeService::launch_worker(Device& device, const adapters::LaunchSpec& spec,
                                                                  const std::string& what) {
  return ChildProcess::launch(
      io_, spec, fmt::format("device {}: {}", device.name, what),
      [this, name = device.name](std::optional<adapters::ExitStatus> exit) { on_probe_exit(name, exit); });
}

void ProbeService::start_probe(Device& device) {
  if (runtime_due(device)) {
    start_runtime_probe(device);
    return;
  }
  // Each stretch of probing learns for the jobs queued and finished since the last one.
  if (!device.active_run) refresh_workload(device);
  const auto& model = device.fitted ? *device.fitted : *device.learning;
  // Up to plans_per_run plans for one worker process. Each is marked as taken, so the next pick
  // spreads away from it; one that never runs (pre-empted, or after a failure) is unmarked.
  std::vector<estimator::ProbePlan> plans;
  while (plans.size() < static_cast<std::size_t>(std::max(1, options_.probing.plans_per_run))) {
    auto plan = device.planner->next(model);
    if (!plan) break;
    device.planner->mark_probed(plan->target);
    plans.push_back(std::move(plan).value());
  }
  const bool requested = device.cycle.requested();
  if (plans.empty() && requested) {
    // Every candidate of the workload is probed: end the request early rather than repeat.
    device.cycle.end_request();
    device.planner->set_target_sigma(options_.probing.target_sigma);
    close_run(device, "done", "every candidate configuration of the workload is probed");
    return;
  }
  if (plans.empty()) return;
  if (!device.active_run) open_run(device, run_reason(device), std::nullopt);
  const auto give_back = [&] {
    for (const auto& plan : plans) device.planner->unmark_probed(plan.target);
  };

  const int threads = config::device_threads(*device.config, options_.probing);
  const auto directory = options_.state_directory / "probes" / fmt::format("{}-{}", *device.active_run, next_run_++);
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  adapters::LaunchSpec spec;
  spec.argv = {options_.worker.string(), "probe"};
  for (std::size_t i = 0; i < plans.size(); ++i) {
    worker::ProbeRequest request;
    request.device = device.name;
    request.threads = threads;
    request.batch_size = plans[i].target.batch_size;
    request.warmup_steps = options_.probing.warmup_steps;
    request.steps_per_repetition = options_.probing.steps_per_repetition;
    request.min_reading_seconds = options_.probing.reading_seconds;
    request.repetitions = options_.probing.repetitions;
    request.meter = device.config->meter;
    request.idle_watts = device.config->idle_watts;
    request.watts_per_busy_core = device.config->watts_per_busy_core;
    request.seed = next_run_++;
    request.networks = plans[i].networks;
    request.network_optimizers = plans[i].optimizers;
    const auto file = directory / fmt::format("request-{}.json", i);
    std::ofstream out(file);
    out << worker::to_json(request).dump();
    if (!out) {
      give_back();
      device.cycle.launch_failed(clock_.steady(), fmt::format("cannot write {}", file.string()));
      return;
    }
    spec.argv.insert(spec.argv.end(), {"--request", file.string()});
  }
  set_probe_launch(spec, directory, threads, "results.jsonl");  // one line per plan, each written once measured
  auto worker = launch_worker(device, spec, "probe");
  if (!worker) {
    give_back();
    spdlog::error("device {}: cannot start a probe: {}", device.name, worker.error().message);
    device.cycle.launch_failed(clock_.steady(), "cannot start joule-worker: " + worker.error().message);
    return;
  }
  Running running;
  running.run_id = *device.active_run;
  running.plans = std::move(plans);
  running.worker = std::move(*worker);
  running.directory = directory;
  running.started = clock_.steady();
  running.taken_at = running.started;
  device.probe = std::move(running);
  device.cycle.probe_started();
}

std::string ProbeService::run_reason(const Device& device) const {
  if (device.cycle.requested()) return "requested";
  return device.campaign_reason.empty() ? "idle" : device.campaign_reason;
}

void ProbeService::set_probe_launch(adapters::LaunchSpec& spec, const std::filesystem::path& directory, int threads,
                                    const std::string& stdout_name) const {
  spec.workdir = directory;
  spec.env = {"PATH=/usr/local/bin:/usr/bin:/bin", fmt::format("TMPDIR={}", directory.string()),
              fmt::format("OMP_NUM_THREADS={}", threads), fmt::format("MKL_NUM_THREADS={}", threads),
              fmt::format("OPENBLAS_NUM_THREADS={}", threads)};
  spec.stdout_path = directory / stdout_name;
  spec.stderr_path = directory / "stderr.log";
  spec.status_path = directory / "status";
  spec.runner = options_.runner;
}

bool ProbeService::runtime_due(const Device& device) const {
  return !options_.probing.python.empty() && !device.runtime_tried && !device.learning->runtimes().contains("python");
}

void ProbeService::start_runtime_probe(Device& device) {
  if (!device.active_run) open_run(device, run_reason(device), std::nullopt);
  const int threads = config::device_threads(*device.config, options_.probing);
  const auto directory =
      options_.state_directory / "probes" / fmt::format("{}-runtime-{}", *device.active_run, next_run_++);
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  adapters::LaunchSpec spec;
  spec.argv = {options_.worker.string(),
               "runtime",
               "--json",
               "--python",
               options_.probing.python,
               "--device",
               device.name,
               "--threads",
               std::to_string(threads),
               "--meter",
               device.config->meter,
               "--idle-watts",
               fmt::format("{}", device.config->idle_watts),
               "--watts-per-busy-core",
               fmt::format("{}", device.config->watts_per_busy_core)};
  if (options_.probing.reading_seconds > 0.0)
    spec.argv.insert(spec.argv.end(), {"--reading-seconds", fmt::format("{}", options_.probing.reading_seconds)});
  set_probe_launch(spec, directory, threads, "result.json");
  auto worker = launch_worker(device, spec, "runtime probe");
  if (!worker) {
    spdlog::error("device {}: cannot start the runtime probe: {}", device.name, worker.error().message);
    device.cycle.launch_failed(clock_.steady(), "cannot start joule-worker: " + worker.error().message);
    return;
  }
  Running running;
  running.run_id = *device.active_run;
  running.worker = std::move(*worker);
  running.directory = directory;
  running.started = clock_.steady();
  running.taken_at = running.started;
  running.runtime_only = true;
  device.probe = std::move(running);
  device.cycle.probe_started();
  spdlog::info("device {}: measuring what {} costs (start-up, and its loop per step beyond LibTorch)", device.name,
               options_.probing.python);
}

void ProbeService::on_runtime_exit(Device& device, Running& probe, const std::optional<adapters::ExitStatus>& exit,
                                   double seconds) {
  const std::string& name = device.name;
  auto run = runs_.find(probe.run_id);
  if (run != runs_.end()) run->second.probe_seconds += seconds;
  ProbeOutcome outcome = ProbeOutcome::completed;
  if (probe.preempted) {
    // Not tried: it runs again before the next layer probe.
    outcome = ProbeOutcome::preempted;
    metrics_.count_probe_outcome(name, "preempted");
    if (run != runs_.end()) ++run->second.preempted;
  } else {
    device.runtime_tried = true;
    const auto parsed = json::parse(read_file(probe.directory / "result.json"), nullptr, false);
    auto result = worker::parse_runtime_probe_result(parsed);
    std::string problem;
    if (!exit || !exit->success() || !result) {
      const std::string why = last_line(read_file(probe.directory / "stderr.log", 8192));
      problem = fmt::format("the runtime probe of {} failed ({}): {}", options_.probing.python,
                            exit ? exit->describe() : "no exit status",
                            !why.empty() ? why
                            : result     ? "no output"
                                         : result.error().message);
    } else {
      // Spent whatever it taught: the day's cap, the run, the budgets and the metrics count it.
      const auto ended = now_ms();
      device.joules_today += result->joules;
      metrics_.add_probe_energy(name, result->meter_source, result->joules);
      budgets_.record(adapters::StoredEnergyUse{budgets_.node(), name, "probe",
                                                ended - static_cast<std::int64_t>(seconds * 1000.0), ended,
                                                result->joules, result->meter_source});
      if (run != runs_.end()) {
        run->second.joules += result->joules;
        run->second.source = result->meter_source;
      }
      auto cost = estimator::fit_runtime_cost(result->runtime, result->steps, result->starts);
      if (!device.source.empty() && result->meter_source != device.source) {
        problem = fmt::format("the runtime probe was metered by {} and the layer probes by {}: not kept",
                              result->meter_source, device.source);
      } else if (!cost) {
        problem = fmt::format("the runtime probe of {} measured nothing usable: {}", options_.probing.python,
                              cost.error().message);
      } else {
        cost->interpreter = result->interpreter;
        cost->version = result->version;
        cost->source = result->meter_source;
        cost->measured_ms = ended;
        device.learning->set_runtime(*cost);
        if (device.fitted && !device.replacing) {
          auto updated = std::make_shared<estimator::DeviceEnergyModel>(*device.fitted);
          updated->set_runtime(*cost);
          device.fitted = updated;
          install_model(device, updated);
        }
        device.runtime_problem.clear();
        spdlog::info(
            "device {}: {} ({}) starts in {:.2f} s ({:.3g} J) and adds {:.0f} µs + {:.1f} µs per module to "
            "each step ({}; {:.3g} + {:.3g} J)",
            name, result->interpreter, result->version, cost->start_seconds, cost->start_joules,
            cost->step_seconds_base * 1e6, cost->step_seconds_per_module * 1e6, result->meter_source,
            cost->step_joules_base, cost->step_joules_per_module);
      }
    }
    if (!problem.empty()) {
      outcome = ProbeOutcome::completed;  // layer probing goes on: a Python job's estimate says what it lacks
      device.runtime_problem = problem;
      metrics_.count_probe_outcome(name, "failed");
      spdlog::warn("device {}: {}", name, problem);
      if (run != runs_.end()) {
        ++run->second.failed;
        run->second.message = problem;
      }
    } else {
      metrics_.count_probe_outcome(name, "completed");
    }
  }
  if (run != runs_.end()) save_run(run->first);
  std::error_code ec;
  std::filesystem::remove_all(probe.directory, ec);
  if (device.cycle.probe_ended(clock_.steady(), outcome))
    close_run(device, "failed", "the runtime probe failed (" + device.cycle.backoff_reason() + ")");
}

std::optional<std::string> ProbeService::runtime_problem(const std::string& name) const {
  const auto it = devices_.find(name);
  if (it == devices_.end()) return std::nullopt;
  const Device& device = *it->second;
  if (device.learning->runtimes().contains("python")) return std::nullopt;
  if (options_.probing.python.empty())
    return "Python's start-up and per-step cost are not in this estimate: [probing] python is empty, so no "
           "interpreter is measured";
  if (!device.runtime_problem.empty())
    return "Python's start-up and per-step cost are not in this estimate: " + device.runtime_problem;
  return std::nullopt;  // not measured yet: the estimate's own warning says so
}

bool ProbeService::take_results(Device& device, Running& probe) {
  // Only whole lines: the worker flushes each result once measured; a line cut short by a
  // kill has no newline and is never read.
  const std::string output = read_file(probe.directory / "results.jsonl");
  std::vector<std::string> lines;
  for (std::size_t from = 0, end; (end = output.find('\n', from)) != std::string::npos; from = end + 1)
    if (end > from) lines.push_back(output.substr(from, end - from));
  const std::size_t taken_before = probe.taken;
  double joules = 0.0;
  std::string source;
  for (; probe.taken < lines.size() && probe.taken < probe.plans.size(); ++probe.taken) {
    const auto parsed = json::parse(lines[probe.taken], nullptr, false);
    if (const auto metered = accept_result(device, probe.run_id, probe.plans[probe.taken], parsed)) {
      joules += metered->first;
      source = metered->second;
    }
  }
  if (joules > 0.0) {
    // Probing spends the budgets that cover the device like any other work.
    const auto ended = now_ms();
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(clock_.steady() - probe.taken_at);
    budgets_.record(
        adapters::StoredEnergyUse{budgets_.node(), device.name, "probe", ended - took.count(), ended, joules, source});
  }
  if (probe.taken > 0) probe.taken_at = clock_.steady();
  return taken_before != probe.taken;
}

void ProbeService::preempt(const std::string& device_name) {
  const auto it = devices_.find(device_name);
  if (it == devices_.end() || !it->second->probe || it->second->probe->environment_only) return;
  Device& device = *it->second;
  device.probe->preempted = true;
  // At once: the job must not share the device with a probe, and a half-measured probe is worthless.
  device.probe->worker->kill();
  spdlog::info("device {}: probe pre-empted by a job", device_name);
}

void ProbeService::on_probe_exit(const std::string& device_name, const std::optional<adapters::ExitStatus>& exit) {
  const auto it = devices_.find(device_name);
  if (it == devices_.end() || !it->second->probe) return;
  Device& device = *it->second;
  // Its ChildProcess (which calls this) goes with `probe` at the end: nothing of it is used below.
  Running probe = std::move(*device.probe);
  device.probe.reset();
  const double seconds = std::chrono::duration<double>(clock_.steady() - probe.started).count();
  std::error_code ec;

  if (probe.environment_only) {
    const auto parsed = json::parse(read_file(probe.directory / "stdout"), nullptr, false);
    if (!exit || !exit->success() || !parsed.is_object()) {
      const std::string why = last_line(read_file(probe.directory / "stderr", 4096));
      device.cycle.environment_failed(fmt::format("joule-worker env failed: {}", why.empty() ? "no output" : why));
      spdlog::error("device {}: {} (probing is off for this device until a reload)", device_name,
                    device.cycle.waiting());
      // A run requested before the check ended would otherwise wait out its seconds for nothing.
      if (device.active_run) {
        device.cycle.end_request();
        close_run(device, "failed", device.cycle.waiting());
      }
      return;
    }
    const std::string environment = parsed.value("fingerprint", "");
    device.cycle.environment_known();
    if (!device.environment.empty() && environment != device.environment) {
      spdlog::warn(
          "device {}: its energy model was learnt under \"{}\" but probes now run under \"{}\"; the model "
          "is withdrawn and the device re-probes",
          device_name, device.environment, environment);
      models_.withdraw(device_name);
      device.environment = environment;
      begin_campaign(device, "environment");
      device.replacing.reset();  // nothing to keep serving: it described other conditions
    } else {
      device.environment = environment;
    }
    return;
  }

  if (probe.runtime_only) {
    on_runtime_exit(device, probe, exit, seconds);
    return;
  }

  auto run = runs_.find(probe.run_id);
  if (run != runs_.end()) run->second.probe_seconds += seconds;
  // What the worker measured before it ended is kept however it ended (a pre-empted batch
  // keeps the plans it finished).
  take_results(device, probe);
  std::size_t done = probe.taken;
  std::string failure;
  ProbeOutcome outcome = ProbeOutcome::completed;
  if (probe.preempted) {
    outcome = ProbeOutcome::preempted;
    metrics_.count_probe_outcome(device_name, "preempted");
    if (run != runs_.end()) ++run->second.preempted;
  } else if (done < probe.plans.size()) {
    // The plan it was on failed (or the worker ended without its result): not tried again. The
    // ones after it never ran.
    outcome = ProbeOutcome::failed;
    const auto& target = probe.plans[done].target;
    const std::string why = last_line(read_file(probe.directory / "stderr.log", 8192));
    metrics_.count_probe_outcome(device_name, "failed");
    failure = fmt::format("probe of {} ({}) failed with {}: {}", target.layer.type,
                          estimator::to_string(target.position), exit ? exit->describe() : "no exit status", why);
    spdlog::warn("device {}: {}", device_name, failure);
    if (run != runs_.end()) {
      ++run->second.failed;
      run->second.message = failure;
    }
    ++done;
  }
  for (std::size_t i = done; i < probe.plans.size(); ++i) device.planner->unmark_probed(probe.plans[i].target);
  if (run != runs_.end()) save_run(run->first);
  std::filesystem::remove_all(probe.directory, ec);
  if (device.cycle.probe_ended(clock_.steady(), outcome))
    close_run(device, "failed", failure + " (" + device.cycle.backoff_reason() + ")");
}

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

void ProbeService::feedback(const JobFeedback& feedback) {
  const auto it = devices_.find(feedback.device);
  if (it == devices_.end()) return;
  Device& device = *it->second;
  if (feedback.partial || !feedback.estimate.ok) return;
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
    probing["runtime"] = std::move(runtime);
  }
  return {{"last_probe_ms", device.last_probe_ms ? json(*device.last_probe_ms) : json(nullptr)},
          {"heldout_error", heldout},
          {"probing", probing}};
}

}  // namespace joule::daemon
