#pragma once
// jouled's SQLite state: one file in WAL mode, schema versioned (PRAGMA user_version) and
// migrated forward on open. Rows here are plain storage types; the daemon maps them to its own.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "joule/common/result.hpp"

struct sqlite3;
struct sqlite3_stmt;

namespace joule::adapters {

/// A job row. Times are milliseconds since the Unix epoch.
struct StoredJob {
  std::string id;
  std::int64_t sequence = 0;
  std::string name;
  std::string spec_json;
  std::string state;
  int priority = 0;
  std::string device;
  std::int64_t submitted_ms = 0;
  std::optional<std::int64_t> started_ms;
  std::optional<std::int64_t> finished_ms;
  std::optional<int> exit_code;
  std::string reason;
  std::optional<double> energy_joules;
  std::string energy_source;
  std::int64_t pid = 0;
  std::uint64_t pid_start_ticks = 0;
  std::string boot_id;  ///< the kernel boot the pid belongs to
  std::string estimate_json;  ///< estimates per eligible device at submission ("" when none)
  std::string token_sha256;   ///< SHA-256 of the job's progress token (JOULE_JOB_TOKEN)
  /// Coordinator: the placement's fencing epoch (1 for the first placement, +1 for each next);
  /// agent: the epoch of the placement this job executes.
  std::int64_t epoch = 0;
  /// Agent: the coordinator's id of the job this one executes ("" for jobs submitted here).
  std::string origin;
  /// Who submitted it ("token:alice", "uid:1000"; "" before owners were kept): only they (and
  /// admins) may cancel, pause or resume it, or read its log and run.env.
  std::string owner;
  /// The local user who submitted it, where the kernel named one: a root jouled runs the job
  /// as that user.
  std::optional<std::int64_t> owner_uid;
  /// Its energy covers only part of its run: it was adopted after a daemon restart, and what
  /// it used before was not metered. Such a figure teaches estimates nothing.
  bool energy_partial = false;
  /// Grams of CO2e of its energy under the node's carbon signal ([carbon]), the mean intensity
  /// over its run (gCO2e/kWh) and what the signal was ("file /etc/...", "constant 250 g/kWh",
  /// with ", stale" when past its end); nullopt and "" without a signal or energy.
  std::optional<double> carbon_grams;
  std::optional<double> carbon_intensity;
  std::string carbon_signal;
  /// What its energy cost under the node's price signal ([price]), the mean price per kWh over
  /// its run, the currency and the signal it came from; nullopt and "" without a signal or energy.
  std::optional<double> cost;
  std::optional<double> cost_price;
  std::string cost_currency;
  std::string cost_signal;
  /// Its run shared its device with other jobs: its energy is its share by CPU time of the
  /// device's (its events say from when).
  bool energy_shared = false;
  /// A job on several GPUs: the others it holds beside `device` (resources.gpus); empty: none.
  std::vector<std::string> companions;
  /// The cores placement chose for this run of a job that let it (resources.cores {min, max});
  /// 0: its spec's count.
  int cores = 0;
  std::string project;  ///< the project it is accounted to ("" for none)
  /// Its estimate on the device it was placed on (the figure placement weighed), for usage
  /// reports' estimate error; nullopt where it had none.
  std::optional<double> estimated_joules;
  /// The knob setting placement chose for it, the estimates weighed, what its check found and
  /// whether the setting was in force, as JSON (daemon/src/jobs/chosen_setting.hpp); "": none.
  std::string chosen_setting;
};

/// A usage report's question: the finished jobs that ran and ended in [from_ms, to_ms).
struct UsageQuery {
  enum class GroupBy { owner, project, device, node, day };  ///< day: of the end, in UTC
  std::int64_t from_ms = 0;
  std::int64_t to_ms = 0;
  GroupBy group_by = GroupBy::owner;
  std::optional<std::string> owner;  ///< only this owner's jobs; nullopt: everyone's
  std::string local_node;            ///< the node of a device named without "node/"
};

/// One group's jobs with one energy source (a group has a row per source its jobs' energy came
/// from; "" for jobs without energy).
struct UsageRow {
  std::string group;
  std::string source;
  std::int64_t jobs = 0;
  double joules = 0.0;
  double device_seconds = 0.0;  ///< summed run times
  /// Jobs whose estimate on their device and whole-run energy are both known; their estimates,
  /// their energy and Σ |estimate − energy| / energy.
  std::int64_t compared_jobs = 0;
  double compared_estimated_joules = 0.0;
  double compared_joules = 0.0;
  double compared_relative_error_sum = 0.0;
  std::int64_t carbon_jobs = 0;  ///< jobs with grams of CO2e, and their grams
  double carbon_grams = 0.0;
};

/// The energy one owner's jobs in one project used in one hour (fair share's recent use, read
/// back at start).
struct RecentUse {
  std::string owner;
  std::string project;
  std::int64_t last_end_ms = 0;  ///< the latest end among them
  double joules = 0.0;
};

/// One entry of the budget ledger: metered energy of a job or probe on one device.
struct StoredEnergyUse {
  std::string node;
  std::string device;
  std::string work;  ///< job id, or "probe"
  std::int64_t start_ms = 0;
  std::int64_t end_ms = 0;
  double joules = 0.0;
  std::string source;
  std::string owner{};    ///< the job's owner ("" for probes), for owners' budgets
  std::string project{};  ///< the job's project ("" for none), for projects' budgets
  std::optional<double> grams{};  ///< its CO2e at the carbon signal over it, for budgets in grams; nullopt: none
  std::optional<double> cost{};   ///< its cost at the price signal over it, for budgets in money; nullopt: none
};

/// A device's fitted energy model, saved so a restart does not probe again.
struct StoredModelSnapshot {
  std::string device;
  std::int64_t version = 0;
  std::int64_t saved_ms = 0;
  std::string source;         ///< meter source of the probe data
  std::string snapshot_json;  ///< DeviceEnergyModel::save()
  std::string meta_json = "{}";  ///< what the daemon knows about it: fingerprint, held-out error...
};

/// One decomposed probe: a training sample of a device's energy model, learnt under one
/// software/hardware fingerprint (samples of another fingerprint are never mixed in).
struct StoredProbeSample {
  std::string device;
  std::string fingerprint;
  std::int64_t at_ms = 0;
  std::string layer_key;  ///< "conv2d@hidden"
  double joules_per_step = 0.0;
  double seconds_per_step = 0.0;
  std::string source;       ///< meter source: "rapl", "modelled"...
  std::string detail_json;  ///< the layer's features and the measured probe networks
};

/// A stretch of probing on one device: background, requested through the API, or a re-probe.
struct StoredProbeRun {
  std::string id;
  std::string device;
  std::string reason;  ///< "idle", "requested", "drift", "age", "environment"
  std::string state;   ///< "running", "done", "preempted", "failed", "interrupted"
  std::optional<double> requested_seconds;
  std::int64_t started_ms = 0;
  std::optional<std::int64_t> finished_ms;
  std::int64_t probes = 0;
  std::int64_t preempted = 0;
  std::int64_t failed = 0;
  double joules = 0.0;         ///< metered energy of the probes (by `source`)
  double probe_seconds = 0.0;  ///< wall time spent in probe processes
  std::string source;
  std::string message;
};

/// One transition or note in a job's history.
struct StoredEvent {
  std::string job_id;
  std::int64_t at_ms = 0;
  std::string state;
  std::string message;
};

/// One connection. Not thread-safe: the daemon writes through one on its storage thread and reads
/// finished jobs through another (open_reader) on its loop.
class Database {
 public:
  /// Opens (creating if needed) and migrates. `full_sync` makes every commit durable against
  /// power loss, not only against a crash of the process.
  static Result<std::unique_ptr<Database>> open(const std::filesystem::path& path, bool full_sync = true);
  /// A second, read-only connection to a file open() has migrated: how the daemon's loop reads
  /// finished jobs back while the storage thread writes (WAL lets both run at once).
  static Result<std::unique_ptr<Database>> open_reader(const std::filesystem::path& path);
  ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  /// The schema version this build writes; open() migrates older files up to it and refuses
  /// newer ones.
  static int latest_schema_version();
  int schema_version();

