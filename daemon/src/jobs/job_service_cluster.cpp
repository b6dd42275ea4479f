// The JobService's cluster half: on a coordinator, the agents' devices and the jobs placed on
// them (placed here, run there, reported back); on an agent, the jobs it runs for its
// coordinator. Identity across nodes is (job id, placement epoch); see cluster/reconcile.hpp.

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "executors/agent_runner.hpp"
#include "executors/local_executor.hpp"
#include "executors/node_executor.hpp"
#include "job_record.hpp"
#include "joule/common/energy_source.hpp"
#include "joule/daemon/job_service.hpp"

namespace joule::daemon {

using adapters::StoredEvent;
using nlohmann::json;
using schedulers::JobState;

void JobService::refresh_pending() {
  for (const auto& id : core().queue().first(core().queue().size())) core().update_pending(pending_job(*jobs_.at(id)));
}

NodeJobs& JobService::nodes() { return *nodes_; }

void JobService::adopt(Job& job, Device& device, const std::string& note, const std::string& report_state,
                       std::optional<std::int64_t> started_ms) {
  device.hold(job.row.id, device.cores_for(job.held_cores()));
  job.waiting.reset();
  track_run(job, device, started_ms.value_or(now_ms()));
  transition(job, JobState::placed, note);
  if (report_state != "placed") {
    if (!job.row.started_ms) job.row.started_ms = started_ms.value_or(now_ms());
    transition(job, JobState::running, note);
  }
}

void JobService::queue_again(Job& job, Device& device, const std::string& why) {
  if (job.spec.restart == schedulers::RestartPolicy::fail) {
    finish(job, JobState::failed, why + "; restart = fail", std::nullopt);
    return;
  }
  // Its energy on the node up to the last report is kept; the run is fenced by epoch.
  std::optional<adapters::StoredEnergyUse> used;
  const auto reported = nodes_->energy_so_far(job, device, nullptr);
  if (reported && job.row.started_ms)
    used = adapters::StoredEnergyUse{device.node,
                                     device.agent_device,
                                     job.row.id,
                                     *job.row.started_ms,
                                     now_ms(),
                                     *reported,
                                     std::string(device.meter->source())};
  budgets_.settle(job.row.id, used);
  release_controls(job, /*ended=*/false);  // the epoch stays: the node may come back with it
  device.release(job.row.id);
  job.row.started_ms.reset();
  job.forget_run_reports();
  transition(job, JobState::queued, fmt::format("{}: queued again (epoch {} is fenced)", why, job.row.epoch));
  enqueue(job);
}

void JobService::run_lost(Job& job, const std::string& why) {
  Device* device = devices_.find(job.row.device);
  if (!device || schedulers::is_terminal(job.state)) return;
  queue_again(job, *device, why);
  schedule();
}

Device& JobService::remote_device(const std::string& name) {
  if (Device* device = devices_.find(name)) return *device;
  const auto slash = name.find('/');
  Device& device = devices_.add_agent_device(name.substr(0, slash), name.substr(slash + 1), "");
  device.ref = budgets_.device_ref(device.name);
  return device;
}

Result<JobView> JobService::pause(const std::string& id, bool pause) {
  auto it = jobs_.find(id);
  if (it == jobs_.end())
    return not_in_memory(id, fmt::format("is {{}}: only a running job can be {}", pause ? "paused" : "resumed"));
  Job& job = *it->second;
  if (job.state != JobState::running && job.state != JobState::throttled)
    return make_error(ErrorCode::conflict, fmt::format("job {} is {}: only a running job can be {}", id, job.row.state,
                                                       pause ? "paused" : "resumed"));
  if (job.paused != pause) {
    schedulers::ThrottleAction action;
    action.kind = pause ? schedulers::ThrottleAction::Kind::pause : schedulers::ThrottleAction::Kind::resume;
    action.job = id;
    action.rule = "user";
    action.reason = pause ? "paused by hand" : "resumed by hand";
    apply(action);
    if (job.paused != pause)
      return make_error(ErrorCode::unavailable,
                        fmt::format("job {} could not be {} (see the log)", id, pause ? "paused" : "resumed"));
  }
  return view_of(job);
}

// --- Agent ---

AgentJobs& JobService::agent() { return *agent_; }

void JobService::take_assignment(const cluster::Assignment& assignment, std::function<void(bool)> done) {
  const std::string local_id = fmt::format("{}.{}", assignment.id, assignment.epoch);
  // Taken up before and ended long ago (out of memory): never run again.
  if (archive_) {
    if (auto stored = archive_->find_job(local_id); !stored || *stored) return done(false);
  }
  auto job = std::make_unique<Job>();
  job->row.id = local_id;
  job->row.origin = assignment.id;
  job->row.epoch = assignment.epoch;
  job->row.sequence = next_sequence_++;
  job->row.name = assignment.name.empty() ? local_id : assignment.name;
  job->row.state = "queued";
  job->row.priority = assignment.priority;
  job->row.submitted_ms = now_ms();
  // The coordinator chose the device: the job may run there only.
  auto spec = schedulers::parse_job_spec(assignment.spec);
  std::string refused;
  if (!spec) {
    refused =
        fmt::format("the coordinator's job does not parse here: {} at {}", spec.error().message, spec.error().where);
  } else {
    // A job on several GPUs: on the GPUs the coordinator held for it, and no others.
    spec->constraints.devices = {assignment.device};
    for (const auto& other : assignment.companions) spec->constraints.devices.push_back(other);
    if (auto runnable = check_runnable(*spec, local_->job_identity(next_sequence_, std::nullopt)); !runnable)
      refused = fmt::format("cannot run here: {} ({})", runnable.error().message, runnable.error().where);
    job->spec = std::move(spec).value();
  }
  job->row.spec_json = spec ? schedulers::to_json(job->spec).dump() : assignment.spec.dump();
  if (refused.empty() && estimator_ && job->spec.model && job->spec.training)
    set_estimates(*job, estimator_->estimate_job(job->spec));
  StoredEvent event{
      local_id, job->row.submitted_ms, "queued",
      fmt::format("assigned by the coordinator: job {} epoch {} on {}{}", assignment.id, assignment.epoch,
                  assignment.device,
                  assignment.companions.empty() ? std::string()
                                                : fmt::format(" (and {})", fmt::join(assignment.companions, ", ")))};
  job->events.push_back(event);
  std::shared_ptr<Job> pending = std::move(job);
  // Built before `pending` moves into the completion below.
  Write write = [row = pending->row, event](adapters::Database& db) -> Status {
    if (auto s = db.insert_job(row); !s) return s;
    return db.insert_event(event);
  };
  persist(std::move(write), [this, job = std::move(pending), refused, done = std::move(done)](Status status) mutable {
    const std::string id = job->row.id;
    if (!status) {
      // Not stored: not taken. The next sync offers it again.
      spdlog::error("job {}: could not store the coordinator's assignment: {}", id, status.error().message);
      return done(false);
    }
    auto owned = std::make_unique<Job>(std::move(*job));
    index(*owned);
    jobs_.emplace(id, std::move(owned));
    done(true);
    Job& stored = *jobs_.at(id);
    if (!refused.empty()) return finish(stored, JobState::failed, refused, std::nullopt);
    enqueue(stored);
    refresh_state_metrics();
    schedule();
  });
}

}  // namespace joule::daemon
