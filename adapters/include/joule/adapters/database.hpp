#pragma once
// jouled's SQLite state: one file in WAL mode, schema versioned (PRAGMA user_version) and
// migrated forward on open. Rows here are plain storage types; the daemon maps them to its own.

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
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
};

/// A device's fitted energy model, saved so a restart does not probe again.
struct StoredModelSnapshot {
  std::string device;
  std::int64_t version = 0;
  std::int64_t saved_ms = 0;
  std::string source;         ///< meter source of the probe data
  std::string snapshot_json;  ///< DeviceEnergyModel::save()
};

/// One transition or note in a job's history.
struct StoredEvent {
  std::string job_id;
  std::int64_t at_ms = 0;
  std::string state;
  std::string message;
};

/// One connection. Not thread-safe: the daemon uses it from its storage thread only.
class Database {
 public:
  /// Opens (creating if needed) and migrates. `full_sync` makes every commit durable against
  /// power loss, not only against a crash of the process.
  static Result<std::unique_ptr<Database>> open(const std::filesystem::path& path, bool full_sync = true);
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
  /// Inserts or replaces the snapshot of its device.
  Status save_model_snapshot(const StoredModelSnapshot& snapshot);
  Result<std::vector<StoredModelSnapshot>> load_model_snapshots();

 private:
  explicit Database(sqlite3* db, std::filesystem::path path);
  Status exec(const char* sql);
  Status migrate();
  Result<sqlite3_stmt*> prepare(const char* sql);
  Error sqlite_error(const std::string& what) const;

  sqlite3* db_;
  std::filesystem::path path_;
  std::map<const char*, sqlite3_stmt*> statements_;  // keyed by the literal's address
};

}  // namespace joule::adapters
