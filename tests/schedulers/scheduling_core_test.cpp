#include "joule/schedulers/scheduling_core.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace joule::schedulers {
namespace {

const UnixMillis kNow = parse_rfc3339("2026-11-26T10:00:00Z").value();
constexpr UnixMillis kMinute = 60'000;

DeviceStatus device(std::string name) {
  DeviceStatus status;
  status.ref = DeviceRef{"n1", std::move(name), {}};
  return status;
}

PendingJob job(std::string id, double joules, double seconds, int priority = 0, double relative_std = 0.1) {
  PendingJob pending;
  pending.id = std::move(id);
  pending.priority = priority;
  pending.candidates.push_back(Candidate{0, Estimate{joules, relative_std * joules, seconds}, std::nullopt, {}});
  return pending;
}

Policy daily_budget(double joules) {
  Policy policy;
  policy.budgets.push_back(
      EnergyBudget{"daily", ScopeTarget{Scope::cluster, ""}, joules, BudgetWindow{BudgetWindow::Kind::day}});
  return policy;
}

RunningSample sample(const std::string& id, double used, double watts = 10.0) {
  RunningSample out;
  out.id = id;
  out.used_joules = used;
  out.controls.power_watts = watts;
  return out;
}

TEST(SchedulingCoreTest, a_pass_takes_the_queue_by_priority_then_submission_and_tracks_what_it_placed) {
  SchedulingCore core;
  core.enqueue(job("first", 100, 60), 1);
  core.enqueue(job("urgent", 100, 60, 5), 2);
  core.enqueue(job("third", 100, 60), 3);
  EXPECT_EQ(core.queue().first(3), (std::vector<std::string>{"urgent", "first", "third"}));

  const PassResult pass = core.place(kNow, {device("cpu")});
  ASSERT_EQ(pass.placements.size(), 1u);
  EXPECT_EQ(pass.placements[0].job, "urgent");
  EXPECT_EQ(core.queue().size(), 2u);
  EXPECT_EQ(core.pending("urgent"), nullptr);
  const TrackedRun* run = core.running("urgent");
  ASSERT_NE(run, nullptr);
  EXPECT_EQ(run->started, kNow);
  ASSERT_TRUE(run->prior);
  EXPECT_DOUBLE_EQ(run->prior->mean_joules, 100.0);
  EXPECT_TRUE(core.ledger().has_reservation("urgent"));
}

TEST(SchedulingCoreTest, a_pass_with_every_device_busy_places_nothing_and_still_says_what_holds_a_job_back) {
  SchedulingCore core(daily_budget(500.0));
  core.enqueue(job("fits", 100, 60), 1);
  core.enqueue(job("too-big", 800, 60), 2);
  DeviceStatus busy = device("cpu");
  busy.busy = true;
  const PassResult pass = core.place(kNow, {busy});
  EXPECT_TRUE(pass.placements.empty());
  EXPECT_EQ(core.queue().size(), 2u);
  std::map<std::string, WaitReason::Kind> why;
  for (const auto& [id, reason] : pass.waiting) why[id] = reason.kind;
  EXPECT_EQ(why["too-big"], WaitReason::Kind::budget) << "the budget, not only the busy device";
}

TEST(SchedulingCoreTest, a_pass_with_every_device_busy_looks_at_max_explain_jobs_however_long_the_queue) {
  // Counting work, not timing it: a submission's pass must not grow with the queue (issue 32).
  SchedulingCore core;
  DeviceStatus busy = device("cpu");
  busy.busy = true;
  for (const int queued : {10, 100, 5000}) {
    while (core.queue().size() < static_cast<std::size_t>(queued))
      core.enqueue(job(fmt::format("j{}", core.queue().size()), 100, 60),
                   static_cast<std::int64_t>(core.queue().size()));
    const PassResult pass = core.place(kNow, {busy});
    EXPECT_TRUE(pass.placements.empty());
    EXPECT_EQ(core.scanned().size(), std::min<std::size_t>(queued, 64)) << queued << " queued";
    EXPECT_EQ(pass.considered, std::min<std::size_t>(queued, 64)) << queued << " queued";
  }
  // A free device is worth the whole scan: the first job that fits it is placed.
  const PassResult free = core.place(kNow, {device("cpu")});
  EXPECT_EQ(free.placements.size(), 1u);
  EXPECT_EQ(core.scanned().size(), 1000u);
}

TEST(SchedulingCoreTest, a_busy_device_is_expected_free_by_the_estimate_then_by_the_step_projection) {
  SchedulingCore core;
  core.enqueue(job("a", 1000, 600), 1);
  ASSERT_EQ(core.place(kNow, {device("cpu")}).placements.size(), 1u);
  DeviceStatus busy = device("cpu");
  busy.busy = true;
  EXPECT_EQ(core.with_expectations(kNow, {busy})[0].busy_until, kNow + 600'000);

  // Epochs of 1 minute and 50 J each, 10 in all: after epoch 4, 6 minutes are left.
  for (int epoch = 1; epoch <= 4; ++epoch)
    ASSERT_NE(core.report("a", {epoch, 10, 50.0 * epoch, kNow + epoch * kMinute}), nullptr);
  const UnixMillis later = kNow + 4 * kMinute;
  const auto expected = core.with_expectations(later, {busy})[0].busy_until;
  ASSERT_TRUE(expected);
  EXPECT_NEAR(static_cast<double>(*expected - later), 6.0 * kMinute, 1000.0);
  EXPECT_EQ(core.report("unknown", {1, 10, 1.0, later}), nullptr);
}

TEST(SchedulingCoreTest, a_job_over_the_budget_waits_and_the_core_wakes_when_the_day_turns) {
  SchedulingCore core(daily_budget(500.0));
  core.enqueue(job("big", 800, 60), 1);
  const PassResult pass = core.place(kNow, {device("cpu")});
  EXPECT_TRUE(pass.placements.empty());
  ASSERT_EQ(pass.waiting.size(), 1u);
  EXPECT_EQ(pass.waiting[0].second.kind, WaitReason::Kind::budget);
  EXPECT_EQ(pass.waiting[0].second.rule, "daily");
  // Nothing is spent, so waiting cannot help until the limit changes; with something spent the
  // day's turn is a moment to try again.
  core.ledger().record(EnergyUse{device("cpu").ref, "probe", kNow - kMinute, kNow, 100.0, "rapl"});
  core.place(kNow, {device("cpu")});
  const auto wake = core.wake_at(kNow);
  ASSERT_TRUE(wake);
  EXPECT_EQ(*wake, parse_rfc3339("2026-11-27T00:00:00Z").value());
  core.dequeue("big");
  EXPECT_FALSE(core.wake_at(kNow)) << "nothing waits";
}

TEST(SchedulingCoreTest, tracking_feeds_the_ledger_and_pauses_a_job_projected_to_overrun_its_budget) {
  SchedulingCore core(daily_budget(1000.0));
  core.enqueue(job("low", 400, 600, 0, 0.5), 1);  // an estimate it is unsure of
  ASSERT_EQ(core.place(kNow, {device("cpu")}).placements.size(), 1u);
  DeviceStatus busy = device("cpu");
  busy.busy = true;

  // Three epochs of ten in, at 200 J an epoch: STEP projects about 2 kJ, over the 1 kJ budget.
  for (int epoch = 1; epoch <= 3; ++epoch) core.report("low", {epoch, 10, 200.0 * epoch, kNow + epoch * kMinute});
  const UnixMillis now = kNow + 3 * kMinute;
  const auto actions = core.track(now, {busy}, {sample("low", 600.0)});
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].kind, ThrottleAction::Kind::pause);
  EXPECT_EQ(actions[0].rule, "daily");
  const auto state = core.ledger().states(now).at(0);
  EXPECT_NEAR(state.spent_joules, 600.0, 1e-6);
  EXPECT_NEAR(state.reserved.mean_joules, 1400.0, 50.0) << "what the projection says it will still use";

