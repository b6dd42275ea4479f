#pragma once
// Slurm as the engine behind the coordinator: each [[slurm.node_types]] is a node
// "slurm:<type>" of `slots` devices that placement scores like any other; a job placed there is
// handed to Slurm with sbatch (its Joule id and epoch in --comment), followed with Slurm's
// listing, suspended and resumed with scontrol, cancelled with scancel. Slurm's commands block,
// so they run on a thread of their own; the job book is only touched on the event loop.
// After a controller crash, jobs are matched by their Joule id, never by Slurm's id, and a job
// Slurm lost before it started is submitted again once (adapters/slurm_reconcile.hpp).

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>

#include "joule/adapters/slurm.hpp"
#include "joule/adapters/slurm_reconcile.hpp"
#include "joule/cluster/sync.hpp"
#include "joule/common/clock.hpp"
#include "joule/config/daemon_config.hpp"
#include "joule/daemon/node_jobs.hpp"
#include "joule/schedulers/job.hpp"

namespace joule::daemon {

/// Where each Slurm slot device's model comes from: "slurm:gpu/0" → "sim:server-gpu" or "node/device".
std::map<std::string, std::string> slurm_model_sources(const config::SlurmConfig& config);

class SlurmExecutor {
 public:
  /// `clock`: the wall time of hand-overs, listings and reports (read on its Slurm thread too).
  SlurmExecutor(boost::asio::io_context& io, NodeJobs& nodes, config::SlurmConfig config,
                const Clock& clock = system_clock());
  ~SlurmExecutor();

  /// Registers the node types' devices with the book (on the loop) and starts following Slurm.
  void start();
  void stop();
  /// Whether `node` is one of Slurm's ("slurm:<type>").
  bool owns(const std::string& node) const;
  /// For GET /v1/nodes: each node type, Slurm's last answer and the jobs handed over.
  nlohmann::json describe() const;
  /// Where jouled listens (before start): jobs' JOULE_URL unless [slurm] joule_url says otherwise.
  void set_api_url(std::string url);

 private:
  struct Handed {
    adapters::HandedJob record;  // joule_id is "<job id>.<epoch>"
    std::string job;
    std::int64_t epoch = 0;
    std::string node;
    std::optional<adapters::SlurmJob> last;  // Slurm's last word on it
    bool cancel_sent = false;
    bool suspended_by_us = false;
    std::optional<std::string> failure;  // Slurm refused it: reported failed with Slurm's message
    bool lost = false;
    int releases = 0;  // how often Joule released it from Slurm's launch-failure hold
    // Running, where the cluster meters energy: what sstat says it has used so far.
    std::optional<double> running_joules;
    // Ended, where the cluster meters energy: what sacct says it used, once read, and how often
    // it was asked (the figure reaches slurmdbd a little after the end).
    std::optional<double> energy_joules;
    int energy_asks = 0;
    bool energy_settled = false;
  };

  void run();
  void cycle();
  bool on_loop(const std::function<void()>& work);
  void wake();
  adapters::SlurmSubmission submission_for(const cluster::Assignment& assignment, const config::SlurmNodeType& type) const;
  cluster::ReportedJob report_of(const Handed& handed) const;
  /// What its jobs get as JOULE_URL: [slurm] joule_url, else where jouled listens.
  std::string job_url() const;

  boost::asio::io_context& io_;
  NodeJobs& nodes_;
  const Clock& clock_;
  config::SlurmConfig config_;
  std::string api_url_;  // set before start()
  adapters::SlurmCli cli_;
  std::string user_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  mutable std::mutex mutex_;  // guards wake_wanted_ and the view for describe()
  std::condition_variable wake_;
  bool wake_wanted_ = false;
  // The executor thread's own:
  std::map<std::string, Handed> handed_;  // by joule id "<job id>.<epoch>"
  bool listed_once_ = false;
  // The cluster's energy plugin (AcctGatherEnergyType), read once; empty: jobs' energy is not metered.
  std::optional<std::string> energy_plugin_;
  /// Whether an ended job's report waits for its energy from sacct (asked now, a few times).
  bool awaits_energy(Handed& handed);
  // For describe():
  std::string last_error_;
  std::int64_t last_listing_ms_ = 0;
  std::size_t live_ = 0;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace joule::daemon
