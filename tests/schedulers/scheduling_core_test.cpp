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
  // Counting work, not timing it: a full pass must not grow with the queue (issue 32). Every
  // pass here is a full one: continuing a pass is another test's.
  SchedulingCore core({}, 0, CoreOptions{.continue_within_ms = 0});
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

// A cluster of `count` devices on 4-device nodes, every `free_every`-th one free, the rest busy
// for an hour; jobs eligible everywhere, each device's joules differing by job.
std::vector<DeviceStatus> cluster(std::size_t count, std::size_t free_every) {
  std::vector<DeviceStatus> devices;
  for (std::size_t d = 0; d < count; ++d) {
    DeviceStatus status;
    status.ref = DeviceRef{fmt::format("node{}", d / 4), fmt::format("dev{}", d % 4), {}};
    status.busy = d % free_every != 0;
    if (status.busy) status.busy_until = kNow + 3'600'000 + static_cast<UnixMillis>(d) * 1000;
    devices.push_back(std::move(status));
  }
  return devices;
}

PendingJob everywhere(std::string id, std::size_t devices, std::size_t seed, int priority = 0, double on_free = 1.0,
                      std::size_t free_every = 0) {
  PendingJob pending;
  pending.id = std::move(id);
  pending.priority = priority;
  for (std::size_t d = 0; d < devices; ++d) {
    double joules = 100.0 + static_cast<double>((d * 7919 + seed * 104729) % 1000);
    if (free_every && d % free_every == 0) joules *= on_free;
    pending.candidates.push_back(Candidate{d, Estimate{joules, 0.05 * joules, 60.0}, std::nullopt, {}});
  }
  return pending;
}

TEST(SchedulingCoreTest, a_submission_continues_the_last_pass_and_decides_only_itself) {
  // Counting work, not timing it (issue 32): the pass a submission runs decides the new job
  // alone, whether 10 or 900 jobs are queued ahead of it on 1,000 devices, and decides it as a
  // full pass over the whole queue would. The jobs ahead wait for busy devices (the free ones
  // cost them 5x); the new ones alternate: cheap on the free devices (placed), or not (waits).
  for (const std::size_t queued : {10, 900}) {
    std::vector<DeviceStatus> devices = cluster(1000, 50);
    SchedulingCore open;
    SchedulingCore full({}, 0, CoreOptions{.continue_within_ms = 0});
    for (std::size_t j = 0; j < queued; ++j) {
      open.enqueue(everywhere(fmt::format("j{}", j), devices.size(), j, 0, 5.0, 50), static_cast<std::int64_t>(j));
      full.enqueue(everywhere(fmt::format("j{}", j), devices.size(), j, 0, 5.0, 50), static_cast<std::int64_t>(j));
    }
    const PassResult first = open.place(kNow, devices);
    EXPECT_FALSE(first.continued);
    EXPECT_EQ(first.considered, queued);
    EXPECT_TRUE(first.placements.empty());
    full.place(kNow, devices);

    std::size_t placed = 0;
    for (std::size_t k = 0; k < 6; ++k) {
      const std::string id = fmt::format("new{}", k);
      const double on_free = k % 2 == 0 ? 0.1 : 5.0;
      open.enqueue(everywhere(id, devices.size(), 5000 + k, 0, on_free, 50), static_cast<std::int64_t>(queued + k));
      full.enqueue(everywhere(id, devices.size(), 5000 + k, 0, on_free, 50), static_cast<std::int64_t>(queued + k));
      const PassResult pass = open.place(kNow + 200, devices);
      const PassResult again = full.place(kNow + 200, devices);
      SCOPED_TRACE(fmt::format("{} queued, submission {}", queued, k));
      EXPECT_TRUE(pass.continued);
      EXPECT_EQ(pass.considered, 1u);
      ASSERT_EQ(open.scanned().size(), 1u);
      // The cheapest-first walk stops early: far fewer than the job's 1,000 candidates.
      EXPECT_LT(pass.weighed, 100u);
      EXPECT_GE(again.considered, queued);  // the full pass looked at everything again
      // The same decision for the new job as the full pass.
      ASSERT_EQ(pass.placements.size(), again.placements.size());
      for (std::size_t i = 0; i < pass.placements.size(); ++i) {
        EXPECT_EQ(pass.placements[i].job, again.placements[i].job);
        EXPECT_EQ(pass.placements[i].device, again.placements[i].device);
        devices[pass.placements[i].device].busy = true;  // as the driver reports it from now on
        ++placed;
      }
      std::string why_open, why_full;
      for (const auto& [job, why] : pass.waiting)
        if (job == id) why_open = why.message;
      for (const auto& [job, why] : again.waiting)
        if (job == id) why_full = why.message;
      EXPECT_EQ(why_open, why_full);
    }
    EXPECT_EQ(placed, 3u);
  }
}

