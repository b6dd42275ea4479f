#include "jobs/executors/node_executor.hpp"

#include <gtest/gtest.h>

#include "fake_executor_host.hpp"
#include "jobs/job_record.hpp"
#include "reported_job.hpp"

using joule::daemon::Device;
using joule::daemon::JobRecord;
using joule::daemon::NodeExecutor;
using joule::schedulers::JobState;
using joule::testing::reported_job;

namespace {

using FakeBook = joule::testing::FakeExecutorHost;

class NodeExecutorTest : public ::testing::Test {
 protected:
  NodeExecutorTest() {
    book.devices.add_agent_device("agent-1", "cpu", "rapl");
    book.devices.add_agent_device("agent-2", "cpu", "rapl");
    JobRecord job;
    job.row.id = "job-1";
    job.row.name = "train";
    job.row.spec_json = R"({"run": {"command": ["true"]}})";
    book.jobs.emplace("job-1", std::move(job));
    executor.add_node_changed_hook([this](const std::string& node) { book.changed.push_back(node); });
  }

  // Places job-1 on `device` the way the book does: prepare, store (here at once), start.
  JobRecord& place(const std::string& device_name) {
    JobRecord& job = book.jobs.at("job-1");
    Device& device = *book.devices.find(device_name);
    device.hold(job.row.id, 0);
    job.row.device = device.name;
    placement_note = executor.prepare(job, device);
    job.state = JobState::placed;
    executor.start(job, device);
    return job;
  }

  FakeBook book;
  NodeExecutor executor{book, book.devices};
  std::string placement_note;
};

}  // namespace

TEST_F(NodeExecutorTest, each_placement_gets_a_new_epoch_that_is_published_only_once_stored) {
  JobRecord& job = book.jobs.at("job-1");
  Device& device = book.devices[0];
  device.hold(job.row.id, 0);
  job.row.device = device.name;
  EXPECT_EQ(executor.prepare(job, device), " (epoch 1)");
  job.state = JobState::placed;
  // Prepared but not stored yet: the node must not see an epoch a crash could lose.
  EXPECT_TRUE(executor.desired_for("agent-1").empty());
  executor.start(job, device);
  const auto desired = executor.desired_for("agent-1");
  ASSERT_EQ(desired.size(), 1u);
  EXPECT_EQ(desired[0].id, "job-1");
  EXPECT_EQ(desired[0].epoch, 1);
  EXPECT_EQ(desired[0].device, "cpu");  // the agent's own name for it
  EXPECT_EQ(book.changed, std::vector<std::string>{"agent-1"});
  EXPECT_TRUE(executor.desired_for("agent-2").empty());
}

TEST_F(NodeExecutorTest, a_report_of_an_older_epoch_never_settles_the_current_placement) {
  JobRecord& job = place("agent-1/cpu");
  book.devices[0].holds.clear();
  (void)executor.prepare(job, book.devices[1]);  // placed again elsewhere: epoch 2
  job.row.device = "agent-2/cpu";
  book.devices[1].hold(job.row.id, 0);
  executor.start(job, book.devices[1]);
  ASSERT_EQ(job.row.epoch, 2);

  // agent-1 still reports epoch 1 ending: acknowledged (it may stop reporting it), not recorded.
  auto old_end = reported_job("job-1", 1, "succeeded");
  old_end.energy_joules = 500.0;
  old_end.energy_source = "rapl";
  const auto recorded = executor.apply_reports("agent-1", {old_end});
  EXPECT_EQ(recorded, (std::vector<std::pair<std::string, std::int64_t>>{{"job-1", 1}}));
  EXPECT_EQ(job.state, JobState::placed);
  EXPECT_FALSE(job.row.energy_joules.has_value());
  // Epoch 2 reported by the wrong node is stale too.
  (void)executor.apply_reports("agent-1", {reported_job("job-1", 2, "running")});
  EXPECT_EQ(job.state, JobState::placed);
}

