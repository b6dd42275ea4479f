// The job book driven by a manual clock: time-dependent rules (deadlines, durations) read the
// clock it is given, and a coordinator's jobs run through the NodeExecutor without processes.

#include "joule/daemon/job_service.hpp"
#include "jobs/job_record.hpp"

#include "joule/adapters/job_process.hpp"
#include "joule/estimator/thread_count.hpp"
#include "joule/schedulers/time_format.hpp"

#include <fmt/format.h>

#include <future>

#include <gtest/gtest.h>

#include "../fakes/sysfs_fixtures.hpp"
#include "counting_meter.hpp"
#include "job_book.hpp"
#include "reported_job.hpp"
#include "text_file.hpp"

using joule::daemon::DeviceTable;
using joule::daemon::JobService;
using joule::testing::reported_job;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// A page of jobs as the API writes it, read back.
json page_of(const joule::daemon::JobPage& page, const joule::daemon::GridSignalFeed* carbon) {
  return json::parse(joule::daemon::routes::job_page_text(page, {carbon, nullptr}));
}

class JobServiceTest : public ::testing::Test, protected joule::testing::JobBook {
 protected:
  JobServiceTest() : JobBook(devices(), 1'900'000'000'000) {}  // 2030-03-17

  static std::vector<joule::daemon::Device> devices() {
    std::vector<joule::daemon::Device> out(1);
    out[0].name = "cpu";
    out[0].meter = std::make_unique<joule::testing::CountingMeter>();
    return out;
  }

  // The state the API shows once what is being written has committed.
  std::string state_of(const std::string& id) {
    EXPECT_TRUE(run_until([&] { return jobs_.writes_in_flight() == 0; }));
    return shown_now(id);
  }
  // `count` jobs only agent-1 may run (the first is placed once it has joined, the others wait).
  std::vector<std::string> submit_for_agent(int count) {
    std::vector<std::string> ids;
    for (int i = 0; i < count; ++i) {
      auto submitted = submit({{"run", {{"command", {"train"}}}}, {"constraints", {{"devices", {"agent-1/cpu"}}}}});
      EXPECT_TRUE(submitted);
      if (submitted) ids.push_back((*submitted)["id"]);
    }
    return ids;
  }
  // A cancel on `book`, answered once it is committed (or refused).
  joule::Result<json> cancel_on(JobService& book, const std::string& id) {
    std::optional<joule::Result<json>> answer;
    book.cancel(id, [&](joule::Result<joule::daemon::JobView> result) { answer = rendered(result); });
    EXPECT_TRUE(run_until([&] { return answer.has_value(); }));
    return answer.value_or(joule::make_error(joule::ErrorCode::internal, "no answer"));
  }
  // What a starting daemon reads of the database: the jobs it keeps in memory and their events.
  std::pair<std::vector<joule::adapters::StoredJob>, std::vector<joule::adapters::StoredEvent>> stored_for_start(
      std::size_t finished_kept) {
    auto current = database_->load_current_jobs(finished_kept).value();
    std::vector<joule::adapters::StoredEvent> events;
    for (const auto& row : current) {
      auto stored = database_->load_job_events(row.id).value();
      events.insert(events.end(), stored.begin(), stored.end());
    }
    return {std::move(current), std::move(events)};
  }
  // The state the API shows at this moment.
  std::string shown_now(const std::string& id) { return shown(id).value()["state"]; }

  // The estimator's rows for a job that may run on `device` only: `mean` J (σ 5 J, RAPL), 60 s.
  static std::vector<joule::daemon::EstimateRow> rapl_estimate(const std::string& device, double mean) {
    return {joule::testing::estimate_row(device, "rapl", mean, 5.0, 60.0)};
  }
  // 1000 J on the cpu at its defaults; measured at a 2800 MHz cap: 20 % fewer joules, 25 % more time.
  static std::vector<joule::daemon::EstimateRow> capped_cpu_estimate() {
    auto rows = rapl_estimate("cpu", 1000.0);
    rows[0].estimate->settings.push_back({{"cpu_max_frequency_mhz", 2800.0, "2800 MHz"},
                                          "measured",
                                          0.8,
                                          0.02,
                                          1.25,
                                          0.02,
                                          1,
                                          {800.0, 40.0},
                                          {75.0, 1.0}});
    return rows;
  }
  // A small training job (a model and its training, so it is estimated) that may run on `device` only.
  joule::Result<json> submit_training_on(const std::string& device) {
    return submit({{"run", {{"command", {"train"}}}},
                   {"model", {{"input", {{"shape", {1, 8}}}}, {"layers", {{{"type", "linear"}, {"out_features", 2}}}}}},
                   {"training", {{"batch_size", 8}, {"epochs", 1}, {"samples_per_epoch", 64}}},
                   {"constraints", {{"devices", {device}}}}});
  }
  // A budget of 1,000 J an hour on `device` ("node/device"), 900 J of it spent from 10 to 1
  // minute ago; returns the clock's now.
  std::int64_t spend_most_of_the_hour_on(const std::string& device) {
    joule::schedulers::Policy policy;
    joule::schedulers::EnergyBudget budget;
    budget.name = "agent-hour";
    budget.scope = {joule::schedulers::Scope::device, device};
    budget.limit = 1000.0;
    budget.window.rolling_seconds = 3600;
    policy.budgets.push_back(budget);
    jobs_.budgets().set_policy(policy);
    const auto now = clock_.unix_ms();
    const auto slash = device.find('/');
    jobs_.budgets().record(
        {device.substr(0, slash), device.substr(slash + 1), "earlier", now - 600'000, now - 60'000, 900.0, "rapl"});
    return now;
  }
  // A policy with knob goal min-energy, allowing jobs `max_slowdown` more time.
  void choose_settings_within(double max_slowdown) {
    joule::schedulers::Policy policy;
    policy.knobs.goal = joule::schedulers::KnobGoal::min_energy;
    policy.knobs.max_slowdown = max_slowdown;
    jobs_.set_policy(policy);
  }
  // An agent with one device that runs jobs, metered by RAPL there.
  void agent_joins(const std::string& node) {
    joule::cluster::ReportedDevice device;
    device.name = "cpu";
    device.source = "rapl";
    jobs_.nodes().update_node(node, {device});
  }
};

}  // namespace

TEST_F(JobServiceTest, a_deadline_is_judged_by_the_clock_the_service_is_given) {
  // In the future by the system's clock in 2026, past by this service's.
  auto late = submit({{"run", {{"command", {"true"}}}}, {"constraints", {{"deadline", "2029-01-01T00:00:00Z"}}}});
  ASSERT_FALSE(late);
  EXPECT_EQ(late.error().where, "/constraints/deadline");
  EXPECT_TRUE(submit({{"run", {{"command", {"true"}}}}, {"constraints", {{"deadline", "2031-01-01T00:00:00Z"}}}}));
}

