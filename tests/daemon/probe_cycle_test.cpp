#include "joule/daemon/probe_cycle.hpp"

#include <gtest/gtest.h>

#include <chrono>

namespace joule::daemon {
namespace {

using namespace std::chrono_literals;
using Action = ProbeStep::Action;

class ProbeCycleTest : public ::testing::Test {
 protected:
  ProbeCycle::TimePoint at(std::chrono::milliseconds since_start) const { return start_ + since_start; }

  /// An idle device the policy allows, 60 s of idleness asked, and work for the planner.
  ProbeConditions free_device() const {
    ProbeConditions conditions;
    conditions.idle_seconds = 60.0;
    conditions.needs_probing = [this] { return planner_has_work_; };
    return conditions;
  }

  /// The environment check, run and answered, as the service does it first.
  void environment_checked(ProbeCycle& cycle) {
    EXPECT_EQ(cycle.step(at(0ms), free_device()).action, Action::check_environment);
    cycle.environment_check_started();
    cycle.environment_known();
  }

  ProbeCycle::TimePoint start_ = ProbeCycle::TimePoint{} + 1h;
  bool planner_has_work_ = true;
};

TEST_F(ProbeCycleTest, checks_the_environment_before_anything_else_and_waits_for_it) {
  ProbeCycle cycle;
  EXPECT_EQ(cycle.state(), ProbeState::checking_environment);
  EXPECT_EQ(cycle.step(at(0ms), free_device()).action, Action::check_environment);
  cycle.environment_check_started();
  EXPECT_TRUE(cycle.worker_running());
  // While it runs, nothing else starts, however long it takes.
  EXPECT_EQ(cycle.step(at(600s), free_device()).action, Action::none);
  EXPECT_EQ(cycle.state(), ProbeState::checking_environment);
  cycle.environment_known();
  EXPECT_FALSE(cycle.worker_running());
}

TEST_F(ProbeCycleTest, a_failed_environment_check_makes_the_device_unavailable_until_a_reload) {
  ProbeCycle cycle;
  cycle.step(at(0ms), free_device());
  cycle.environment_check_started();
  cycle.environment_failed("joule-worker env failed: no LibTorch");
  const auto step = cycle.step(at(3600s), free_device());
  EXPECT_EQ(step.action, Action::none);
  EXPECT_EQ(cycle.state(), ProbeState::unavailable);
  EXPECT_EQ(cycle.waiting(), "joule-worker env failed: no LibTorch");
  EXPECT_EQ(step.end_background_run, "joule-worker env failed: no LibTorch");
  cycle.reload();
  EXPECT_EQ(cycle.step(at(3601s), free_device()).action, Action::check_environment);
}

TEST_F(ProbeCycleTest, probes_only_after_idle_seconds_of_idleness_measured_from_the_first_idle_step) {
  ProbeCycle cycle;
  environment_checked(cycle);
  EXPECT_EQ(cycle.step(at(1s), free_device()).action, Action::none);
  EXPECT_EQ(cycle.state(), ProbeState::settling);
  EXPECT_EQ(cycle.waiting(), "waiting for 60 s of idleness ([probing] idle_seconds)");
  EXPECT_EQ(cycle.step(at(31s), free_device()).action, Action::none);
  EXPECT_EQ(cycle.waiting(), "waiting for 30 s of idleness ([probing] idle_seconds)");
  EXPECT_EQ(cycle.step(at(61s), free_device()).action, Action::start_probe);
  cycle.probe_started();
  EXPECT_EQ(cycle.state(), ProbeState::probing);
  EXPECT_TRUE(cycle.waiting().empty());
}

TEST_F(ProbeCycleTest, a_job_on_the_device_restarts_the_idleness_and_ends_a_background_run) {
  ProbeCycle cycle;
  environment_checked(cycle);
  cycle.step(at(1s), free_device());
  auto busy = free_device();
  busy.device_busy = true;
  const auto step = cycle.step(at(50s), busy);
  EXPECT_EQ(cycle.state(), ProbeState::busy);
  EXPECT_EQ(step.end_background_run, "a job runs on the device or waits for it");
  // Idle again at 100 s: the 60 s count from there, not from the first idle moment.
  EXPECT_EQ(cycle.step(at(100s), free_device()).action, Action::none);
  EXPECT_EQ(cycle.step(at(159s), free_device()).action, Action::none);
  EXPECT_EQ(cycle.step(at(160s), free_device()).action, Action::start_probe);
}

TEST_F(ProbeCycleTest, the_policy_refuses_with_its_own_sentence) {
  ProbeCycle cycle;
  environment_checked(cycle);
  auto refused = free_device();
  refused.refusal = "outside the probing hours 01:00-05:00 ([probing] hours)";
  const auto step = cycle.step(at(120s), refused);
  EXPECT_EQ(step.action, Action::none);
  EXPECT_EQ(cycle.state(), ProbeState::refused);
  EXPECT_EQ(cycle.waiting(), *refused.refusal);
  EXPECT_EQ(step.end_background_run, *refused.refusal);
}

TEST_F(ProbeCycleTest, converges_when_the_planner_has_nothing_worth_probing_and_says_so_once) {
  ProbeCycle cycle;
  environment_checked(cycle);
  planner_has_work_ = false;
  cycle.step(at(1s), free_device());
  auto step = cycle.step(at(61s), free_device());
  EXPECT_EQ(step.action, Action::none);
  EXPECT_EQ(cycle.state(), ProbeState::converged);
  EXPECT_TRUE(step.newly_converged);
  EXPECT_TRUE(step.end_background_run.has_value());
  EXPECT_FALSE(cycle.step(at(62s), free_device()).newly_converged);
  // New work (a queued job's layers): it probes again, and a later convergence is news again.
  planner_has_work_ = true;
  EXPECT_EQ(cycle.step(at(63s), free_device()).action, Action::start_probe);
  cycle.probe_started();
  cycle.probe_ended(at(70s), ProbeOutcome::completed);
  planner_has_work_ = false;
  EXPECT_TRUE(cycle.step(at(71s), free_device()).newly_converged);
}

TEST_F(ProbeCycleTest, the_planner_is_not_asked_before_the_device_is_free_to_probe) {
  ProbeCycle cycle;
  environment_checked(cycle);
  int asked = 0;
  auto conditions = free_device();
  conditions.needs_probing = [&] {
    ++asked;
    return true;
  };
  cycle.step(at(1s), conditions);  // settling
  conditions.device_busy = true;
  cycle.step(at(100s), conditions);  // busy
  EXPECT_EQ(asked, 0);
  conditions.device_busy = false;
  cycle.step(at(101s), conditions);
  cycle.step(at(161s), conditions);
  EXPECT_EQ(asked, 1);
}

TEST_F(ProbeCycleTest, repeated_failures_back_off_for_the_failure_backoff_and_preemptions_do_not_count) {
  ProbeCycle cycle;
  environment_checked(cycle);
  cycle.step(at(0s), free_device());
  auto now = at(60s);
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(cycle.step(now, free_device()).action, Action::start_probe);
    cycle.probe_started();
    EXPECT_FALSE(cycle.probe_ended(now + 1s, ProbeOutcome::failed));
    ASSERT_EQ(cycle.step(now + 1s, free_device()).action, Action::start_probe);
    cycle.probe_started();
    EXPECT_FALSE(cycle.probe_ended(now + 2s, ProbeOutcome::preempted));
    now += 2s;
  }
  ASSERT_EQ(cycle.step(now, free_device()).action, Action::start_probe);
  cycle.probe_started();
  EXPECT_TRUE(cycle.probe_ended(now, ProbeOutcome::failed));  // the third failure in a row
  auto step = cycle.step(now + 599s, free_device());
  EXPECT_EQ(step.action, Action::none);
  EXPECT_EQ(cycle.state(), ProbeState::backing_off);
  EXPECT_EQ(cycle.waiting(), "paused for 10 minutes after 3 failed probes in a row (see GET /v1/probes)");
  EXPECT_EQ(cycle.step(now + 600s, free_device()).action, Action::start_probe);
}

TEST_F(ProbeCycleTest, a_success_resets_the_count_of_failures) {
  ProbeCycle cycle;
  environment_checked(cycle);
  cycle.step(at(0s), free_device());
  const auto now = at(60s);
  for (const auto outcome : {ProbeOutcome::failed, ProbeOutcome::failed, ProbeOutcome::completed, ProbeOutcome::failed,
                             ProbeOutcome::failed}) {
    ASSERT_EQ(cycle.step(now, free_device()).action, Action::start_probe);
    cycle.probe_started();
    EXPECT_FALSE(cycle.probe_ended(now, outcome));
  }
}

TEST_F(ProbeCycleTest, a_probe_that_cannot_start_waits_for_the_launch_backoff) {
  ProbeCycle cycle;
  environment_checked(cycle);
  cycle.step(at(0s), free_device());
  ASSERT_EQ(cycle.step(at(60s), free_device()).action, Action::start_probe);
  cycle.launch_failed(at(60s), "cannot start joule-worker: No such file or directory");
  EXPECT_EQ(cycle.state(), ProbeState::backing_off);
  EXPECT_EQ(cycle.waiting(), "cannot start joule-worker: No such file or directory (trying again in 60 s)");
  EXPECT_EQ(cycle.step(at(119s), free_device()).action, Action::none);
  EXPECT_EQ(cycle.step(at(120s), free_device()).action, Action::start_probe);
}

TEST_F(ProbeCycleTest, a_requested_run_probes_at_once_through_refusals_and_convergence_until_its_time_is_over) {
  ProbeCycle cycle;
  environment_checked(cycle);
  planner_has_work_ = false;
  cycle.request(at(30s));
  auto conditions = free_device();
  conditions.refusal_when_requested = "today's probe energy cap of 500000 J is spent (500012 J)";
  // The daily cap stops a requested run too, without ending it.
  auto step = cycle.step(at(1s), conditions);
  EXPECT_EQ(cycle.state(), ProbeState::refused);
  EXPECT_FALSE(step.end_background_run.has_value());
  // What refuses only background probing (hours, the enabled switch) does not stop it.
  conditions.refusal = "probing is disabled ([probing] enabled = false)";
  conditions.refusal_when_requested.reset();
  EXPECT_EQ(cycle.step(at(2s), conditions).action, Action::start_probe);  // no idleness, no convergence
  cycle.probe_started();
  cycle.probe_ended(at(29s), ProbeOutcome::completed);
  // Once its time is over, the background rules judge the same step.
  step = cycle.step(at(30s), conditions);
  EXPECT_TRUE(step.request_over);
  EXPECT_FALSE(cycle.requested());
  EXPECT_EQ(cycle.state(), ProbeState::refused);
  EXPECT_EQ(step.end_background_run, "probing is disabled ([probing] enabled = false)");
}

TEST_F(ProbeCycleTest, a_reload_asks_the_environment_again_only_if_it_may_have_changed) {
  ProbeCycle cycle;
  environment_checked(cycle);
  cycle.reload();
  EXPECT_NE(cycle.step(at(1s), free_device()).action, Action::check_environment);
  cycle.environment_may_have_changed();
  EXPECT_EQ(cycle.step(at(2s), free_device()).action, Action::check_environment);
}

TEST(ProbeStateTest, every_state_has_its_api_name) {
  EXPECT_EQ(to_string(ProbeState::checking_environment), "checking_environment");
  EXPECT_EQ(to_string(ProbeState::unavailable), "unavailable");
  EXPECT_EQ(to_string(ProbeState::busy), "busy");
  EXPECT_EQ(to_string(ProbeState::backing_off), "backing_off");
  EXPECT_EQ(to_string(ProbeState::refused), "refused");
  EXPECT_EQ(to_string(ProbeState::settling), "settling");
  EXPECT_EQ(to_string(ProbeState::probing), "probing");
  EXPECT_EQ(to_string(ProbeState::converged), "converged");
}

}  // namespace
}  // namespace joule::daemon