  // The driver paused it: the stretch it ran is recorded, and ending it settles the rest.
  const auto stretch = core.paused("low", now);
  ASSERT_TRUE(stretch);
  EXPECT_NEAR(stretch->joules, 600.0, 1e-6);
  const auto settled = core.end("low", EnergyUse{busy.ref, "low", kNow, now + kMinute, 650.0, "rapl"});
  ASSERT_TRUE(settled);
  EXPECT_NEAR(settled->joules, 50.0, 1e-6);
  EXPECT_EQ(core.running("low"), nullptr);
  EXPECT_FALSE(core.ledger().has_reservation("low"));
  EXPECT_NEAR(core.ledger().states(now + kMinute).at(0).spent_joules, 650.0, 1e-6);
}

TEST(SchedulingCoreTest, without_throttling_tracking_only_feeds_the_ledger) {
  SchedulingCore core(daily_budget(1000.0), 0, CoreOptions{.throttle = false});
  core.enqueue(job("low", 400, 600), 1);
  core.place(kNow, {device("cpu")});
  core.report("low", {1, 10, 300.0, kNow + kMinute});
  core.report("low", {2, 10, 600.0, kNow + 2 * kMinute});
  DeviceStatus busy = device("cpu");
  busy.busy = true;
  EXPECT_TRUE(core.track(kNow + 2 * kMinute, {busy}, {sample("low", 600.0)}).empty());
  EXPECT_NEAR(core.ledger().states(kNow + 2 * kMinute).at(0).spent_joules, 600.0, 1e-6);
}

TEST(SchedulingCoreTest, a_run_it_did_not_place_is_tracked_with_its_prior_reserved) {
  SchedulingCore core(daily_budget(1000.0));
  core.enqueue(job("adopted", 300, 60), 1);
  TrackedRun run;
  run.id = "adopted";
  run.started = kNow - kMinute;
  run.prior = EnergyDistribution{300.0, 0.0};
  run.reports = {{1, 4, 80.0, kNow - 30'000}, {2, 4, 160.0, kNow}};
  core.track_run(run, device("cpu").ref);
  EXPECT_EQ(core.queue().size(), 0u) << "a job that runs is not queued";
  ASSERT_NE(core.running("adopted"), nullptr);
  ASSERT_TRUE(core.running("adopted")->projection) << "projected from the reports it came with";
  EXPECT_NEAR(core.ledger().states(kNow).at(0).reserved.mean_joules, 300.0, 1e-6);
}

TEST(SchedulingCoreTest, a_job_queued_again_leaves_its_run_and_its_reservation) {
  SchedulingCore core(daily_budget(1000.0));
  core.enqueue(job("again", 300, 60), 1);
  ASSERT_EQ(core.place(kNow, {device("cpu")}).placements.size(), 1u);
  ASSERT_TRUE(core.ledger().has_reservation("again"));
  core.enqueue(job("again", 300, 60), 1);  // its node was lost, or its placement not stored
  EXPECT_EQ(core.running("again"), nullptr);
  EXPECT_FALSE(core.ledger().has_reservation("again"));
  EXPECT_NEAR(core.ledger().states(kNow).at(0).reserved.mean_joules, 0.0, 1e-9);
  EXPECT_EQ(core.queue().size(), 1u);
}

}  // namespace
}  // namespace joule::schedulers