TEST_F(JobServiceTest, a_job_on_an_agent_runs_through_its_reports_and_keeps_their_energy_and_times) {
  agent_joins("agent-1");
  auto submitted = submit({{"run", {{"command", {"train"}}}}, {"constraints", {{"devices", {"agent-1/cpu"}}}}});
  ASSERT_TRUE(submitted) << submitted.error().message;
  const std::string id = (*submitted)["id"];
  // Placed once stored; published to the agent once the placement is stored too.
  ASSERT_TRUE(run_until([&] { return !jobs_.nodes().desired_for("agent-1").empty(); }));
  EXPECT_EQ(state_of(id), "placed");
  const auto desired = jobs_.nodes().desired_for("agent-1");
  EXPECT_EQ(desired[0].id, id);
  EXPECT_EQ(desired[0].epoch, 1);
  EXPECT_EQ(desired[0].device, "cpu");

  auto started = reported_job(id, 1, "running");
  started.started_ms = clock_.unix_ms();
  started.energy_joules = 5.0;
  started.energy_source = "rapl";
  (void)jobs_.nodes().apply_reports("agent-1", {started});
  // Shown once durable: until its write commits, the job is shown as the database has it.
  EXPECT_EQ(shown_now(id), "placed");
  EXPECT_EQ(listed("running", 10).value()["total"], 0);
  EXPECT_EQ(state_of(id), "running");
  EXPECT_EQ(listed("running", 10).value()["total"], 1);

  clock_.advance(90s);
  auto ended = reported_job(id, 1, "succeeded");
  ended.started_ms = started.started_ms;
  ended.finished_ms = clock_.unix_ms();
  ended.energy_joules = 250.0;
  ended.energy_source = "rapl";
  ended.exit_code = 0;
  const auto recorded = jobs_.nodes().apply_reports("agent-1", {ended});
  EXPECT_EQ(recorded.size(), 1u);
  ASSERT_TRUE(run_until([&] { return jobs_.writes_in_flight() == 0; }));
  const json job = shown(id).value();
  EXPECT_EQ(job["state"], "succeeded");
  EXPECT_EQ(job["energy"]["joules"], 250.0);
  EXPECT_EQ(job["energy"]["source"], "rapl");
  EXPECT_EQ(job["energy"]["measured"], true);
  EXPECT_EQ(job["seconds"], 90.0);
  EXPECT_TRUE(jobs_.nodes().desired_for("agent-1").empty());  // ended: no longer the agent's to run
}

TEST_F(JobServiceTest, a_lost_agents_job_is_queued_again_and_adopted_when_the_agent_comes_back_running_it) {
  agent_joins("agent-1");
  agent_joins("agent-2");
  auto submitted = submit({{"run", {{"command", {"train"}}}}, {"constraints", {{"devices", {"agent-1/cpu"}}}}});
  ASSERT_TRUE(submitted);
  const std::string id = (*submitted)["id"];
  ASSERT_TRUE(run_until([&] { return !jobs_.nodes().desired_for("agent-1").empty(); }));
  (void)jobs_.nodes().apply_reports("agent-1", {reported_job(id, 1, "running")});
  jobs_.nodes().node_lost("agent-1");
  EXPECT_EQ(state_of(id), "queued");
  EXPECT_TRUE(jobs_.nodes().desired_for("agent-1").empty());
  auto late = reported_job(id, 1, "succeeded");
  late.energy_joules = 900.0;
  late.energy_source = "rapl";
  // It is still the job's last placement, so agent-1 coming back with it running is adopted...
  (void)jobs_.nodes().apply_reports("agent-1", {reported_job(id, 1, "running")});
  EXPECT_EQ(state_of(id), "running");
  // ...and its end recorded, once.
  EXPECT_EQ(jobs_.nodes().apply_reports("agent-1", {late}).size(), 1u);
  EXPECT_EQ(state_of(id), "succeeded");
  EXPECT_EQ(shown(id).value()["energy"]["joules"], 900.0);
  EXPECT_EQ(jobs_.nodes().apply_reports("agent-1", {late}).size(), 1u);  // acknowledged again, not counted twice
}

TEST_F(JobServiceTest, a_running_jobs_duration_follows_the_monotonic_clock_when_the_wall_clock_is_set_back) {
  auto submitted = submit({{"run", {{"command", {"/bin/sleep", "30"}}}}});
  ASSERT_TRUE(submitted) << submitted.error().message;
  const std::string id = (*submitted)["id"];
  ASSERT_TRUE(run_until([&] { return state_of(id) == "running"; }));
  clock_.advance(5s);
  clock_.set_wall(clock_.unix_ms() - 3'600'000);  // an hour back
  EXPECT_EQ(shown(id).value()["seconds"], 5.0);
  clock_.advance(2s);
  std::optional<joule::Result<json>> cancelled;
  jobs_.cancel(id, [&](joule::Result<joule::daemon::JobView> result) { cancelled = rendered(result); });
  ASSERT_TRUE(run_until([&] { return state_of(id) == "cancelled"; }));
  EXPECT_GE(shown(id).value()["seconds"].get<double>(), 7.0);
}

TEST_F(JobServiceTest, listing_by_state_pages_with_a_cursor_both_ways_and_counts_the_state) {
  agent_joins("agent-1");
  const auto ids = submit_for_agent(7);  // one is placed, the others wait
  ASSERT_EQ(ids.size(), 7u);
  ASSERT_TRUE(run_until([&] { return jobs_.writes_in_flight() == 0; }));
  const auto ids_of = [](const json& page) {
    std::vector<std::string> out;
    for (const auto& job : page["jobs"]) out.push_back(job["id"]);
    return out;
  };
  auto first = listed("queued", 4).value();
  EXPECT_EQ(first["total"], 6);
  EXPECT_EQ(ids_of(first), (std::vector<std::string>{ids[1], ids[2], ids[3], ids[4]}));
  auto second = listed("queued", 4, first["next"].get<std::string>()).value();
  EXPECT_EQ(ids_of(second), (std::vector<std::string>{ids[5], ids[6]}));
  EXPECT_TRUE(second["next"].is_null());
  auto newest = listed("queued", 2, std::nullopt, true).value();
  EXPECT_EQ(ids_of(newest), (std::vector<std::string>{ids[6], ids[5]}));
  auto older = listed("queued", 10, newest["next"].get<std::string>(), true).value();
  EXPECT_EQ(ids_of(older), (std::vector<std::string>{ids[4], ids[3], ids[2], ids[1]}));
  auto all = listed(std::nullopt, 100).value();
  EXPECT_EQ(all["total"], 7);
  EXPECT_EQ(ids_of(all), ids);
  // The cursor may be a job of another state: listing goes on after its place in the order.
  EXPECT_EQ(ids_of(listed("queued", 100, ids[0]).value()).size(), 6u);
  EXPECT_EQ(listed("placed", 100).value()["total"], 1);
}

TEST_F(JobServiceTest, a_stored_job_that_cannot_be_read_is_skipped_and_the_rest_is_served) {
  joule::adapters::StoredJob good;
  good.id = "good";
  good.sequence = 1;
  good.state = "succeeded";
  good.spec_json = R"({"run": {"command": ["true"]}})";
  joule::adapters::StoredJob unknown_state = good;
  unknown_state.id = "odd-state";
  unknown_state.sequence = 2;
  unknown_state.state = "exploded";
  joule::adapters::StoredJob bad_spec = good;
  bad_spec.id = "bad-spec";
  bad_spec.sequence = 3;
  bad_spec.spec_json = R"({"run": {"command": []}})";
  DeviceTable restarted_devices(devices());
  JobService restarted(io_, writer_, metrics_, restarted_devices, options(), {}, clock_);
  ASSERT_TRUE(restarted.recover({good, unknown_state, bad_spec}, {}));
  EXPECT_TRUE(restarted.job("good"));
  EXPECT_FALSE(restarted.job("odd-state"));
  EXPECT_FALSE(restarted.job("bad-spec"));
  EXPECT_EQ(page_of(restarted.jobs(std::nullopt, 10).value(), nullptr)["total"], 1);
}

