#include "joule/adapters/database.hpp"

#include <sqlite3.h>

#include <gtest/gtest.h>

#include "temp_dir.hpp"

using joule::adapters::Database;
using joule::adapters::StoredEvent;
using joule::adapters::StoredJob;
using joule::testing::TempDir;

namespace {

StoredJob sample_job(const std::string& id, std::int64_t sequence) {
  StoredJob job;
  job.id = id;
  job.sequence = sequence;
  job.name = "name-" + id;
  job.spec_json = R"({"run":{"command":["true"]}})";
  job.state = "queued";
  job.priority = 2;
  job.submitted_ms = 1000 + sequence;
  return job;
}

}  // namespace

TEST(DatabaseTest, fresh_file_is_migrated_to_the_latest_schema_in_wal_mode) {
  TempDir dir;
  auto db = Database::open(dir / "jouled.db");
  ASSERT_TRUE(db) << db.error().message;
  EXPECT_EQ((*db)->schema_version(), Database::latest_schema_version());
  sqlite3* raw = nullptr;
  sqlite3_open((dir / "jouled.db").c_str(), &raw);
  sqlite3_stmt* stmt = nullptr;
  sqlite3_prepare_v2(raw, "PRAGMA journal_mode", -1, &stmt, nullptr);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)), "wal");
  sqlite3_finalize(stmt);
  sqlite3_close(raw);
}

TEST(DatabaseTest, jobs_and_events_round_trip_across_reopen) {
  TempDir dir;
  {
    auto db = Database::open(dir / "jouled.db");
    ASSERT_TRUE(db);
    StoredJob job = sample_job("a", 1);
    ASSERT_TRUE((*db)->insert_job(job));
    ASSERT_TRUE((*db)->insert_event(StoredEvent{"a", 1001, "queued", "submitted"}));
    job.state = "succeeded";
    job.exit_code = 0;
    job.energy_joules = 12.5;
    job.energy_source = "modelled";
    job.started_ms = 1002;
    job.finished_ms = 2002;
    job.pid = 4242;
    job.pid_start_ticks = 77;
    ASSERT_TRUE((*db)->update_job(job));
    ASSERT_TRUE((*db)->insert_job(sample_job("b", 2)));
  }
  auto db = Database::open(dir / "jouled.db");
  ASSERT_TRUE(db);
  auto jobs = (*db)->load_jobs();
  ASSERT_TRUE(jobs);
  ASSERT_EQ(jobs->size(), 2u);
  const StoredJob& a = (*jobs)[0];
  EXPECT_EQ(a.id, "a");
  EXPECT_EQ(a.state, "succeeded");
  EXPECT_EQ(a.exit_code, 0);
  EXPECT_DOUBLE_EQ(*a.energy_joules, 12.5);
  EXPECT_EQ(a.energy_source, "modelled");
  EXPECT_EQ(a.finished_ms, 2002);
  EXPECT_EQ(a.pid_start_ticks, 77u);
  EXPECT_FALSE((*jobs)[1].exit_code);
  auto events = (*db)->load_events();
  ASSERT_TRUE(events);
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].message, "submitted");
}

TEST(DatabaseTest, duplicate_ids_and_unknown_updates_fail_cleanly) {
  TempDir dir;
  auto db = Database::open(dir / "jouled.db");
  ASSERT_TRUE(db);
  ASSERT_TRUE((*db)->insert_job(sample_job("a", 1)));
  EXPECT_FALSE((*db)->insert_job(sample_job("a", 2)));
  auto missing = (*db)->update_job(sample_job("zzz", 9));
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, joule::ErrorCode::not_found);
}

TEST(DatabaseTest, a_file_from_a_newer_jouled_is_refused) {
  TempDir dir;
  {
    auto db = Database::open(dir / "jouled.db");
    ASSERT_TRUE(db);
  }
  sqlite3* raw = nullptr;
  sqlite3_open((dir / "jouled.db").c_str(), &raw);
  sqlite3_exec(raw, "PRAGMA user_version = 999", nullptr, nullptr, nullptr);
  sqlite3_close(raw);
  auto db = Database::open(dir / "jouled.db");
  ASSERT_FALSE(db);
  EXPECT_NE(db.error().message.find("newer"), std::string::npos);
}