  Status begin();
  Status commit();
  Status rollback();
  Status savepoint();
  Status release_savepoint();
  Status rollback_to_savepoint();

  Status insert_job(const StoredJob& job);
  Status update_job(const StoredJob& job);
  Status insert_event(const StoredEvent& event);
  Result<std::vector<StoredJob>> load_jobs();
  Result<std::vector<StoredEvent>> load_events();
  /// What a starting daemon keeps in memory: every job not finished (queued, placed, running,
  /// throttled) and the latest `finished` of each finished state, in submission order.
  Result<std::vector<StoredJob>> load_current_jobs(std::size_t finished);
  Result<std::optional<StoredJob>> find_job(const std::string& id);
  /// One job's events, oldest first.
  Result<std::vector<StoredEvent>> load_job_events(const std::string& id);
  /// At most `limit` jobs (of `state`, where given) after `after_sequence` in submission order,
  /// or before it, newest first: a page in O(limit + log n).
  Result<std::vector<StoredJob>> page_jobs(const std::optional<std::string>& state,
                                           std::optional<std::int64_t> after_sequence, std::size_t limit,
                                           bool newest_first);
  /// Succeeded jobs that have an energy figure, the last to finish first: `limit` of them after
  /// skipping `offset`.
  Result<std::vector<StoredJob>> latest_succeeded_jobs(std::size_t limit, std::size_t offset = 0);
  /// How many jobs each stored state holds (unknown states too: bad rows), as triggers keep
  /// them: seven rows read, not the jobs counted.
  Result<std::map<std::string, std::int64_t>> count_jobs_by_state();
  /// Finished jobs' use summed per group and energy source (UsageQuery), by one indexed query.
  Result<std::vector<UsageRow>> usage(const UsageQuery& query);
  /// The energy of the jobs that ended in [since_ms, until_ms), per owner, project and hour.
  Result<std::vector<RecentUse>> recent_use(std::int64_t since_ms, std::int64_t until_ms);
  /// Deletes finished jobs that ended before `before_ms` (at most `limit`), with their events;
  /// returns each one's id and state.
  Result<std::vector<std::pair<std::string, std::string>>> forget_finished_jobs(std::int64_t before_ms,
                                                                                std::size_t limit);
  /// The highest submission number stored (0 with none).
  Result<std::int64_t> max_job_sequence();
  /// Inserts or replaces the snapshot of its device.
  Status save_model_snapshot(const StoredModelSnapshot& snapshot);
  Result<std::vector<StoredModelSnapshot>> load_model_snapshots();
  Status insert_probe_sample(const StoredProbeSample& sample);
  /// A device's samples under one fingerprint, oldest first.
  Result<std::vector<StoredProbeSample>> load_probe_samples(const std::string& device, const std::string& fingerprint);
  /// The fingerprint of a device's newest sample (samples learnt before any model was saved).
  Result<std::optional<std::string>> latest_probe_fingerprint(const std::string& device);
  /// Inserts or updates a run by id.
  Status save_probe_run(const StoredProbeRun& run);
  /// The latest `limit` runs, oldest first.
  Result<std::vector<StoredProbeRun>> load_probe_runs(std::size_t limit);