TEST_F(JobServiceTest, a_placement_the_database_refuses_leaves_the_job_waiting_until_writes_succeed_again) {
  agent_joins("agent-1");
  jobs_.nodes().node_lost("agent-1");  // the job waits for its only device
  auto submitted = submit({{"run", {{"command", {"train"}}}}, {"constraints", {{"devices", {"agent-1/cpu"}}}}});
  ASSERT_TRUE(submitted);
  const std::string id = (*submitted)["id"];
  EXPECT_FALSE(jobs_.storage_failure());

  // The database turns read-only (as a full disk or a damaged file make it), then the agent is back.
  ASSERT_TRUE(database_->set_query_only(true));
  agent_joins("agent-1");
  ASSERT_TRUE(run_until([&] { return jobs_.storage_failure().has_value(); }));
  EXPECT_EQ(state_of(id), "queued");  // waits, not failed, and "placed" was never shown
  EXPECT_TRUE(jobs_.nodes().desired_for("agent-1").empty());
  EXPECT_EQ(listed("placed", 10).value()["total"], 0);

  ASSERT_TRUE(database_->set_query_only(false));
  // Placing waits a while before it tries again.
  jobs_.sample_meters();
  EXPECT_EQ(state_of(id), "queued");
  clock_.advance(6s);
  jobs_.sample_meters();
  ASSERT_TRUE(run_until([&] { return !jobs_.nodes().desired_for("agent-1").empty(); }));
  EXPECT_EQ(state_of(id), "placed");
  EXPECT_FALSE(jobs_.storage_failure());
  EXPECT_EQ(jobs_.nodes().desired_for("agent-1")[0].epoch, 2);  // the refused placement's epoch is never reused
}

TEST_F(JobServiceTest, a_job_that_ends_while_the_database_refuses_writes_is_stored_and_shown_once_it_takes_them) {
  agent_joins("agent-1");
  auto submitted = submit({{"run", {{"command", {"train"}}}}, {"constraints", {{"devices", {"agent-1/cpu"}}}}});
  ASSERT_TRUE(submitted);
  const std::string id = (*submitted)["id"];
  ASSERT_TRUE(run_until([&] { return !jobs_.nodes().desired_for("agent-1").empty(); }));
  auto started = reported_job(id, 1, "running");
  started.started_ms = clock_.unix_ms();
  (void)jobs_.nodes().apply_reports("agent-1", {started});
  EXPECT_EQ(state_of(id), "running");

  // The job ends while the database takes no writes (a full disk): its end is not shown.
  ASSERT_TRUE(database_->set_query_only(true));
  clock_.advance(30s);
  auto ended = reported_job(id, 1, "succeeded");
  ended.started_ms = started.started_ms;
  ended.finished_ms = clock_.unix_ms();
  ended.energy_joules = 120.0;
  ended.energy_source = "rapl";
  ended.exit_code = 0;
  (void)jobs_.nodes().apply_reports("agent-1", {ended});
  ASSERT_TRUE(run_until([&] { return jobs_.storage_failure().has_value(); }));
  EXPECT_EQ(state_of(id), "running");
  jobs_.sample_meters();  // tries again, and fails again
  EXPECT_EQ(state_of(id), "running");

  // Once writes succeed again the next meter sample stores it, with its end in its history.
  ASSERT_TRUE(database_->set_query_only(false));
  jobs_.sample_meters();
  ASSERT_TRUE(run_until([&] { return shown_now(id) == "succeeded"; }));
  EXPECT_FALSE(jobs_.storage_failure());
  const auto stored = database_->find_job(id).value();
  ASSERT_TRUE(stored);
  EXPECT_EQ(stored->state, "succeeded");
  EXPECT_EQ(stored->energy_joules, 120.0);
  const auto events = database_->load_job_events(id).value();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().state, "succeeded");
  EXPECT_EQ(shown(id).value()["energy"]["joules"], 120.0);
}

TEST_F(JobServiceTest, a_new_model_stores_again_only_the_queued_jobs_whose_estimate_moved) {
  agent_joins("agent-1");
  spend_most_of_the_hour_on("agent-1/cpu");  // the job stays queued
  double mean = 500.123456789;  // more digits than a job keeps
  estimate_with([&mean](const joule::schedulers::JobSpec&) { return rapl_estimate("agent-1/cpu", mean); });
  auto submitted = submit_training_on("agent-1/cpu");
  ASSERT_TRUE(submitted) << submitted.error().message;
  const std::string id = (*submitted)["id"];
  ASSERT_TRUE(run_until([&] { return jobs_.writes_in_flight() == 0; }));
  ASSERT_EQ(state_of(id), "queued");

  // Each refresh estimates off the loop and ends on it; a store it asks for is in flight then.
  auto refreshed = [&] { return run_until([&] { return !jobs_.refreshing_estimates(); }); };
  jobs_.refresh_estimates();  // the same estimate: nothing to store
  ASSERT_TRUE(refreshed());
  EXPECT_EQ(jobs_.writes_in_flight(), 0u);
  mean = 450.5;
  jobs_.refresh_estimates();  // a moved one is stored and shown
  EXPECT_TRUE(jobs_.refreshing_estimates());
  ASSERT_TRUE(refreshed());
  ASSERT_TRUE(run_until([&] { return jobs_.writes_in_flight() == 0; }));
  EXPECT_EQ(shown(id).value()["estimate"][0]["joules"]["mean"], 450.5);
  EXPECT_EQ(json::parse(database_->find_job(id).value()->estimate_json)[0]["joules"]["mean"], 450.5);
  jobs_.refresh_estimates();
  ASSERT_TRUE(refreshed());
  EXPECT_EQ(jobs_.writes_in_flight(), 0u);
}

// A coordinator's submission is estimated on every device of its cluster (~15 ms at 1,500
// devices): the models' part runs off the loop, which meanwhile takes other submissions.
TEST_F(JobServiceTest, a_submissions_model_work_runs_off_the_loop_while_it_takes_other_submissions) {
  agent_joins("agent-1");
  spend_most_of_the_hour_on("agent-1/cpu");  // the jobs stay queued
  estimate_with([](const joule::schedulers::JobSpec&) { return rapl_estimate("agent-1/cpu", 500.0); });
  std::promise<void> release;
  hold_model_work_until(release.get_future().share());
  std::optional<joule::Result<json>> held;
  jobs_.submit({{"run", {{"command", {"train"}}}},
                {"model", {{"input", {{"shape", {1, 8}}}}, {"layers", {{{"type", "linear"}, {"out_features", 2}}}}}},
                {"training", {{"batch_size", 8}, {"epochs", 1}, {"samples_per_epoch", 64}}},
                {"constraints", {{"devices", {"agent-1/cpu"}}}}},
               joule::daemon::JobService::Submitter{"token:test", std::nullopt},
               [&](joule::Result<joule::daemon::JobView> result) { held = rendered(result); });
  // While its models work, another submission (nothing to estimate) is stored and answered.
  auto other = submit({{"run", {{"command", {"true"}}}}, {"constraints", {{"devices", {"agent-1/cpu"}}}}});
  ASSERT_TRUE(other) << other.error().message;
  EXPECT_FALSE(held);
  release.set_value();
  ASSERT_TRUE(run_until([&] { return held.has_value(); }));
  ASSERT_TRUE(*held) << held->error().message;
  const std::string id = (**held)["id"];
  EXPECT_EQ(shown(id).value()["estimate"][0]["joules"]["mean"], 500.0);
  // Accepted after the other: the later place in submission order.
  EXPECT_GT(database_->find_job(id).value()->sequence, database_->find_job((*other)["id"]).value()->sequence);
}

