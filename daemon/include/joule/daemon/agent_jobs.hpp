#pragma once
// An agent's side of the jobs its coordinator places on it, as ClusterAgent meets it: the
// assignments it holds, its reports of them, the coordinator's plan carried out (start, stop,
// pause, resume) and its own devices as reported. The book's agent runner answers it
// (JobService::agent()). Lives on the daemon's event loop.

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "joule/cluster/reconcile.hpp"
#include "joule/cluster/sync.hpp"

namespace joule::daemon {

class AgentJobs {
 public:
  virtual ~AgentJobs() = default;
  /// The assignments this node holds (stored or being stored), for the coordinator's plan.
  virtual std::vector<cluster::LocalAssignment> local_assignments() const = 0;
  /// Reports of those jobs, except ended ones in `acknowledged` (by the coordinator's id, epoch).
  virtual std::vector<cluster::ReportedJob> assignment_reports(
      const std::set<std::pair<std::string, std::int64_t>>& acknowledged) const = 0;
  /// Runs the coordinator's placement here (stored first; a duplicate is ignored).
  virtual void assign(const cluster::Assignment& assignment) = 0;
  virtual void stop_assignment(const std::string& local_id, const std::string& why) = 0;
  virtual void pause_assignment(const std::string& local_id, bool pause, const std::string& why) = 0;
  /// This node's own devices as its syncs report them.
  virtual std::vector<cluster::ReportedDevice> reported_devices() const = 0;
  /// Jobs run for the coordinator from now on hold a lease of this many seconds, renewed at every
  /// meter sample; their runner pauses them when jouled stops renewing it (0: none).
  virtual void set_lease_seconds(double seconds) = 0;
  /// Called when a job run for the coordinator changes state (so the agent reports at once).
  virtual void set_assignment_changed_hook(std::function<void()> hook) = 0;
};

}  // namespace joule::daemon
