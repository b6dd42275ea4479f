#pragma once
// jouled in a cluster. A coordinator answers its agents' syncs (POST /v1/cluster/sync), keeps
// the node registry, declares silent nodes lost and holds copies of the agents' energy models;
// an agent syncs with its coordinator from a thread of its own and makes what it runs match
// what the coordinator wants, pausing its jobs when it has been cut off for a whole lease.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include "joule/client/http_client.hpp"
#include "joule/cluster/node_registry.hpp"
#include "joule/cluster/sync.hpp"
#include "joule/common/clock.hpp"
#include "joule/common/result.hpp"
#include "joule/daemon/agent_jobs.hpp"
#include "joule/daemon/estimate_service.hpp"
#include "joule/daemon/grid_signal_feed.hpp"
#include "joule/daemon/job_service.hpp"
#include "joule/daemon/metrics.hpp"
#include "joule/daemon/model_service.hpp"

namespace joule::daemon {

struct CoordinatorOptions {
  double heartbeat_seconds = 1.0;
  double lost_after_seconds = 30.0;
  /// Its own [price] currency: an agent's prices count only in it (budgets in money add them
  /// up); empty: agents' prices are not taken.
  std::string price_currency{};
};

class ClusterCoordinator {
 public:
  using Answer = std::function<void(Result<nlohmann::json>)>;

  /// `clock`: leases run on its monotonic time (a wall clock set forward must not declare every
  /// node lost); its wall time only dates what GET /v1/nodes shows.
  /// `devices`: the book's device table, which holds the agents' devices as they report them.
  ClusterCoordinator(boost::asio::io_context& io, JobService& jobs, const DeviceTable& devices, ModelService& models,
                     Metrics& metrics, CoordinatorOptions options, const Clock& clock = system_clock());
  ~ClusterCoordinator();

  /// Expects the nodes the stored jobs were placed on, and starts watching leases.
  void start();
  /// Answers held syncs and stops the lease timer.
  void stop();
  /// POST /v1/cluster/sync. With wait_seconds, the answer waits while nothing changes for the node.
  void sync(const nlohmann::json& body, Answer answer);
  /// GET /v1/nodes: at most `limit` agents in name order after `after` (a page costs its own
  /// nodes: building 10,000 with their devices held the loop for a third of a second), with
  /// "total", the count of each state over all of them, and "next" (the name to list after,
  /// or null at the end).
  nlohmann::json nodes(std::size_t limit, const std::optional<std::string>& after = std::nullopt) const;
  void set_options(CoordinatorOptions options);
  /// The agents' devices' energy models in GET /v1/nodes are described by `estimates` (none
  /// where unset).
  void describe_models_with(const EstimateService* estimates) { estimates_ = estimates; }

 private:
  struct HeldSync {
    std::string digest;
    Answer answer;
    std::unique_ptr<boost::asio::steady_timer> timer;
  };
  cluster::SyncReply reply_for(const std::string& node);
  void release_held(const std::string& node, bool timed_out_only);
  void check_leases();
  void publish_node_counts();
  // A node's own carbon and price signals, sent with its sync: its devices are placed and its
  // jobs accounted by them from now on (a price only in this coordinator's currency).
  void take_signals(const cluster::SyncRequest& request);
  // GET /v1/nodes: the signals a node reported of its own (null each: the coordinator's stands in).
  nlohmann::json node_signals_view(const std::string& node) const;
  /// Monotonic milliseconds: the registry's time, for leases.
  std::int64_t now_ms() const;
  /// A registry time as wall time, for display.
  std::int64_t wall_ms(std::int64_t registry_ms) const;

  boost::asio::io_context& io_;
  JobService& jobs_;
  const DeviceTable& devices_;
  const EstimateService* estimates_ = nullptr;
  ModelService& models_;
  Metrics& metrics_;
  CoordinatorOptions options_;
  const Clock& clock_;
  cluster::NodeRegistry registry_;
  std::map<std::string, std::list<HeldSync>> held_;
  std::map<std::string, std::int64_t> model_versions_;  // by "node/device"
  std::map<std::string, std::string> signal_digests_;   // by node: the signals it reported, as taken
  std::string incarnation_;     // this coordinator process
  std::int64_t revision_ = 0;   // of the replies it built
  boost::asio::steady_timer lease_timer_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

struct AgentOptions {
  std::string node;
  std::string coordinator;  ///< http(s)://host:port
  std::string token;
  std::filesystem::path ca_file;
  std::string version;
  double lost_after_seconds = 30.0;  ///< the lease until the coordinator says otherwise
  /// This node's own signals ([carbon], [price]), reported for the coordinator to place and
  /// account its jobs by; null: none (the coordinator's stand for this node).
  const GridSignalFeed* carbon = nullptr;
  const GridSignalFeed* price = nullptr;
};

class ClusterAgent {
 public:
  /// `clock`: how long the coordinator has been silent (the lease) and when it last answered;
  /// read on the agent's sync threads.
  ClusterAgent(boost::asio::io_context& io, AgentJobs& jobs, ModelService& models, AgentOptions options,
               const Clock& clock = system_clock());
  ~ClusterAgent();  ///< stops the sync thread

  void start();
  void stop();
  /// What this agent knows of its coordinator, for GET /v1/nodes on the agent.
  nlohmann::json status() const;

 private:
  void poll(const client::ServerUrl& url);
  void report(const client::ServerUrl& url);
  void report_soon();
  /// One sync: build the report on the loop, send it, apply the answer on the loop.
  /// One sync on `connection` (each thread keeps its own, alive from sync to sync).
  std::optional<cluster::SyncReply> exchange(client::HttpConnection& connection, bool wait);
  /// Runs `work` on the event loop and waits for it (false when the loop is gone or stopping).
  bool on_loop(const std::function<void()>& work);
  cluster::SyncRequest build_request(double wait_seconds);
  void apply(const cluster::SyncReply& reply);
  void fence(double silent_seconds);

  boost::asio::io_context& io_;
  AgentJobs& jobs_;
  ModelService& models_;
  AgentOptions options_;
  const Clock& clock_;
  std::string incarnation_;
  client::ClientTls tls_;
  std::thread poller_;    // long-polls the coordinator for the desired state
  std::thread reporter_;  // tells it at once when an assigned job starts or ends
  std::atomic<bool> stopping_{false};
  std::mutex wake_mutex_;
  std::condition_variable wake_;
  bool report_wanted_ = false;
  // Loop-thread state:
  std::set<std::pair<std::string, std::int64_t>> acknowledged_;
  std::map<std::string, std::int64_t> coordinator_models_;
  std::string coordinator_signals_;        // the digest of this node's signals the coordinator holds
  bool knows_coordinator_models_ = false;  // models are offered once the coordinator said what it has
  std::string digest_;
  std::string applied_from_;
  std::int64_t applied_revision_ = 0;
  bool fenced_ = false;
  // Shared with status():
  mutable std::mutex status_mutex_;
  std::optional<std::int64_t> last_sync_ms_;
  std::chrono::steady_clock::time_point last_ok_;
  std::string last_error_;
  double lease_seconds_;
  double heartbeat_seconds_ = 1.0;
};

}  // namespace joule::daemon
