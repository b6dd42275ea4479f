// ProbeService's runs of joule-worker: the environment check, layer probes and the runtime probe,
// started through the job runner, their results taken as they come and their ends.
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
#include <fmt/ranges.h>
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

void ProbeService::check_environment(Device& device) {
  // `joule-worker env` says which LibTorch, BLAS and threads probes would run under now; a
  // model learnt under others is withdrawn before it estimates anything.
  const auto directory = options_.state_directory / "probes" / fmt::format("env-{}", device.name);
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  adapters::LaunchSpec spec;
  spec.argv = {worker_for(device.name).string(),
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
    spdlog::error("device {}: cannot start {}: {}", device.name, worker_for(device.name).string(),
                  worker.error().message);
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
  // A MIG device is the one CUDA device its process sees (joule-worker trains on cuda:0 there).
  adapters::LaunchSpec launch = spec;
  if (const daemon::Device* entry = table_.find(device.name); entry && !entry->cuda_visible.empty()) {
    // cuda:N is NVML's GPU N, numbered by PCI bus; CUDA numbers fastest first unless told.
    launch.env.push_back("CUDA_DEVICE_ORDER=PCI_BUS_ID");
    if (entry->mig_gpu) launch.env.push_back("CUDA_VISIBLE_DEVICES=" + entry->cuda_visible);
  }
  return ChildProcess::launch(
      io_, launch, fmt::format("device {}: {}", device.name, what),
      [this, name = device.name](std::optional<adapters::ExitStatus> exit) { on_probe_exit(name, exit); });
}

void ProbeService::start_probe(Device& device) {
  // Each stretch of probing learns for the jobs queued and finished since the last one.
  if (!device.active_run) refresh_workload(device);
  if (runtime_due(device)) {
    start_runtime_probe(device);
    return;
  }
  if (reference_due(device)) {
    start_whole_probe(device, *device.reference);
    return;
  }
  if (auto next = next_probe(device); next && next->whole) {
    start_whole_probe(device, *next->whole, next->setting);
    return;
  }
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
  const auto give_back = [&] {
    for (const auto& plan : plans) device.planner->unmark_probed(plan.target);
  };

  const int threads = config::device_threads(*device.config, options_.probing);
  const auto directory = open_probe_directory(device, "");
  adapters::LaunchSpec spec;
  spec.argv = {worker_for(device.name).string(), "probe"};
  for (std::size_t i = 0; i < plans.size(); ++i) {
    worker::ProbeRequest request =
        probe_request(options_.probing, *device.config, device.name, threads, plans[i].target.batch_size, next_run_++);
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
  Running running;
  running.plans = std::move(plans);
  running.directory = directory;
  if (!launch_probe(device, spec, "probe", std::move(running))) give_back();
}

bool ProbeService::launch_probe(Device& device, const adapters::LaunchSpec& spec, const std::string& what,
                                Running running) {
  auto worker = launch_worker(device, spec, what);
  if (!worker) {
    spdlog::error("device {}: cannot start the {}: {}", device.name, what, worker.error().message);
    device.cycle.launch_failed(clock_.steady(), "cannot start joule-worker: " + worker.error().message);
    return false;
  }
  running.run_id = *device.active_run;
  running.worker = std::move(*worker);
  running.started = clock_.steady();
  running.taken_at = running.started;
  device.probe = std::move(running);
  device.cycle.probe_started();
  return true;
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
  if (options_.probing.python.empty()) return false;
  const auto& runtimes = device.learning->runtimes();
  const auto measured = runtimes.find("python");
  if (measured == runtimes.end()) return !device.runtime_tried;
  const std::int64_t last = std::max(measured->second.measured_ms, device.runtime_attempt_ms);
  // A layer kind of the workload that no run has read yet: soon, as a run that pools too few.
  for (const auto& kind : device.runtime_kinds_wanted)
    if (!measured->second.kinds.contains(kind) && !device.runtime_kinds_unread.contains(kind))
      return now_ms() >= last + static_cast<std::int64_t>(kRuntimeRereadMinutes * 60'000.0);
  // Read again (estimator::kRuntimeRunsPooled says why): soon while it pools fewer runs than it
  // keeps, then with the reference network; never with reference_minutes = 0.
  const double every = options_.probing.reference_minutes;
  if (!(every > 0.0)) return false;
  const double minutes =
      measured->second.runs() < estimator::kRuntimeRunsPooled ? std::min(every, kRuntimeRereadMinutes) : every;
  return now_ms() >= last + static_cast<std::int64_t>(minutes * 60'000.0);
}

std::filesystem::path ProbeService::open_probe_directory(Device& device, const std::string& kind) {
  if (!device.active_run) open_run(device, run_reason(device), std::nullopt);
  const auto directory = options_.state_directory / "probes" /
                         fmt::format("{}-{}{}", *device.active_run, kind.empty() ? "" : kind + "-", next_run_++);
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  return directory;
}

void ProbeService::start_runtime_probe(Device& device) {
  const int threads = config::device_threads(*device.config, options_.probing);
  const auto directory = open_probe_directory(device, "runtime");
  adapters::LaunchSpec spec;
  spec.argv = {worker_for(device.name).string(),
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
  // The workload's own layer kinds not read yet first, then those read before
  // (estimator::runtime_kinds_to_read); none this campaign found unreadable.
  std::vector<std::string> wanted;
  for (const auto& kind : device.runtime_kinds_wanted)
    if (!device.runtime_kinds_unread.contains(kind)) wanted.push_back(kind);
  const auto earlier = device.learning->runtimes().find("python");
  const std::vector<std::string> kinds = estimator::runtime_kinds_to_read(
      wanted, earlier != device.learning->runtimes().end() ? earlier->second.kinds
                                                           : std::map<std::string, estimator::RuntimeKindCost>{});
  if (!kinds.empty()) spec.argv.insert(spec.argv.end(), {"--kinds", fmt::format("{}", fmt::join(kinds, ","))});
  set_probe_launch(spec, directory, threads, "result.json");
  Running running;
  running.directory = directory;
  running.runtime_only = true;
  running.runtime_kinds = kinds;
  if (!launch_probe(device, spec, "runtime probe", std::move(running))) return;
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
    device.runtime_attempt_ms = now_ms();
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
        for (auto& reading : cost->steps) reading.measured_ms = ended;
        for (auto& reading : cost->starts) reading.measured_ms = ended;
        // Pooled with the runs before it: this campaign's, else the model it replaces.
        for (const estimator::DeviceEnergyModel* model :
             {static_cast<const estimator::DeviceEnergyModel*>(device.learning.get()), device.fitted.get(),
              device.replacing.get()}) {
          if (!model) continue;
          const auto earlier = model->runtimes().find(cost->runtime);
          if (earlier == model->runtimes().end()) continue;
          if (auto pooled = estimator::pool_runtime_runs(earlier->second, *cost)) cost = std::move(pooled);
          break;
        }
        device.learning->set_runtime(*cost);
        if (device.fitted && !device.replacing) {
          auto updated = std::make_shared<estimator::DeviceEnergyModel>(*device.fitted);
          updated->set_runtime(*cost);
          device.fitted = updated;
          install_model(device, updated);
        }
        device.runtime_problem.clear();
        // A kind asked for and not read (its network would not build or train there) is not asked
        // again by runtime_due; the worker's stderr says why.
        for (const auto& kind : probe.runtime_kinds)
          if (std::none_of(result->steps.begin(), result->steps.end(),
                           [&](const estimator::RuntimeStepReading& r) { return r.kind == kind; })) {
            device.runtime_kinds_unread.insert(kind);
            spdlog::warn("device {}: the runtime probe did not read {} layers on their own ({})", name, kind,
                         last_line(read_file(probe.directory / "stderr.log", 8192)));
          }
        spdlog::info(
            "device {}: {} ({}) starts in {:.2f} s ({:.3g} J) and adds {:.0f} µs + {:.1f} µs per module to "
            "each step ({}; {:.3g} + {:.3g} J; ±{:.0f} %, {} run{} pooled)",
            name, result->interpreter, result->version, cost->start_seconds, cost->start_joules,
            cost->step_seconds_base * 1e6, cost->step_seconds_per_module * 1e6, result->meter_source,
            cost->step_joules_base, cost->step_joules_per_module, 100.0 * cost->step_sigma, cost->runs(),
            cost->runs() == 1 ? "" : "s");
        if (!cost->kinds.empty()) {
          std::vector<std::string> kinds;
          for (const auto& [kind, k] : cost->kinds)
            kinds.push_back(fmt::format("{} {:.1f}", kind, k.seconds_per_layer * 1e6));
          spdlog::info("device {}: per layer of a kind read on its own network, µs a step: {}", name,
                       fmt::join(kinds, ", "));
        }
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

const std::filesystem::path& ProbeService::worker_for(const std::string& device_name) const {
  const daemon::Device* entry = table_.find(device_name);
  return entry && !entry->worker.empty() ? entry->worker : options_.worker;
}

bool ProbeService::probing(const std::string& device_name) const {
  const auto it = devices_.find(device_name);
  return it != devices_.end() && it->second->probe && !it->second->probe->environment_only;
}

void ProbeService::preempt(const std::string& device_name) {
  // A probe on a MIG device reads its GPU's counter whole: a job on a sibling would be in it.
  if (const daemon::Device* entry = table_.find(device_name); entry && entry->mig_gpu)
    for (const auto& other : table_)
      if (other.name != device_name && other.mig_gpu == entry->mig_gpu) preempt_here(other.name);
  preempt_here(device_name);
}

void ProbeService::preempt_here(const std::string& device_name) {
  const auto it = devices_.find(device_name);
  if (it == devices_.end() || !it->second->probe || it->second->probe->environment_only) return;
  Device& device = *it->second;
  device.probe->preempted = true;
  // At once: the job must not share the device with a probe, and a half-measured probe is worthless.
  device.probe->worker->kill();
  // And the device's defaults back before the job sets its own knobs.
  put_knobs_back(*device.probe);
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
  if (probe.whole) {
    on_whole_exit(device, probe, exit, seconds);
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

}  // namespace joule::daemon
