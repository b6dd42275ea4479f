#pragma once
// A job as the JobService keeps it: its stored row, its spec, and what runs it now. Private
// to the JobService's source files.

#include <memory>
#include <optional>
#include <vector>

#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include "joule/daemon/job_service.hpp"
#include "joule/schedulers/step_projection.hpp"

namespace joule::daemon {

namespace asio = boost::asio;

struct JobService::Job {
  adapters::StoredJob row;  // everything that is persisted
  schedulers::JobSpec spec;
  schedulers::JobState state = schedulers::JobState::queued;
  std::vector<adapters::StoredEvent> events;
  // Run-time only:
  std::optional<double> energy_at_start;
  std::optional<double> cpu_seconds;  // its process group's CPU time, last read (CpuTimeModel meters)
  std::optional<double> used_joules;  // its energy so far while it runs, as of the last meter sample
  std::unique_ptr<asio::posix::stream_descriptor> exit_watch;
  std::unique_ptr<asio::steady_timer> kill_timer;
  bool cancel_requested = false;
  // Scheduling:
  schedulers::PendingJob pending;                   // what placement sees while it is queued
  std::optional<schedulers::WaitReason> waiting;     // why it is not running, from the last pass
  std::optional<schedulers::EnergyDistribution> prior;  // its estimate where it was placed
  std::vector<schedulers::EpochReport> progress;
  std::optional<schedulers::Projection> projection;
  // Throttling in force, and the controls that apply it (restored when the job ends or jouled stops):
  std::optional<adapters::JobCgroup> cgroup;
  std::unique_ptr<adapters::JobPauser> pauser;
  std::unique_ptr<adapters::CpuQuota> quota;
  std::unique_ptr<adapters::GpuPowerLimit> gpu_limit;
  bool paused = false;
  std::optional<double> cpu_quota;
  std::optional<double> gpu_limit_watts;
  // Coordinator, for a job placed on an agent:
  std::int64_t committed_epoch = 0;  // the placement epoch that is stored (only that one is sent)
  bool agent_seen = false;           // the agent reported this epoch
  std::optional<double> reported_used;  // joules so far, metered on the agent
};

}  // namespace joule::daemon
