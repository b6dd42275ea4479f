#pragma once
// What jouled opens and works out before its services are built: the state directory and what
// its database holds, the devices and their meters, the job book's options (accounts, work
// directory, worker, Python package), policies, access and the server's limits. Each function
// throws std::runtime_error naming what is wrong (or returns the Result) when it cannot.

#include <cstddef>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "joule/adapters/control_journal.hpp"
#include "joule/adapters/database.hpp"
#include "joule/common/result.hpp"
#include "joule/config/daemon_config.hpp"
#include "joule/daemon/access.hpp"
#include "joule/daemon/daemon_app.hpp"
#include "joule/daemon/device_table.hpp"
#include "joule/daemon/http_server.hpp"
#include "joule/daemon/job_service.hpp"
#include "joule/daemon/model_service.hpp"
#include "joule/daemon/probe_service.hpp"
#include "joule/schedulers/policy.hpp"

namespace joule::daemon {

/// What the state directory held at start, read before the storage writer takes the database.
struct StateAtStart {
  std::unique_ptr<adapters::Database> database;  ///< handed to the storage writer
  /// A read-only connection of the book's own, for the finished jobs out of memory.
  std::unique_ptr<adapters::Database> archive;
  /// The jobs not finished and the latest finished ones, with their events.
  std::vector<adapters::StoredJob> jobs;
  std::vector<adapters::StoredEvent> events;
  std::vector<adapters::StoredModelSnapshot> models;
  StoredProbeState probes;
  /// The budget ledger's history, as far back as its windows reach.
  std::vector<adapters::StoredEnergyUse> energy_uses;
};
/// Creates the state directory (private to jouled) and reads what its database holds.
StateAtStart open_state(const config::DaemonConfig& config);

/// This node's name as policies and the cluster know it: [node] name, else the host's.
std::string node_name(const config::DaemonConfig& config);
/// The job book's options: who jobs run as (their work directory prepared where they run as
/// other accounts), jouled's runner, the worker and the Python package jobs import.
JobServiceOptions job_service_options(const config::DaemonConfig& config);
/// [[devices]] with their meters, as the device table holds them.
std::vector<Device> open_devices(const config::DaemonConfig& config);
/// The settings a jouled that died without restoring them left behind (a kill -9 while a job ran
/// at its knobs) are put back before anything runs, as a clean stop would have; a journal that
/// cannot be read is moved aside, with an error naming it, so that the next one starts clean.
std::unique_ptr<adapters::ControlJournal> open_control_journal(const std::filesystem::path& file,
                                                               const DeviceTable& devices, const std::string& nvpmodel);
/// The simulated devices (and Slurm node types) whose models are learnt from simulated probes.
std::vector<ProbeableDevice> simulated_devices(const config::DaemonConfig& config);

/// [auth] and [cluster] agent tokens as the API checks them. Root and jouled's own account
/// administer jouled without a token when they call from this machine.
AccessConfig access_config(const config::DaemonConfig& config);
/// The server's limits; a coordinator's agent syncs are long polls that count apart.
/// Throws when the TLS certificate or key cannot be read.
HttpServerOptions server_options(const config::DaemonConfig& config, bool coordinator);
/// policies.d: as configured, else beside the config file; none without a config file.
std::filesystem::path policy_directory(const config::DaemonConfig& config, const CommandLine& command_line);
/// The whole directory validates or nothing of it is used (the error lists file:line of each problem).
Result<schedulers::Policy> load_policy(const std::filesystem::path& directory);
/// The agent's bearer token for its coordinator: the first line of [cluster] token_file.
std::string read_token_file(const std::filesystem::path& path);
void apply_log_level(const std::string& level);

}  // namespace joule::daemon
