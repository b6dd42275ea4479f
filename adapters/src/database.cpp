#include "joule/adapters/database.hpp"

#include <sqlite3.h>

#include <array>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace joule::adapters {
namespace {

// Each entry moves the schema from version i to i + 1. Never edit a released entry: add one.
constexpr std::array<const char*, 14> kMigrations = {
    R"sql(
CREATE TABLE jobs (
  id              TEXT PRIMARY KEY,
  sequence        INTEGER NOT NULL UNIQUE,
  name            TEXT NOT NULL,
  spec            TEXT NOT NULL,
  state           TEXT NOT NULL,
  priority        INTEGER NOT NULL,
  device          TEXT NOT NULL DEFAULT '',
  submitted_ms    INTEGER NOT NULL,
  started_ms      INTEGER,
  finished_ms     INTEGER,
  exit_code       INTEGER,
  reason          TEXT NOT NULL DEFAULT '',
  energy_joules   REAL,
  energy_source   TEXT NOT NULL DEFAULT '',
  pid             INTEGER NOT NULL DEFAULT 0,
  pid_start_ticks INTEGER NOT NULL DEFAULT 0,
  boot_id         TEXT NOT NULL DEFAULT ''
);
CREATE INDEX jobs_by_state ON jobs(state);
CREATE TABLE job_events (
  id      INTEGER PRIMARY KEY,
  job_id  TEXT NOT NULL REFERENCES jobs(id),
  at_ms   INTEGER NOT NULL,
  state   TEXT NOT NULL,
  message TEXT NOT NULL
);
CREATE INDEX job_events_by_job ON job_events(job_id, id);
)sql",
    R"sql(
ALTER TABLE jobs ADD COLUMN estimate TEXT NOT NULL DEFAULT '';
CREATE TABLE model_snapshots (
  device   TEXT PRIMARY KEY,
  version  INTEGER NOT NULL,
  saved_ms INTEGER NOT NULL,
  source   TEXT NOT NULL,
  snapshot TEXT NOT NULL
);
)sql",
    R"sql(
ALTER TABLE model_snapshots ADD COLUMN meta TEXT NOT NULL DEFAULT '{}';
CREATE TABLE probe_samples (
  id               INTEGER PRIMARY KEY,
  device           TEXT NOT NULL,
  fingerprint      TEXT NOT NULL,
  at_ms            INTEGER NOT NULL,
  layer_key        TEXT NOT NULL,
  joules_per_step  REAL NOT NULL,
  seconds_per_step REAL NOT NULL,
  source           TEXT NOT NULL,
  detail           TEXT NOT NULL
);
CREATE INDEX probe_samples_by_device ON probe_samples(device, fingerprint, id);
CREATE TABLE probe_runs (
  id                TEXT PRIMARY KEY,
  device            TEXT NOT NULL,
  reason            TEXT NOT NULL,
  state             TEXT NOT NULL,
  requested_seconds REAL,
  started_ms        INTEGER NOT NULL,
  finished_ms       INTEGER,
  probes            INTEGER NOT NULL DEFAULT 0,
  preempted         INTEGER NOT NULL DEFAULT 0,
  failed            INTEGER NOT NULL DEFAULT 0,
  joules            REAL NOT NULL DEFAULT 0,
  probe_seconds     REAL NOT NULL DEFAULT 0,
  source            TEXT NOT NULL DEFAULT '',
  message           TEXT NOT NULL DEFAULT ''
);
CREATE INDEX probe_runs_by_start ON probe_runs(started_ms);
)sql",
    R"sql(
ALTER TABLE jobs ADD COLUMN token_sha256 TEXT NOT NULL DEFAULT '';
CREATE TABLE energy_uses (
  id       INTEGER PRIMARY KEY,
  node     TEXT NOT NULL,
  device   TEXT NOT NULL,
  work     TEXT NOT NULL,
  start_ms INTEGER NOT NULL,
  end_ms   INTEGER NOT NULL,
  joules   REAL NOT NULL,
  source   TEXT NOT NULL
);
CREATE INDEX energy_uses_by_end ON energy_uses(end_ms);
)sql",
    R"sql(
ALTER TABLE jobs ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN origin TEXT NOT NULL DEFAULT '';
)sql",
    R"sql(
ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN owner_uid INTEGER;
)sql",
    // Whether a job's energy covers only part of its run (adopted after a restart). Rows from
    // before the column get it from the events that said so.
    R"sql(
ALTER TABLE jobs ADD COLUMN energy_partial INTEGER NOT NULL DEFAULT 0;
UPDATE jobs SET energy_partial = 1 WHERE id IN (SELECT job_id FROM job_events
  WHERE message LIKE 'adopted process group%' OR message LIKE '%while jouled was down%');
)sql",
    // Finished jobs are served from here, not from memory: a page of one state in submission
    // order, and the latest succeeded ones by when they finished, each by an index; and the jobs
    // of each state counted as rows change (counting a million rows at start took 2 s).
    R"sql(
DROP INDEX IF EXISTS jobs_by_state;
CREATE INDEX IF NOT EXISTS jobs_by_state_and_sequence ON jobs(state, sequence);
CREATE INDEX IF NOT EXISTS jobs_by_state_and_finish ON jobs(state, finished_ms);
DROP TABLE IF EXISTS job_counts;
CREATE TABLE job_counts (state TEXT PRIMARY KEY, jobs INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO job_counts (state, jobs) SELECT state, COUNT(*) FROM jobs GROUP BY state;
CREATE TRIGGER IF NOT EXISTS job_counts_on_insert AFTER INSERT ON jobs BEGIN
  INSERT INTO job_counts (state, jobs) VALUES (NEW.state, 1) ON CONFLICT(state) DO UPDATE SET jobs = jobs + 1;
END;
CREATE TRIGGER IF NOT EXISTS job_counts_on_update AFTER UPDATE OF state ON jobs WHEN OLD.state != NEW.state BEGIN
  UPDATE job_counts SET jobs = jobs - 1 WHERE state = OLD.state;
  INSERT INTO job_counts (state, jobs) VALUES (NEW.state, 1) ON CONFLICT(state) DO UPDATE SET jobs = jobs + 1;
END;
CREATE TRIGGER IF NOT EXISTS job_counts_on_delete AFTER DELETE ON jobs BEGIN
  UPDATE job_counts SET jobs = jobs - 1 WHERE state = OLD.state;
END;
)sql",
    // A finished job's grams of CO2e, the intensity over its run and the signal it came from.
    R"sql(
