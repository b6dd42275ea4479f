#pragma once
// The agent's half of the job book: the coordinator's assignments taken in (stored by the book,
// then queued for the one device the coordinator chose and run by the local executor), reported
// back with their energy, stopped and paused as the coordinator's plan says, and this node's
// devices as its syncs report them. Unit-tested against a fake book
// (tests/daemon/agent_runner_test.cpp).

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "joule/common/clock.hpp"
#include "joule/daemon/agent_jobs.hpp"
#include "joule/daemon/device_table.hpp"
#include "joule/schedulers/throttle_controller.hpp"

namespace joule::daemon {

struct JobRecord;

/// What the agent runner asks of the job book.
class AgentHost {
 public:
  virtual ~AgentHost() = default;
  virtual const Clock& clock() const = 0;
  /// Every job in memory that was run for the coordinator (its row's origin is set).
  virtual void for_each_assigned(const std::function<void(const JobRecord&)>& visit) const = 0;
  virtual JobRecord* find_job(const std::string& id) = 0;
  /// Stores the assignment as a job of this node and queues it (or fails it, where it cannot run
  /// here); `done` gets whether it was stored. Nothing happens for one stored before.
  virtual void take_assignment(const cluster::Assignment& assignment, std::function<void(bool stored)> done) = 0;
  /// An event in the job's history that changes no state.
  virtual void note(JobRecord& job, const std::string& message) = 0;
  virtual void cancel(const std::string& id) = 0;
  virtual void throttle(const schedulers::ThrottleAction& action) = 0;
  /// The joules a running job has used on `device` so far, as of the device's last sample.
  virtual std::optional<double> sampled_energy(const JobRecord& job, const Device& device) const = 0;
  /// The lease the jobs it runs from now on hold (AgentJobs::set_lease_seconds).
  virtual void lease_runs_for(double seconds) = 0;
};

class AgentRunner final : public AgentJobs {
 public:
  AgentRunner(AgentHost& host, const DeviceTable& devices);
  ~AgentRunner() override;

  std::vector<cluster::LocalAssignment> local_assignments() const override;
  std::vector<cluster::ReportedJob> assignment_reports(
      const std::set<std::pair<std::string, std::int64_t>>& acknowledged) const override;
  void assign(const cluster::Assignment& assignment) override;
  void stop_assignment(const std::string& local_id, const std::string& why) override;
  void pause_assignment(const std::string& local_id, bool pause, const std::string& why) override;
  std::vector<cluster::ReportedDevice> reported_devices() const override;
  void set_lease_seconds(double seconds) override { host_.lease_runs_for(seconds); }
  void set_assignment_changed_hook(std::function<void()> hook) override { changed_ = std::move(hook); }

  /// A job run for the coordinator changed state: the hook is called.
  void changed() const {
    if (changed_) changed_();
  }

 private:
  AgentHost& host_;
  const DeviceTable& devices_;
  std::set<std::string> in_flight_;  // assignments being stored
  std::function<void()> changed_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace joule::daemon
