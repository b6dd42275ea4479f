#pragma once
// Jobs placed on another node's devices (coordinator side): the placement is stored with a new
// epoch, then published in that node's desired state, which its runner takes up (an agent on
// its next sync, or the Slurm executor); the runner's reports say when it started, how much it
// used and how it ended. A report for another epoch never settles the current placement
// (cluster/reconcile.hpp judges them).

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "executor.hpp"
#include "joule/cluster/sync.hpp"
#include "joule/daemon/device_table.hpp"
#include "joule/daemon/node_jobs.hpp"

namespace joule::daemon {

class NodeExecutor final : public Executor, public NodeJobs {
 public:
  /// `devices`: the node's device table, the agents' devices among them (Device::node set).
  NodeExecutor(ExecutorHost& host, DeviceTable& devices);

  std::string prepare(JobRecord& job, Device& device) override;
  void start(JobRecord& job, Device& device) override;
  void stop(JobRecord& job) override;
  Status throttle(JobRecord& job, Device& device, const schedulers::ThrottleAction& action) override;
  bool can_limit_cpu(const JobRecord&) const override { return false; }
  std::optional<double> energy_so_far(JobRecord& job, Device& device, const adapters::ExitStatus* exit) override;
  std::string source_so_far(const JobRecord& job, const Device& device) const override;
  std::optional<double> energy_as_sampled(JobRecord& job, Device& device) override {
    return energy_so_far(job, device, nullptr);
  }
  bool settle_energy(JobRecord& job, Device* device, const adapters::ExitStatus* exit) override;
  void release(JobRecord& job, bool ended) override;
  void recover(JobRecord& job, Device* device) override;

  // NodeJobs: what the nodes' runners meet.
  void update_node(const std::string& node, const std::vector<cluster::ReportedDevice>& reported) override;
  void set_progress_token(const std::string& job, std::int64_t epoch, const std::string& sha256) override;
  void set_node_signals(const std::string& node, std::shared_ptr<const cluster::ReportedSignal> carbon,
                        std::shared_ptr<const cluster::ReportedSignal> price) override;
  std::vector<std::pair<std::string, std::int64_t>> apply_reports(
      const std::string& node, const std::vector<cluster::ReportedJob>& reports) override;
  std::vector<cluster::Assignment> desired_for(const std::string& node) const override;
  void node_lost(const std::string& node) override;
  std::vector<std::string> nodes_with_jobs() const override;
  void add_node_changed_hook(std::function<void(const std::string& node)> hook) override {
    node_changed_.push_back(std::move(hook));
  }

 private:
  /// A placement on a node, as far as its reports tell.
  struct Run {
    std::int64_t committed_epoch = 0;     // the placement epoch that is stored (only that one is published)
    bool seen = false;                    // the node reported this epoch
    std::optional<double> reported_used;  // joules so far, metered on the node
    std::string reported_source;          // of those joules, where the node named one
  };

  void finish(JobRecord& job, const cluster::ReportedJob& report);
  /// The desired state of the node holding `device` changed: its hooks are called.
  void changed(const std::string& device);

  ExecutorHost& host_;
  DeviceTable& devices_;
  std::vector<std::function<void(const std::string&)>> node_changed_;
  std::map<std::string, Run> runs_;  // by job id; kept while the job is queued again (it may be adopted)
  // Each node's own signals, for its devices (those it reports later too).
  struct NodeSignals {
    std::shared_ptr<const cluster::ReportedSignal> carbon, price;
  };
  std::map<std::string, NodeSignals> node_signals_;
};

}  // namespace joule::daemon