ALTER TABLE jobs ADD COLUMN carbon_grams REAL;
ALTER TABLE jobs ADD COLUMN carbon_intensity REAL;
ALTER TABLE jobs ADD COLUMN carbon_signal TEXT NOT NULL DEFAULT '';
)sql",
    // The project a job is accounted to (issue 35; older rows from their spec, where it named
    // one) and its estimate on the device it ran on, for usage reports without parsing either.
    R"sql(
ALTER TABLE jobs ADD COLUMN project TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN estimated_joules REAL;
UPDATE jobs SET project = json_extract(spec, '$.project')
  WHERE json_valid(spec) AND json_type(spec, '$.project') = 'text';
CREATE INDEX jobs_usage ON jobs(state, finished_ms, owner, project, device, energy_source, energy_joules, started_ms,
  estimated_joules, energy_partial, carbon_grams);
)sql",
    // Whose a job's energy was, for owners' and projects' budgets after a restart (older rows
    // from their job, where it is still stored).
    R"sql(
ALTER TABLE energy_uses ADD COLUMN owner TEXT NOT NULL DEFAULT '';
ALTER TABLE energy_uses ADD COLUMN project TEXT NOT NULL DEFAULT '';
UPDATE energy_uses SET owner = (SELECT owner FROM jobs WHERE jobs.id = energy_uses.work),
  project = (SELECT project FROM jobs WHERE jobs.id = energy_uses.work)
  WHERE work != 'probe' AND EXISTS (SELECT 1 FROM jobs WHERE jobs.id = energy_uses.work);
)sql",
    // Budgets in grams and money (issue 34): each ledger entry's grams and cost (older job
    // entries their share of their job's grams; probes and costs before this stay unknown), and
    // each job's cost under the price signal; whether a job's energy was its share of a device's
    // (issue 36; older rows: not known to have been).
    R"sql(
ALTER TABLE energy_uses ADD COLUMN grams REAL;
ALTER TABLE energy_uses ADD COLUMN cost REAL;
UPDATE energy_uses SET grams = (SELECT carbon_grams * energy_uses.joules / energy_joules FROM jobs
  WHERE jobs.id = energy_uses.work AND energy_joules > 0) WHERE work != 'probe';
ALTER TABLE jobs ADD COLUMN cost REAL;
ALTER TABLE jobs ADD COLUMN cost_price REAL;
ALTER TABLE jobs ADD COLUMN cost_currency TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN cost_signal TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN energy_shared INTEGER NOT NULL DEFAULT 0;
)sql",
    // The other devices a job on several GPUs holds beside `device` (issue 36), a JSON array of
    // names ('' for every other job); the cores placement chose for a job that let it (0: its
    // spec's).
    R"sql(
ALTER TABLE jobs ADD COLUMN companions TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN cores INTEGER NOT NULL DEFAULT 0;
)sql",
    // The knob setting placement chose for a job, what it predicted there, what the job's check
    // found and whether it was in force, as JSON ('' for none; issue 33): a restart and the
    // finished job's record keep them.
    R"sql(
ALTER TABLE jobs ADD COLUMN chosen_setting TEXT NOT NULL DEFAULT '';
)sql",
};

constexpr const char* kInsertJob =
    "INSERT INTO jobs (id, sequence, name, spec, state, priority, device, submitted_ms, started_ms,"
    " finished_ms, exit_code, reason, energy_joules, energy_source, pid, pid_start_ticks, boot_id, estimate,"
    " token_sha256, epoch, origin, owner, owner_uid, energy_partial, carbon_grams, carbon_intensity, carbon_signal,"
    " project, estimated_joules, cost, cost_price, cost_currency, cost_signal, energy_shared, companions,"
    " cores, chosen_setting) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, "
    "?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29, ?30, ?31, ?32, ?33, ?34, ?35, ?36, ?37)";
constexpr const char* kUpdateJob =
    "UPDATE jobs SET sequence = ?2, name = ?3, spec = ?4, state = ?5, priority = ?6, device = ?7,"
    " submitted_ms = ?8, started_ms = ?9, finished_ms = ?10, exit_code = ?11, reason = ?12,"
    " energy_joules = ?13, energy_source = ?14, pid = ?15, pid_start_ticks = ?16, boot_id = ?17,"
    " estimate = ?18, token_sha256 = ?19, epoch = ?20, origin = ?21, owner = ?22, owner_uid = ?23,"
    " energy_partial = ?24, carbon_grams = ?25, carbon_intensity = ?26, carbon_signal = ?27, project = ?28,"
    " estimated_joules = ?29, cost = ?30, cost_price = ?31, cost_currency = ?32, cost_signal = ?33,"
    " energy_shared = ?34, companions = ?35, cores = ?36, chosen_setting = ?37 WHERE id = ?1";
#define JOULE_JOB_COLUMNS                                                                                        \
  "SELECT id, sequence, name, spec, state, priority, device, submitted_ms, started_ms, finished_ms, exit_code,"  \
  " reason, energy_joules, energy_source, pid, pid_start_ticks, boot_id, estimate, token_sha256, epoch, origin," \
  " owner, owner_uid, energy_partial, carbon_grams, carbon_intensity, carbon_signal, project, estimated_joules," \
  " cost, cost_price, cost_currency, cost_signal, energy_shared, companions, cores, chosen_setting FROM jobs "
constexpr const char* kSelectJobs = JOULE_JOB_COLUMNS "ORDER BY sequence";
// Every job not finished (by state, through the index: a scan of a million finished rows
// would read them all), then the latest finished ones of each finished state, in submission
// order. One query over the three finished states sorted all their rows (2.4 s at a million).
#define JOULE_LATEST_IN(state)                                                                      \
  " UNION ALL SELECT * FROM (" JOULE_JOB_COLUMNS "INDEXED BY jobs_by_state_and_sequence WHERE state = '" state \
  "' ORDER BY sequence DESC LIMIT ?1)"