// A pass, with the devices it placed jobs on reported busy from then on, as a driver does.
PassResult place(SchedulingCore& core, UnixMillis now, std::vector<DeviceStatus>& devices) {
  PassResult result = core.place(now, devices);
  for (const auto& placement : result.placements) devices[placement.device].busy = true;
  return result;
}

TEST(SchedulingCoreTest, a_pass_is_full_again_when_anything_but_a_tail_submission_changed) {
  std::vector<DeviceStatus> devices = cluster(40, 8);
  SchedulingCore core;
  for (std::size_t j = 0; j < 20; ++j)
    core.enqueue(everywhere(fmt::format("j{}", j), devices.size(), j), static_cast<std::int64_t>(j));
  std::int64_t sequence = 100;
  auto submit = [&](int priority = 0) {
    core.enqueue(everywhere(fmt::format("s{}", sequence), devices.size(), static_cast<std::size_t>(sequence), priority),
                 sequence);
    ++sequence;
  };
  ASSERT_FALSE(place(core, kNow, devices).continued);
  submit();
  EXPECT_TRUE(place(core, kNow + 1, devices).continued);

  submit(5);  // ahead of the queue: the jobs behind it may decide otherwise
  EXPECT_FALSE(place(core, kNow + 2, devices).continued);

  submit();
  devices[3].busy = !devices[3].busy;  // a device freed or taken
  EXPECT_FALSE(place(core, kNow + 3, devices).continued);

  submit();
  core.ledger().record(EnergyUse{devices[0].ref, "probe", kNow - 1000, kNow, 50.0, "rapl"});
  EXPECT_FALSE(place(core, kNow + 4, devices).continued);

  submit();
  EXPECT_FALSE(place(core, kNow + 4 + CoreOptions{}.continue_within_ms, devices).continued);  // too long since

  submit();
  core.dequeue("j3");
  EXPECT_FALSE(place(core, kNow + 5'000, devices).continued);

  submit();
  EXPECT_TRUE(place(core, kNow + 5'001, devices).continued);
  // Nothing new: a continued pass with nothing to decide.
  const PassResult idle = place(core, kNow + 5'002, devices);
  EXPECT_TRUE(idle.continued);
  EXPECT_EQ(idle.considered, 0u);
}

TEST(SchedulingCoreTest, behind_a_queue_longer_than_a_pass_looks_at_a_submission_costs_nothing_to_decide) {
  std::vector<DeviceStatus> devices = cluster(100, 10);
  SchedulingCore core({}, 0, CoreOptions{.max_scan = 50});
  for (std::size_t j = 0; j < 200; ++j)
    core.enqueue(everywhere(fmt::format("j{}", j), devices.size(), j), static_cast<std::int64_t>(j));
  ASSERT_EQ(place(core, kNow, devices).considered, 50u);
  core.enqueue(everywhere("late", devices.size(), 7), 1000);
  const PassResult pass = place(core, kNow + 1, devices);
  EXPECT_TRUE(pass.continued);
  EXPECT_EQ(pass.considered, 0u);
  EXPECT_EQ(pass.weighed, 0u);
  EXPECT_TRUE(core.scanned().empty());
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
  EXPECT_NEAR(state.spent, 600.0, 1e-6);
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
  EXPECT_NEAR(core.ledger().states(now + kMinute).at(0).spent, 650.0, 1e-6);
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
  EXPECT_NEAR(core.ledger().states(kNow + 2 * kMinute).at(0).spent, 600.0, 1e-6);
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
