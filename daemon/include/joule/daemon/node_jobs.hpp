#pragma once
// The coordinator's side of the jobs it places on other nodes' devices, as those nodes' runners
// meet it (agents that sync, the Slurm executor): a node's devices reported, what the node
// should run, its reports of the runs, and its loss. The job book's node executor answers it
// (JobService::nodes()). Lives on the daemon's event loop.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "joule/cluster/sync.hpp"

namespace joule::daemon {

class NodeJobs {
 public:
  virtual ~NodeJobs() = default;
  /// Adds or refreshes a node's devices from its sync; new ones become placement candidates.
  virtual void update_node(const std::string& node, const std::vector<cluster::ReportedDevice>& devices) = 0;
  /// The node's own carbon and price signals (null: none of its own; the coordinator's stand in),
  /// for its devices from now on.
  virtual void set_node_signals(const std::string& node, std::shared_ptr<const cluster::ReportedSignal> carbon,
                                std::shared_ptr<const cluster::ReportedSignal> price) = 0;
  /// A run's own progress token (JOULE_JOB_TOKEN), as its SHA-256, for a runner that hands the
  /// token to the job itself (the Slurm executor): progress reports of `job`'s `epoch` need it.
  virtual void set_progress_token(const std::string& job, std::int64_t epoch, const std::string& sha256) = 0;
  /// The node's reports of the jobs it runs: starts, energy so far, ends, adoptions. Returns the
  /// ends recorded (now or before), which the node may stop reporting.
  virtual std::vector<std::pair<std::string, std::int64_t>> apply_reports(
      const std::string& node, const std::vector<cluster::ReportedJob>& reports) = 0;
  /// What the node should run now: its placements whose epoch is stored.
  virtual std::vector<cluster::Assignment> desired_for(const std::string& node) const = 0;
  /// The node went silent past its lease: its devices leave placement and its jobs go back to
  /// the queue or fail (their restart policy).
  virtual void node_lost(const std::string& node) = 0;
  /// Nodes whose devices the book knows (from their syncs, or from the stored state: recovery
  /// expects them back).
  virtual std::vector<std::string> nodes_with_jobs() const = 0;
  /// Called when a node's desired state changed (so a waiting sync answers at once, or the
  /// Slurm executor acts); hooks add up.
  virtual void add_node_changed_hook(std::function<void(const std::string& node)> hook) = 0;
};

}  // namespace joule::daemon