constexpr const char* kSelectCurrentJobs =
    "SELECT * FROM (" JOULE_JOB_COLUMNS "INDEXED BY jobs_by_state_and_sequence"
    " WHERE state IN ('queued', 'placed', 'running', 'throttled')" JOULE_LATEST_IN("succeeded") JOULE_LATEST_IN(
        "failed") JOULE_LATEST_IN("cancelled") ") ORDER BY sequence";
#undef JOULE_LATEST_IN
constexpr const char* kSelectJob = JOULE_JOB_COLUMNS "WHERE id = ?1";
constexpr const char* kPageJobs = JOULE_JOB_COLUMNS "WHERE sequence > ?1 ORDER BY sequence LIMIT ?2";
constexpr const char* kPageJobsNewest = JOULE_JOB_COLUMNS "WHERE sequence < ?1 ORDER BY sequence DESC LIMIT ?2";
constexpr const char* kPageJobsInState =
    JOULE_JOB_COLUMNS "WHERE state = ?3 AND sequence > ?1 ORDER BY sequence LIMIT ?2";
constexpr const char* kPageJobsInStateNewest =
    JOULE_JOB_COLUMNS "WHERE state = ?3 AND sequence < ?1 ORDER BY sequence DESC LIMIT ?2";
constexpr const char* kLatestSucceededJobs = JOULE_JOB_COLUMNS
    "WHERE state = 'succeeded' AND energy_joules IS NOT NULL ORDER BY finished_ms DESC, sequence DESC LIMIT ?1 OFFSET "
    "?2";
#undef JOULE_JOB_COLUMNS
// Usage reports (GET /v1/usage): finished jobs that ran, by when they ended, summed per group and
// energy source from an index that covers every column they read: reading the rows themselves
// meant walking past each one's stored estimates (overflow pages), 2.5-2.9 s at a million jobs. ?3: only one owner's
// (NULL: everyone's); ?4: the node of a device named without one.
#define JOULE_USAGE_BY(key)                                                                         \
  "SELECT " key                                                                                     \
  ", energy_source, COUNT(*), TOTAL(energy_joules),"                                                \
  " TOTAL(MAX(0, finished_ms - started_ms)) / 1000.0, COUNT(CASE WHEN " JOULE_COMPARED              \
  " THEN 1 END),"                                                                                   \
  " TOTAL(CASE WHEN " JOULE_COMPARED                                                                \
  " THEN estimated_joules END),"                                                                    \
  " TOTAL(CASE WHEN " JOULE_COMPARED                                                                \
  " THEN energy_joules END),"                                                                       \
  " TOTAL(CASE WHEN " JOULE_COMPARED                                                                \
  " THEN ABS(estimated_joules - energy_joules) / energy_joules END),"                               \
  " COUNT(carbon_grams), TOTAL(carbon_grams)"                                                       \
  " FROM jobs INDEXED BY jobs_usage"                                                                \
  " WHERE state IN ('succeeded', 'failed', 'cancelled') AND finished_ms >= ?1 AND finished_ms < ?2" \
  " AND started_ms IS NOT NULL AND (?3 IS NULL OR owner = ?3)"                                      \
  " GROUP BY 1, 2 ORDER BY 1, 2"
// A job whose estimate can be held against what it used: both known, a whole run.
#define JOULE_COMPARED "estimated_joules IS NOT NULL AND energy_joules > 0 AND energy_partial = 0"
constexpr std::array<const char*, 5> kUsageBy = {
    JOULE_USAGE_BY("owner"), JOULE_USAGE_BY("project"), JOULE_USAGE_BY("device"),
    JOULE_USAGE_BY("CASE WHEN instr(device, '/') > 0 THEN substr(device, 1, instr(device, '/') - 1) ELSE ?4 END"),
    JOULE_USAGE_BY("strftime('%Y-%m-%d', finished_ms / 1000, 'unixepoch')")};
#undef JOULE_COMPARED
#undef JOULE_USAGE_BY
constexpr const char* kRecentUse =
    "SELECT owner, project, MAX(finished_ms), TOTAL(energy_joules) FROM jobs INDEXED BY jobs_usage"
    " WHERE state IN ('succeeded', 'failed', 'cancelled') AND finished_ms >= ?1 AND finished_ms < ?2"
    " AND energy_joules > 0 GROUP BY owner, project, finished_ms / 3600000";
constexpr const char* kCountJobsByState = "SELECT state, jobs FROM job_counts WHERE jobs != 0";
constexpr const char* kMaxJobSequence = "SELECT COALESCE(MAX(sequence), 0) FROM jobs";
constexpr const char* kOldFinishedJobs =
    "SELECT id FROM jobs INDEXED BY jobs_by_state_and_finish WHERE state = ?1 AND finished_ms < ?2 LIMIT ?3";
constexpr const char* kDeleteJobEvents = "DELETE FROM job_events WHERE job_id = ?1";
constexpr const char* kDeleteJob = "DELETE FROM jobs WHERE id = ?1";
constexpr const char* kSelectJobEvents =
    "SELECT job_id, at_ms, state, message FROM job_events WHERE job_id = ?1 ORDER BY id";
constexpr const char* kInsertEnergyUse =
    "INSERT INTO energy_uses (node, device, work, start_ms, end_ms, joules, source, owner, project, grams, cost)"
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)";
constexpr const char* kSelectEnergyUses =
    "SELECT node, device, work, start_ms, end_ms, joules, source, owner, project, grams, cost FROM energy_uses"
    " WHERE end_ms >= ?1 ORDER BY end_ms, id";
constexpr const char* kDeleteEnergyUses = "DELETE FROM energy_uses WHERE end_ms < ?1";
constexpr const char* kSaveSnapshot =
    "INSERT INTO model_snapshots (device, version, saved_ms, source, snapshot, meta) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
    " ON CONFLICT(device) DO UPDATE SET version = ?2, saved_ms = ?3, source = ?4, snapshot = ?5, meta = ?6";
constexpr const char* kSelectSnapshots = "SELECT device, version, saved_ms, source, snapshot, meta FROM model_snapshots";
constexpr const char* kInsertProbeSample =
    "INSERT INTO probe_samples (device, fingerprint, at_ms, layer_key, joules_per_step, seconds_per_step, source,"
    " detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";
constexpr const char* kSelectProbeSamples =
    "SELECT device, fingerprint, at_ms, layer_key, joules_per_step, seconds_per_step, source, detail"
    " FROM probe_samples WHERE device = ?1 AND fingerprint = ?2 ORDER BY id";