// The API writes a job's stored estimate into its answer as stored (not parsed and written out
// again): the text reads back as the job's JSON.
TEST_F(JobServiceTest, a_job_and_a_page_written_as_text_read_back_as_their_json) {
  agent_joins("agent-1");
  spend_most_of_the_hour_on("agent-1/cpu");  // the jobs stay queued
  estimate_with([](const joule::schedulers::JobSpec&) { return rapl_estimate("agent-1/cpu", 500.123456789); });
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(submit_training_on("agent-1/cpu"));
  ASSERT_TRUE(run_until([&] { return jobs_.writes_in_flight() == 0; }));
  const auto page = jobs_.jobs("queued", 10, std::nullopt, false);
  ASSERT_TRUE(page);
  ASSERT_EQ(page->jobs.size(), 3u);
  const json listed = json::parse(joule::daemon::routes::job_page_text(*page, {}));
  EXPECT_EQ(listed["total"], 3);
  EXPECT_TRUE(listed["next"].is_null());
  ASSERT_EQ(listed["jobs"].size(), 3u);
  for (std::size_t i = 0; i < 3; ++i)
    EXPECT_EQ(listed["jobs"][i], joule::daemon::routes::job_json(page->jobs[i], false, {}));
  for (const auto& view : page->jobs) {
    const json written = json::parse(joule::daemon::routes::job_text(view, true, {}));
    EXPECT_EQ(written, joule::daemon::routes::job_json(view, true, {}));
    EXPECT_EQ(written["estimate"][0]["joules"]["mean"], 500.123);
  }
}

TEST_F(JobServiceTest, a_job_waiting_for_a_budget_is_placed_when_the_services_clock_reaches_the_windows_turn) {
  agent_joins("agent-1");
  // 900 J spent in the last hour: a 500 J job does not fit until that use leaves the window.
  const auto now = spend_most_of_the_hour_on("agent-1/cpu");
  estimate_with([](const joule::schedulers::JobSpec&) { return rapl_estimate("agent-1/cpu", 500.0); });
  auto submitted = submit_training_on("agent-1/cpu");
  ASSERT_TRUE(submitted) << submitted.error().message;
  const std::string id = (*submitted)["id"];
  ASSERT_TRUE(run_until([&] { return jobs_.writes_in_flight() == 0; }));
  EXPECT_EQ(state_of(id), "queued");
  const json waiting = shown(id).value()["waiting"];
  ASSERT_EQ(waiting["reason"], "budget") << waiting.dump(2);
  // The 900 J leave the window when their end does: 3540 s from now, as the job is told.
  const auto fits_at = now + 3'540'000;
  EXPECT_EQ(waiting["retry_at"], joule::schedulers::format_rfc3339(fits_at));
  // The wake-up is a timer on the service's clock: real time passing changes nothing...
  ASSERT_TRUE(clock_.next_deadline());
  {
    auto busy = boost::asio::make_work_guard(io_);
    io_.run_for(50ms);
    io_.restart();
  }
  EXPECT_EQ(state_of(id), "queued");
  // ...and moving the clock from deadline to deadline places it at the moment it was told.
  while (jobs_.nodes().desired_for("agent-1").empty() && clock_.unix_ms() < fits_at + 60'000) {
    ASSERT_TRUE(clock_.next_deadline()) << "nothing waits to wake the job up at " << clock_.unix_ms() - now;
    const auto step = std::max(*clock_.next_deadline() - clock_.steady(), std::chrono::steady_clock::duration(1ms));
    clock_.advance(std::chrono::duration_cast<std::chrono::milliseconds>(step));
    ASSERT_TRUE(run_until([&] { return !clock_.next_deadline() || *clock_.next_deadline() > clock_.steady(); }));
    ASSERT_TRUE(run_until([&] { return jobs_.writes_in_flight() == 0; }));
  }
  EXPECT_FALSE(jobs_.nodes().desired_for("agent-1").empty());
  EXPECT_EQ(clock_.unix_ms(), fits_at);
  EXPECT_EQ(state_of(id), "placed");
}

TEST_F(JobServiceTest, submissions_in_a_row_continue_the_last_pass_and_are_counted_as_waiting) {
  // The clock stands still and nothing but submissions happens: after the first full pass each
  // submission's pass continues it, deciding the new job alone (issue 32); the waiting gauge
  // still counts every queued job.
  agent_joins("agent-1");
  const auto ids = submit_for_agent(6);
  ASSERT_EQ(ids.size(), 6u);
  ASSERT_TRUE(run_until([&] { return jobs_.writes_in_flight() == 0; }));
  const std::string text = metrics_.serialize();
  auto value = [&](const std::string& series) {
    const auto at = text.find(series + " ");
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + series.size() + 1));
  };
  EXPECT_GE(value("joule_placement_passes_total{kind=\"continued\"}"), 4.0) << text;
  EXPECT_GE(value("joule_placement_passes_total{kind=\"full\"}"), 1.0) << text;
  double waiting = 0.0;
  for (std::size_t at = text.find("\njoule_jobs_waiting{"); at != std::string::npos;
       at = text.find("\njoule_jobs_waiting{", at + 1))
    waiting += std::stod(text.substr(text.find("} ", at) + 2));
  EXPECT_EQ(waiting, 5.0) << text;  // the first runs on the agent's device, 5 wait for it
  EXPECT_EQ(value("joule_jobs_waiting{reason=\"device-busy\"}"), 5.0) << text;
}

TEST_F(JobServiceTest, finished_jobs_leave_memory_and_are_served_from_the_database_as_before) {
  keep_finished(2);
  agent_joins("agent-1");
  // The first is placed, the others wait and are cancelled.
  const auto ids = submit_for_agent(8);
  ASSERT_EQ(ids.size(), 8u);
  for (std::size_t i = 1; i < ids.size(); ++i) {
    const auto cancelled = cancel_on(jobs_, ids[i]);
    ASSERT_TRUE(cancelled) << cancelled.error().message;
  }
  ASSERT_TRUE(run_until([&] { return jobs_.writes_in_flight() == 0; }));
  const auto ids_of = [](const json& page) {
    std::vector<std::string> out;
    for (const auto& job : page["jobs"]) out.push_back(job["id"]);
    return out;
  };
  // Five of the seven cancelled jobs are out of memory now; paging crosses from one to the other.
  auto first = listed("cancelled", 3).value();
  EXPECT_EQ(first["total"], 7);
  EXPECT_EQ(ids_of(first), (std::vector<std::string>{ids[1], ids[2], ids[3]}));
  auto rest = listed("cancelled", 10, first["next"].get<std::string>()).value();
  EXPECT_EQ(ids_of(rest), (std::vector<std::string>{ids[4], ids[5], ids[6], ids[7]}));
  EXPECT_TRUE(rest["next"].is_null());
  auto newest = listed(std::nullopt, 3, std::nullopt, true).value();
  EXPECT_EQ(newest["total"], 8);
  EXPECT_EQ(ids_of(newest), (std::vector<std::string>{ids[7], ids[6], ids[5]}));
  auto older = listed(std::nullopt, 10, newest["next"].get<std::string>(), true).value();
  EXPECT_EQ(ids_of(older), (std::vector<std::string>{ids[4], ids[3], ids[2], ids[1], ids[0]}));
  EXPECT_EQ(older["jobs"][4]["state"], "placed");  // shown from memory, as it stands
  // A job read back shows what it showed in memory: its state, reason and history.
  auto old = shown(ids[1]).value();
  EXPECT_EQ(old["state"], "cancelled");
  EXPECT_EQ(old["reason"], "cancelled while queued");
  ASSERT_EQ(old["events"].size(), 2u);
  EXPECT_EQ(old["events"][1]["state"], "cancelled");
  EXPECT_EQ(jobs_.job(ids[1], false).value().job().row.owner, "token:test");
  EXPECT_FALSE(jobs_.job(ids[1], false).value().directory.empty());  // where its logs are
  const auto again = cancel_on(jobs_, ids[1]);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code, joule::ErrorCode::conflict);
  EXPECT_EQ(again.error().message, fmt::format("job {} has already cancelled", ids[1]));
  EXPECT_EQ(jobs_.pause(ids[1], true).error().code, joule::ErrorCode::conflict);
  EXPECT_EQ(shown("no-such-job").error().code, joule::ErrorCode::not_found);

  // A restarted book loads what is not finished and the latest finished, and counts the rest.
  auto [current, events] = stored_for_start(2);
  EXPECT_EQ(current.size(), 3u);  // the placed job and the last two cancelled (none other ended)
  DeviceTable restarted_devices(devices());
  JobService restarted(io_, writer_, metrics_, restarted_devices, options(), {}, clock_);
  restarted.keep_finished_in(*archive_, 2);
  ASSERT_TRUE(restarted.recover(std::move(current), std::move(events)));
  auto listed = page_of(restarted.jobs("cancelled", 100).value(), nullptr);
  EXPECT_EQ(listed["total"], 7);
  EXPECT_EQ(ids_of(listed).size(), 7u);
  EXPECT_EQ(page_of(restarted.jobs(std::nullopt, 100).value(), nullptr)["total"], 8);
  EXPECT_EQ(rendered(restarted.job(ids[2])).value()["state"], "cancelled");
  // A new job is numbered after every stored one, not only after those loaded: it lists last.
  std::optional<joule::Result<json>> submitted;
  restarted.submit({{"run", {{"command", {"train"}}}}, {"constraints", {{"devices", {"agent-1/cpu"}}}}},
                   JobService::Submitter{"token:test", std::nullopt},
                   [&](joule::Result<joule::daemon::JobView> result) { submitted = rendered(result); });
  ASSERT_TRUE(run_until([&] { return submitted.has_value(); }));
  ASSERT_TRUE(*submitted) << submitted->error().message;
  auto latest = page_of(restarted.jobs(std::nullopt, 1, std::nullopt, true).value(), nullptr);
  EXPECT_EQ(ids_of(latest), (std::vector<std::string>{(**submitted)["id"].get<std::string>()}));
}