TEST_F(NodeExecutorTest, reports_start_meter_and_end_the_run_with_the_nodes_energy_and_exit_code) {
  JobRecord& job = place("agent-1/cpu");
  auto started = reported_job("job-1", 1, "running");
  started.started_ms = 900'000;
  started.energy_joules = 12.0;
  started.energy_source = "rapl";
  (void)executor.apply_reports("agent-1", {started});
  EXPECT_EQ(job.state, JobState::running);
  EXPECT_EQ(job.row.started_ms, 900'000);
  EXPECT_EQ(executor.energy_so_far(job, book.devices[0], nullptr), 12.0);

  auto progress = reported_job("job-1", 1, "running");
  progress.energy_joules = 40.0;
  (void)executor.apply_reports("agent-1", {progress});
  EXPECT_EQ(executor.energy_so_far(job, book.devices[0], nullptr), 40.0);

  auto ended = reported_job("job-1", 1, "failed");
  ended.energy_joules = 55.0;
  ended.energy_source = "rapl";
  ended.exit_code = 137;  // killed by signal 9 on the agent
  ended.reason = "killed by signal 9";
  const auto recorded = executor.apply_reports("agent-1", {ended});
  EXPECT_EQ(recorded.size(), 1u);
  EXPECT_EQ(job.state, JobState::failed);
  EXPECT_EQ(job.row.energy_joules, 55.0);
  EXPECT_EQ(job.row.energy_source, "rapl");
  EXPECT_EQ(job.row.exit_code, 137);
  EXPECT_EQ(job.row.reason, "killed by signal 9 (on agent-1/cpu, epoch 1)");
  // The node's own model learns from its figure there, not this node's.
  EXPECT_FALSE(executor.settle_energy(job, &book.devices[0], nullptr));
}

TEST_F(NodeExecutorTest, a_run_that_started_and_ended_between_two_syncs_counts_as_run) {
  JobRecord& job = place("agent-1/cpu");
  auto ended = reported_job("job-1", 1, "succeeded");
  ended.started_ms = 950'000;
  ended.energy_joules = 30.0;
  ended.energy_source = "rapl";
  (void)executor.apply_reports("agent-1", {ended});
  EXPECT_EQ(job.state, JobState::succeeded);
  EXPECT_EQ(job.row.started_ms, 950'000);
}

TEST_F(NodeExecutorTest, a_node_without_a_meter_charges_the_estimate_labelled_as_a_models_figure) {
  JobRecord& job = place("agent-1/cpu");
  job.estimates = joule::daemon::read_estimates(std::string(
      R"([{"device": "agent-1/cpu", "status": "ok", "source": "simulated", "joules": {"mean": 321.0, "std": 10.0}}])"));
  auto ended = reported_job("job-1", 1, "succeeded");
  ended.started_ms = 950'000;
  (void)executor.apply_reports("agent-1", {ended});
  EXPECT_EQ(job.row.energy_joules, 321.0);
  EXPECT_EQ(job.row.energy_source, "simulated");
}

TEST_F(NodeExecutorTest, a_cancel_before_the_node_took_the_job_up_ends_it_here_at_once) {
  JobRecord& job = place("agent-1/cpu");
  job.cancel_requested = true;
  executor.stop(job);
  EXPECT_EQ(job.state, JobState::cancelled);
  EXPECT_EQ(job.row.reason, "cancelled before it started");
}

TEST_F(NodeExecutorTest, a_cancel_after_the_node_took_the_job_up_is_left_to_the_node) {
  JobRecord& job = place("agent-1/cpu");
  (void)executor.apply_reports("agent-1", {reported_job("job-1", 1, "running")});
  book.changed.clear();
  job.cancel_requested = true;
  executor.stop(job);
  EXPECT_EQ(job.state, JobState::running);
  EXPECT_EQ(book.changed, std::vector<std::string>{"agent-1"});
  const auto desired = executor.desired_for("agent-1");
  ASSERT_EQ(desired.size(), 1u);
  EXPECT_TRUE(desired[0].stop);
}

TEST_F(NodeExecutorTest, only_pause_and_resume_are_applied_from_here) {
  JobRecord& job = place("agent-1/cpu");
  (void)executor.apply_reports("agent-1", {reported_job("job-1", 1, "running")});
  joule::schedulers::ThrottleAction pause;
  pause.kind = joule::schedulers::ThrottleAction::Kind::pause;
  pause.job = "job-1";
  ASSERT_TRUE(executor.throttle(job, book.devices[0], pause));
  EXPECT_TRUE(job.paused);
  EXPECT_TRUE(executor.desired_for("agent-1")[0].paused);
  joule::schedulers::ThrottleAction quota;
  quota.kind = joule::schedulers::ThrottleAction::Kind::cpu_quota;
  quota.value = 0.5;
  EXPECT_FALSE(executor.throttle(job, book.devices[0], quota));
  EXPECT_FALSE(job.cpu_quota.has_value());
  EXPECT_FALSE(executor.can_limit_cpu(job));
}

TEST_F(NodeExecutorTest, a_node_that_comes_back_still_running_the_job_is_adopted_under_the_same_epoch) {
  JobRecord& job = place("agent-1/cpu");
  (void)executor.apply_reports("agent-1", {reported_job("job-1", 1, "running")});
  // The node is lost: the book queues the job again and lets go of the run, keeping its epoch.
  executor.release(job, /*ended=*/false);
  book.devices[0].holds.clear();
  job.state = JobState::queued;
  EXPECT_FALSE(executor.energy_so_far(job, book.devices[0], nullptr).has_value());

  auto back = reported_job("job-1", 1, "running");
  back.energy_joules = 70.0;
  (void)executor.apply_reports("agent-1", {back});
  EXPECT_EQ(job.state, JobState::running);
  EXPECT_TRUE(book.devices[0].holds_job("job-1"));
  EXPECT_EQ(executor.energy_so_far(job, book.devices[0], nullptr), 70.0);
  EXPECT_EQ(executor.desired_for("agent-1").size(), 1u);
}

TEST_F(NodeExecutorTest, recovery_publishes_the_stored_epoch_and_reserves_the_job_again) {
  JobRecord& job = book.jobs.at("job-1");
  job.row.device = "agent-2/cpu";
  job.row.epoch = 4;
  job.state = JobState::running;
  executor.recover(job, &book.devices[1]);
  EXPECT_TRUE(book.devices[1].holds_job("job-1"));
  EXPECT_EQ(book.reserved, std::vector<std::string>{"job-1"});
  const auto desired = executor.desired_for("agent-2");
  ASSERT_EQ(desired.size(), 1u);
  EXPECT_EQ(desired[0].epoch, 4);
  // It ran before the restart: a cancel now is the node's to carry out.
  job.cancel_requested = true;
  executor.stop(job);
  EXPECT_EQ(job.state, JobState::running);
}

TEST_F(NodeExecutorTest, an_old_runs_end_reported_while_the_job_is_placed_again_on_the_same_node_settles_nothing) {
  JobRecord& job = place("agent-1/cpu");
  (void)executor.apply_reports("agent-1", {reported_job("job-1", 1, "running")});
  // agent-1 is lost; the book queues the job again, then places it on agent-1 once more.
  executor.release(job, /*ended=*/false);
  job.state = JobState::queued;
  (void)executor.prepare(job, book.devices[0]);  // epoch 2, being stored: not published yet
  job.state = JobState::placed;
  ASSERT_EQ(job.row.epoch, 2);
  // Back, agent-1 reports how epoch 1 ended while it was away: not this placement's end.
  auto old_end = reported_job("job-1", 1, "succeeded");
  old_end.energy_joules = 80.0;
  old_end.energy_source = "rapl";
  EXPECT_EQ(executor.apply_reports("agent-1", {old_end}).size(), 1u);  // acknowledged
  EXPECT_EQ(job.state, JobState::placed);
  EXPECT_FALSE(job.row.energy_joules.has_value());
  executor.start(job, book.devices[0]);
  EXPECT_EQ(executor.desired_for("agent-1")[0].epoch, 2);
}

TEST_F(NodeExecutorTest,
       a_lost_nodes_devices_leave_placement_before_its_job_is_queued_again_and_come_back_with_its_sync) {
  JobRecord& job = place("agent-1/cpu");
  job.state = JobState::running;
  executor.node_lost("agent-1");
  const Device& cpu = *book.devices.find("agent-1/cpu");
  EXPECT_FALSE(cpu.node_ready);
  EXPECT_TRUE(book.devices.find("agent-2/cpu")->node_ready);
  EXPECT_EQ(job.state, JobState::queued);
  EXPECT_EQ(book.notes.back(), "lost: node agent-1 lost (no sync within its lease)");
  EXPECT_EQ(book.passes, 1);
  EXPECT_FALSE(book.devices.find("agent-1/cpu")->meter->read());  // silenced until it reports again

  joule::cluster::ReportedDevice reported_cpu;
  reported_cpu.name = "cpu";
  reported_cpu.source = "rapl";
  reported_cpu.energy_joules = 5.0;
  executor.update_node("agent-1", {reported_cpu});
  EXPECT_TRUE(cpu.node_ready);
  EXPECT_EQ(book.passes, 2);  // ready again: a placement pass
  EXPECT_EQ(book.devices.find("agent-1/cpu")->meter->read()->value, 5.0);
  executor.update_node("agent-1", {reported_cpu});
  EXPECT_EQ(book.passes, 2);  // nothing new: no pass

  joule::cluster::ReportedDevice gpu;
  gpu.name = "cuda:0";
  gpu.source = "nvml";
  executor.update_node("agent-1", {reported_cpu, gpu});
  EXPECT_EQ(book.added, std::vector<std::string>{"agent-1/cuda:0"});
  EXPECT_EQ(book.devices.of_node("agent-1").size(), 2u);
  EXPECT_EQ(executor.nodes_with_jobs(), (std::vector<std::string>{"agent-1", "agent-2"}));
}