constexpr const char* kLatestProbeFingerprint =
    "SELECT fingerprint FROM probe_samples WHERE device = ?1 ORDER BY id DESC LIMIT 1";
constexpr const char* kSaveProbeRun =
    "INSERT INTO probe_runs (id, device, reason, state, requested_seconds, started_ms, finished_ms, probes, preempted,"
    " failed, joules, probe_seconds, source, message) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13,"
    " ?14) ON CONFLICT(id) DO UPDATE SET state = ?4, finished_ms = ?7, probes = ?8, preempted = ?9, failed = ?10,"
    " joules = ?11, probe_seconds = ?12, source = ?13, message = ?14";
constexpr const char* kSelectProbeRuns =
    "SELECT id, device, reason, state, requested_seconds, started_ms, finished_ms, probes, preempted, failed, joules,"
    " probe_seconds, source, message FROM (SELECT * FROM probe_runs ORDER BY started_ms DESC, rowid DESC LIMIT ?1)"
    " ORDER BY started_ms, rowid";
constexpr const char* kInsertEvent = "INSERT INTO job_events (job_id, at_ms, state, message) VALUES (?1, ?2, ?3, ?4)";
constexpr const char* kSelectEvents = "SELECT job_id, at_ms, state, message FROM job_events ORDER BY id";

void bind_text(sqlite3_stmt* stmt, int index, const std::string& text) {
  sqlite3_bind_text(stmt, index, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
}

template <class T>
void bind_optional(sqlite3_stmt* stmt, int index, const std::optional<T>& value) {
  if (!value) {
    sqlite3_bind_null(stmt, index);
  } else if constexpr (std::is_floating_point_v<T>) {
    sqlite3_bind_double(stmt, index, *value);
  } else {
    sqlite3_bind_int64(stmt, index, static_cast<sqlite3_int64>(*value));
  }
}

void bind_job(sqlite3_stmt* stmt, const StoredJob& job) {
  bind_text(stmt, 1, job.id);
  sqlite3_bind_int64(stmt, 2, job.sequence);
  bind_text(stmt, 3, job.name);
  bind_text(stmt, 4, job.spec_json);
  bind_text(stmt, 5, job.state);
  sqlite3_bind_int(stmt, 6, job.priority);
  bind_text(stmt, 7, job.device);
  sqlite3_bind_int64(stmt, 8, job.submitted_ms);
  bind_optional(stmt, 9, job.started_ms);
  bind_optional(stmt, 10, job.finished_ms);
  bind_optional(stmt, 11, job.exit_code);
  bind_text(stmt, 12, job.reason);
  bind_optional(stmt, 13, job.energy_joules);
  bind_text(stmt, 14, job.energy_source);
  sqlite3_bind_int64(stmt, 15, job.pid);
  sqlite3_bind_int64(stmt, 16, static_cast<sqlite3_int64>(job.pid_start_ticks));
  bind_text(stmt, 17, job.boot_id);
  bind_text(stmt, 18, job.estimate_json);
  bind_text(stmt, 19, job.token_sha256);
  sqlite3_bind_int64(stmt, 20, job.epoch);
  bind_text(stmt, 21, job.origin);
  bind_text(stmt, 22, job.owner);
  bind_optional(stmt, 23, job.owner_uid);
  sqlite3_bind_int(stmt, 24, job.energy_partial ? 1 : 0);
  bind_optional(stmt, 25, job.carbon_grams);
  bind_optional(stmt, 26, job.carbon_intensity);
  bind_text(stmt, 27, job.carbon_signal);
  bind_text(stmt, 28, job.project);
  bind_optional(stmt, 29, job.estimated_joules);
  bind_optional(stmt, 30, job.cost);
  bind_optional(stmt, 31, job.cost_price);
  bind_text(stmt, 32, job.cost_currency);
  bind_text(stmt, 33, job.cost_signal);
  sqlite3_bind_int(stmt, 34, job.energy_shared ? 1 : 0);
  bind_text(stmt, 35, job.companions.empty() ? std::string() : nlohmann::json(job.companions).dump());
  sqlite3_bind_int(stmt, 36, job.cores);
  bind_text(stmt, 37, job.chosen_setting);
}

std::string column_text(sqlite3_stmt* stmt, int column) {
  const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(stmt, column));
  return text ? std::string(text, static_cast<std::size_t>(sqlite3_column_bytes(stmt, column))) : std::string();
}

template <class T>
std::optional<T> column_optional(sqlite3_stmt* stmt, int column) {
  if (sqlite3_column_type(stmt, column) == SQLITE_NULL) return std::nullopt;
  if constexpr (std::is_floating_point_v<T>) {
    return sqlite3_column_double(stmt, column);
  } else {
    return static_cast<T>(sqlite3_column_int64(stmt, column));
  }
}

// Resets a cached statement however the step ended, so the next use starts clean.
struct StatementReset {
  sqlite3_stmt* stmt;
  ~StatementReset() {
    sqlite3_reset(stmt);
    sqlite3_clear_bindings(stmt);
  }
};

}  // namespace

Database::Database(sqlite3* db, std::filesystem::path path) : db_(db), path_(std::move(path)) {}

Database::~Database() {
  for (auto& [sql, stmt] : statements_) sqlite3_finalize(stmt);
  sqlite3_close_v2(db_);
}

int Database::latest_schema_version() { return static_cast<int>(kMigrations.size()); }

Result<std::unique_ptr<Database>> Database::connect(const std::filesystem::path& path, int flags,
                                                    std::string_view purpose) {
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &raw, flags | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string message = raw ? sqlite3_errmsg(raw) : sqlite3_errstr(rc);
    sqlite3_close_v2(raw);
    return make_error(ErrorCode::unavailable, fmt::format("cannot open {}{}: {}", path.string(), purpose, message));
  }
  sqlite3_busy_timeout(raw, 5000);
  return std::unique_ptr<Database>(new Database(raw, path));
}