TEST_F(JobServiceTest, finished_jobs_older_than_keep_finished_days_leave_the_database_with_their_directories) {
  keep_finished(1);
  agent_joins("agent-1");
  const auto ids = submit_for_agent(4);
  ASSERT_EQ(ids.size(), 4u);
  // The first is placed; the next two are cancelled now, the last a day and a half later.
  ASSERT_TRUE(cancel_on(jobs_, ids[1]));
  ASSERT_TRUE(cancel_on(jobs_, ids[2]));
  ASSERT_TRUE(run_until([&] { return jobs_.writes_in_flight() == 0; }));
  const auto log_directory = dir_.path() / "jobs" / ids[1];
  std::filesystem::create_directories(log_directory);

  // A node whose finished jobs are kept a day, started on what is stored.
  auto options = this->options();
  options.keep_finished_days = 1;
  auto [current, events] = stored_for_start(1);
  DeviceTable pruning_devices(devices());
  JobService pruning(io_, writer_, metrics_, pruning_devices, options, {}, clock_);
  pruning.keep_finished_in(*archive_, 1);
  ASSERT_TRUE(pruning.recover(std::move(current), std::move(events)));
  clock_.advance(36h);
  ASSERT_TRUE(cancel_on(pruning, ids[3]));
  pruning.sample_meters();
  ASSERT_TRUE(run_until([&] { return pruning.writes_in_flight() == 0 && !database_->find_job(ids[1]).value(); }));
  EXPECT_FALSE(database_->find_job(ids[2]).value());
  EXPECT_TRUE(database_->load_job_events(ids[1]).value().empty());
  EXPECT_EQ(pruning.job(ids[1]).error().code, joule::ErrorCode::not_found);
  EXPECT_EQ(pruning.job(ids[3]).value().job().row.state, "cancelled");  // a day and a half younger
  EXPECT_EQ(pruning.jobs("cancelled", 10).value().total, 1u);
  EXPECT_EQ(pruning.jobs(std::nullopt, 10).value().total, 2u);  // and the placed one
  ASSERT_TRUE(run_until([&] { return !std::filesystem::exists(log_directory); }));
}

