#include "agent_runner.hpp"

#include <fmt/format.h>

#include "../job_record.hpp"

namespace joule::daemon {

using schedulers::JobState;

AgentRunner::AgentRunner(AgentHost& host, const DeviceTable& devices) : host_(host), devices_(devices) {}

AgentRunner::~AgentRunner() { *alive_ = false; }

std::vector<cluster::LocalAssignment> AgentRunner::local_assignments() const {
  std::vector<cluster::LocalAssignment> out;
  host_.for_each_assigned([&](const JobRecord& job) {
    out.push_back({job.row.id, job.row.origin, job.row.epoch, schedulers::is_terminal(job.state), job.paused,
                   job.cancel_requested});
  });
  for (const auto& id : in_flight_) {
    const auto dot = id.rfind('.');
    out.push_back({id, id.substr(0, dot), std::stoll(id.substr(dot + 1)), false, false, false});
  }
  return out;
}

std::vector<cluster::ReportedJob> AgentRunner::assignment_reports(
    const std::set<std::pair<std::string, std::int64_t>>& acknowledged) const {
  std::vector<cluster::ReportedJob> out;
  const auto now = host_.clock().unix_ms();
  host_.for_each_assigned([&](const JobRecord& job) {
    const auto& row = job.row;
    // What is stored, not what is being stored: an end the coordinator records must be one this
    // node keeps across a kill -9 (its own view of the job says the same as the coordinator's).
    const ShownRow& stored = job.shown;
    const auto stored_state = schedulers::job_state_from_string(stored.state);
    const bool ended = stored_state && schedulers::is_terminal(*stored_state);
    if (ended &&
        (acknowledged.contains({row.origin, row.epoch}) || now - stored.finished_ms.value_or(now) > kReportEndsForMs))
      return;
    cluster::ReportedJob report;
    report.id = row.origin;
    report.epoch = row.epoch;
    report.state = stored.state;
    report.reason = stored.reason;
    report.exit_code = stored.exit_code;
    report.started_ms = stored.started_ms;
    report.finished_ms = stored.finished_ms;
    report.energy_partial = stored.energy_partial;
    report.fenced = ended && *stored_state == JobState::cancelled && stored.reason.rfind(kFencedReason, 0) == 0;
    if (stored.energy_joules) {
      report.energy_joules = stored.energy_joules;
      report.energy_source = stored.energy_source;
    } else if (const Device* device = devices_.find(row.device)) {
      // Still running: its energy so far, as of its device's last sample.
      if (const auto used = host_.sampled_energy(job, *device)) {
        report.energy_joules = used;
        report.energy_source = std::string(device->meter->source());
      }
    }
    out.push_back(std::move(report));
  });
  return out;
}

void AgentRunner::assign(const cluster::Assignment& assignment) {
  const std::string local_id = fmt::format("{}.{}", assignment.id, assignment.epoch);
  if (host_.find_job(local_id) || in_flight_.contains(local_id)) return;
  in_flight_.insert(local_id);
  host_.take_assignment(assignment, [this, alive = alive_, local_id](bool) {
    // Stored or not, it is no longer in flight: a failed store is offered again by the next sync.
    if (*alive) in_flight_.erase(local_id);
  });
}

void AgentRunner::stop_assignment(const std::string& local_id, const std::string& why) {
  JobRecord* job = host_.find_job(local_id);
  if (!job || schedulers::is_terminal(job->state)) return;
  host_.note(*job, "stop: " + why);
  host_.cancel(local_id);
}

void AgentRunner::pause_assignment(const std::string& local_id, bool pause, const std::string& why) {
  const JobRecord* job = host_.find_job(local_id);
  if (!job || schedulers::is_terminal(job->state)) return;
  if (job->state != JobState::running && job->state != JobState::throttled) return;
  if (job->paused == pause) return;
  schedulers::ThrottleAction action;
  action.kind = pause ? schedulers::ThrottleAction::Kind::pause : schedulers::ThrottleAction::Kind::resume;
  action.job = local_id;
  action.rule = "coordinator";
  action.reason = why;
  host_.throttle(action);
}

std::vector<cluster::ReportedDevice> AgentRunner::reported_devices() const {
  std::vector<cluster::ReportedDevice> out;
  for (const auto& device : devices_) {
    if (device.on_agent()) continue;
    cluster::ReportedDevice report;
    report.name = device.name;
    report.source = std::string(device.meter->source());
    report.energy_joules = device.energy_joules;
    report.power_watts = device.power_watts;
    report.runs_jobs = device.runs_jobs;
    report.busy = !device.idle();
    report.battery_percent = device.battery_percent;
    report.meter_error = device.meter_error;
    report.cores = device.shared_cores;
    report.gpu_group = device.gpu_group;
    out.push_back(std::move(report));
  }
  return out;
}

}  // namespace joule::daemon
