// The agent runner against a fake job book on a manual clock: assignments taken in once, the
// plan's stops and pauses passed on, reports of running and ended jobs (acknowledged ends left
// out) and the node's own devices as its syncs report them.

#include "jobs/executors/agent_runner.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "counting_meter.hpp"
#include "jobs/job_record.hpp"

using joule::daemon::AgentHost;
using joule::daemon::AgentRunner;
using joule::daemon::Device;
using joule::daemon::DeviceTable;
using joule::daemon::JobRecord;
using joule::schedulers::JobState;

namespace {

// The book as the runner sees it: stores assignments when told to, records the rest.
class FakeBook final : public AgentHost {
 public:
  const joule::Clock& clock() const override { return time; }
  void for_each_assigned(const std::function<void(const JobRecord&)>& visit) const override {
    for (const auto& [id, job] : jobs)
      if (!job.row.origin.empty()) visit(job);
  }
  JobRecord* find_job(const std::string& id) override {
    const auto it = jobs.find(id);
    return it == jobs.end() ? nullptr : &it->second;
  }
  void take_assignment(const joule::cluster::Assignment& assignment, std::function<void(bool)> done) override {
    taken.push_back(assignment.id);
    pending.push_back([this, assignment, done = std::move(done)](bool stored) {
      if (stored) {
        JobRecord job;
        job.row.id = assignment.id + "." + std::to_string(assignment.epoch);
        job.row.origin = assignment.id;
        job.row.epoch = assignment.epoch;
        job.row.state = "queued";
        job.shown = joule::daemon::ShownRow::of(job.row);  // stored with it
        jobs.emplace(job.row.id, std::move(job));
      }
      done(stored);
    });
  }
  void note(JobRecord& job, const std::string& message) override { notes.push_back(job.row.id + ": " + message); }
  void cancel(const std::string& id) override { cancelled.push_back(id); }
  void throttle(const joule::schedulers::ThrottleAction& action) override {
    actions.push_back(std::string(joule::schedulers::to_string(action.kind)) + " " + action.job);
  }
  std::optional<double> sampled_energy(const JobRecord&, const Device&) const override { return energy_so_far; }
  void lease_runs_for(double seconds) override { lease_seconds = seconds; }

  // Stores (or fails to store) the assignments taken so far, as the storage thread's commits would.
  void commit(bool stored) {
    auto commits = std::move(pending);
    pending.clear();
    for (auto& commit : commits) commit(stored);
  }

  joule::ManualClock time{1'900'000'000'000};
  std::map<std::string, JobRecord> jobs;
  std::vector<std::string> taken, notes, cancelled, actions;
  std::vector<std::function<void(bool)>> pending;
  std::optional<double> energy_so_far;
  std::optional<double> lease_seconds;
};

joule::cluster::Assignment assignment(const std::string& id, std::int64_t epoch) {
  joule::cluster::Assignment a;
  a.id = id;
  a.epoch = epoch;
  a.device = "cpu";
  return a;
}

class AgentRunnerTest : public ::testing::Test {
 protected:
  AgentRunnerTest() {
    Device cpu;
    cpu.name = "cpu";
    cpu.meter = std::make_unique<joule::testing::CountingMeter>();
    devices.add(std::move(cpu));
    runner.set_assignment_changed_hook([this] { ++changes; });
  }

  FakeBook book;
  DeviceTable devices;
  AgentRunner runner{book, devices};
  int changes = 0;
};

TEST_F(AgentRunnerTest, an_assignment_is_taken_once_and_held_while_it_is_being_stored) {
  runner.assign(assignment("job-a", 1));
  runner.assign(assignment("job-a", 1));  // the next sync offers it again before the commit
  EXPECT_EQ(book.taken, std::vector<std::string>{"job-a"});
  auto held = runner.local_assignments();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].local_id, "job-a.1");
  EXPECT_EQ(held[0].origin, "job-a");
  EXPECT_EQ(held[0].epoch, 1);

  book.commit(true);
  runner.assign(assignment("job-a", 1));  // stored: a duplicate is ignored
  EXPECT_EQ(book.taken.size(), 1u);
  ASSERT_EQ(runner.local_assignments().size(), 1u);

  // A store that fails leaves nothing held: the next sync offers it again and it is taken.
  runner.assign(assignment("job-b", 3));
  book.commit(false);
  EXPECT_EQ(runner.local_assignments().size(), 1u);
  runner.assign(assignment("job-b", 3));
  EXPECT_EQ(book.taken, (std::vector<std::string>{"job-a", "job-b", "job-b"}));
}