Result<std::unique_ptr<Database>> Database::open(const std::filesystem::path& path, bool full_sync) {
  auto connected = connect(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, "");
  if (!connected) return connected.error();
  auto db = std::move(connected).value();
  if (auto s = db->exec("PRAGMA journal_mode=WAL"); !s) return s.error();
  if (auto s = db->exec(full_sync ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL"); !s) return s.error();
  if (auto s = db->exec("PRAGMA foreign_keys=ON"); !s) return s.error();
  if (auto s = db->migrate(); !s) return s.error();
  return db;
}

Result<std::unique_ptr<Database>> Database::open_reader(const std::filesystem::path& path) {
  auto connected = connect(path, SQLITE_OPEN_READONLY, " for reading");
  if (!connected) return connected.error();
  auto db = std::move(connected).value();
  if (const int version = db->schema_version(); version != latest_schema_version())
    return make_error(ErrorCode::unavailable, fmt::format("{} has schema version {}, not {}: open it for writing first",
                                                          path.string(), version, latest_schema_version()));
  return db;
}

Error Database::sqlite_error(const std::string& what) const {
  return make_error(ErrorCode::io, fmt::format("{}: {}: {}", path_.string(), what, sqlite3_errmsg(db_)));
}

Status Database::set_query_only(bool on) { return exec(on ? "PRAGMA query_only = ON" : "PRAGMA query_only = OFF"); }

Status Database::release_memory() { return exec("PRAGMA shrink_memory"); }

Status Database::exec(const char* sql) {
  char* message = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &message) != SQLITE_OK) {
    std::string text = message ? message : "unknown error";
    sqlite3_free(message);
    return make_error(ErrorCode::io, fmt::format("{}: {}", path_.string(), text));
  }
  return {};
}

int Database::schema_version() {
  auto stmt = prepare("PRAGMA user_version");
  if (!stmt) return -1;
  StatementReset reset{*stmt};
  return sqlite3_step(*stmt) == SQLITE_ROW ? sqlite3_column_int(*stmt, 0) : -1;
}

Status Database::migrate() {
  const int current = schema_version();
  if (current < 0) return sqlite_error("reading the schema version");
  if (current > latest_schema_version()) {
    return make_error(ErrorCode::unavailable,
                      fmt::format("{} has schema version {}, newer than this jouled knows ({}); "
                                  "run the newer jouled or restore a backup",
                                  path_.string(), current, latest_schema_version()));
  }
  for (int version = current; version < latest_schema_version(); ++version) {
    if (auto s = exec("BEGIN IMMEDIATE"); !s) return s;
    auto step = exec(kMigrations[static_cast<std::size_t>(version)]);
    if (step) step = exec(fmt::format("PRAGMA user_version = {}", version + 1).c_str());
    if (!step) {
      (void)exec("ROLLBACK");
      return make_error(ErrorCode::io, fmt::format("migrating to schema {}: {}", version + 1, step.error().message));
    }
    if (auto s = exec("COMMIT"); !s) return s;
  }
  return {};
}

Result<sqlite3_stmt*> Database::prepare(const char* sql) {
  if (auto it = statements_.find(sql); it != statements_.end()) return it->second;
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, &stmt, nullptr) != SQLITE_OK)
    return sqlite_error("preparing a statement");
  statements_.emplace(sql, stmt);
  return stmt;
}

Status Database::begin() { return exec("BEGIN IMMEDIATE"); }
Status Database::commit() { return exec("COMMIT"); }
Status Database::rollback() { return exec("ROLLBACK"); }
Status Database::savepoint() { return exec("SAVEPOINT one_write"); }
Status Database::release_savepoint() { return exec("RELEASE one_write"); }
Status Database::rollback_to_savepoint() {
  auto s = exec("ROLLBACK TO one_write");
  if (!s) return s;
  return exec("RELEASE one_write");
}

Status Database::insert_job(const StoredJob& job) {
  auto stmt = prepare(kInsertJob);
  if (!stmt) return stmt.error();
  StatementReset reset{*stmt};
  bind_job(*stmt, job);
  if (sqlite3_step(*stmt) != SQLITE_DONE) return sqlite_error(fmt::format("inserting job {}", job.id));
  return {};
}

Status Database::update_job(const StoredJob& job) {
  auto stmt = prepare(kUpdateJob);
  if (!stmt) return stmt.error();
  StatementReset reset{*stmt};
  bind_job(*stmt, job);
  if (sqlite3_step(*stmt) != SQLITE_DONE) return sqlite_error(fmt::format("updating job {}", job.id));
  if (sqlite3_changes(db_) != 1) return make_error(ErrorCode::not_found, fmt::format("job {} is not stored", job.id));
  return {};
}

Status Database::insert_event(const StoredEvent& event) {
  auto stmt = prepare(kInsertEvent);
  if (!stmt) return stmt.error();
  StatementReset reset{*stmt};
  bind_text(*stmt, 1, event.job_id);
  sqlite3_bind_int64(*stmt, 2, event.at_ms);
  bind_text(*stmt, 3, event.state);
  bind_text(*stmt, 4, event.message);
  if (sqlite3_step(*stmt) != SQLITE_DONE)
    return sqlite_error(fmt::format("recording an event of job {}", event.job_id));
  return {};
}

namespace {

StoredJob read_job(sqlite3_stmt* stmt) {
  StoredJob job;
  job.id = column_text(stmt, 0);
  job.sequence = sqlite3_column_int64(stmt, 1);
  job.name = column_text(stmt, 2);
  job.spec_json = column_text(stmt, 3);
  job.state = column_text(stmt, 4);
  job.priority = sqlite3_column_int(stmt, 5);
  job.device = column_text(stmt, 6);
  job.submitted_ms = sqlite3_column_int64(stmt, 7);
  job.started_ms = column_optional<std::int64_t>(stmt, 8);
  job.finished_ms = column_optional<std::int64_t>(stmt, 9);
  job.exit_code = column_optional<int>(stmt, 10);
  job.reason = column_text(stmt, 11);
  job.energy_joules = column_optional<double>(stmt, 12);
  job.energy_source = column_text(stmt, 13);
  job.pid = sqlite3_column_int64(stmt, 14);
  job.pid_start_ticks = static_cast<std::uint64_t>(sqlite3_column_int64(stmt, 15));
  job.boot_id = column_text(stmt, 16);
  job.estimate_json = column_text(stmt, 17);
  job.token_sha256 = column_text(stmt, 18);
  job.epoch = sqlite3_column_int64(stmt, 19);
  job.origin = column_text(stmt, 20);
  job.owner = column_text(stmt, 21);
  job.owner_uid = column_optional<std::int64_t>(stmt, 22);
  job.energy_partial = sqlite3_column_int(stmt, 23) != 0;
  job.carbon_grams = column_optional<double>(stmt, 24);
  job.carbon_intensity = column_optional<double>(stmt, 25);
  job.carbon_signal = column_text(stmt, 26);
  job.project = column_text(stmt, 27);
  job.estimated_joules = column_optional<double>(stmt, 28);
  job.cost = column_optional<double>(stmt, 29);
  job.cost_price = column_optional<double>(stmt, 30);
  job.cost_currency = column_text(stmt, 31);
  job.cost_signal = column_text(stmt, 32);
  job.energy_shared = sqlite3_column_int(stmt, 33) != 0;
  // Written by this code only: anything else in the column is read as none.
  const auto companions = nlohmann::json::parse(column_text(stmt, 34), nullptr, /*allow_exceptions=*/false);
  if (companions.is_array())
    for (const auto& name : companions)
      if (name.is_string()) job.companions.push_back(name.get<std::string>());
  job.cores = sqlite3_column_int(stmt, 35);
  job.chosen_setting = column_text(stmt, 36);
  return job;
}

}  // namespace