// With a policy knobs.goal, placement chooses among the knob settings the job's estimate carries
// (what probing measured at them) within its allowed slowdown, the executor sets the one chosen
// on the device (a fixture cpufreq tree) and puts the default back when the job ends; the job
// shows the setting, what it was predicted to save, and what it measured.
TEST_F(JobServiceTest,
       with_a_knob_goal_a_job_runs_at_its_cheapest_setting_within_its_slowdown_and_the_default_returns) {
  joule::testing::TempDir tree;
  const auto limit_file = tree / "sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq";
  const auto knob = joule::testing::intel_pstate_knob(tree);
  device_table_.find("cpu")->cpu_frequency = knob;
  choose_settings_within(0.5);
  // 100 J and 60 s at the defaults; each setting's ratios as measured (2 % spreads).
  estimate_with([](const joule::schedulers::JobSpec&) {
    auto rows = rapl_estimate("cpu", 100.0);
    for (const auto& [mhz, energy, time] : {std::tuple{3800.0, 0.95, 1.05}, {2800.0, 0.80, 1.25}, {2100.0, 0.70, 1.7}})
      rows[0].estimate->settings.push_back({{"cpu_max_frequency_mhz", mhz, fmt::format("{:g} MHz", mhz)},
                                            "measured",
                                            energy,
                                            0.02,
                                            time,
                                            0.02,
                                            1,
                                            {100.0 * energy, 5.0},
                                            {60.0 * time, 1.0}});
    return rows;
  });
  auto run_with = [&](json constraints) {
    constraints["devices"] = {"cpu"};
    auto submitted =
        submit({{"run", {{"command", {"/bin/sleep", "30"}}}},
                {"model", {{"input", {{"shape", {1, 8}}}}, {"layers", {{{"type", "linear"}, {"out_features", 2}}}}}},
                {"training", {{"batch_size", 8}, {"epochs", 1}, {"samples_per_epoch", 64}}},
                {"constraints", constraints}});
    EXPECT_TRUE(submitted) << submitted.error().message;
    return submitted ? (*submitted)["id"].get<std::string>() : std::string();
  };
  auto limit_now = [&] {
    std::ifstream in(limit_file);
    std::string text;
    std::getline(in, text);
    return text;
  };

  // The policy allows 50 % slower: 2800 MHz saves most within it (2100 MHz is 70 % slower).
  const std::string id = run_with(json::object());
  ASSERT_TRUE(run_until([&] { return state_of(id) == "running"; }));
  json job = shown(id).value();
  const json chosen = job["knobs"]["chosen"];
  EXPECT_EQ(chosen["label"], "2800 MHz") << job.dump(2);
  EXPECT_EQ(chosen["goal"], "min-energy");
  EXPECT_NEAR(chosen["predicted"]["energy_saving"].get<double>(), 0.20, 1e-9);
  EXPECT_NEAR(chosen["predicted"]["slowdown"].get<double>(), 0.25, 1e-9);
  EXPECT_NEAR(chosen["predicted"]["joules_at_defaults"].get<double>(), 100.0, 1e-9);
  EXPECT_EQ(job["knobs"]["in_force"], "cpu_max_frequency_mhz 2800 (policy0 2800 MHz)");
  EXPECT_EQ(limit_now(), "2800000");
  clock_.advance(2s);
  std::optional<joule::Result<json>> cancelled;
  jobs_.cancel(id, [&](joule::Result<joule::daemon::JobView> result) { cancelled = rendered(result); });
  ASSERT_TRUE(run_until([&] { return state_of(id) == "cancelled"; }));
  EXPECT_EQ(limit_now(), "4700000");
  EXPECT_EQ(shown(id).value()["knobs"]["in_force"], nullptr);

  // A job that allows 10 %: only 3800 MHz keeps its slowdown at the policy's risk.
  const std::string careful = run_with({{"max_slowdown", 0.1}});
  ASSERT_TRUE(run_until([&] { return state_of(careful) == "running"; }));
  job = shown(careful).value();
  EXPECT_EQ(job["knobs"]["chosen"]["label"], "3800 MHz") << job.dump(2);
  EXPECT_EQ(job["spec"]["constraints"]["max_slowdown"], 0.1);
  EXPECT_EQ(limit_now(), "3800000");
  cancelled.reset();
  jobs_.cancel(careful, [&](joule::Result<joule::daemon::JobView> result) { cancelled = rendered(result); });
  ASSERT_TRUE(run_until([&] { return state_of(careful) == "cancelled"; }));
  EXPECT_EQ(limit_now(), "4700000");

  // A job that asks for a measured setting itself is weighed at it: 80 J, not the defaults' 100.
  auto own = json{{"run", {{"command", {"/bin/sleep", "30"}}}},
                  {"model", {{"input", {{"shape", {1, 8}}}}, {"layers", {{{"type", "linear"}, {"out_features", 2}}}}}},
                  {"training", {{"batch_size", 8}, {"epochs", 1}, {"samples_per_epoch", 64}}},
                  {"knobs", {{"cpu_max_frequency_mhz", 2800}}}};
  auto asked = submit(own);
  ASSERT_TRUE(asked) << asked.error().message;
  const std::string mine = (*asked)["id"];
  ASSERT_TRUE(run_until([&] { return state_of(mine) == "running"; }));
  job = shown(mine).value();
  EXPECT_FALSE(job["knobs"].contains("chosen"));
  EXPECT_TRUE(std::any_of(job["events"].begin(), job["events"].end(), [](const json& event) {
    return event["message"].get<std::string>().find("80 J") != std::string::npos;
  })) << job.dump(2);
  cancelled.reset();
  jobs_.cancel(mine, [&](joule::Result<joule::daemon::JobView> result) { cancelled = rendered(result); });
  ASSERT_TRUE(run_until([&] { return state_of(mine) == "cancelled"; }));

  // With the goal off, jobs run at the defaults.
  jobs_.set_policy(joule::schedulers::Policy{});
  const std::string plain = run_with(json::object());
  ASSERT_TRUE(run_until([&] { return state_of(plain) == "running"; }));
  EXPECT_FALSE(shown(plain).value().contains("knobs"));
  EXPECT_EQ(limit_now(), "4700000");
  cancelled.reset();
  jobs_.cancel(plain, [&](joule::Result<joule::daemon::JobView> result) { cancelled = rendered(result); });
  ASSERT_TRUE(run_until([&] { return state_of(plain) == "cancelled"; }));
}

// A job that lets placement choose its cores (resources.cores {min, max}) runs at the count the
// device's figures make cheapest, holds that many, and its threads and CPUs follow; counts the
// device has no figures for are not chosen.
TEST_F(JobServiceTest, a_job_with_a_range_of_cores_runs_at_the_cheapest_count_measured) {
  if (joule::adapters::usable_cpus().size() < 2) GTEST_SKIP() << "needs a node with 2 CPUs";
  joule::daemon::Device& cpu = *device_table_.find("cpu");
  cpu.shared_cores = 2;
  cpu.threads = 1;
  // 100 J in 60 s at the device's 1 thread; 70 J in 40 s measured at 2 threads.
  estimate_with([](const joule::schedulers::JobSpec&) {
    auto rows = rapl_estimate("cpu", 100.0);
    rows[0].estimate->settings.push_back(
        {joule::estimator::threads_setting(2), "measured", 0.7, 0.02, 0.67, 0.02, 1, {70.0, 3.5}, {40.0, 2.0}});
    return rows;
  });
  auto submitted =
      submit({{"run", {{"command", {"/bin/sleep", "30"}}}},
              {"model", {{"input", {{"shape", {1, 8}}}}, {"layers", {{{"type", "linear"}, {"out_features", 2}}}}}},
              {"training", {{"batch_size", 8}, {"epochs", 1}, {"samples_per_epoch", 64}}},
              {"resources", {{"cores", {{"min", 1}, {"max", 2}}}}},
              {"constraints", {{"devices", {"cpu"}}}}});
  ASSERT_TRUE(submitted) << submitted.error().message;
  const std::string id = (*submitted)["id"];
  ASSERT_TRUE(run_until([&] { return state_of(id) == "running"; }));
  const json job = shown(id).value();
  EXPECT_TRUE(std::any_of(job["events"].begin(), job["events"].end(), [](const json& event) {
    return event["message"].get<std::string>().find("(2 of resources.cores 1-2, placement's choice)") !=
           std::string::npos;
  })) << job.dump(2);
  EXPECT_EQ(cpu.cores_held(), 2);
  EXPECT_EQ(job["cores"], 2);
  // Stored, for a restart to hold as many again.
  const auto stored = database_->load_current_jobs(0).value();
  const auto row = std::find_if(stored.begin(), stored.end(), [&](const auto& r) { return r.id == id; });
  ASSERT_NE(row, stored.end());
  EXPECT_EQ(row->cores, 2);
  std::optional<joule::Result<json>> cancelled;
  jobs_.cancel(id, [&](joule::Result<joule::daemon::JobView> result) { cancelled = rendered(result); });
  ASSERT_TRUE(run_until([&] { return state_of(id) == "cancelled"; }));
  EXPECT_EQ(cpu.cores_held(), 0);
}

namespace {
// A meter whose reading the test sets: the test plays the hardware.
class ScriptedMeter final : public joule::adapters::EnergyMeter {
 public:
  explicit ScriptedMeter(const double* total) : total_(total) {}
  std::string_view source() const override { return "rapl"; }
  joule::Result<joule::Joules> read() override { return joule::Joules{*total_}; }

 private:
  const double* total_;
};
}  // namespace

