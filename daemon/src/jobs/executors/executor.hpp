#pragma once
// How a placed job runs, behind one interface: on this node as a process group
// (LocalExecutor), or on another node whose runner, an agent or Slurm, takes it from that
// node's desired state (NodeExecutor). The job book (JobService) decides what runs where and
// keeps each job's state; an executor makes a placement happen and tells the book what became
// of it through an ExecutorHost. Executors live on the daemon's event loop.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "joule/adapters/job_process.hpp"
#include "joule/common/clock.hpp"
#include "joule/common/result.hpp"
#include "joule/schedulers/job.hpp"
#include "joule/schedulers/placement.hpp"
#include "joule/schedulers/throttle_controller.hpp"

namespace joule::daemon {

struct Device;
struct JobRecord;

/// What an executor may ask of, and tell, the job book.
class ExecutorHost {
 public:
  virtual ~ExecutorHost() = default;
  /// The book's clock: wall time for what is stored, monotonic time for how long a run lasts.
  virtual const Clock& clock() const = 0;
  /// The job runs (from placed, or from throttled when its controls were let go); `note` is the event.
  virtual void running(JobRecord& job, const std::string& note) = 0;
  /// The job ended: its energy figure, device, reservation and controls are settled by the book.
  virtual void ended(JobRecord& job, schedulers::JobState state, const std::string& reason,
                     std::optional<adapters::ExitStatus> exit) = 0;
  /// An event in the job's history that changes no state.
  virtual void note(JobRecord& job, const std::string& message) = 0;
  /// A job's knobs were set on `device` ("set") or refused ("refused"): counted for metrics.
  virtual void count_knobs(const std::string& device, const std::string& outcome) = 0;
  /// A placement that never started goes back to the queue.
  virtual void requeue(JobRecord& job, const std::string& why) = 0;
  /// A run on another node is gone but the job is not over (its runner fenced it): the device,
  /// reservation and controls are let go and the job is queued again, its epoch fenced.
  virtual void run_lost(JobRecord& job, const std::string& why) = 0;
  /// A job stored as placed that is found to have run since: counted as running, without an event.
  virtual void count_as_run(JobRecord& job) = 0;
  /// Reserves the job's expected energy on its device again (after a restart or an adoption).
  virtual void reserve_again(JobRecord& job) = 0;
  /// The job's estimate on `device`, when it has one there.
  virtual std::optional<schedulers::Estimate> estimate_for(const JobRecord& job, const std::string& device) const = 0;
  virtual JobRecord* find_job(const std::string& id) = 0;
  /// A device of the table by name (a job on several GPUs' others); nullptr: none such.
  virtual Device* find_device(const std::string& name) = 0;
  /// The minors of this node's GPUs (gpu_minor) that none of `own` opens: what a job on those
  /// devices is fenced off.
  virtual std::vector<unsigned> gpus_not_of(const std::vector<std::string>& own) const = 0;
  /// The node a device belongs to, as budgets and cluster reports name it.
  virtual std::string device_node(const std::string& device) const = 0;
  /// A device another node reported for the first time: the book scopes it for budgets and
  /// counts its energy.
  virtual void device_added(Device& device) = 0;
  /// Devices were added or became ready again: a placement pass, after the queued jobs' candidates
  /// are brought up to date where `added`.
  virtual void devices_changed(bool added) = 0;
  /// A job's node is lost: the job is queued again (failed where restart = fail, cancelled where
  /// it was being cancelled), its device let go; no placement pass yet (devices_changed follows).
  virtual void lost(JobRecord& job, Device& device, const std::string& why) = 0;
  /// A node came back still running a job the book had queued again: it is placed there again
  /// (and running unless `report_state` is "placed").
  virtual void adopt(JobRecord& job, Device& device, const std::string& note, const std::string& report_state,
                     std::optional<std::int64_t> started_ms) = 0;
};

class Executor {
 public:
  virtual ~Executor() = default;
  /// The job is being placed on `device`: what identifies this run is set up before the
  /// placement is stored. Returns what the placement event adds after the device (" (epoch 3)").
  virtual std::string prepare(JobRecord& job, Device& device) = 0;
  /// The placement is stored: start the run. The book hears running() or ended() later.
  virtual void start(JobRecord& job, Device& device) = 0;
  /// Stop a placed or running job (cancel_requested is set): it ends later, or at once when
  /// nothing had started yet.
  virtual void stop(JobRecord& job) = 0;
  /// Applies a throttling action to a running job; sets the record's paused, cpu_quota and
  /// gpu_limit_watts to what is in force.
  virtual Status throttle(JobRecord& job, Device& device, const schedulers::ThrottleAction& action) = 0;
  /// While a chosen setting is checked in the job's first epochs: its device's defaults in force
  /// (`at_defaults`), or the setting again. Only where the executor sets knobs (this node's).
  virtual void switch_setting(JobRecord& /*job*/, Device& /*device*/, bool /*at_defaults*/) {}
  /// Whether a CPU quota can be set on this run.
  virtual bool can_limit_cpu(const JobRecord& job) const = 0;
  /// Joules the run has used so far (all of them once `exit` is known), from a fresh reading;
  /// nothing where unknown.
  virtual std::optional<double> energy_so_far(JobRecord& job, Device& device,
                                              const adapters::ExitStatus* exit = nullptr) = 0;
  /// The same as of the device's last meter sample (what every sample's bookkeeping uses, so
  /// that a sample reads each meter once).
  virtual std::optional<double> energy_as_sampled(JobRecord& job, Device& device) = 0;
  /// Where that figure comes from: the device's meter, unless the run's node says otherwise
  /// (Slurm's energy accounting).
  virtual std::string source_so_far(const JobRecord& job, const Device& device) const;
  /// The run ended: record its energy figure on the row where this executor meters it. Returns
  /// whether this node metered it (so its figure can teach this node's energy model).
  virtual bool settle_energy(JobRecord& job, Device* device, const adapters::ExitStatus* exit) = 0;
  /// Lets go of the run: controls restored, watches and timers stopped, its state forgotten.
  /// `ended`: the job is over (its cgroup goes too); otherwise jouled stops and a later one adopts it.
  virtual void release(JobRecord& job, bool ended) = 0;
  /// After a restart, for a job stored as placed or running here: adopt, finish or requeue it.
  virtual void recover(JobRecord& job, Device* device) = 0;
};

}  // namespace joule::daemon