Status Database::each_row(const char* sql, const std::function<void(sqlite3_stmt*)>& bind,
                          const std::function<void(sqlite3_stmt*)>& row, const std::string& what) {
  auto stmt = prepare(sql);
  if (!stmt) return stmt.error();
  StatementReset reset{*stmt};
  if (bind) bind(*stmt);
  int rc = 0;
  while ((rc = sqlite3_step(*stmt)) == SQLITE_ROW) row(*stmt);
  if (rc != SQLITE_DONE) return sqlite_error(what);
  return {};
}

Result<std::vector<StoredJob>> Database::select_jobs(const char* sql, const std::function<void(sqlite3_stmt*)>& bind,
                                                     const std::string& what) {
  std::vector<StoredJob> jobs;
  if (auto s = each_row(
          sql, bind, [&](sqlite3_stmt* stmt) { jobs.push_back(read_job(stmt)); }, what);
      !s)
    return s.error();
  return jobs;
}

Result<std::vector<StoredEvent>> Database::select_events(const char* sql,
                                                         const std::function<void(sqlite3_stmt*)>& bind,
                                                         const std::string& what) {
  std::vector<StoredEvent> events;
  const auto read = [&](sqlite3_stmt* stmt) {
    events.push_back(
        StoredEvent{column_text(stmt, 0), sqlite3_column_int64(stmt, 1), column_text(stmt, 2), column_text(stmt, 3)});
  };
  if (auto s = each_row(sql, bind, read, what); !s) return s.error();
  return events;
}

Result<std::vector<StoredJob>> Database::load_jobs() { return select_jobs(kSelectJobs, {}, "loading jobs"); }

Result<std::vector<StoredJob>> Database::load_current_jobs(std::size_t finished) {
  return select_jobs(
      kSelectCurrentJobs,
      [finished](sqlite3_stmt* stmt) { sqlite3_bind_int64(stmt, 1, static_cast<sqlite3_int64>(finished)); },
      "loading jobs");
}

Result<std::optional<StoredJob>> Database::find_job(const std::string& id) {
  auto found = select_jobs(
      kSelectJob, [&id](sqlite3_stmt* stmt) { bind_text(stmt, 1, id); }, fmt::format("reading job {}", id));
  if (!found) return found.error();
  if (found->empty()) return std::optional<StoredJob>();
  return std::optional<StoredJob>(std::move(found->front()));
}

Result<std::vector<StoredJob>> Database::page_jobs(const std::optional<std::string>& state,
                                                   std::optional<std::int64_t> after_sequence, std::size_t limit,
                                                   bool newest_first) {
  const char* sql =
      state ? (newest_first ? kPageJobsInStateNewest : kPageJobsInState) : (newest_first ? kPageJobsNewest : kPageJobs);
  const std::int64_t after =
      after_sequence.value_or(newest_first ? std::numeric_limits<std::int64_t>::max() : std::int64_t{0});
  return select_jobs(
      sql,
      [&](sqlite3_stmt* stmt) {
        sqlite3_bind_int64(stmt, 1, after);
        sqlite3_bind_int64(stmt, 2, static_cast<sqlite3_int64>(limit));
        if (state) bind_text(stmt, 3, *state);
      },
      "listing jobs");
}

Result<std::vector<StoredJob>> Database::latest_succeeded_jobs(std::size_t limit, std::size_t offset) {
  return select_jobs(
      kLatestSucceededJobs,
      [limit, offset](sqlite3_stmt* stmt) {
        sqlite3_bind_int64(stmt, 1, static_cast<sqlite3_int64>(limit));
        sqlite3_bind_int64(stmt, 2, static_cast<sqlite3_int64>(offset));
      },
      "reading finished jobs");
}

Result<std::vector<UsageRow>> Database::usage(const UsageQuery& query) {
  std::vector<UsageRow> rows;
  const auto bind = [&](sqlite3_stmt* stmt) {
    sqlite3_bind_int64(stmt, 1, query.from_ms);
    sqlite3_bind_int64(stmt, 2, query.to_ms);
    if (query.owner)
      bind_text(stmt, 3, *query.owner);
    else
      sqlite3_bind_null(stmt, 3);
    if (query.group_by == UsageQuery::GroupBy::node) bind_text(stmt, 4, query.local_node);
  };
  const auto read = [&](sqlite3_stmt* stmt) {
    UsageRow row;
    row.group = column_text(stmt, 0);
    row.source = column_text(stmt, 1);
    row.jobs = sqlite3_column_int64(stmt, 2);
    row.joules = sqlite3_column_double(stmt, 3);
    row.device_seconds = sqlite3_column_double(stmt, 4);
    row.compared_jobs = sqlite3_column_int64(stmt, 5);
    row.compared_estimated_joules = sqlite3_column_double(stmt, 6);
    row.compared_joules = sqlite3_column_double(stmt, 7);
    row.compared_relative_error_sum = sqlite3_column_double(stmt, 8);
    row.carbon_jobs = sqlite3_column_int64(stmt, 9);
    row.carbon_grams = sqlite3_column_double(stmt, 10);
    rows.push_back(std::move(row));
  };
  const char* sql = kUsageBy[static_cast<std::size_t>(query.group_by)];
  if (auto s = each_row(sql, bind, read, "summing usage"); !s) return s.error();
  return rows;
}