TEST(DatabaseTest, an_unopenable_path_says_which) {
  auto db = Database::open("/nonexistent-dir/sub/jouled.db");
  ASSERT_FALSE(db);
  EXPECT_NE(db.error().message.find("/nonexistent-dir/sub/jouled.db"), std::string::npos);
}

TEST(DatabaseTest, probe_samples_and_runs_round_trip_and_stay_apart_by_fingerprint) {
  using joule::adapters::StoredProbeRun;
  using joule::adapters::StoredProbeSample;
  TempDir dir;
  {
    auto db = Database::open(dir / "jouled.db");
    ASSERT_TRUE(db) << db.error().message;
    ASSERT_TRUE((*db)->insert_probe_sample({"cpu", "torch 1.13.1; OpenBLAS", 5, "linear@input", 0.5, 0.01, "modelled",
                                            R"({"features":{"in_features":64}})"}));
    ASSERT_TRUE((*db)->insert_probe_sample({"cpu", "torch 1.13.1; reference BLAS", 6, "linear@input", 3.0, 0.06,
                                            "modelled", "{}"}));
    StoredProbeRun run;
    run.id = "r1";
    run.device = "cpu";
    run.reason = "requested";
    run.state = "running";
    run.requested_seconds = 30.0;
    run.started_ms = 100;
    ASSERT_TRUE((*db)->save_probe_run(run));
    run.state = "done";
    run.finished_ms = 200;
    run.probes = 4;
    run.joules = 12.5;
    ASSERT_TRUE((*db)->save_probe_run(run));  // an update, not a second row
    run = StoredProbeRun{};
    run.id = "r2";
    run.device = "cpu";
    run.reason = "idle";
    run.state = "preempted";
    run.started_ms = 300;
    ASSERT_TRUE((*db)->save_probe_run(run));
  }
  auto db = Database::open(dir / "jouled.db");
  ASSERT_TRUE(db);
  auto samples = (*db)->load_probe_samples("cpu", "torch 1.13.1; OpenBLAS");
  ASSERT_TRUE(samples);
  ASSERT_EQ(samples->size(), 1u);
  EXPECT_EQ((*samples)[0].layer_key, "linear@input");
  EXPECT_DOUBLE_EQ((*samples)[0].joules_per_step, 0.5);
  auto runs = (*db)->load_probe_runs(10);
  ASSERT_TRUE(runs);
  ASSERT_EQ(runs->size(), 2u);
  EXPECT_EQ((*runs)[0].state, "done");
  EXPECT_EQ((*runs)[0].probes, 4);
  EXPECT_EQ((*runs)[0].finished_ms, 200);
  EXPECT_FALSE((*runs)[1].requested_seconds);
  auto latest = (*db)->load_probe_runs(1);
  ASSERT_TRUE(latest);
  ASSERT_EQ(latest->size(), 1u);
  EXPECT_EQ((*latest)[0].id, "r2");
}

TEST(DatabaseTest, the_budget_ledger_and_job_tokens_round_trip_and_old_entries_are_forgotten) {
  TempDir dir;
  {
    auto db = Database::open(dir / "jouled.db");
    ASSERT_TRUE(db) << db.error().message;
    auto job = sample_job("a", 1);
    job.token_sha256 = std::string(64, 'f');
    ASSERT_TRUE((*db)->insert_job(job));
    using joule::adapters::StoredEnergyUse;
    ASSERT_TRUE((*db)->insert_energy_use(StoredEnergyUse{"lab1", "cpu", "a", 1000, 5000, 12.5, "rapl"}));
    ASSERT_TRUE((*db)->insert_energy_use(StoredEnergyUse{"lab1", "cuda:0", "probe", 6000, 9000, 3.0, "nvml"}));
  }
  auto db = Database::open(dir / "jouled.db");
  ASSERT_TRUE(db);
  EXPECT_EQ((*db)->load_jobs()->at(0).token_sha256, std::string(64, 'f'));
  auto uses = (*db)->load_energy_uses(0);
  ASSERT_TRUE(uses);
  ASSERT_EQ(uses->size(), 2u);
  EXPECT_EQ(uses->at(0).work, "a");
  EXPECT_EQ(uses->at(0).start_ms, 1000);
  EXPECT_EQ(uses->at(0).joules, 12.5);
  EXPECT_EQ(uses->at(1).source, "nvml");
  EXPECT_EQ((*db)->load_energy_uses(5001)->size(), 1u);
  ASSERT_TRUE((*db)->forget_energy_uses(6000));
  EXPECT_EQ((*db)->load_energy_uses(0)->size(), 1u);
}