TEST_F(AgentRunnerTest, stops_and_pauses_reach_only_running_jobs_that_are_not_over) {
  runner.assign(assignment("job-a", 1));
  book.commit(true);
  JobRecord& job = book.jobs.at("job-a.1");
  runner.pause_assignment("job-a.1", true, "paused by the coordinator's policy");
  EXPECT_TRUE(book.actions.empty());  // queued: nothing to pause
  job.state = JobState::running;
  runner.pause_assignment("job-a.1", true, "paused by the coordinator's policy");
  EXPECT_EQ(book.actions, std::vector<std::string>{"pause job-a.1"});
  job.paused = true;
  runner.pause_assignment("job-a.1", true, "again");  // already paused
  runner.pause_assignment("job-a.1", false, "resumed by the coordinator");
  EXPECT_EQ(book.actions, (std::vector<std::string>{"pause job-a.1", "resume job-a.1"}));

  runner.stop_assignment("job-a.1", "the coordinator placed it elsewhere");
  EXPECT_EQ(book.notes, std::vector<std::string>{"job-a.1: stop: the coordinator placed it elsewhere"});
  EXPECT_EQ(book.cancelled, std::vector<std::string>{"job-a.1"});
  job.state = JobState::cancelled;
  runner.stop_assignment("job-a.1", "again");  // over: nothing more
  runner.stop_assignment("unknown.1", "never held");
  EXPECT_EQ(book.cancelled.size(), 1u);
}

TEST_F(AgentRunnerTest, reports_carry_energy_so_far_then_the_end_until_it_is_acknowledged_or_old) {
  runner.assign(assignment("job-a", 2));
  book.commit(true);
  JobRecord& job = book.jobs.at("job-a.2");
  job.state = JobState::running;
  job.row.state = "running";
  job.row.device = "cpu";
  job.row.started_ms = book.time.unix_ms();
  job.shown = joule::daemon::ShownRow::of(job.row);  // stored
  book.energy_so_far = 12.5;
  auto reports = runner.assignment_reports({});
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].id, "job-a");
  EXPECT_EQ(reports[0].epoch, 2);
  EXPECT_EQ(reports[0].state, "running");
  EXPECT_EQ(reports[0].energy_joules, 12.5);
  EXPECT_EQ(reports[0].energy_source, "simulated");  // the device's meter

  job.state = JobState::succeeded;
  job.row.state = "succeeded";
  job.row.finished_ms = book.time.unix_ms();
  job.row.energy_joules = 20.0;
  job.row.energy_source = "rapl";
  // Its end is reported once stored, not before: a kill -9 in between would lose it here while
  // the coordinator had recorded it.
  reports = runner.assignment_reports({});
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].state, "running");
  EXPECT_FALSE(reports[0].finished_ms);
  job.shown = joule::daemon::ShownRow::of(job.row);
  reports = runner.assignment_reports({});
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].state, "succeeded");
  EXPECT_EQ(reports[0].energy_joules, 20.0);
  EXPECT_EQ(reports[0].energy_source, "rapl");
  EXPECT_FALSE(reports[0].fenced);
  EXPECT_TRUE(runner.assignment_reports({{"job-a", 2}}).empty());  // acknowledged
  book.time.advance(std::chrono::minutes(11));
  EXPECT_TRUE(runner.assignment_reports({}).empty());  // reported long enough
}

TEST_F(AgentRunnerTest, the_nodes_own_devices_are_reported_with_their_meter_and_whether_busy) {
  devices.add_agent_device("other", "cpu", "rapl");  // an agent's device is never its own report
  devices.find("cpu")->hold("job-a.1", 0);
  devices.find("cpu")->energy_joules = 42.0;
  const auto reported = runner.reported_devices();
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_EQ(reported[0].name, "cpu");
  EXPECT_EQ(reported[0].source, "simulated");
  EXPECT_EQ(reported[0].energy_joules, 42.0);
  EXPECT_TRUE(reported[0].busy);
  runner.changed();
  EXPECT_EQ(changes, 1);
}

}  // namespace