Result<std::vector<RecentUse>> Database::recent_use(std::int64_t since_ms, std::int64_t until_ms) {
  std::vector<RecentUse> rows;
  const auto bind = [&](sqlite3_stmt* stmt) {
    sqlite3_bind_int64(stmt, 1, since_ms);
    sqlite3_bind_int64(stmt, 2, until_ms);
  };
  const auto read = [&](sqlite3_stmt* stmt) {
    rows.push_back(RecentUse{column_text(stmt, 0), column_text(stmt, 1), sqlite3_column_int64(stmt, 2),
                             sqlite3_column_double(stmt, 3)});
  };
  if (auto s = each_row(kRecentUse, bind, read, "reading recent use"); !s) return s.error();
  return rows;
}

Result<std::map<std::string, std::int64_t>> Database::count_jobs_by_state() {
  std::map<std::string, std::int64_t> counts;
  const auto read = [&](sqlite3_stmt* stmt) { counts[column_text(stmt, 0)] = sqlite3_column_int64(stmt, 1); };
  if (auto s = each_row(kCountJobsByState, {}, read, "counting jobs"); !s) return s.error();
  return counts;
}

Result<std::vector<std::pair<std::string, std::string>>> Database::forget_finished_jobs(std::int64_t before_ms,
                                                                                        std::size_t limit) {
  std::vector<std::pair<std::string, std::string>> forgotten;
  for (const std::string state : {"succeeded", "failed", "cancelled"}) {
    if (forgotten.size() >= limit) break;
    std::vector<std::string> ids;
    const auto bind = [&](sqlite3_stmt* stmt) {
      bind_text(stmt, 1, state);
      sqlite3_bind_int64(stmt, 2, before_ms);
      sqlite3_bind_int64(stmt, 3, static_cast<sqlite3_int64>(limit - forgotten.size()));
    };
    const auto read = [&](sqlite3_stmt* stmt) { ids.push_back(column_text(stmt, 0)); };
    if (auto s = each_row(kOldFinishedJobs, bind, read, "finding old finished jobs"); !s) return s.error();
    for (const auto& id : ids) {
      // Its events first: they refer to it.
      for (const char* sql : {kDeleteJobEvents, kDeleteJob}) {
        const auto bind_id = [&id](sqlite3_stmt* stmt) { bind_text(stmt, 1, id); };
        if (auto s = each_row(
                sql, bind_id, [](sqlite3_stmt*) {}, fmt::format("deleting job {}", id));
            !s)
          return s.error();
      }
      forgotten.emplace_back(id, state);
    }
  }
  return forgotten;
}

Result<std::int64_t> Database::max_job_sequence() {
  auto stmt = prepare(kMaxJobSequence);
  if (!stmt) return stmt.error();
  StatementReset reset{*stmt};
  if (sqlite3_step(*stmt) != SQLITE_ROW) return sqlite_error("reading the last job's number");
  return static_cast<std::int64_t>(sqlite3_column_int64(*stmt, 0));
}

Result<std::vector<StoredEvent>> Database::load_job_events(const std::string& id) {
  return select_events(
      kSelectJobEvents, [&id](sqlite3_stmt* stmt) { bind_text(stmt, 1, id); },
      fmt::format("reading the events of job {}", id));
}

Status Database::save_model_snapshot(const StoredModelSnapshot& snapshot) {
  auto stmt = prepare(kSaveSnapshot);
  if (!stmt) return stmt.error();
  StatementReset reset{*stmt};
  bind_text(*stmt, 1, snapshot.device);
  sqlite3_bind_int64(*stmt, 2, snapshot.version);
  sqlite3_bind_int64(*stmt, 3, snapshot.saved_ms);
  bind_text(*stmt, 4, snapshot.source);
  bind_text(*stmt, 5, snapshot.snapshot_json);
  bind_text(*stmt, 6, snapshot.meta_json);
  if (sqlite3_step(*stmt) != SQLITE_DONE) return sqlite_error(fmt::format("saving the model of {}", snapshot.device));
  return {};
}

Result<std::vector<StoredModelSnapshot>> Database::load_model_snapshots() {
  auto stmt = prepare(kSelectSnapshots);
  if (!stmt) return stmt.error();
  StatementReset reset{*stmt};
  std::vector<StoredModelSnapshot> out;
  int rc = 0;
  while ((rc = sqlite3_step(*stmt)) == SQLITE_ROW) {
    out.push_back(StoredModelSnapshot{column_text(*stmt, 0), sqlite3_column_int64(*stmt, 1),
                                      sqlite3_column_int64(*stmt, 2), column_text(*stmt, 3), column_text(*stmt, 4),
                                      column_text(*stmt, 5)});
  }
  if (rc != SQLITE_DONE) return sqlite_error("loading model snapshots");
  return out;
}

Status Database::insert_probe_sample(const StoredProbeSample& sample) {
  auto stmt = prepare(kInsertProbeSample);
  if (!stmt) return stmt.error();
  StatementReset reset{*stmt};
  bind_text(*stmt, 1, sample.device);
  bind_text(*stmt, 2, sample.fingerprint);
  sqlite3_bind_int64(*stmt, 3, sample.at_ms);
  bind_text(*stmt, 4, sample.layer_key);
  sqlite3_bind_double(*stmt, 5, sample.joules_per_step);
  sqlite3_bind_double(*stmt, 6, sample.seconds_per_step);
  bind_text(*stmt, 7, sample.source);
  bind_text(*stmt, 8, sample.detail_json);
  if (sqlite3_step(*stmt) != SQLITE_DONE) return sqlite_error(fmt::format("saving a probe sample of {}", sample.device));
  return {};
}