  Status insert_energy_use(const StoredEnergyUse& use);
  /// Ledger entries that ended at or after `since_ms`, oldest first.
  Result<std::vector<StoredEnergyUse>> load_energy_uses(std::int64_t since_ms);
  /// Drops entries no budget window can count any more.
  Status forget_energy_uses(std::int64_t before_ms);

  /// Refuses every write on this connection from now on, or allows them again (PRAGMA
  /// query_only): how a full disk or a damaged file look to jouled, for tests of how it degrades.
  Status set_query_only(bool on);
  /// Frees what this connection's page cache holds (PRAGMA shrink_memory): after start-up read a
  /// large database, its caches hold 2 MiB a connection that steady work may never need.
  Status release_memory();

 private:
  explicit Database(sqlite3* db, std::filesystem::path path);
  /// A connection with `flags` (SQLite's), waiting up to 5 s for a lock; `purpose` completes
  /// the error ("cannot open PATH<purpose>: why").
  static Result<std::unique_ptr<Database>> connect(const std::filesystem::path& path, int flags,
                                                   std::string_view purpose);
  Status exec(const char* sql);
  Status migrate();
  Result<sqlite3_stmt*> prepare(const char* sql);
  /// Runs `sql` with its parameters set by `bind` and hands each result row to `row`; `what`
  /// names the work in the error.
  Status each_row(const char* sql, const std::function<void(sqlite3_stmt*)>& bind,
                  const std::function<void(sqlite3_stmt*)>& row, const std::string& what);
  Result<std::vector<StoredJob>> select_jobs(const char* sql, const std::function<void(sqlite3_stmt*)>& bind,
                                             const std::string& what);
  Result<std::vector<StoredEvent>> select_events(const char* sql, const std::function<void(sqlite3_stmt*)>& bind,
                                                 const std::string& what);
  Error sqlite_error(const std::string& what) const;

  sqlite3* db_;
  std::filesystem::path path_;
  std::map<const char*, sqlite3_stmt*> statements_;  // keyed by the literal's address
};

}  // namespace joule::adapters
