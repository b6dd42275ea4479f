#pragma once
// The one exchange between an agent and its coordinator (POST /v1/cluster/sync): the agent says
// what it has and runs, the coordinator answers with what the agent should run. Level-triggered:
// every reply carries the whole desired state of the node, so a lost message, a restarted
// agent or a restarted coordinator converge on the next exchange.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "joule/common/result.hpp"
#include "joule/schedulers/grid_signal.hpp"

namespace joule::cluster {

/// A device of the agent as the coordinator sees it.
struct ReportedDevice {
  std::string name;    ///< the agent's own name for it: "cpu", "cuda:0", "sim:jetson-orin"
  std::string source;  ///< its meter's source: "rapl", "nvml", "modelled", "simulated"...
  double energy_joules = 0.0;  ///< cumulative, metered on the agent since it started
  double power_watts = 0.0;
  bool runs_jobs = true;
  bool busy = false;  ///< a job (or a probe) holds it
  std::optional<double> battery_percent;
  std::optional<std::string> meter_error;
  std::int64_t model_version = 0;  ///< 0: no energy model yet
  /// Cores it shares among jobs that ask for cores (resources.cores), each on cores of its own;
  /// 0: one job at a time.
  int cores = 0;
  /// The GPUs of one model on the agent it belongs to (the agent's Device::gpu_group): a job
  /// asking for several GPUs runs on GPUs of one group; empty: not a GPU.
  std::string gpu_group;
};

/// A job the agent executes for the coordinator, as it stands on the agent.
struct ReportedJob {
  std::string id;  ///< the coordinator's job id
  std::int64_t epoch = 0;
  std::string state;  ///< Joule's state names: placed, running, throttled, succeeded...
  std::string reason;
  std::optional<int> exit_code;
  std::optional<std::int64_t> started_ms;
  std::optional<std::int64_t> finished_ms;
  std::optional<double> energy_joules;  ///< so far while it runs; the total once it ended
  std::string energy_source;
  bool energy_partial = false;
  /// Ended by its runner because no jouled renewed its lease: the run is gone, the job is not
  /// over (the coordinator queues it again rather than recording this end).
  bool fenced = false;
};

/// A device's energy model, sent when the coordinator holds an older version.
struct ModelUpload {
  std::string device;
  std::int64_t version = 0;
  nlohmann::json snapshot;  ///< DeviceEnergyModel::save()
};

/// A grid signal an agent has in force for its node (its own jouled.toml's [carbon] or
/// [price]), for the coordinator to place and account the node's jobs by.
struct ReportedSignal {
  schedulers::GridSignal signal;
  std::string label;     ///< where it comes from: "file /etc/...", "constant 100 g/kWh"
  std::string currency;  ///< a price's currency; empty for carbon
};

/// What an agent's signals are, as a digest of each: sent whole only when the coordinator's
/// copy differs (SyncReply::signals_digest), since a forecast is kilobytes and a sync is every second.
std::string digest_of_signals(const std::optional<ReportedSignal>& carbon, const std::optional<ReportedSignal>& price);

struct SyncRequest {
  std::string node;
  std::string incarnation;  ///< new at each agent start: tells a restart from a slow network
  std::string version;      ///< the agent's jouled version
  std::vector<ReportedDevice> devices;
  std::vector<ReportedJob> jobs;
  std::vector<ModelUpload> models;
  /// >0: the coordinator may hold the answer this long while the desired state is `digest`.
  double wait_seconds = 0.0;
  std::string digest;  ///< the digest of the last desired state the agent applied
  /// Its signals' digest ("" without any), and the signals themselves when `signals_sent`
  /// (either may be absent: the node has no such signal of its own).
  std::string signals_digest;
  bool signals_sent = false;
  std::optional<ReportedSignal> carbon;
  std::optional<ReportedSignal> price;
};

/// One job the coordinator wants on the agent, with how it should stand.
struct Assignment {
  std::string id;
  std::int64_t epoch = 0;
  std::string device;  ///< the agent's own device name
  /// A job on several GPUs (resources.gpus): its other GPUs, by the agent's own names. Fixed for
  /// an id and epoch, as the device is.
  std::vector<std::string> companions;
  std::string name;
  int priority = 0;
  nlohmann::json spec;  ///< the job as submitted (canonical JobSpec JSON)
  bool paused = false;  ///< throttled by the coordinator's policy
  bool stop = false;    ///< cancelled: stop it and report how it ended
};

struct SyncReply {
  double lease_seconds = 30.0;     ///< an agent unheard of this long is lost; it fences its jobs then
  double heartbeat_seconds = 1.0;  ///< how often the agent syncs
  std::vector<Assignment> jobs;    ///< the whole desired state of the node
  std::string digest;              ///< of `jobs`: the agent echoes it to long-poll
  /// Ended jobs whose end the coordinator has recorded: the agent stops reporting them.
  std::vector<std::pair<std::string, std::int64_t>> recorded;
  std::map<std::string, std::int64_t> model_versions;  ///< by the agent's device name
  /// Which coordinator process answered, and how late its state is: an agent applies a reply
  /// only if it is newer than the last one it applied (two requests may cross).
  std::string coordinator;
  std::int64_t revision = 0;
  std::string signals_digest;  ///< of the node's signals the coordinator holds ("" none)
};

/// A node name: 1-64 of [A-Za-z0-9._-], so "node/device" stays unambiguous.
bool is_valid_node_name(const std::string& name);

/// Parse with every error naming its JSON pointer ("/jobs/3/epoch").
Result<SyncRequest> parse_sync_request(const nlohmann::json& body);
Result<SyncReply> parse_sync_reply(const nlohmann::json& body);
nlohmann::json to_json(const SyncRequest& request);
nlohmann::json to_json(const SyncReply& reply);
/// A short stable digest of a desired state (the assignments in order).
std::string digest_of(const std::vector<Assignment>& jobs);

}  // namespace joule::cluster