TEST(DatabaseTest, an_energy_uses_owner_project_grams_and_cost_round_trip_and_older_rows_get_them_from_their_job) {
  TempDir dir;
  using joule::adapters::StoredEnergyUse;
  {
    auto db = Database::open(dir / "jouled.db");
    ASSERT_TRUE(db) << db.error().message;
    auto job = sample_job("old", 1);
    job.owner = "token:alice";
    job.project = "vision";
    job.energy_joules = 25.0;  // of which the use below is half
    job.carbon_grams = 10.0;
    ASSERT_TRUE((*db)->insert_job(job));
    ASSERT_TRUE((*db)->insert_energy_use(StoredEnergyUse{"lab1", "cpu", "old", 1000, 5000, 12.5, "rapl"}));
    ASSERT_TRUE((*db)->insert_energy_use(StoredEnergyUse{"lab1", "cpu", "probe", 6000, 7000, 1.0, "rapl"}));
    ASSERT_TRUE((*db)->insert_energy_use(StoredEnergyUse{"lab1", "cpu", "gone", 7000, 8000, 2.0, "rapl"}));
  }
  // A file from before schema 11: its energy uses have no owner or project.
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open((dir / "jouled.db").c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw,
                         "ALTER TABLE energy_uses DROP COLUMN owner; ALTER TABLE energy_uses DROP COLUMN project; "
                         "ALTER TABLE energy_uses DROP COLUMN grams; ALTER TABLE energy_uses DROP COLUMN cost; "
                         "ALTER TABLE jobs DROP COLUMN cost; ALTER TABLE jobs DROP COLUMN cost_price; "
                         "ALTER TABLE jobs DROP COLUMN cost_currency; ALTER TABLE jobs DROP COLUMN cost_signal; "
                         "ALTER TABLE jobs DROP COLUMN energy_shared; ALTER TABLE jobs DROP COLUMN companions; ALTER "
                         "TABLE jobs DROP COLUMN cores; "
                         "ALTER TABLE jobs DROP COLUMN chosen_setting; "
                         "PRAGMA user_version = 10",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(raw);
  auto db = Database::open(dir / "jouled.db");
  ASSERT_TRUE(db) << db.error().message;
  ASSERT_TRUE((*db)->insert_energy_use(
      StoredEnergyUse{"lab1", "cuda:0", "new", 9000, 9500, 4.0, "nvml", "uid:1000", "lab", 0.3, 0.0012}));
  auto uses = (*db)->load_energy_uses(0);
  ASSERT_TRUE(uses);
  ASSERT_EQ(uses->size(), 4u);
  EXPECT_EQ(uses->at(0).owner, "token:alice");  // from its job
  EXPECT_EQ(uses->at(0).project, "vision");
  EXPECT_DOUBLE_EQ(uses->at(0).grams.value(), 5.0);  // its share of its job's grams
  EXPECT_FALSE(uses->at(0).cost);                    // no older job had a cost
  EXPECT_EQ(uses->at(1).owner, "");                  // a probe is nobody's
  EXPECT_FALSE(uses->at(1).grams);                   // and its grams were never known
  EXPECT_EQ(uses->at(2).project, "");                // its job is no longer stored
  EXPECT_EQ(uses->at(3).owner, "uid:1000");
  EXPECT_EQ(uses->at(3).project, "lab");
  EXPECT_DOUBLE_EQ(uses->at(3).grams.value(), 0.3);
  EXPECT_DOUBLE_EQ(uses->at(3).cost.value(), 0.0012);
}

TEST(DatabaseTest, a_partial_energy_flag_is_stored_and_older_files_get_it_from_their_events) {
  TempDir dir;
  {
    auto db = Database::open(dir / "jouled.db");
    ASSERT_TRUE(db) << db.error().message;
    StoredJob adopted = sample_job("adopted", 1);
    adopted.energy_partial = true;
    ASSERT_TRUE((*db)->insert_job(adopted));
    ASSERT_TRUE((*db)->insert_job(sample_job("whole", 2)));
    ASSERT_TRUE((*db)->insert_job(sample_job("older", 3)));
    ASSERT_TRUE((*db)->insert_event(StoredEvent{"older", 2000, "running",
                                                "adopted process group 42 after a daemon restart; energy is metered "
                                                "from now on only"}));
  }
  // Make the file look as a jouled before the column left it: no column, the previous version.
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open((dir / "jouled.db").c_str(), &raw), SQLITE_OK);
  // Schema 10's index covers the column: it goes first, as it was not there then either.
  ASSERT_EQ(sqlite3_exec(raw, "DROP INDEX jobs_usage", nullptr, nullptr, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw, "ALTER TABLE jobs DROP COLUMN energy_partial", nullptr, nullptr, nullptr), SQLITE_OK);
  // Nor the columns of later schemas (9: carbon; 10: project and estimate; 11: energy uses' owner
  // and project).
  for (const char* later :
       {"carbon_grams", "carbon_intensity", "carbon_signal", "project", "estimated_joules", "cost", "cost_price",
        "cost_currency", "cost_signal", "energy_shared", "companions", "cores", "chosen_setting"})
    ASSERT_EQ(
        sqlite3_exec(raw, (std::string("ALTER TABLE jobs DROP COLUMN ") + later).c_str(), nullptr, nullptr, nullptr),
        SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw,
                         "ALTER TABLE energy_uses DROP COLUMN owner; ALTER TABLE energy_uses DROP COLUMN project; "
                         "ALTER TABLE energy_uses DROP COLUMN grams; ALTER TABLE energy_uses DROP COLUMN cost",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  // The column came with schema 7; later migrations run again over it, as they may.
  ASSERT_EQ(sqlite3_exec(raw, "PRAGMA user_version = 6", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(raw);

  auto db = Database::open(dir / "jouled.db");
  ASSERT_TRUE(db) << db.error().message;
  auto jobs = (*db)->load_jobs();
  ASSERT_TRUE(jobs);
  ASSERT_EQ(jobs->size(), 3u);
  EXPECT_FALSE((*jobs)[0].energy_partial);  // the column was dropped with its value; no event says so
  EXPECT_FALSE((*jobs)[1].energy_partial);
  EXPECT_TRUE((*jobs)[2].energy_partial);  // its event did
  EXPECT_FALSE((*jobs)[0].energy_shared);  // not known to have shared its device
  StoredJob again = (*jobs)[0];
  again.energy_partial = true;
  again.energy_shared = true;
  EXPECT_TRUE(again.companions.empty());  // none before schema 13
  again.companions = {"cuda:1", "cuda:2"};
  EXPECT_EQ(again.cores, 0);
  again.cores = 4;
  ASSERT_TRUE((*db)->update_job(again));
  EXPECT_TRUE((*(*db)->load_jobs())[0].energy_partial);
  EXPECT_TRUE((*(*db)->load_jobs())[0].energy_shared);
  EXPECT_EQ((*(*db)->load_jobs())[0].companions, (std::vector<std::string>{"cuda:1", "cuda:2"}));
  EXPECT_EQ((*(*db)->load_jobs())[0].cores, 4);
}

TEST(DatabaseTest, finished_jobs_are_read_back_by_page_by_id_and_by_count_through_a_reader) {
  TempDir dir;
  auto db = Database::open(dir / "jouled.db");
  ASSERT_TRUE(db) << db.error().message;
  const std::vector<std::string> states = {"succeeded", "queued", "failed", "succeeded", "running", "succeeded"};
  for (std::size_t i = 0; i < states.size(); ++i) {
    StoredJob job = sample_job("job-" + std::to_string(i + 1), static_cast<std::int64_t>(i + 1));
    job.state = states[i];
    job.finished_ms = 1000 + static_cast<std::int64_t>((i * 7) % 5);  // finish order differs from submission
    job.energy_joules = 10.0 * static_cast<double>(i + 1);
    ASSERT_TRUE((*db)->insert_job(job));
    ASSERT_TRUE((*db)->insert_event(StoredEvent{job.id, 900, "queued", "accepted"}));
    ASSERT_TRUE((*db)->insert_event(StoredEvent{job.id, 1000, job.state, "ended"}));
  }
  // The daemon's loop reads through a connection of its own while the writer goes on.
  auto reader = Database::open_reader(dir / "jouled.db");
  ASSERT_TRUE(reader) << reader.error().message;
  const auto ids = [](const joule::Result<std::vector<StoredJob>>& jobs) {
    std::vector<std::string> out;
    for (const auto& job : jobs.value()) out.push_back(job.id);
    return out;
  };
  const std::string succeeded = "succeeded";
  EXPECT_EQ(ids((*reader)->page_jobs(succeeded, std::nullopt, 2, false)), (std::vector<std::string>{"job-1", "job-4"}));
  EXPECT_EQ(ids((*reader)->page_jobs(succeeded, 4, 2, false)), (std::vector<std::string>{"job-6"}));
  EXPECT_EQ(ids((*reader)->page_jobs(succeeded, std::nullopt, 5, true)),
            (std::vector<std::string>{"job-6", "job-4", "job-1"}));
  EXPECT_EQ(ids((*reader)->page_jobs(std::nullopt, 4, 10, true)),
            (std::vector<std::string>{"job-3", "job-2", "job-1"}));
  EXPECT_EQ(ids((*reader)->page_jobs(std::nullopt, 5, 10, false)), (std::vector<std::string>{"job-6"}));
  // Not finished, and the latest finished one of each finished state, in submission order.
  EXPECT_EQ(ids((*reader)->load_current_jobs(1)), (std::vector<std::string>{"job-2", "job-3", "job-5", "job-6"}));
  // The last to finish first: finished at 1000, 1002, 1004, 1001, 1003, 1000.
  EXPECT_EQ(ids((*reader)->latest_succeeded_jobs(10)), (std::vector<std::string>{"job-4", "job-6", "job-1"}));
  EXPECT_EQ(ids((*reader)->latest_succeeded_jobs(1, 1)), (std::vector<std::string>{"job-6"}));
  const auto counts = (*reader)->count_jobs_by_state().value();
  EXPECT_EQ(counts.at("succeeded"), 3);
  EXPECT_EQ(counts.at("queued"), 1);
  EXPECT_EQ((*reader)->max_job_sequence().value(), 6);
  // Counts follow a job's row as it changes state.
  StoredJob ended = (*db)->find_job("job-2").value().value();
  ended.state = "succeeded";
  ASSERT_TRUE((*db)->update_job(ended));
  ASSERT_TRUE((*db)->update_job(ended));  // the same state again counts once
  const auto after = (*reader)->count_jobs_by_state().value();
  EXPECT_EQ(after.at("succeeded"), 4);
  EXPECT_FALSE(after.contains("queued"));
  const auto found = (*reader)->find_job("job-3").value();
  ASSERT_TRUE(found);
  EXPECT_EQ(found->state, "failed");
  EXPECT_FALSE((*reader)->find_job("job-9").value());
  const auto events = (*reader)->load_job_events("job-3").value();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].message, "ended");

  // What the writer commits later is read at once; the reader itself writes nothing.
  ASSERT_TRUE((*db)->insert_job(sample_job("job-7", 7)));
  EXPECT_TRUE((*reader)->find_job("job-7").value());
  EXPECT_FALSE((*reader)->insert_job(sample_job("job-8", 8)));
}

TEST(DatabaseTest, a_reader_refuses_a_file_not_yet_migrated) {
  TempDir dir;
  EXPECT_FALSE(Database::open_reader(dir / "missing.db"));
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open((dir / "old.db").c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw, "PRAGMA user_version = 3", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(raw);
  auto reader = Database::open_reader(dir / "old.db");
  ASSERT_FALSE(reader);
  EXPECT_NE(reader.error().message.find("schema version 3"), std::string::npos) << reader.error().message;
}

TEST(DatabaseTest, usage_sums_the_finished_jobs_that_ran_in_the_range_per_group_and_source) {
  TempDir dir;
  auto db = Database::open(dir / "jouled.db");
  ASSERT_TRUE(db) << db.error().message;
  constexpr std::int64_t kDay = 86'400'000;
  const std::int64_t day0 = 20'000 * kDay;  // 2024-10-04T00:00:00Z
  auto finished = [&](const std::string& id, std::int64_t sequence, const std::string& owner,
                      const std::string& project, const std::string& device, std::int64_t end, double joules,
                      const std::string& source) {
    StoredJob job = sample_job(id, sequence);
    job.state = "succeeded";
    job.owner = owner;
    job.project = project;
    job.device = device;
    job.started_ms = end - 3'600'000;  // an hour each
    job.finished_ms = end;
    job.energy_joules = joules;
    job.energy_source = source;
    return job;
  };
  std::vector<StoredJob> jobs = {
      finished("a1", 1, "token:alice", "vision", "cpu", day0 + 1000, 100.0, "rapl"),
      finished("a2", 2, "token:alice", "vision", "lab2/cuda:0", day0 + kDay + 1000, 300.0, "nvml"),
      finished("b1", 3, "token:bob", "", "cpu", day0 + 2000, 50.0, "modelled"),
      finished("late", 4, "token:bob", "", "cpu", day0 + 3 * kDay, 70.0, "rapl"),  // after `to`
  };
  jobs[0].estimated_joules = 110.0;  // 10 % over
  jobs[1].estimated_joules = 240.0;  // 20 % under
  jobs[1].carbon_grams = 12.5;
  StoredJob queued = sample_job("queued", 5);  // not finished: not counted
  queued.owner = "token:alice";
  StoredJob never_ran = sample_job("cancelled", 6);  // cancelled while queued: it used nothing
  never_ran.state = "cancelled";
  never_ran.owner = "token:alice";
  never_ran.finished_ms = day0 + 5000;
  jobs.push_back(queued);
  jobs.push_back(never_ran);
  for (const auto& job : jobs) ASSERT_TRUE((*db)->insert_job(job));

  joule::adapters::UsageQuery query;
  query.from_ms = day0;
  query.to_ms = day0 + 2 * kDay;
  query.local_node = "lab1";
  auto by_owner = (*db)->usage(query);
  ASSERT_TRUE(by_owner) << by_owner.error().message;
  ASSERT_EQ(by_owner->size(), 3u);  // alice: nvml and rapl; bob: modelled
  const auto& alice_nvml = (*by_owner)[0];
  EXPECT_EQ(alice_nvml.group, "token:alice");
  EXPECT_EQ(alice_nvml.source, "nvml");
  EXPECT_EQ(alice_nvml.jobs, 1);
  EXPECT_DOUBLE_EQ(alice_nvml.joules, 300.0);
  EXPECT_DOUBLE_EQ(alice_nvml.device_seconds, 3600.0);
  EXPECT_EQ(alice_nvml.compared_jobs, 1);
  EXPECT_DOUBLE_EQ(alice_nvml.compared_relative_error_sum, 0.2);
  EXPECT_EQ(alice_nvml.carbon_jobs, 1);
  EXPECT_DOUBLE_EQ(alice_nvml.carbon_grams, 12.5);
  EXPECT_EQ((*by_owner)[1].source, "rapl");
  EXPECT_NEAR((*by_owner)[1].compared_relative_error_sum, 0.1, 1e-12);
  EXPECT_EQ((*by_owner)[2].group, "token:bob");
  EXPECT_EQ((*by_owner)[2].compared_jobs, 0);

  query.group_by = joule::adapters::UsageQuery::GroupBy::node;
  auto by_node = (*db)->usage(query);
  ASSERT_TRUE(by_node);
  ASSERT_EQ(by_node->size(), 3u);
  EXPECT_EQ((*by_node)[0].group, "lab1");  // "cpu": this node's
  EXPECT_EQ((*by_node)[2].group, "lab2");
  query.group_by = joule::adapters::UsageQuery::GroupBy::day;
  auto by_day = (*db)->usage(query);
  ASSERT_TRUE(by_day);
  ASSERT_EQ(by_day->size(), 3u);
  EXPECT_EQ((*by_day)[0].group, "2024-10-04");
  EXPECT_EQ((*by_day)[2].group, "2024-10-05");
  // Fair share's history: per owner, project and hour, in a span (the late job included).
  auto recent = (*db)->recent_use(day0 + kDay, day0 + 10 * kDay);
  ASSERT_TRUE(recent) << recent.error().message;
  ASSERT_EQ(recent->size(), 2u);
  EXPECT_EQ((*recent)[0].owner == "token:alice" ? (*recent)[0].joules : (*recent)[1].joules, 300.0);
  query.group_by = joule::adapters::UsageQuery::GroupBy::project;
  query.owner = "token:bob";
  auto bobs = (*db)->usage(query);
  ASSERT_TRUE(bobs);
  ASSERT_EQ(bobs->size(), 1u);
  EXPECT_EQ((*bobs)[0].group, "");
  EXPECT_DOUBLE_EQ((*bobs)[0].joules, 50.0);
}
