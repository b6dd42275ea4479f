#include "joule/adapters/slurm_reconcile.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <gtest/gtest.h>

using joule::adapters::HandedJob;
using joule::adapters::reconcile;
using joule::adapters::ReconcileAction;
using joule::adapters::ReconcileDecision;
using joule::adapters::ReconcileOptions;
using joule::adapters::SlurmJob;

namespace {

constexpr std::int64_t kNow = 1'700'000'000'000;

HandedJob handed(std::string joule_id, std::string slurm_id, std::int64_t age_ms = 2'000, bool seen_running = false,
                 int resubmissions = 0) {
  return HandedJob{std::move(joule_id), std::move(slurm_id), kNow - age_ms, seen_running, resubmissions};
}

SlurmJob slurm(std::string slurm_id, std::string joule_id, std::string state = "PENDING") {
  SlurmJob job;
  job.slurm_id = std::move(slurm_id);
  job.joule_id = std::move(joule_id);
  job.state = std::move(state);
  if (job.state != "PENDING") {
    job.nodes = "localhost";
    job.start_ms = kNow - 1000;
  }
  return job;
}

ReconcileOptions options() {
  ReconcileOptions o;
  o.now_ms = kNow;
  return o;
}

std::vector<ReconcileDecision> run(const std::vector<HandedJob>& jobs, const std::vector<SlurmJob>& listing,
                                   const ReconcileOptions& o = options()) {
  return reconcile(jobs, listing, o);
}

std::size_t count(const std::vector<ReconcileDecision>& decisions, ReconcileAction action) {
  return static_cast<std::size_t>(
      std::count_if(decisions.begin(), decisions.end(), [&](const auto& d) { return d.action == action; }));
}

}  // namespace

TEST(SlurmReconcileTest, a_listed_job_is_kept_with_slurms_record) {
  auto d = run({handed("a", "10")}, {slurm("10", "a", "RUNNING")});
  ASSERT_EQ(d.size(), 1U);
  EXPECT_EQ(d[0].action, ReconcileAction::keep);
  EXPECT_EQ(d[0].joule_id, "a");
  EXPECT_EQ(d[0].slurm_id, "10");
  EXPECT_FALSE(d[0].slurm_id_changed);
  ASSERT_TRUE(d[0].job);
  EXPECT_EQ(d[0].job->state, "RUNNING");
}

TEST(SlurmReconcileTest, a_finished_job_is_kept_so_its_end_is_read) {
  auto d = run({handed("a", "10", 2000, true)}, {slurm("10", "a", "COMPLETED")});
  ASSERT_EQ(d.size(), 1U);
  EXPECT_EQ(d[0].action, ReconcileAction::keep);
  EXPECT_EQ(d[0].job->state, "COMPLETED");
}

TEST(SlurmReconcileTest, a_job_found_under_another_id_is_kept_and_the_change_noted) {
  auto d = run({handed("a", "10")}, {slurm("12", "a")});
  ASSERT_EQ(d.size(), 1U);
  EXPECT_EQ(d[0].action, ReconcileAction::keep);
  EXPECT_EQ(d[0].slurm_id, "12");
  EXPECT_TRUE(d[0].slurm_id_changed);
  EXPECT_NE(d[0].reason.find("recorded: '10'"), std::string::npos) << d[0].reason;
}

TEST(SlurmReconcileTest, a_submission_whose_answer_was_lost_is_found_by_joule_id) {
  // sbatch timed out on Joule's side but slurmctld had taken the job: no id was recorded.
  auto d = run({handed("a", "")}, {slurm("7", "a")});
  ASSERT_EQ(d.size(), 1U);
  EXPECT_EQ(d[0].action, ReconcileAction::keep);
  EXPECT_EQ(d[0].slurm_id, "7");
  EXPECT_TRUE(d[0].slurm_id_changed);
}