// The setting chosen for a job is checked in its first epochs, Zeus-style: one epoch at the
// setting, the next at the defaults (the fixture's cap read back as the hardware's clock: 70 J
// and 13 s an epoch capped, 100 J and 10 s at the defaults), then the goal keeps the setting.
// The next job of the network is weighed by what this one measured.
TEST_F(JobServiceTest, a_chosen_setting_is_checked_in_the_jobs_first_epochs_and_the_next_job_weighed_by_it) {
  joule::testing::TempDir tree;
  const auto limit_file = tree / "sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq";
  const auto knob = joule::testing::intel_pstate_knob(tree);
  double metered = 0.0;
  device_table_.find("cpu")->cpu_frequency = knob;
  device_table_.find("cpu")->meter = std::make_unique<ScriptedMeter>(&metered);
  choose_settings_within(0.5);
  estimate_with([](const joule::schedulers::JobSpec&) { return capped_cpu_estimate(); });
  const json body = {
      {"run", {{"command", {"/bin/sleep", "30"}}}},
      {"model", {{"input", {{"shape", {1, 8}}}}, {"layers", {{{"type", "linear"}, {"out_features", 2}}}}}},
      {"training", {{"batch_size", 8}, {"epochs", 10}, {"samples_per_epoch", 64}}},
      {"constraints", {{"devices", {"cpu"}}}}};
  auto limit_now = [&] {
    std::ifstream in(limit_file);
    std::string text;
    std::getline(in, text);
    return text;
  };
  // One epoch on the "hardware": its cost at the cap in force, then the job's report.
  auto epoch = [&](const std::string& id, int n) {
    const bool capped = limit_now() == "2800000";
    metered += capped ? 70.0 : 100.0;
    clock_.advance(capped ? 13s : 10s);
    auto answer = jobs_.report_progress(id, {n, 10, json::object()});
    EXPECT_TRUE(answer) << answer.error().message;
  };

  auto submitted = submit(body);
  ASSERT_TRUE(submitted) << submitted.error().message;
  const std::string id = (*submitted)["id"];
  ASSERT_TRUE(run_until([&] { return state_of(id) == "running"; }));
  EXPECT_EQ(shown(id).value()["knobs"]["chosen"]["label"], "2800 MHz");
  EXPECT_EQ(limit_now(), "2800000");
  epoch(id, 1);  // warm-up
  EXPECT_EQ(limit_now(), "2800000");
  epoch(id, 2);  // metered at the setting; the defaults for the next
  EXPECT_EQ(limit_now(), "4700000");
  EXPECT_EQ(shown(id).value()["knobs"]["in_force"], nullptr);
  epoch(id, 3);  // metered at the defaults: the setting saves 30 % at 30 % more time, within 50 %
  EXPECT_EQ(limit_now(), "2800000");
  EXPECT_EQ(state_of(id), "running");  // its notes committed
  json job = shown(id).value();
  const json check = job["knobs"]["chosen"]["check"];
  EXPECT_TRUE(check["kept"].get<bool>()) << job.dump(2);
  EXPECT_EQ(check["setting_epoch"], 2);
  EXPECT_EQ(check["default_epoch"], 3);
  EXPECT_NEAR(check["energy_ratio"].get<double>(), 0.7, 1e-9);
  EXPECT_NEAR(check["time_ratio"].get<double>(), 1.3, 1e-9);
  const std::string said =
      "cpu_max_frequency_mhz 2800 MHz checked in epochs 2 and 3: 0.70× the joules and 1.30× the "
      "time of the defaults: the setting kept";
  EXPECT_TRUE(std::any_of(job["events"].begin(), job["events"].end(), [&](const json& event) {
    return event["message"] == said;
  })) << job.dump(2);
  epoch(id, 4);
  EXPECT_EQ(limit_now(), "2800000");  // nothing more to check
  const std::string exposition = metrics_.serialize();
  EXPECT_NE(exposition.find("outcome=\"chosen\"} 1"), std::string::npos) << exposition;
  EXPECT_NE(exposition.find("outcome=\"check-kept\"} 1"), std::string::npos);
  std::optional<joule::Result<json>> cancelled;
  jobs_.cancel(id, [&](joule::Result<joule::daemon::JobView> result) { cancelled = rendered(result); });
  ASSERT_TRUE(run_until([&] { return state_of(id) == "cancelled"; }));
  EXPECT_EQ(limit_now(), "4700000");

  // The next job of the same network is weighed by what the first measured, not the prediction.
  auto next = submit(body);
  ASSERT_TRUE(next) << next.error().message;
  const std::string second = (*next)["id"];
  ASSERT_TRUE(run_until([&] { return state_of(second) == "running"; }));
  job = shown(second).value();
  EXPECT_NEAR(job["knobs"]["chosen"]["predicted"]["energy_saving"].get<double>(), 0.3, 1e-9) << job.dump(2);
  EXPECT_NEAR(job["knobs"]["chosen"]["predicted"]["slowdown"].get<double>(), 0.3, 1e-9);
  cancelled.reset();
  jobs_.cancel(second, [&](joule::Result<joule::daemon::JobView> result) { cancelled = rendered(result); });
  ASSERT_TRUE(run_until([&] { return state_of(second) == "cancelled"; }));

  // A restart keeps both: the first job's record shows its setting, prediction and check as
  // before, and the next job of the network is still weighed by what the first measured.
  auto [current, events] = stored_for_start(10);
  DeviceTable restarted_devices(devices());
  restarted_devices.find("cpu")->cpu_frequency = knob;
  restarted_devices.find("cpu")->meter = std::make_unique<ScriptedMeter>(&metered);
  JobService restarted(io_, writer_, metrics_, restarted_devices, options(),
                       joule::daemon::JobServiceLinks{&estimator_}, clock_);
  ASSERT_TRUE(restarted.recover(std::move(current), std::move(events)));
  const json first = rendered(restarted.job(id)).value();
  EXPECT_EQ(first["knobs"]["chosen"]["label"], "2800 MHz") << first.dump(2);
  EXPECT_EQ(first["knobs"]["chosen"]["goal"], "min-energy");
  EXPECT_TRUE(first["knobs"]["chosen"]["check"]["kept"].get<bool>()) << first.dump(2);
  EXPECT_NEAR(first["knobs"]["chosen"]["check"]["energy_ratio"].get<double>(), 0.7, 1e-9);
  EXPECT_NEAR(first["knobs"]["chosen"]["predicted"]["energy_saving"].get<double>(), 0.2, 1e-9);
  joule::schedulers::Policy policy;
  policy.knobs.goal = joule::schedulers::KnobGoal::min_energy;
  policy.knobs.max_slowdown = 0.5;
  restarted.set_policy(policy);
  std::optional<joule::Result<json>> third;
  restarted.submit(body, JobService::Submitter{"token:test", std::nullopt},
                   [&](joule::Result<joule::daemon::JobView> result) { third = rendered(result); });
  ASSERT_TRUE(run_until([&] { return third.has_value(); }));
  ASSERT_TRUE(*third) << third->error().message;
  const std::string third_id = (**third)["id"];
  ASSERT_TRUE(run_until([&] {
    return rendered(restarted.job(third_id)).value()["state"] == "running" && restarted.writes_in_flight() == 0;
  }));
  job = rendered(restarted.job(third_id)).value();
  EXPECT_NEAR(job["knobs"]["chosen"]["predicted"]["energy_saving"].get<double>(), 0.3, 1e-9) << job.dump(2);
  EXPECT_TRUE(cancel_on(restarted, third_id));
}

