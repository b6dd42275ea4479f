#include "joule/cluster/reconcile.hpp"

#include <gtest/gtest.h>

namespace joule::cluster {
namespace {

using schedulers::JobState;

ReportedJob report(std::string state, std::int64_t epoch = 2) {
  ReportedJob job;
  job.id = "j1";
  job.epoch = epoch;
  job.state = std::move(state);
  return job;
}

TEST(JudgeReportTest, a_report_of_another_epoch_or_node_or_an_unknown_job_is_stale) {
  const CoordinatorJob job{JobState::running, 2, "edge1"};
  EXPECT_EQ(judge_report(job, "edge1", report("running", 1)), Verdict::stale);
  EXPECT_EQ(judge_report(job, "edge2", report("running", 2)), Verdict::stale);
  EXPECT_EQ(judge_report(std::nullopt, "edge1", report("running")), Verdict::stale);
  EXPECT_EQ(judge_report(job, "edge1", report("exploded")), Verdict::stale);
}

TEST(JudgeReportTest, the_placement_starting_and_ending_is_recorded_once) {
  EXPECT_EQ(judge_report(CoordinatorJob{JobState::placed, 2, "edge1"}, "edge1", report("running")), Verdict::started);
  EXPECT_EQ(judge_report(CoordinatorJob{JobState::placed, 2, "edge1"}, "edge1", report("placed")), Verdict::progress);
  EXPECT_EQ(judge_report(CoordinatorJob{JobState::running, 2, "edge1"}, "edge1", report("running")), Verdict::progress);
  EXPECT_EQ(judge_report(CoordinatorJob{JobState::running, 2, "edge1"}, "edge1", report("succeeded")), Verdict::finished);
  // Once recorded, the same report again is only acknowledged.
  EXPECT_EQ(judge_report(CoordinatorJob{JobState::succeeded, 2, "edge1"}, "edge1", report("succeeded")),
            Verdict::recorded);
  // A job ended here (failed after a lost node, cancelled) but still running there: stop it.
  EXPECT_EQ(judge_report(CoordinatorJob{JobState::failed, 2, "edge1"}, "edge1", report("running")), Verdict::stale);
}

TEST(JudgeReportTest, a_job_queued_again_after_its_node_was_lost_is_adopted_if_not_placed_elsewhere) {
  EXPECT_EQ(judge_report(CoordinatorJob{JobState::queued, 2, "edge1"}, "edge1", report("running")), Verdict::adopt);
  // Placed elsewhere in between: the epoch moved on, the old run is fenced.
  EXPECT_EQ(judge_report(CoordinatorJob{JobState::placed, 3, "edge2"}, "edge1", report("running")), Verdict::stale);
}

// A job queued again after its node was lost must not be settled by that node's report of a run
// it fenced or lost (once, such a report cancelled it; a refused "succeeded" left it queued but
// out of the queue, never to run): only a run that succeeded ends it; any other end is stale
// and the job runs again.
TEST(JudgeReportTest, a_run_that_ended_while_its_node_was_lost_ends_the_job_only_if_it_succeeded) {
  const CoordinatorJob queued{JobState::queued, 2, "edge1"};
  EXPECT_EQ(judge_report(queued, "edge1", report("succeeded", 2)), Verdict::ended_while_lost);
  EXPECT_EQ(judge_report(queued, "edge1", report("cancelled", 2)), Verdict::stale);
  EXPECT_EQ(judge_report(queued, "edge1", report("failed", 2)), Verdict::stale);
  EXPECT_EQ(judge_report(queued, "edge2", report("succeeded", 2)), Verdict::stale);
}

// The agent was silent past the job's lease but back before the coordinator declared it lost:
// the runner fenced the run, and the job, still running at the coordinator, must run again
// rather than end "cancelled" (bench/chaos.py saw 2 of 400 jobs end so).
TEST(JudgeReportTest, a_run_its_runner_fenced_queues_the_job_again) {
  ReportedJob fenced = report("cancelled", 2);
  fenced.fenced = true;
  EXPECT_EQ(judge_report(CoordinatorJob{JobState::running, 2, "edge1"}, "edge1", fenced), Verdict::fenced);
  EXPECT_EQ(judge_report(CoordinatorJob{JobState::placed, 2, "edge1"}, "edge1", fenced), Verdict::fenced);
  EXPECT_EQ(judge_report(CoordinatorJob{JobState::queued, 2, "edge1"}, "edge1", fenced), Verdict::stale);
  EXPECT_EQ(judge_report(CoordinatorJob{JobState::cancelled, 2, "edge1"}, "edge1", fenced), Verdict::recorded);
  // Without the flag, a cancellation is the job's end (cancelled on the agent, by hand).
  EXPECT_EQ(judge_report(CoordinatorJob{JobState::running, 2, "edge1"}, "edge1", report("cancelled", 2)),
            Verdict::finished);
}

Assignment want(std::string id, std::int64_t epoch, bool paused = false, bool stop = false) {
  Assignment a;
  a.id = std::move(id);
  a.epoch = epoch;
  a.device = "cpu";
  a.paused = paused;
  a.stop = stop;
  return a;
}

LocalAssignment have(std::string origin, std::int64_t epoch, bool paused = false, bool terminal = false) {
  return LocalAssignment{origin + "." + std::to_string(epoch), origin, epoch, terminal, paused, false};
}

TEST(PlanAgentTest, starts_what_it_lacks_and_fences_what_it_was_not_given) {
  const auto plan = plan_agent({want("a", 1), want("b", 3)}, {have("b", 2), have("c", 1)});
  ASSERT_EQ(plan.start.size(), 2u);
  EXPECT_EQ(plan.start[0].id, "a");
  EXPECT_EQ(plan.start[1].epoch, 3);
  ASSERT_EQ(plan.stop.size(), 2u);
  EXPECT_EQ(plan.stop[0].first, "b.2");
  EXPECT_NE(plan.stop[0].second.find("fenced"), std::string::npos);
  EXPECT_EQ(plan.stop[1].first, "c.1");
}

TEST(PlanAgentTest, is_idempotent_and_leaves_ended_runs_alone) {
  EXPECT_TRUE(plan_agent({want("a", 1)}, {have("a", 1)}).start.empty());
  const auto ended = plan_agent({want("a", 1)}, {have("a", 1, false, true), have("z", 4, false, true)});
  EXPECT_TRUE(ended.start.empty());
  EXPECT_TRUE(ended.stop.empty());
}

TEST(PlanAgentTest, pauses_resumes_and_stops_as_the_coordinator_says) {
  auto plan = plan_agent({want("a", 1, true), want("b", 1, false), want("c", 1, false, true)},
                         {have("a", 1), have("b", 1, true), have("c", 1)});
  EXPECT_EQ(plan.pause, std::vector<std::string>{"a.1"});
  EXPECT_EQ(plan.resume, std::vector<std::string>{"b.1"});
  ASSERT_EQ(plan.stop.size(), 1u);
  EXPECT_EQ(plan.stop[0].first, "c.1");
  // A cancelled job it never started is not started.
  EXPECT_TRUE(plan_agent({want("d", 1, false, true)}, {}).start.empty());
}

}  // namespace
}  // namespace joule::cluster
