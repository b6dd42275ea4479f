#include "node_executor.hpp"

#include "joule/common/energy_source.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "../job_record.hpp"
#include "joule/cluster/reconcile.hpp"

namespace joule::daemon {

using nlohmann::json;
using schedulers::JobState;

NodeExecutor::NodeExecutor(ExecutorHost& host, DeviceTable& devices) : host_(host), devices_(devices) {}

void NodeExecutor::changed(const std::string& device_name) {
  if (const Device* device = devices_.find(device_name); device && device->on_agent())
    for (const auto& hook : node_changed_) hook(device->node);
}

void NodeExecutor::update_node(const std::string& node, const std::vector<cluster::ReportedDevice>& reported) {
  bool added = false;
  bool woke = false;
  for (const auto& report : reported) {
    const std::string name = node + "/" + report.name;
    Device* device = devices_.find(name);
    if (!device) {
      device = &devices_.add_agent_device(node, report.name, report.source);
      host_.device_added(*device);
      added = true;
      spdlog::info("node {}: device {} ({} meter{})", node, report.name, report.source,
                   report.runs_jobs ? "" : "; estimation only");
      if (const auto signals = node_signals_.find(node); signals != node_signals_.end()) {
        device->reported_carbon = signals->second.carbon;
        device->reported_price = signals->second.price;
      }
    }
    device->meter->reported_readings()->report(report.source, report.energy_joules, report.meter_error);
    device->meter_note = fmt::format("metered on agent {} by its {} meter", node, report.source);
    device->runs_jobs = report.runs_jobs;
    // Its cores shared among jobs as the agent shares them: the coordinator packs jobs that ask
    // for cores there, and the agent's own placement runs them side by side.
    device->shared_cores = report.cores;
    // Its GPUs of one model, as a group of this node alone: a job on several GPUs runs on GPUs
    // of one node (its processes meet on the node's loopback).
    device->gpu_group = report.gpu_group.empty() ? "" : node + "/" + report.gpu_group;
    device->reported_power_watts = report.power_watts;
    device->battery_percent = report.battery_percent;
    // Busy with something this coordinator did not place there (a fenced run still stopping).
    device->reported_busy = report.busy && device->idle();
    woke = woke || !device->node_ready;
    device->node_ready = true;
  }
  if (added || woke) host_.devices_changed(added);
}

void NodeExecutor::set_progress_token(const std::string& job, std::int64_t epoch, const std::string& sha256) {
  JobRecord* found = host_.find_job(job);
  if (found && found->row.epoch == epoch) found->row.token_sha256 = sha256;
}

void NodeExecutor::set_node_signals(const std::string& node, std::shared_ptr<const cluster::ReportedSignal> carbon,
                                    std::shared_ptr<const cluster::ReportedSignal> price) {
  node_signals_[node] = NodeSignals{carbon, price};
  for (const std::size_t index : devices_.of_node(node)) {
    devices_[index].reported_carbon = carbon;
    devices_[index].reported_price = price;
  }
  host_.devices_changed(false);  // a pass: the node's jobs may cost otherwise now
}

void NodeExecutor::node_lost(const std::string& node) {
  // Every device of the node leaves placement before any of its jobs is queued again.
  for (const std::size_t index : devices_.of_node(node)) {
    Device& device = devices_[index];
    device.node_ready = false;
    device.reported_busy = false;
    device.meter->reported_readings()->silence(fmt::format("node {} is lost", node));
  }
  for (const std::size_t index : devices_.of_node(node)) {
    Device& device = devices_[index];
    const std::vector<DeviceHold> holds = device.holds;  // lost() releases them
    for (const DeviceHold& hold : holds) {
      JobRecord* job = host_.find_job(hold.job);
      if (!job || schedulers::is_terminal(job->state)) continue;
      host_.lost(*job, device, fmt::format("node {} lost (no sync within its lease)", node));
    }
  }
  host_.devices_changed(false);
}

std::vector<std::string> NodeExecutor::nodes_with_jobs() const {
  std::set<std::string> nodes;
  for (const auto& device : devices_)
    if (device.on_agent()) nodes.insert(device.node);
  return {nodes.begin(), nodes.end()};
}

std::string NodeExecutor::prepare(JobRecord& job, Device&) {
  // A new epoch per placement: whatever still runs an older one is fenced by it.
  job.row.epoch += 1;
  Run& run = runs_[job.row.id];
  run.seen = false;
  run.reported_used.reset();
  return fmt::format(" (epoch {})", job.row.epoch);
}

void NodeExecutor::start(JobRecord& job, Device&) {
  // Stored before the node may see it: a node only ever runs an epoch that survives a crash.
  runs_[job.row.id].committed_epoch = job.row.epoch;
  changed(job.row.device);
}

void NodeExecutor::stop(JobRecord& job) {
  if (!runs_[job.row.id].seen) {
    // The node has not taken it up: it ends here, and leaves the node's desired state.
    host_.ended(job, JobState::cancelled, "cancelled before it started", std::nullopt);
    return;
  }
  host_.note(job, "cancel requested; the agent stops it");
  changed(job.row.device);
}

Status NodeExecutor::throttle(JobRecord& job, Device&, const schedulers::ThrottleAction& action) {
  // The node pauses and resumes it as its desired state says on its next sync; CPU quotas and
  // GPU limits stay with the node's own policy (it offers none here: can_limit_cpu is false).
  using Kind = schedulers::ThrottleAction::Kind;
  if (action.kind != Kind::pause && action.kind != Kind::resume)
    return make_error(ErrorCode::unavailable, "a job on another node is only paused or resumed from here");
  job.paused = action.kind == Kind::pause;
  changed(job.row.device);
  return {};
}

std::optional<double> NodeExecutor::energy_so_far(JobRecord& job, Device& device, const adapters::ExitStatus*) {
  const auto it = runs_.find(job.row.id);
  if (it == runs_.end()) return std::nullopt;
  if (it->second.reported_used) return it->second.reported_used;
  // A node that meters nothing while a job runs (Slurm): its estimate pro rata of its run time,
  // where the device's figures are a model's anyway (never beside a meter's: it would read as one).
  if (is_measurement(device.meter->source()) || !job.row.started_ms) return std::nullopt;
  const auto estimate = host_.estimate_for(job, device.name);
  if (!estimate || estimate->seconds_mean <= 0.0) return std::nullopt;
  const double elapsed =
      static_cast<double>(std::max<std::int64_t>(0, host_.clock().unix_ms() - *job.row.started_ms)) / 1000.0;
  return estimate->joules_mean * std::min(1.0, elapsed / estimate->seconds_mean);
}

std::string NodeExecutor::source_so_far(const JobRecord& job, const Device& device) const {
  const auto it = runs_.find(job.row.id);
  if (it != runs_.end() && it->second.reported_used && !it->second.reported_source.empty())
    return it->second.reported_source;
  return Executor::source_so_far(job, device);
}

bool NodeExecutor::settle_energy(JobRecord&, Device*, const adapters::ExitStatus*) {
  // finish() has put the node's figure on the row; the node's own model learns from it there.
  return false;
}

void NodeExecutor::release(JobRecord& job, bool ended) {
  if (ended) {
    runs_.erase(job.row.id);
    return;
  }
  // Its node is lost: the epoch stays, so that the node coming back with it can be adopted.
  const auto it = runs_.find(job.row.id);
  if (it == runs_.end()) return;
  it->second.seen = false;
  it->second.reported_used.reset();
}

void NodeExecutor::recover(JobRecord& job, Device* device) {
  if (device) device->hold(job.row.id, 0);  // an agent's device runs one job at a time
  for (const auto& name : job.row.companions)  // and a job on several GPUs holds them all
    if (Device* other = devices_.find(name)) other->hold(job.row.id, 0);
  Run& run = runs_[job.row.id];
  run.committed_epoch = job.row.epoch;
  run.seen = job.state != JobState::placed;
  host_.reserve_again(job);
  spdlog::info("job {}: {} on {} (epoch {}); waiting for node {} to report it", job.row.id, job.row.state,
               job.row.device, job.row.epoch, host_.device_node(job.row.device));
}

std::vector<cluster::Assignment> NodeExecutor::desired_for(const std::string& node) const {
  std::vector<cluster::Assignment> out;
  for (const std::size_t index : devices_.of_node(node)) {
    const Device& device = devices_[index];
    // Every job it holds: one, or several side by side on a device that shares its cores.
    for (const DeviceHold& hold : device.holds) {
      JobRecord* found = host_.find_job(hold.job);
      if (!found) continue;
      const JobRecord& job = *found;
      // A job on several GPUs is held by each; it is assigned once, on its own device.
      if (job.row.device != device.name) continue;
      const auto run = runs_.find(job.row.id);
      if (schedulers::is_terminal(job.state) || run == runs_.end() || run->second.committed_epoch != job.row.epoch)
        continue;
      cluster::Assignment assignment;
      assignment.id = job.row.id;
      assignment.epoch = job.row.epoch;
      assignment.device = device.agent_device;
      for (const auto& name : job.row.companions)
        if (const Device* other = devices_.find(name)) assignment.companions.push_back(other->agent_device);
      assignment.name = job.row.name;
      assignment.priority = job.row.priority;
      assignment.spec = json::parse(job.row.spec_json, nullptr, false);
      // A range of cores the coordinator chose a count in: the agent runs it at that count.
      if (job.row.cores > 0 && assignment.spec.is_object() && assignment.spec.contains("resources") &&
          assignment.spec["resources"].is_object())
        assignment.spec["resources"]["cores"] = job.row.cores;
      assignment.paused = job.paused;
      assignment.stop = job.cancel_requested;
      out.push_back(std::move(assignment));
    }
  }
  return out;
}

std::vector<std::pair<std::string, std::int64_t>> NodeExecutor::apply_reports(
    const std::string& node, const std::vector<cluster::ReportedJob>& reports) {
  std::vector<std::pair<std::string, std::int64_t>> recorded;
  for (const auto& report : reports) {
    JobRecord* found = host_.find_job(report.id);
    std::optional<cluster::CoordinatorJob> known;
    if (found) {
      // The job's latest epoch, stored or still being stored: while a new placement's write is
      // in flight, a report of the one before it is stale (it once settled the new placement
      // with the old run's end).
      known = cluster::CoordinatorJob{found->state, found->row.epoch, host_.device_node(found->row.device)};
    }
    const auto verdict = cluster::judge_report(known, node, report);
    if (verdict == cluster::Verdict::stale) {
      // A fenced run that ended: nothing to record, but the node may stop reporting it.
      const auto state = schedulers::job_state_from_string(report.state);
      if (state && schedulers::is_terminal(*state)) recorded.emplace_back(report.id, report.epoch);
      continue;
    }
    JobRecord& job = *found;
    Run& run = runs_[job.row.id];
    switch (verdict) {
      case cluster::Verdict::started:
        run.seen = true;
        run.reported_used = report.energy_joules;
        run.reported_source = report.energy_source;
        job.row.started_ms = report.started_ms.value_or(host_.clock().unix_ms());
        host_.running(job, fmt::format("started on {} (epoch {})", job.row.device, report.epoch));
        break;
      case cluster::Verdict::progress:
        run.seen = true;
        run.reported_used = report.energy_joules;
        run.reported_source = report.energy_source;
        break;
      case cluster::Verdict::finished:
        finish(job, report);
        recorded.emplace_back(report.id, report.epoch);
        break;
      case cluster::Verdict::fenced:
        // Its agent was silent past the job's lease (down or hung) but back before the node was
        // declared lost: the runner ended the run; the job runs again, on a new epoch.
        host_.run_lost(job, fmt::format("its run on {} was fenced ({})", job.row.device, report.reason));
        recorded.emplace_back(report.id, report.epoch);
        break;
      case cluster::Verdict::ended_while_lost:
        // Queued again after its node was lost, and that node ran it to the end: taken back onto
        // its device and ended, if the device is still free for it; else it runs again.
        if (Device* device = devices_.find(job.row.device); device && device->idle()) {
          run.seen = true;
          host_.adopt(job, *device,
                      fmt::format("{} came back having run it to the end (epoch {})", device->node, report.epoch),
                      "running", report.started_ms);
          finish(job, report);
        }
        recorded.emplace_back(report.id, report.epoch);
        break;
      case cluster::Verdict::recorded:
        recorded.emplace_back(report.id, report.epoch);
        break;
      case cluster::Verdict::adopt:
        if (Device* device = devices_.find(job.row.device); device && device->idle()) {
          run.seen = true;
          run.reported_used = report.energy_joules;
          run.reported_source = report.energy_source;
          host_.adopt(job, *device,
                      fmt::format("adopted: {} came back still running it (epoch {})", device->node, report.epoch),
                      report.state, report.started_ms);
        }
        break;
      case cluster::Verdict::stale:
        break;
    }
  }
  return recorded;
}

void NodeExecutor::finish(JobRecord& job, const cluster::ReportedJob& report) {
  const auto state = schedulers::job_state_from_string(report.state).value_or(JobState::failed);
  // It started and ended between two syncs: it did run.
  if (job.state == JobState::placed && state != JobState::cancelled && state != JobState::failed)
    host_.count_as_run(job);
  if (!job.row.started_ms && report.started_ms) job.row.started_ms = report.started_ms;
  job.row.energy_joules = report.energy_joules;
  job.row.energy_source = report.energy_source;
  if (!report.energy_joules && job.row.started_ms) {
    // No meter where it ran (a Slurm node): it is charged its estimate there, labelled a model's figure.
    if (const auto* estimate = find_estimate(job.estimates, job.row.device); estimate && estimate->ok) {
      job.row.energy_joules = estimate->joules_mean;
      job.row.energy_source = estimate->source == EnergySource::simulated ? "simulated" : "modelled";
    }
  }
  job.row.energy_partial = report.energy_partial;
  std::optional<adapters::ExitStatus> exit;
  if (report.exit_code) {
    adapters::ExitStatus status;
    status.signaled = *report.exit_code > 128;
    status.value = status.signaled ? *report.exit_code - 128 : *report.exit_code;
    exit = status;
  }
  const std::string reason = fmt::format("{} (on {}, epoch {})", report.reason.empty() ? report.state : report.reason,
                                         job.row.device, report.epoch);
  host_.ended(job, state, reason, exit);
}

}  // namespace joule::daemon