// A job on cores of its own may be given a clock cap too, where each CPU has a cpufreq policy of
// its own: the cap reaches the job's core alone, and comes back when it ends.
TEST_F(JobServiceTest, a_job_on_a_core_of_its_own_is_given_a_cap_on_that_core_alone) {
  if (joule::adapters::usable_cpus().size() < 2) GTEST_SKIP() << "needs a node with 2 CPUs";
  joule::testing::TempDir tree;
  for (int cpu = 0; cpu < 2; ++cpu)
    joule::testing::write_cpufreq_policy(tree, joule::testing::intel_pstate_policy(cpu));
  joule::daemon::Device& cpu = *device_table_.find("cpu");
  cpu.shared_cores = 2;
  cpu.threads = 1;
  cpu.cpu_frequency = joule::adapters::CpuFrequencyKnob::discover(tree / "sys/devices/system/cpu/cpufreq").value();
  choose_settings_within(0.5);
  estimate_with([](const joule::schedulers::JobSpec&) { return capped_cpu_estimate(); });
  auto submitted =
      submit({{"run", {{"command", {"/bin/sleep", "30"}}}},
              {"model", {{"input", {{"shape", {1, 8}}}}, {"layers", {{{"type", "linear"}, {"out_features", 2}}}}}},
              {"training", {{"batch_size", 8}, {"epochs", 1}, {"samples_per_epoch", 64}}},
              {"resources", {{"cores", 1}}},
              {"constraints", {{"devices", {"cpu"}}}}});
  ASSERT_TRUE(submitted) << submitted.error().message;
  const std::string id = (*submitted)["id"];
  ASSERT_TRUE(run_until([&] { return state_of(id) == "running"; }));
  const json job = shown(id).value();
  EXPECT_EQ(job["knobs"]["chosen"]["label"], "2800 MHz") << job.dump(2);
  EXPECT_EQ(cpu.cores_held(), 1) << "it holds its core, not the CPU";
  int own = -1;
  for (const auto& event : job["events"]) {
    const std::string message = event["message"];
    if (message.rfind("on CPUs ", 0) == 0) own = std::stoi(message.substr(8));
  }
  ASSERT_TRUE(own == 0 || own == 1) << job.dump(2);
  auto max_of = [&](int policy) {
    return joule::testing::read_text(
        tree / ("sys/devices/system/cpu/cpufreq/policy" + std::to_string(policy) + "/scaling_max_freq"));
  };
  EXPECT_EQ(job["knobs"]["in_force"], fmt::format("cpu_max_frequency_mhz 2800 (policy{} 2800 MHz)", own));
  EXPECT_EQ(max_of(own), "2800000\n");
  EXPECT_EQ(max_of(1 - own), "4700000\n") << "the other core, free for another job, keeps its clock";
  std::optional<joule::Result<json>> cancelled;
  jobs_.cancel(id, [&](joule::Result<joule::daemon::JobView> result) { cancelled = rendered(result); });
  ASSERT_TRUE(run_until([&] { return state_of(id) == "cancelled"; }));
  EXPECT_EQ(max_of(own), "4700000\n");
}

namespace {
// A node with two GPUs of one model, each metered by a reading the test sets.
class GpuPairBookTest : public ::testing::Test, protected joule::testing::JobBook {
 protected:
  GpuPairBookTest() : JobBook(devices(), 1'900'000'000'000) {}

  static std::vector<joule::daemon::Device> devices() {
    std::vector<joule::daemon::Device> out(3);
    out[0].name = "cpu";
    out[0].meter = std::make_unique<joule::testing::CountingMeter>();
    for (int i = 0; i < 2; ++i) {
      out[1 + i].name = fmt::format("cuda:{}", i);
      out[1 + i].meter = std::make_unique<ScriptedMeter>(&gpu_joules[i]);
      out[1 + i].gpu_group = "Fake GPU";
    }
    return out;
  }
  static inline double gpu_joules[2] = {0.0, 0.0};
};
}  // namespace

// A job on both GPUs is sampled once, its energy so far the sum of the two GPUs' since it
// started (each GPU holds it, but only its own device reports it).
TEST_F(GpuPairBookTest, a_job_on_two_gpus_is_sampled_once_with_both_gpus_energy) {
  gpu_joules[0] = 100.0;
  gpu_joules[1] = 500.0;
  auto submitted = submit({{"run", {{"command", {"/bin/sleep", "30"}}}}, {"resources", {{"gpus", 2}}}});
  ASSERT_TRUE(submitted) << submitted.error().message;
  const std::string id = (*submitted)["id"];
  ASSERT_TRUE(run_until([&] { return shown(id).value()["state"] == "running"; }));
  EXPECT_EQ(device_table_.find("cuda:0")->holds.size(), 1u);
  EXPECT_EQ(device_table_.find("cuda:1")->holds.size(), 1u);
  jobs_.sample_meters();
  gpu_joules[0] += 30.0;  // 30 J on one GPU, 70 J on the other since it started
  gpu_joules[1] += 70.0;
  clock_.advance(std::chrono::seconds(1));
  jobs_.sample_meters();
  const json job = shown(id).value();
  EXPECT_NEAR(job["energy_so_far"]["joules"].get<double>(), 100.0, 1e-9) << job.dump(2);
  EXPECT_EQ(job["devices"].size(), 2u) << job.dump(2);
  std::optional<joule::Result<json>> cancelled;
  jobs_.cancel(id, [&](joule::Result<joule::daemon::JobView> result) { cancelled = rendered(result); });
  ASSERT_TRUE(run_until([&] { return shown(id).value()["state"] == "cancelled"; }));
  EXPECT_TRUE(device_table_.find("cuda:0")->holds.empty());
  EXPECT_TRUE(device_table_.find("cuda:1")->holds.empty());
}

// A job on both GPUs may be given a setting too: placement weighs it at the power limit the
// GPUs offer, and it is to run at it on each (here no NVML takes it: it runs at the defaults,
// said so, and nothing is left set).
TEST_F(GpuPairBookTest, a_job_on_two_gpus_is_given_a_power_limit_for_both) {
  for (const char* name : {"cuda:0", "cuda:1"}) {
    joule::daemon::Device& gpu = *device_table_.find(name);
    gpu.can_limit_gpu = true;
    gpu.gpu_min_watts = 100.0;
    gpu.gpu_max_watts = 300.0;
  }
  joule::schedulers::Policy policy;
  policy.knobs.goal = joule::schedulers::KnobGoal::min_energy;
  jobs_.set_policy(policy);
  // 1000 J in 60 s at the defaults; at 210 W (70 % of 300 W) 20 % fewer joules, 5 % more time.
  estimate_with([](const joule::schedulers::JobSpec&) {
    std::vector<joule::daemon::EstimateRow> rows;
    for (const char* name : {"cuda:0", "cuda:1"}) {
      auto row = joule::testing::estimate_row(name, "nvml", 1000.0, 20.0, 60.0);
      row.estimate->settings.push_back({{"gpu_power_limit_watts", 210.0, "210 W"},
                                        "measured",
                                        0.8,
                                        0.02,
                                        1.05,
                                        0.02,
                                        1,
                                        {800.0, 16.0},
                                        {63.0, 1.0}});
      rows.push_back(std::move(row));
    }
    return rows;
  });
  auto submitted =
      submit({{"run", {{"command", {"/bin/sleep", "30"}}}},
              {"model", {{"input", {{"shape", {1, 8}}}}, {"layers", {{{"type", "linear"}, {"out_features", 2}}}}}},
              {"training", {{"batch_size", 8}, {"epochs", 1}, {"samples_per_epoch", 64}}},
              {"resources", {{"gpus", 2}}}});
  ASSERT_TRUE(submitted) << submitted.error().message;
  const std::string id = (*submitted)["id"];
  ASSERT_TRUE(run_until([&] { return shown(id).value()["state"] == "running"; }));
  const json job = shown(id).value();
  EXPECT_EQ(job["knobs"]["chosen"]["label"], "210 W") << job.dump(2);
  EXPECT_NEAR(job["knobs"]["chosen"]["predicted"]["energy_saving"].get<double>(), 0.2, 1e-9) << job.dump(2);
  EXPECT_EQ(job["knobs"]["in_force"], nullptr) << job.dump(2);
  EXPECT_TRUE(std::any_of(job["events"].begin(), job["events"].end(), [](const json& event) {
    return event["message"].get<std::string>().find("knobs refused, it runs at the device's defaults") !=
           std::string::npos;
  })) << job.dump(2);
  std::optional<joule::Result<json>> cancelled;
  jobs_.cancel(id, [&](joule::Result<joule::daemon::JobView> result) { cancelled = rendered(result); });
  ASSERT_TRUE(run_until([&] { return shown(id).value()["state"] == "cancelled"; }));
}