TEST(SlurmReconcileTest, a_job_lost_before_it_started_is_resubmitted) {
  auto d = run({handed("a", "10")}, {});
  ASSERT_EQ(d.size(), 1U);
  EXPECT_EQ(d[0].action, ReconcileAction::resubmit);
  EXPECT_EQ(d[0].slurm_id, "10");
  EXPECT_FALSE(d[0].job);
}

TEST(SlurmReconcileTest, a_reused_slurm_id_with_another_joule_id_is_not_ours) {
  // After a controller crash slurmctld handed id 10 to a job of someone else's, or to another
  // Joule job; neither is job a.
  auto other_user = run({handed("a", "10")}, {slurm("10", "", "RUNNING")});
  ASSERT_EQ(other_user.size(), 1U);
  EXPECT_EQ(other_user[0].action, ReconcileAction::resubmit);
  EXPECT_NE(other_user[0].reason.find("Slurm job 10 is now another job"), std::string::npos) << other_user[0].reason;

  auto other_joule = run({handed("a", "10"), handed("b", "11")}, {slurm("10", "b")});
  ASSERT_EQ(other_joule.size(), 2U);
  EXPECT_EQ(other_joule[0].joule_id, "a");
  EXPECT_EQ(other_joule[0].action, ReconcileAction::resubmit);
  EXPECT_NE(other_joule[0].reason.find("joule id b"), std::string::npos);
  EXPECT_EQ(other_joule[1].joule_id, "b");
  EXPECT_EQ(other_joule[1].action, ReconcileAction::keep);
  EXPECT_EQ(other_joule[1].slurm_id, "10");
  EXPECT_TRUE(other_joule[1].slurm_id_changed);

  // The same when Joule had seen a start: a running job under a reused id is still not ours.
  auto started = run({handed("a", "10", 2000, true)}, {slurm("10", "zzz", "RUNNING")});
  ASSERT_EQ(started.size(), 2U);
  EXPECT_EQ(started[0].action, ReconcileAction::lost);
  EXPECT_EQ(started[1].action, ReconcileAction::stray);
  EXPECT_EQ(started[1].slurm_id, "10");
}

