#pragma once
// jouled.toml: what a node's daemon listens on, where it keeps state, its devices and meters.
// The whole file is validated before any of it is used; every problem names file and line.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "joule/common/result.hpp"

namespace joule::config {

/// One device of this node and how it is metered.
struct DeviceConfig {
  /// "cpu", "cuda:N" (an NVIDIA GPU: probed and metered; jobs run on "cpu" in this version),
  /// or "sim:<profile>" for a simulated device (probed by its simulator; it runs no jobs).
  std::string name = "cpu";
  /// "auto" walks the preference list (cpu: rapl, ina3221, battery, modelled; cuda: nvml,
  /// ina3221); a source name forces that meter: rapl, nvml, ina3221, hwmon, battery, modelled.
  std::string meter = "auto";
  double idle_watts = 10.0;           ///< modelled meter: power of the idle CPU
  double watts_per_busy_core = 12.0;  ///< modelled meter: added power per fully busy core
  /// The file set idle_watts or watts_per_busy_core: otherwise the cpu's modelled meter takes the
  /// board's published figures where the table has them (adapters/board_power.hpp).
  bool modelled_figures_set = false;
  /// cpu only: the board whose published figures the modelled meter takes, as its firmware would
  /// name it ("Raspberry Pi 4 Model B"); empty: what /proc/device-tree/model or DMI says.
  std::string board;
  std::size_t probes = 200;           ///< simulated devices: THOR probes of the first campaign
  /// Simulated devices only: run jobs (the real process runs on this host's CPU; the device's
  /// meter adds the job's simulated power, labelled "simulated"). For trying clusters.
  bool runs_jobs = false;
  /// Intra-op and BLAS threads of the device's probes and of every job placed on it (jobs get
  /// OMP_NUM_THREADS, MKL_NUM_THREADS, OPENBLAS_NUM_THREADS and JOULE_THREADS), so that the
  /// model is learnt under the conditions jobs run in. 0: [probing] threads.
  int threads = 0;
  /// cpu only: where the CPU frequency knob's cpufreq policies are (jobs' `knobs.cpu_*`); a
  /// directory without policies leaves the device without the knob, and says why; empty ("off"
  /// in the file): no knob.
  std::filesystem::path cpufreq = "/sys/devices/system/cpu/cpufreq";
  /// cuda:N only: where a Jetson GPU's devfreq device is looked for (jobs'
  /// `knobs.gpu_max_frequency_mhz`); none there (a discrete GPU): no knob. Empty ("off"): none.
  std::filesystem::path devfreq = "/sys/class/devfreq";
  /// The joule-worker this device's probes and built-in jobs run (an absolute path): on a GPU
  /// node, one built against the node's PyTorch LibTorch with CUDA (Debian's is CPU-only; see
  /// bench/gpu/build_worker.sh). Empty: a `joule-worker-cuda` beside jouled for a GPU, else
  /// [probing] worker's.
  std::filesystem::path worker;
};

/// Background probing (THOR): when a real device is idle, joule-worker trains small networks
/// on it to keep its energy model current.
struct ProbingConfig {
  bool enabled = true;
  double idle_seconds = 60.0;       ///< the device must have been idle this long first
  int start_minute = 0;             ///< allowed hours of the day, local time: [start, end)
  int end_minute = 24 * 60;
  double max_joules_per_day = 500e3;   ///< metered probe energy per device and calendar day; 0 = no cap
  double max_model_age_hours = 168.0;  ///< re-probe a model older than this
  double target_sigma = 0.15;       ///< stop when the model is this sure (latent σ of log J)
  int threads = 1;                  ///< threads of devices that set none (DeviceConfig::threads)
  int warmup_steps = 3;
  int steps_per_repetition = 1;  ///< at least this many steps per reading
  double reading_seconds = 0.0;  ///< a reading lasts at least this long; 0 = what its meter needs
  int repetitions = 5;
  std::size_t refit_every = 5;      ///< refit the GPs after this many new probes
  /// Probe plans one joule-worker process measures in turn: each process pays ~0.6 s of LibTorch
  /// start (and a CUDA context on GPUs) before it meters anything.
  int plans_per_run = 4;
  std::filesystem::path worker;     ///< joule-worker; empty = beside the jouled binary, then $PATH
  /// The interpreter the runtime probe measures (start-up and Python's per-step cost of jobs whose
  /// command runs Python); a path, or a name looked up in PATH. Empty: not measured, and Python
  /// jobs' estimates say their runtime is missing.
  std::string python = "python3";
  /// Minutes between readings of a reference network (the first network a campaign measured
  /// whole, measured again): how much the device's speed moves between probes and jobs, shown in
  /// GET /v1/devices, and the least spread an estimate on the device claims. 0: no readings.
  double reference_minutes = 30.0;
  /// The most the device's own speed may move (log σ of the reference network's readings) before
  /// its estimates say the device is too noisy to be estimated tighter. 0: no bound.
  double max_speed_spread = 0.15;
};

/// The thread count probes and jobs use on a device: its own, else [probing] threads.
inline int device_threads(const DeviceConfig& device, const ProbingConfig& probing) {
  return device.threads > 0 ? device.threads : probing.threads;
}

struct ServerConfig {
  std::string host = "127.0.0.1";
  std::uint16_t port = 8571;
  std::size_t max_body_bytes = 1 << 20;
  double request_timeout_seconds = 30.0;
  double idle_timeout_seconds = 10.0;  ///< a connection must start a request within this
  std::size_t max_connections = 512;
  std::size_t max_connections_per_client = 256;  ///< per remote address
  std::size_t max_queued_jobs = 10000;
  /// TLS: both set serves HTTPS only (PEM certificate chain and private key).
  std::filesystem::path tls_certificate;
  std::filesystem::path tls_private_key;
};

/// This node's part in a cluster: standalone (the default), the coordinator (queue, placement
/// across its agents' devices) or an agent (devices, meters, probes, execution).
struct ClusterConfig {
  std::string role = "standalone";
  std::string coordinator;        ///< agent: the coordinator's URL, http(s)://host:port
  std::filesystem::path token_file;  ///< agent: file holding the bearer token it presents
  std::filesystem::path ca_file;     ///< agent: CA to verify the coordinator's certificate
  double heartbeat_seconds = 1.0;    ///< coordinator: how often agents sync
  /// coordinator: an agent unheard of this long is lost (its jobs go back to the queue or
  /// fail, per their restart policy); the agent pauses its jobs after the same time alone.
  double lost_after_seconds = 30.0;
  /// coordinator: hashes of the tokens agents present; empty: the [auth] tokens.
  std::vector<std::string> agent_token_sha256;
};

/// A kind of node behind a Slurm partition: the coordinator places jobs onto it as onto
/// `slots` devices "slurm:<name>/0".."slurm:<name>/<slots-1>" (a node "slurm:<name>").
struct SlurmNodeType {
  std::string name;
  std::string partition;   ///< empty: the cluster's default partition
  std::string nodelist;    ///< sbatch --nodelist; empty: any node of the partition
  std::string constraint;  ///< sbatch --constraint (node features); empty: none
  int slots = 1;           ///< jobs of this type at once
  /// Its energy model: an agent's device running on such a node ("node/device"), or a
  /// simulated profile ("sim:<profile>", learnt here, labelled simulated).
  std::string model;
  std::size_t probes = 200;  ///< simulated models: THOR probes of the campaign
  /// The thread count its jobs get (OMP_NUM_THREADS and friends, as on a local device): the
  /// count the model's device is probed at. 0: not set, the job's environment decides.
  int threads = 0;
};

/// Slurm as the engine behind the coordinator (sbatch, squeue/scontrol, scancel).
struct SlurmConfig {
  std::filesystem::path bin_dir;  ///< where sbatch and friends are; empty: PATH
  std::filesystem::path conf;     ///< SLURM_CONF for them; empty: Slurm's default
  double poll_seconds = 2.0;      ///< how often Slurm's view is read
  double timeout_seconds = 15.0;  ///< per command (sbatch needs ~9 s to give up on a dead slurmctld)
  std::string workdir;            ///< where jobs without run.workdir run and write their output
  /// The URL Slurm jobs reach this jouled at (their JOULE_URL, for progress reports); empty:
  /// the address jouled listens on, which a compute node other than this one reaches only if
  /// it is not a loopback one.
  std::string joule_url;
  std::vector<SlurmNodeType> node_types;
};

/// [carbon] and [price]: where this node's grid carbon intensity (gCO2e per kWh; min-carbon
/// placement, each job's grams, budgets in grams) or its electricity price per kWh (min-cost,
/// each job's cost, budgets in money) comes from. A file or a URL (CSV, or the JSON of the UK
/// National Grid, ElectricityMaps or WattTime for carbon, of aWATTar or Octopus Energy for
/// prices: config/grid_signal_file.hpp), refreshed on a period; the constant (`intensity`,
/// `per_kwh`) stands in where neither says anything for now (not configured, unreadable from the
/// start, or run past its end). No section: no such signal.
struct SignalConfig {
  std::filesystem::path file;        ///< re-read when it changes (checked every refresh_seconds)
  /// http:// or https://, fetched every refresh_seconds; "{now}" in it becomes the time of the
  /// request (UTC, "2026-11-29T10:30Z"), for APIs whose forecasts start at a time in the path.
  std::string url;
  std::filesystem::path token_file;  ///< url: a token sent with each request (Authorization: Bearer)
  std::string token_header;          ///< url: send the token in this header instead ("auth-token")
  std::optional<double> constant;    ///< the stand-in: gCO2e/kWh ([carbon] intensity), price per kWh ([price] per_kwh)
  std::string currency;              ///< [price]: the prices' currency code ("EUR")
  double refresh_seconds = 300.0;
  double timeout_seconds = 10.0;  ///< url: per request
  bool configured() const { return !file.empty() || !url.empty() || constant.has_value(); }
  bool operator==(const SignalConfig&) const = default;
};

struct DaemonConfig {
  ServerConfig server;
  std::filesystem::path state_directory = "/var/lib/jouled";
  /// This node's name in policies and (later) the cluster; empty: the host name.
  std::string node_name;
  /// A Jetson's power modes as a knob of every local device (jobs' `knobs.power_mode`): JetPack's
  /// nvpmodel tool and the file that defines the modes. No file there (not a Jetson): no knob.
  /// An empty `nvpmodel` ("off"): no knob either.
  std::string nvpmodel = "/usr/sbin/nvpmodel";
  std::filesystem::path nvpmodel_conf = "/etc/nvpmodel.conf";
  /// policies.d: budgets, caps, floors and the placement objective. Empty: policies.d beside
  /// the config file, or none (embedded default policy) when jouled runs without a config file.
  std::filesystem::path policy_directory;
  std::string log_level = "info";
  std::vector<std::string> token_sha256;  ///< [auth] token_sha256: hex SHA-256 of admin tokens
  /// [[auth.tokens]]: a token of a named owner with scopes ("read", "submit", "admin").
  struct NamedToken {
    std::string name;
    std::string sha256;
    std::vector<std::string> scopes;
  };
  std::vector<NamedToken> tokens;
  /// [auth] local_users: what a loopback client without a token may do, identified by its uid:
  /// "submit" (read, and submit and act on its own jobs), "read" or "none".
  std::string local_users = "submit";
  std::vector<DeviceConfig> devices = {DeviceConfig{}};
  ProbingConfig probing;
  double meter_interval_seconds = 1.0;
  double kill_grace_seconds = 10.0;
  /// [jobs] keep_finished_days: finished jobs older than this leave the database, with their
  /// logs and directories; 0 keeps them for ever.
  int keep_finished_days = 0;
  /// Give each job a cgroup of its own (freezer, CPU quota for throttling) where jouled's cgroup
  /// is delegated (systemd Delegate=yes, or root on cgroup v1).
  bool job_cgroups = true;
  /// [jobs] run_as: "per-job" (each job a uid and gid of its own, where jouled may switch
  /// users), "jouled" (as the daemon itself: jobs can reach its state), or an account name.
  std::string job_run_as = "per-job";
  std::vector<std::string> job_groups;       ///< [jobs] groups: supplementary groups of per-job accounts
  std::filesystem::path job_work_directory;  ///< [jobs] directory; empty: "<state directory>-jobs"
  ClusterConfig cluster;
  SlurmConfig slurm;
  SignalConfig carbon;
  SignalConfig price;
  std::string source = "embedded defaults";  ///< the file it came from
};

/// A problem in a config file, located by file and line.
struct ConfigProblem {
  std::string file;
  int line = 0;
  std::string message;
  std::string describe() const;  ///< "jouled.toml:12: server.port must be ..."
};

struct LoadedConfig {
  DaemonConfig config;
  std::vector<ConfigProblem> warnings;  ///< e.g. unknown keys; the config is still usable
};

/// Parses TOML text on top of `defaults`. On failure the error lists every problem, one per line.
Result<LoadedConfig> parse_config(const std::string& text, const std::string& file_name,
                                  const DaemonConfig& defaults = {});
/// Reads and parses a file.
Result<LoadedConfig> load_config_file(const std::filesystem::path& path, const DaemonConfig& defaults = {});

/// Splits "HOST:PORT" or "[v6]:PORT".
Result<std::pair<std::string, std::uint16_t>> parse_listen_address(const std::string& text);
/// Whether a host string names a loopback address (127.0.0.0/8, ::1, localhost).
bool is_loopback_host(const std::string& host);
/// Level names spdlog understands: trace, debug, info, warn, error, critical, off.
bool is_valid_log_level(const std::string& level);

/// The effective config as JSON for the start-up log; token hashes are counted, not shown.
nlohmann::json to_json(const DaemonConfig& config);

}  // namespace joule::config