Result<std::vector<StoredProbeSample>> Database::load_probe_samples(const std::string& device,
                                                                    const std::string& fingerprint) {
  auto stmt = prepare(kSelectProbeSamples);
  if (!stmt) return stmt.error();
  StatementReset reset{*stmt};
  bind_text(*stmt, 1, device);
  bind_text(*stmt, 2, fingerprint);
  std::vector<StoredProbeSample> out;
  int rc = 0;
  while ((rc = sqlite3_step(*stmt)) == SQLITE_ROW) {
    out.push_back(StoredProbeSample{column_text(*stmt, 0), column_text(*stmt, 1), sqlite3_column_int64(*stmt, 2),
                                    column_text(*stmt, 3), sqlite3_column_double(*stmt, 4),
                                    sqlite3_column_double(*stmt, 5), column_text(*stmt, 6), column_text(*stmt, 7)});
  }
  if (rc != SQLITE_DONE) return sqlite_error("loading probe samples");
  return out;
}

Result<std::optional<std::string>> Database::latest_probe_fingerprint(const std::string& device) {
  auto stmt = prepare(kLatestProbeFingerprint);
  if (!stmt) return stmt.error();
  StatementReset reset{*stmt};
  bind_text(*stmt, 1, device);
  const int rc = sqlite3_step(*stmt);
  if (rc == SQLITE_ROW) return std::optional<std::string>(column_text(*stmt, 0));
  if (rc != SQLITE_DONE) return sqlite_error("reading the latest probe fingerprint");
  return std::optional<std::string>();
}

Status Database::save_probe_run(const StoredProbeRun& run) {
  auto stmt = prepare(kSaveProbeRun);
  if (!stmt) return stmt.error();
  StatementReset reset{*stmt};
  bind_text(*stmt, 1, run.id);
  bind_text(*stmt, 2, run.device);
  bind_text(*stmt, 3, run.reason);
  bind_text(*stmt, 4, run.state);
  bind_optional(*stmt, 5, run.requested_seconds);
  sqlite3_bind_int64(*stmt, 6, run.started_ms);
  bind_optional(*stmt, 7, run.finished_ms);
  sqlite3_bind_int64(*stmt, 8, run.probes);
  sqlite3_bind_int64(*stmt, 9, run.preempted);
  sqlite3_bind_int64(*stmt, 10, run.failed);
  sqlite3_bind_double(*stmt, 11, run.joules);
  sqlite3_bind_double(*stmt, 12, run.probe_seconds);
  bind_text(*stmt, 13, run.source);
  bind_text(*stmt, 14, run.message);
  if (sqlite3_step(*stmt) != SQLITE_DONE) return sqlite_error(fmt::format("saving probe run {}", run.id));
  return {};
}

Result<std::vector<StoredProbeRun>> Database::load_probe_runs(std::size_t limit) {
  auto stmt = prepare(kSelectProbeRuns);
  if (!stmt) return stmt.error();
  StatementReset reset{*stmt};
  sqlite3_bind_int64(*stmt, 1, static_cast<sqlite3_int64>(limit));
  std::vector<StoredProbeRun> out;
  int rc = 0;
  while ((rc = sqlite3_step(*stmt)) == SQLITE_ROW) {
    StoredProbeRun run;
    run.id = column_text(*stmt, 0);
    run.device = column_text(*stmt, 1);
    run.reason = column_text(*stmt, 2);
    run.state = column_text(*stmt, 3);
    run.requested_seconds = column_optional<double>(*stmt, 4);
    run.started_ms = sqlite3_column_int64(*stmt, 5);
    run.finished_ms = column_optional<std::int64_t>(*stmt, 6);
    run.probes = sqlite3_column_int64(*stmt, 7);
    run.preempted = sqlite3_column_int64(*stmt, 8);
    run.failed = sqlite3_column_int64(*stmt, 9);
    run.joules = sqlite3_column_double(*stmt, 10);
    run.probe_seconds = sqlite3_column_double(*stmt, 11);
    run.source = column_text(*stmt, 12);
    run.message = column_text(*stmt, 13);
    out.push_back(std::move(run));
  }
  if (rc != SQLITE_DONE) return sqlite_error("loading probe runs");
  return out;
}

Status Database::insert_energy_use(const StoredEnergyUse& use) {
  auto stmt = prepare(kInsertEnergyUse);
  if (!stmt) return stmt.error();
  StatementReset reset{*stmt};
  bind_text(*stmt, 1, use.node);
  bind_text(*stmt, 2, use.device);
  bind_text(*stmt, 3, use.work);
  sqlite3_bind_int64(*stmt, 4, use.start_ms);
  sqlite3_bind_int64(*stmt, 5, use.end_ms);
  sqlite3_bind_double(*stmt, 6, use.joules);
  bind_text(*stmt, 7, use.source);
  bind_text(*stmt, 8, use.owner);
  bind_text(*stmt, 9, use.project);
  bind_optional(*stmt, 10, use.grams);
  bind_optional(*stmt, 11, use.cost);
  if (sqlite3_step(*stmt) != SQLITE_DONE) return sqlite_error(fmt::format("recording the energy of {}", use.work));
  return {};
}

Result<std::vector<StoredEnergyUse>> Database::load_energy_uses(std::int64_t since_ms) {
  auto stmt = prepare(kSelectEnergyUses);
  if (!stmt) return stmt.error();
  StatementReset reset{*stmt};
  sqlite3_bind_int64(*stmt, 1, since_ms);
  std::vector<StoredEnergyUse> out;
  int rc = 0;
  while ((rc = sqlite3_step(*stmt)) == SQLITE_ROW) {
    out.push_back(StoredEnergyUse{
        column_text(*stmt, 0), column_text(*stmt, 1), column_text(*stmt, 2), sqlite3_column_int64(*stmt, 3),
        sqlite3_column_int64(*stmt, 4), sqlite3_column_double(*stmt, 5), column_text(*stmt, 6), column_text(*stmt, 7),
        column_text(*stmt, 8), column_optional<double>(*stmt, 9), column_optional<double>(*stmt, 10)});
  }
  if (rc != SQLITE_DONE) return sqlite_error("loading the budget ledger");
  return out;
}

Status Database::forget_energy_uses(std::int64_t before_ms) {
  auto stmt = prepare(kDeleteEnergyUses);
  if (!stmt) return stmt.error();
  StatementReset reset{*stmt};
  sqlite3_bind_int64(*stmt, 1, before_ms);
  if (sqlite3_step(*stmt) != SQLITE_DONE) return sqlite_error("pruning the budget ledger");
  return {};
}

Result<std::vector<StoredEvent>> Database::load_events() {
  return select_events(kSelectEvents, {}, "loading job events");
}

}  // namespace joule::adapters