TEST(SlurmReconcileTest, a_started_job_that_is_gone_is_lost) {
  auto d = run({handed("a", "10", 60'000, true)}, {});
  ASSERT_EQ(d.size(), 1U);
  EXPECT_EQ(d[0].action, ReconcileAction::lost);
  EXPECT_NE(d[0].reason.find("had started"), std::string::npos);
}

TEST(SlurmReconcileTest, a_missing_job_older_than_min_job_age_may_have_run_so_it_is_lost) {
  auto d = run({handed("a", "10", 301'000)}, {});
  ASSERT_EQ(d.size(), 1U);
  EXPECT_EQ(d[0].action, ReconcileAction::lost);
  EXPECT_NE(d[0].reason.find("MinJobAge"), std::string::npos);

  auto o = options();
  o.min_job_age_ms = 600'000;  // a cluster with a longer MinJobAge
  EXPECT_EQ(run({handed("a", "10", 301'000)}, {}, o)[0].action, ReconcileAction::resubmit);
}

TEST(SlurmReconcileTest, guarded_jobs_gone_after_they_started_are_resubmitted_to_learn_their_end) {
  // With a run claim, a second copy cannot run the command again: it reports the first's end.
  auto o = options();
  o.guarded = true;
  auto started = run({handed("a", "10", 60'000, true)}, {}, o);
  ASSERT_EQ(started.size(), 1U);
  EXPECT_EQ(started[0].action, ReconcileAction::resubmit);
  EXPECT_NE(started[0].reason.find("after it started"), std::string::npos) << started[0].reason;
  EXPECT_EQ(run({handed("a", "10", 301'000)}, {}, o)[0].action, ReconcileAction::resubmit);
  // Still once: a controller that keeps crashing does not make Joule submit forever.
  EXPECT_EQ(run({handed("a", "10", 2000, true, 1)}, {}, o)[0].action, ReconcileAction::lost);
  // A listed job is kept as ever.
  EXPECT_EQ(run({handed("a", "10")}, {slurm("10", "a", "RUNNING")}, o)[0].action, ReconcileAction::keep);
}

TEST(SlurmReconcileTest, resubmits_at_most_max_resubmissions_times) {
  EXPECT_EQ(run({handed("a", "10", 2000, false, 1)}, {})[0].action, ReconcileAction::lost);
  auto o = options();
  o.max_resubmissions = 3;
  EXPECT_EQ(run({handed("a", "10", 2000, false, 2)}, {}, o)[0].action, ReconcileAction::resubmit);
  EXPECT_EQ(run({handed("a", "10", 2000, false, 3)}, {}, o)[0].action, ReconcileAction::lost);
}

TEST(SlurmReconcileTest, never_resubmits_twice_in_one_reconcile) {
  // The same joule id recorded twice (a caller's bug) is decided once.
  auto d = run({handed("a", "10"), handed("a", "11"), handed("b", "12")}, {});
  ASSERT_EQ(d.size(), 2U);
  EXPECT_EQ(d[0].joule_id, "a");
  EXPECT_EQ(d[0].slurm_id, "10");
  EXPECT_EQ(d[1].joule_id, "b");
  EXPECT_EQ(count(d, ReconcileAction::resubmit), 2U);
}

TEST(SlurmReconcileTest, never_resubmits_while_a_job_with_its_joule_id_exists) {
  // Whatever state that job is in, even finished or cancelled.
  for (const char* state : {"PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED"}) {
    auto d = run({handed("a", "10")}, {slurm("15", "a", state)});
    ASSERT_EQ(d.size(), 1U) << state;
    EXPECT_EQ(d[0].action, ReconcileAction::keep) << state;
    EXPECT_EQ(d[0].slurm_id, "15") << state;
  }
}

TEST(SlurmReconcileTest, a_live_job_with_an_unknown_joule_id_is_a_stray) {
  auto d = run({handed("a", "10")}, {slurm("10", "a"), slurm("11", "forgotten", "RUNNING"), slurm("12", "", "RUNNING"),
                                     slurm("13", "done", "COMPLETED")});
  ASSERT_EQ(d.size(), 2U);
  EXPECT_EQ(d[0].action, ReconcileAction::keep);
  EXPECT_EQ(d[1].action, ReconcileAction::stray);
  EXPECT_EQ(d[1].slurm_id, "11");
  EXPECT_EQ(d[1].joule_id, "forgotten");
  ASSERT_TRUE(d[1].job);
  EXPECT_EQ(d[1].job->state, "RUNNING");
}

TEST(SlurmReconcileTest, a_second_live_job_for_one_joule_id_is_a_stray) {
  // A resubmission raced with a job that came back: the recorded id wins, the other is cancelled.
  auto d = run({handed("a", "20")}, {slurm("10", "a", "RUNNING"), slurm("20", "a")});
  ASSERT_EQ(d.size(), 2U);
  EXPECT_EQ(d[0].action, ReconcileAction::keep);
  EXPECT_EQ(d[0].slurm_id, "20");
  EXPECT_EQ(d[1].action, ReconcileAction::stray);
  EXPECT_EQ(d[1].slurm_id, "10");

  // Without the recorded id among them: a started one is kept over a pending one...
  auto started = run({handed("a", "5")}, {slurm("30", "a"), slurm("31", "a", "RUNNING")});
  EXPECT_EQ(started[0].slurm_id, "31");
  EXPECT_EQ(started[1].slurm_id, "30");
  EXPECT_EQ(started[1].action, ReconcileAction::stray);
  // ...and among equals the lowest id (numerically: 9 < 10).
  auto lowest = run({handed("a", "5")}, {slurm("10", "a"), slurm("9", "a")});
  EXPECT_EQ(lowest[0].slurm_id, "9");
  EXPECT_EQ(lowest[1].slurm_id, "10");

  // A finished duplicate needs no cancel.
  auto finished = run({handed("a", "20")}, {slurm("10", "a", "CANCELLED"), slurm("20", "a", "RUNNING")});
  ASSERT_EQ(finished.size(), 1U);
  EXPECT_EQ(finished[0].slurm_id, "20");
}

TEST(SlurmReconcileTest, strays_are_only_ids_with_this_daemons_prefix) {
  auto o = options();
  o.id_prefix = "node-a.";
  auto d = run({}, {slurm("1", "node-a.x", "RUNNING"), slurm("2", "node-b.y", "RUNNING")}, o);
  ASSERT_EQ(d.size(), 1U);
  EXPECT_EQ(d[0].slurm_id, "1");
  EXPECT_EQ(d[0].action, ReconcileAction::stray);
}

TEST(SlurmReconcileTest, after_a_controller_crash_every_job_ends_up_exactly_once) {
  // Ten held jobs submitted within a second of a kill -9: Slurm kept 0..3 (ids 1..4), lost
  // 4..9, and gave ids 5 and 6 to jobs of another user submitted after the restart.
  std::vector<HandedJob> jobs;
  for (int i = 0; i < 10; ++i) jobs.push_back(handed(fmt::format("j{}", i), std::to_string(i + 1), 1500));
  std::vector<SlurmJob> listing;
  for (int i = 0; i < 4; ++i) listing.push_back(slurm(std::to_string(i + 1), fmt::format("j{}", i)));
  listing.push_back(slurm("5", "", "RUNNING"));
  listing.push_back(slurm("6", "", "PENDING"));

  auto d = run(jobs, listing);
  ASSERT_EQ(d.size(), 10U);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(d[i].joule_id, fmt::format("j{}", i));
    EXPECT_EQ(d[i].action, i < 4 ? ReconcileAction::keep : ReconcileAction::resubmit) << i;
  }

  // Joule resubmits 4..9 (new ids 7..12) and reconciles the next listing: nothing more to do.
  for (int i = 4; i < 10; ++i) {
    jobs[i].slurm_id = std::to_string(i + 3);
    jobs[i].resubmissions = 1;
    jobs[i].submitted_ms = kNow;
    listing.push_back(slurm(jobs[i].slurm_id, jobs[i].joule_id));
  }
  auto again = run(jobs, listing);
  ASSERT_EQ(again.size(), 10U);
  EXPECT_EQ(count(again, ReconcileAction::keep), 10U);
  for (const auto& decision : again) EXPECT_FALSE(decision.slurm_id_changed) << decision.joule_id;
}

TEST(SlurmReconcileTest, jobs_of_other_users_are_never_ours) {
  // Another user's job with our joule id in its comment: not kept, not cancelled.
  auto o = options();
  o.user = "joule";
  auto spoof = slurm("10", "a", "RUNNING");
  spoof.user = "mallory";
  auto mine = slurm("11", "b", "RUNNING");
  mine.user = "joule";
  auto d = run({handed("a", "10"), handed("b", "11")}, {spoof, mine}, o);
  ASSERT_EQ(d.size(), 2U);
  EXPECT_EQ(d[0].action, ReconcileAction::resubmit);
  EXPECT_EQ(d[1].action, ReconcileAction::keep);
  auto strays = run({}, {spoof}, o);
  EXPECT_TRUE(strays.empty());
}

TEST(SlurmReconcileTest, records_without_a_joule_id_are_ignored) {
  auto d = run({handed("", "10")}, {slurm("10", "", "RUNNING")});
  EXPECT_TRUE(d.empty());
}

TEST(SlurmReconcileTest, has_started_reads_the_listing) {
  EXPECT_FALSE(joule::adapters::has_started(slurm("1", "a", "PENDING")));
  EXPECT_TRUE(joule::adapters::has_started(slurm("1", "a", "RUNNING")));
  SlurmJob suspended;
  suspended.state = "SUSPENDED";
  EXPECT_TRUE(joule::adapters::has_started(suspended));
  SlurmJob cancelled_pending;
  cancelled_pending.state = "CANCELLED";
  EXPECT_FALSE(joule::adapters::has_started(cancelled_pending));
  EXPECT_EQ(joule::adapters::to_string(ReconcileAction::stray), "stray");
}
