#include "joule/schedulers/placement.hpp"

#include <gtest/gtest.h>

#include <random>

#include <fmt/format.h>

namespace joule::schedulers {
namespace {

const UnixMillis kNow = parse_rfc3339("2026-11-26T10:00:00Z").value();

DeviceStatus device(std::string name, std::string node = "n1") {
  DeviceStatus status;
  status.ref = DeviceRef{std::move(node), std::move(name), {}};
  return status;
}

Candidate on(std::size_t device, double joules, double seconds, double std = 0.0) {
  return Candidate{device, Estimate{joules, std, seconds}, std::nullopt, {}};
}

PendingJob job(std::string id, std::vector<Candidate> candidates) {
  PendingJob pending;
  pending.id = std::move(id);
  pending.candidates = std::move(candidates);
  return pending;
}

Policy with_budget(double joules, Objective objective = Objective::min_energy) {
  Policy policy;
  policy.objective = objective;
  policy.budgets.push_back(
      EnergyBudget{"daily", ScopeTarget{Scope::cluster, ""}, joules, BudgetWindow{BudgetWindow::Kind::day}});
  return policy;
}

struct Pass {
  Pass(Policy policy, std::vector<DeviceStatus> devices, std::vector<PendingJob> jobs)
      : policy(std::move(policy)), devices(std::move(devices)), jobs(std::move(jobs)) {}

  Policy policy;
  std::vector<DeviceStatus> devices;
  std::vector<PendingJob> jobs;
  BudgetLedger ledger;

  PassResult run(UnixMillis now = kNow) {
    ledger.set_budgets(policy.budgets);
    Placer placer(policy);
    std::vector<const PendingJob*> queue;
    for (const auto& j : jobs) queue.push_back(&j);
    return placer.decide(now, devices, queue, ledger);
  }
};

const WaitReason& reason_of(const PassResult& result, const std::string& id) {
  for (const auto& [job, reason] : result.waiting)
    if (job == id) return reason;
  throw std::runtime_error("no reason for " + id);
}

TEST(PlacementTest, min_energy_takes_the_free_device_with_fewest_expected_joules) {
  Pass pass{{}, {device("cpu"), device("cuda:0")}, {job("a", {on(0, 900.0, 60.0), on(1, 300.0, 20.0)})}};
  const auto result = pass.run();
  ASSERT_EQ(result.placements.size(), 1u);
  EXPECT_EQ(result.placements[0].device, 1u);
  EXPECT_EQ(result.placements[0].note, "fewest expected joules: 300 J on n1/cuda:0 (n1/cpu 900 J)");
  EXPECT_NEAR(result.placements[0].reserve.mean_joules, 300.0, 1e-9);
}

// Ordering the candidates cheapest first (what the scheduling core does when a job is queued)
// lets a pass stop early on many devices; it must decide exactly as the walk over all of them:
// the same placements, settings and notes, and the same reasons for every waiting job.
TEST(PlacementTest, an_ordered_pass_decides_as_the_walk_over_every_candidate) {
  std::mt19937 rng(20261129);
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  auto chance = [&](double p) { return uniform(0.0, 1.0) < p; };
  std::size_t placed = 0, waited = 0, by_energy = 0, without_estimate = 0;
  for (int round = 0; round < 300; ++round) {
    const Objective objective = chance(0.8) ? Objective::min_energy : Objective::flops_greedy;
    Policy policy = with_budget(chance(0.3) ? uniform(500.0, 5'000.0) : 1e9, objective);
    policy.budgets.push_back(EnergyBudget{"node-b", ScopeTarget{Scope::node, "b"}, uniform(100.0, 3'000.0),
                                          BudgetWindow{BudgetWindow::Kind::day}});
    if (chance(0.3)) policy.power_caps.push_back(PowerCap{"cap", ScopeTarget{Scope::node, "c"}, uniform(50.0, 400.0)});
    if (chance(0.4)) policy.knobs.goal = KnobGoal::min_energy;
    std::vector<DeviceStatus> devices;
    // Crowded: many devices, few of them free (a pass then looks the free ones up).
    const bool crowded = chance(0.3);
    const std::size_t device_count = crowded ? 100 + rng() % 100 : 2 + rng() % 40;
    for (std::size_t d = 0; d < device_count; ++d) {
      DeviceStatus status = device(fmt::format("dev{}", d), std::string(1, static_cast<char>('a' + d % 4)));
      status.accepts_work = !chance(0.05);
      status.busy = chance(crowded ? 0.97 : 0.7);
      if (status.busy) status.busy_until = kNow + static_cast<UnixMillis>(uniform(1e3, 4e6));
      status.average_power_watts = uniform(0.0, 200.0);
      devices.push_back(std::move(status));
    }
    std::vector<PendingJob> jobs;
    const std::size_t job_count = 1 + rng() % 30;
    for (std::size_t j = 0; j < job_count; ++j) {
      std::vector<Candidate> candidates;
      const double base = uniform(50.0, 500.0);
      const bool unmodelled = chance(0.1);  // no estimate anywhere (a cluster before probing)
      for (std::size_t d = 0; d < device_count; ++d) {
        if (chance(0.3)) continue;
        // Few distinct values, so that equal joules and equal finishes happen.
        const double joules = chance(0.3) ? base : std::round(base * uniform(0.5, 3.0) / 10.0) * 10.0;
        Candidate candidate = on(d, joules, std::round(uniform(10.0, 600.0)), joules * uniform(0.0, 0.4));
        if (unmodelled || chance(0.05)) candidate.estimate.reset();
        if (unmodelled) candidate.flops_joules.reset();
        if (!unmodelled && chance(0.7)) candidate.flops_joules = std::round(uniform(10.0, 100.0));
        if (chance(0.3) && candidate.estimate)
          for (double factor : {0.7, 0.85})
            candidate.settings.push_back(SettingOption{
                "gpu_power_limit_watts", factor * 100.0, "w",
                Estimate{joules * factor * uniform(0.9, 1.1), joules * 0.1, candidate.estimate->seconds_mean / factor},
                0.0});
        candidates.push_back(std::move(candidate));
      }
      if (chance(0.2)) std::shuffle(candidates.begin(), candidates.end(), rng);  // not in device order
      PendingJob pending = job(fmt::format("j{}", j), std::move(candidates));
      if (chance(0.2)) pending.deadline = kNow + static_cast<UnixMillis>(uniform(1e4, 3e6));
      if (chance(0.2)) pending.max_energy_joules = uniform(100.0, 800.0);
      jobs.push_back(std::move(pending));
    }

    Pass walked{policy, devices, jobs};
    Pass ordered{policy, devices, jobs};
    for (auto& pending : ordered.jobs) order_candidates(pending, objective);
    const double spent = uniform(0.0, 2e3);
    for (Pass* pass : {&walked, &ordered}) {
      pass->ledger.record(EnergyUse{DeviceRef{"b", "dev1", {}}, "old", kNow - 60'000, kNow - 1'000, spent, "rapl"});
      pass->ledger.reserve("running", DeviceRef{"a", "dev0", {}}, EnergyDistribution::from_std(300.0, 50.0));
    }
    const PassResult a = walked.run();
    const PassResult b = ordered.run();
    SCOPED_TRACE(fmt::format("round {}", round));
    ASSERT_EQ(a.placements.size(), b.placements.size());
    for (std::size_t i = 0; i < a.placements.size(); ++i) {
      EXPECT_EQ(a.placements[i].job, b.placements[i].job);
      EXPECT_EQ(a.placements[i].device, b.placements[i].device);
      EXPECT_EQ(a.placements[i].note, b.placements[i].note);
      EXPECT_EQ(a.placements[i].setting.has_value(), b.placements[i].setting.has_value());
      EXPECT_EQ(a.placements[i].misses_deadline, b.placements[i].misses_deadline);
      by_energy += a.placements[i].note.find("fewest") != std::string::npos ? 1 : 0;
      without_estimate += a.placements[i].estimate ? 0 : 1;
    }
    ASSERT_EQ(a.waiting.size(), b.waiting.size());
    for (std::size_t i = 0; i < a.waiting.size(); ++i) {
      EXPECT_EQ(a.waiting[i].first, b.waiting[i].first);
      EXPECT_EQ(a.waiting[i].second.kind, b.waiting[i].second.kind);
      EXPECT_EQ(a.waiting[i].second.message, b.waiting[i].second.message);
      EXPECT_EQ(a.waiting[i].second.retry_at, b.waiting[i].second.retry_at);
    }
    EXPECT_EQ(a.next_retry, b.next_retry);
    placed += a.placements.size();
    waited += a.waiting.size();
  }
  // The rounds reach both outcomes often, or the comparison proves little.
  EXPECT_GT(placed, 300u);
  EXPECT_GT(waited, 1000u);
  EXPECT_GT(by_energy, 100u);
  EXPECT_GT(without_estimate, 20u);
}

TEST(PlacementTest, a_job_waits_for_its_efficient_busy_device_while_others_take_free_ones) {
  Pass pass{{}, {device("cpu"), device("cuda:0")}, {}};
  pass.devices[1].busy = true;
  pass.devices[1].busy_until = kNow + 30'000;
  pass.jobs = {job("a", {on(0, 900.0, 60.0), on(1, 300.0, 20.0)}), job("b", {on(0, 100.0, 10.0)})};
  const auto result = pass.run();
  ASSERT_EQ(result.placements.size(), 1u);
  EXPECT_EQ(result.placements[0].job, "b");
  const auto& why = reason_of(result, "a");
  EXPECT_EQ(why.kind, WaitReason::Kind::device_busy);
  EXPECT_EQ(why.device, "n1/cuda:0");
  EXPECT_EQ(why.retry_at, kNow + 30'000);
}

TEST(PlacementTest, a_deadline_sends_the_job_to_a_costlier_device_that_finishes_in_time) {
  Pass pass{{}, {device("cpu"), device("cuda:0")}, {}};
  pass.devices[1].busy = true;
  pass.devices[1].busy_until = kNow + 3'600'000;
  auto a = job("a", {on(0, 900.0, 60.0), on(1, 300.0, 20.0)});
  a.deadline = kNow + 600'000;
  pass.jobs = {a};
  const auto result = pass.run();
  ASSERT_EQ(result.placements.size(), 1u);
  EXPECT_EQ(result.placements[0].device, 0u);
  EXPECT_FALSE(result.placements[0].misses_deadline);
}

TEST(PlacementTest, when_no_device_can_meet_the_deadline_the_earliest_finish_runs_it_and_says_so) {
  Pass pass{{}, {device("cpu"), device("cuda:0")}, {}};
  auto a = job("a", {on(0, 900.0, 600.0), on(1, 300.0, 200.0)});
  a.deadline = kNow + 100'000;
  pass.jobs = {a};
  const auto result = pass.run();
  ASSERT_EQ(result.placements.size(), 1u);
  EXPECT_EQ(result.placements[0].device, 1u);
  EXPECT_TRUE(result.placements[0].misses_deadline);
}

TEST(PlacementTest, admission_refuses_a_job_likely_to_overrun_what_is_left_and_says_when_it_fits) {
  Pass pass{with_budget(1000.0), {device("cpu")}, {}};
  pass.ledger.record({pass.devices[0].ref, "earlier", kNow - 3'600'000, kNow - 1'800'000, 900.0, "rapl"});
  pass.jobs = {job("a", {on(0, 90.0, 60.0, 20.0)})};
  const auto result = pass.run();
  EXPECT_TRUE(result.placements.empty());
  const auto& why = reason_of(result, "a");
  EXPECT_EQ(why.kind, WaitReason::Kind::budget);
  EXPECT_EQ(why.rule, "daily");
  EXPECT_NEAR(why.remaining.value(), 100.0, 1e-9);
  EXPECT_GT(why.needed.value(), 100.0);
  EXPECT_EQ(why.retry_at, parse_rfc3339("2026-11-27T00:00:00Z"));
  EXPECT_EQ(result.next_retry, why.retry_at);
  EXPECT_NE(why.message.find("budget daily (the cluster, calendar day): 100 J left of 1 kJ"), std::string::npos)
      << why.message;
}

TEST(PlacementTest, the_policy_risk_decides_how_much_uncertainty_is_admitted) {
  // Same mean, 90 J of 100 J left; sure estimates fit, wide ones do not at 5%, but do at 50%.
  Pass pass{with_budget(100.0), {device("cpu"), device("gpu")}, {}};
  pass.jobs = {job("sure", {on(0, 90.0, 60.0, 1.0)}), job("unsure", {on(1, 90.0, 60.0, 40.0)})};
  auto result = pass.run();
  ASSERT_EQ(result.placements.size(), 1u);
  EXPECT_EQ(result.placements[0].job, "sure");

  Pass lenient{with_budget(100.0), {device("cpu"), device("gpu")}, {}};
  lenient.policy.risk = 0.5;
  lenient.jobs = {job("unsure", {on(1, 90.0, 60.0, 40.0)})};
  EXPECT_EQ(lenient.run().placements.size(), 1u);
}

TEST(PlacementTest, jobs_placed_in_one_pass_reserve_the_budget_for_each_other) {
  Pass pass{with_budget(100.0), {device("cpu"), device("gpu")}, {}};
  pass.jobs = {job("a", {on(0, 60.0, 10.0), on(1, 60.0, 10.0)}), job("b", {on(0, 60.0, 10.0), on(1, 60.0, 10.0)})};
  const auto result = pass.run();
  ASSERT_EQ(result.placements.size(), 1u);
  EXPECT_EQ(reason_of(result, "b").kind, WaitReason::Kind::budget);
}

TEST(PlacementTest, without_an_estimate_a_budgeted_device_needs_the_jobs_max_energy) {
  Pass pass{with_budget(1000.0), {device("cpu")}, {}};
  pass.jobs = {job("a", {Candidate{0, std::nullopt, std::nullopt, {}}})};
  auto result = pass.run();
  EXPECT_EQ(reason_of(result, "a").kind, WaitReason::Kind::no_estimate);

  pass.jobs[0].max_energy_joules = 400.0;
  result = pass.run();
  ASSERT_EQ(result.placements.size(), 1u);
  EXPECT_NEAR(result.placements[0].reserve.mean_joules, 400.0, 1e-9);
}

TEST(PlacementTest, without_budgets_a_job_with_no_estimate_still_runs) {
  Pass pass{{}, {device("cpu")}, {job("a", {Candidate{0, std::nullopt, std::nullopt, {}}})}};
  EXPECT_EQ(pass.run().placements.size(), 1u);
}

TEST(PlacementTest, max_energy_joules_holds_at_the_policy_risk) {
  Pass pass{{}, {device("cpu"), device("gpu")}, {}};
  auto a = job("a", {on(0, 500.0, 10.0, 50.0), on(1, 200.0, 10.0, 20.0)});
  a.max_energy_joules = 300.0;
  pass.policy.objective = Objective::earliest_finish;  // would take either
  pass.jobs = {a};
  auto result = pass.run();
  ASSERT_EQ(result.placements.size(), 1u);
  EXPECT_EQ(result.placements[0].device, 1u);
}

TEST(PlacementTest, an_exceeded_power_cap_holds_new_work_back) {
  Pass pass{{}, {device("cpu"), device("cuda:0")}, {}};
  pass.policy.power_caps.push_back(PowerCap{"node-cap", ScopeTarget{Scope::node, "n1"}, 200.0, 60.0});
  pass.devices[0].busy = true;
  pass.devices[0].average_power_watts = 150.0;
  pass.jobs = {job("a", {on(1, 6000.0, 60.0)})};  // about 100 W more
  const auto result = pass.run();
  const auto& why = reason_of(result, "a");
  EXPECT_EQ(why.kind, WaitReason::Kind::power_cap);
  EXPECT_EQ(why.message, "power cap node-cap (node n1): 150.0 W of 200.0 W in use; the job adds about 100.0 W");

  pass.jobs = {job("small", {on(1, 1200.0, 60.0)})};  // 20 W fits
  EXPECT_EQ(pass.run().placements.size(), 1u);
}

TEST(PlacementTest, a_battery_at_its_floor_or_unable_to_pay_for_the_job_runs_nothing) {
  Pass pass{{}, {device("cpu", "jetson")}, {}};
  pass.policy.battery_floors.push_back(BatteryFloor{"solar", ScopeTarget{Scope::node, "jetson"}, 30.0, 5.0});
  pass.devices[0].battery_percent = 28.0;
  pass.jobs = {job("a", {on(0, 100.0, 60.0)})};
  EXPECT_EQ(reason_of(pass.run(), "a").kind, WaitReason::Kind::battery_floor);

  pass.devices[0].battery_percent = 40.0;
  pass.devices[0].battery_capacity_joules = 100'000.0;  // 10 kJ above the floor
  EXPECT_EQ(pass.run().placements.size(), 1u);
  pass.jobs = {job("big", {on(0, 20'000.0, 600.0)})};
  EXPECT_EQ(reason_of(pass.run(), "big").kind, WaitReason::Kind::battery_floor);
}

TEST(PlacementTest, baselines_ignore_energy) {
  const std::vector<Candidate> both = {on(0, 900.0, 60.0), on(1, 300.0, 20.0)};
  Pass fifo{{}, {device("cpu"), device("cuda:0")}, {job("a", both)}};
  fifo.policy.objective = Objective::fifo;
  EXPECT_EQ(fifo.run().placements.at(0).device, 0u);

  Pass least{{}, {device("cpu"), device("cuda:0")}, {job("a", both), job("b", both)}};
  least.policy.objective = Objective::least_loaded;
  least.devices[0].work_seconds = 500.0;
  const auto result = least.run();
  ASSERT_EQ(result.placements.size(), 2u);
  EXPECT_EQ(result.placements[0].device, 1u);
  EXPECT_EQ(result.placements[1].device, 0u);
}

TEST(PlacementTest, round_robin_takes_devices_in_turn_across_passes) {
  Policy policy;
  policy.objective = Objective::round_robin;
  Placer placer(policy);
  std::vector<DeviceStatus> devices = {device("a"), device("b"), device("c")};
  BudgetLedger ledger;
  std::vector<std::size_t> chosen;
  for (int i = 0; i < 4; ++i) {
    const auto pending = job("j", {on(0, 1, 1), on(1, 1, 1), on(2, 1, 1)});
    const PendingJob* queue[] = {&pending};
    chosen.push_back(placer.decide(kNow, devices, queue, ledger).placements.at(0).device);
  }
  EXPECT_EQ(chosen, (std::vector<std::size_t>{0, 1, 2, 0}));
}

TEST(PlacementTest, flops_greedy_trusts_the_flops_baseline_and_oracle_style_estimates_are_used_as_given) {
  Pass pass{{}, {device("cpu"), device("cuda:0")}, {}};
  pass.policy.objective = Objective::flops_greedy;
  pass.jobs = {
      job("a", {Candidate{0, Estimate{900, 0, 60}, 100.0, {}}, Candidate{1, Estimate{300, 0, 20}, 500.0, {}}})};
  EXPECT_EQ(pass.run().placements.at(0).device, 0u);
}

TEST(PlacementTest, min_edp_and_earliest_finish_trade_energy_for_time) {
  // cpu: 400 J in 100 s (EDP 40,000); gpu: 500 J in 20 s (EDP 10,000).
  const std::vector<Candidate> both = {on(0, 400.0, 100.0), on(1, 500.0, 20.0)};
  for (const auto objective : {Objective::min_edp, Objective::earliest_finish}) {
    Pass pass{{}, {device("cpu"), device("gpu")}, {job("a", both)}};
    pass.policy.objective = objective;
    EXPECT_EQ(pass.run().placements.at(0).device, 1u) << to_string(objective);
  }
  Pass energy{{}, {device("cpu"), device("gpu")}, {job("a", both)}};
  EXPECT_EQ(energy.run().placements.at(0).device, 0u);
}

TEST(PlacementTest, admission_off_ignores_budgets) {
  Pass pass{with_budget(10.0, Objective::fifo), {device("cpu")}, {job("a", {on(0, 900.0, 60.0)})}};
  pass.policy.admission = false;
  EXPECT_EQ(pass.run().placements.size(), 1u);
}

TEST(PlacementTest, once_no_device_is_free_a_pass_only_explains_a_few_more_jobs) {
  Policy policy = with_budget(100.0);
  BudgetLedger ledger;
  ledger.set_budgets(policy.budgets);
  Placer placer(policy, PlacementOptions{1000, 2});
  std::vector<DeviceStatus> devices = {device("cpu")};
  std::vector<PendingJob> jobs;
  for (int i = 0; i < 5; ++i) jobs.push_back(job("j" + std::to_string(i), {on(0, 60.0, 1.0)}));
  std::vector<const PendingJob*> queue;
  for (const auto& j : jobs) queue.push_back(&j);
  const auto result = placer.decide(kNow, devices, queue, ledger);
  EXPECT_EQ(result.placements.size(), 1u);
  EXPECT_EQ(result.considered, 3u);
  // The budget, not the busy device, is what holds j1 back.
  EXPECT_EQ(reason_of(result, "j1").kind, WaitReason::Kind::budget);
}

TEST(PlacementTest, never_fits_compares_with_whole_budgets_deadlines_and_max_energy) {
  Policy policy = with_budget(1000.0);
  BudgetLedger ledger;
  ledger.set_budgets(policy.budgets);
  Placer placer(policy);
  std::vector<DeviceStatus> devices = {device("cpu"), device("gpu")};
  ledger.record({devices[0].ref, "x", kNow - 1000, kNow - 500, 990.0, "rapl"});  // spent: irrelevant here

  auto fits = job("fits", {on(0, 5000.0, 10.0), on(1, 800.0, 10.0, 10.0)});
  EXPECT_EQ(placer.never_fits(kNow, devices, fits, ledger), std::nullopt);

  auto too_big = job("big", {on(0, 5000.0, 10.0), on(1, 1500.0, 10.0)});
  const auto why = placer.never_fits(kNow, devices, too_big, ledger);
  ASSERT_TRUE(why);
  EXPECT_EQ(why->kind, WaitReason::Kind::budget);

  auto late = job("late", {on(0, 10.0, 3600.0)});
  late.deadline = kNow + 60'000;
  EXPECT_EQ(placer.never_fits(kNow, devices, late, ledger)->kind, WaitReason::Kind::deadline);

  auto unknown = job("unknown", {Candidate{0, std::nullopt, std::nullopt, {}}});
  EXPECT_EQ(placer.never_fits(kNow, devices, unknown, ledger), std::nullopt);
}

}  // namespace
}  // namespace joule::schedulers

namespace joule::schedulers {
namespace {

TEST(PlacementTest, min_energy_takes_a_free_device_the_estimates_cannot_tell_from_the_busy_best) {
  // Two alike devices: the busy one looks 3 % cheaper, well within the estimates' spread.
  Pass alike{{}, {device("jetson-1"), device("jetson-2")}, {}};
  alike.devices[0].busy = true;
  alike.devices[0].busy_until = kNow + 600'000;
  alike.jobs = {job("a", {on(0, 970.0, 60.0, 80.0), on(1, 1000.0, 60.0, 80.0)})};
  ASSERT_EQ(alike.run().placements.size(), 1u);
  EXPECT_EQ(alike.run().placements.at(0).device, 1u);

  // Clearly cheaper beyond the spread: waiting for it is worth it.
  Pass clear{{}, {device("gpu"), device("cpu")}, {}};
  clear.devices[0].busy = true;
  clear.devices[0].busy_until = kNow + 600'000;
  clear.jobs = {job("a", {on(0, 300.0, 60.0, 30.0), on(1, 1000.0, 60.0, 80.0)})};
  const auto result = clear.run();
  EXPECT_TRUE(result.placements.empty());
  EXPECT_EQ(reason_of(result, "a").kind, WaitReason::Kind::device_busy);
}

TEST(PlacementTest, a_job_without_estimates_takes_a_free_device_rather_than_wait_for_a_busy_one) {
  // Two identical Slurm slots: the first is busy with a job of unknown length.
  Pass pass{{}, {device("0", "slurm:cpu"), device("1", "slurm:cpu")}, {}};
  pass.devices[0].busy = true;
  pass.jobs = {job("a", {Candidate{0, std::nullopt, std::nullopt, {}}, Candidate{1, std::nullopt, std::nullopt, {}}})};
  const auto result = pass.run();
  ASSERT_EQ(result.placements.size(), 1u);
  EXPECT_EQ(result.placements[0].device, 1u);
}

SettingOption at(std::string label, double value, double joules, double seconds) {
  return SettingOption{"gpu_power_limit_watts", value, std::move(label), Estimate{joules, 0.0, seconds}, 0.0};
}

Candidate with_settings(Candidate candidate, std::vector<SettingOption> settings) {
  candidate.settings = std::move(settings);
  return candidate;
}

Policy with_knobs(KnobGoal goal, std::optional<double> max_slowdown = 0.10) {
  Policy policy;
  policy.knobs.goal = goal;
  policy.knobs.max_slowdown = max_slowdown;
  return policy;
}

TEST(PlacementKnobsTest, the_cheapest_setting_within_the_allowed_slowdown_is_chosen_and_the_saving_said) {
  const auto gpu = with_settings(on(0, 1000.0, 100.0), {at("120 W", 120, 900.0, 105.0), at("90 W", 90, 800.0, 115.0),
                                                        at("60 W", 60, 700.0, 160.0)});
  Pass pass{with_knobs(KnobGoal::min_energy, 0.20), {device("cuda:0")}, {job("a", {gpu})}};
  auto result = pass.run();
  ASSERT_EQ(result.placements.size(), 1u);
  const Placement& placed = result.placements[0];
  ASSERT_TRUE(placed.setting);
  EXPECT_EQ(placed.setting->label, "90 W");  // 60 W is cheaper but 60 % slower
  EXPECT_NEAR(placed.estimate->joules_mean, 800.0, 1e-9);
  EXPECT_NEAR(placed.reserve.mean_joules, 800.0, 1e-9);
  EXPECT_NEAR(placed.at_default->joules_mean, 1000.0, 1e-9);
  EXPECT_NE(placed.note.find("at gpu_power_limit_watts 90 W (min-energy): 20% fewer joules, 15% more time"),
            std::string::npos)
      << placed.note;

  // The job's own max_slowdown replaces the policy's.
  pass.jobs[0].max_slowdown = 0.06;
  result = pass.run();
  ASSERT_TRUE(result.placements[0].setting);
  EXPECT_EQ(result.placements[0].setting->label, "120 W");
  pass.jobs[0].max_slowdown = 1.0;
  EXPECT_EQ(pass.run().placements[0].setting->label, "60 W");
}

TEST(PlacementKnobsTest, without_a_goal_or_a_cheaper_setting_jobs_run_at_the_defaults) {
  const auto gpu = with_settings(on(0, 1000.0, 100.0), {at("90 W", 90, 800.0, 105.0)});
  Pass off{with_knobs(KnobGoal::off), {device("cuda:0")}, {job("a", {gpu})}};
  EXPECT_FALSE(off.run().placements[0].setting);
  const auto dearer = with_settings(on(0, 1000.0, 100.0), {at("90 W", 90, 1100.0, 105.0)});
  Pass none{with_knobs(KnobGoal::min_energy), {device("cuda:0")}, {job("a", {dearer})}};
  EXPECT_FALSE(none.run().placements[0].setting);
  // Baselines that read no estimates never choose settings.
  Policy fifo = with_knobs(KnobGoal::min_energy);
  fifo.objective = Objective::fifo;
  Pass baseline{fifo, {device("cuda:0")}, {job("a", {gpu})}};
  EXPECT_FALSE(baseline.run().placements[0].setting);
}

TEST(PlacementKnobsTest, device_and_setting_are_chosen_together) {
  // cuda:0 is cheaper at its defaults, cuda:1 at its best setting.
  const auto first = with_settings(on(0, 1000.0, 100.0), {at("90 W", 90, 950.0, 105.0)});
  const auto second = with_settings(on(1, 1100.0, 80.0), {at("90 W", 90, 850.0, 86.0)});
  Pass pass{with_knobs(KnobGoal::min_energy), {device("cuda:0"), device("cuda:1")}, {job("a", {first, second})}};
  const auto result = pass.run();
  ASSERT_EQ(result.placements.size(), 1u);
  EXPECT_EQ(result.placements[0].device, 1u);
  EXPECT_EQ(result.placements[0].setting->label, "90 W");
}

TEST(PlacementKnobsTest, an_unsure_slowdown_must_hold_at_the_policys_risk) {
  // Predicted 8 % slower: within 10 %; with a 5 % log-std, its 95th percentile is about 17 %.
  auto unsure = at("90 W", 90, 800.0, 108.0);
  unsure.slowdown_log_std = 0.05;
  Pass pass{with_knobs(KnobGoal::min_energy),
            {device("cuda:0")},
            {job("a", {with_settings(on(0, 1000.0, 100.0), {unsure})})}};
  EXPECT_FALSE(pass.run().placements[0].setting);
  pass.policy.risk = 0.4;  // a policy that accepts more risk takes it
  EXPECT_TRUE(pass.run().placements[0].setting);
}

TEST(PlacementKnobsTest, a_saving_the_readings_cannot_tell_from_their_noise_changes_nothing) {
  // 0.6 % fewer joules with a 2 % log-std (what a knob that changes nothing read on the VM):
  // its 95th percentile is above the defaults. A 20 % saving holds at that risk.
  auto noise = at("3800 MHz", 3800, 994.0, 99.4);
  noise.saving_log_std = 0.02;
  Pass pass{
      with_knobs(KnobGoal::min_energy), {device("cuda:0")}, {job("a", {with_settings(on(0, 1000.0, 100.0), {noise})})}};
  EXPECT_FALSE(pass.run().placements[0].setting);
  auto real = at("90 W", 90, 800.0, 105.0);
  real.saving_log_std = 0.02;
  pass.jobs = {job("a", {with_settings(on(0, 1000.0, 100.0), {noise, real})})};
  ASSERT_TRUE(pass.run().placements[0].setting);
  EXPECT_EQ(pass.run().placements[0].setting->label, "90 W");
}

TEST(PlacementKnobsTest, a_job_that_fits_only_at_a_setting_is_not_refused_at_submission) {
  const auto gpu = with_settings(on(0, 1000.0, 100.0), {at("90 W", 90, 800.0, 105.0)});
  Pass pass{with_knobs(KnobGoal::min_energy), {device("cuda:0")}, {job("a", {gpu})}};
  pass.jobs[0].max_energy_joules = 900.0;
  pass.ledger.set_budgets(pass.policy.budgets);
  EXPECT_FALSE(Placer(pass.policy).never_fits(kNow, pass.devices, pass.jobs[0], pass.ledger));
  Pass off{with_knobs(KnobGoal::off), {device("cuda:0")}, {job("a", {gpu})}};
  off.jobs[0].max_energy_joules = 900.0;
  const auto refused = Placer(off.policy).never_fits(kNow, off.devices, off.jobs[0], off.ledger);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->kind, WaitReason::Kind::max_energy);
}

TEST(PlacementKnobsTest, a_deadline_the_defaults_keep_forbids_a_slower_setting) {
  const auto gpu = with_settings(on(0, 1000.0, 100.0), {at("90 W", 90, 800.0, 108.0)});
  Pass pass{with_knobs(KnobGoal::min_energy), {device("cuda:0")}, {job("a", {gpu})}};
  pass.jobs[0].deadline = kNow + 104'000;
  EXPECT_FALSE(pass.run().placements[0].setting);
  pass.jobs[0].deadline = kNow + 110'000;
  EXPECT_TRUE(pass.run().placements[0].setting);
}

TEST(PlacementKnobsTest, zeus_and_edp_goals_weigh_time_against_energy) {
  // 90 W: 20 % fewer joules for 15 % more time; 75 W: 25 % fewer for 40 % more.
  const auto gpu = with_settings(on(0, 1000.0, 100.0), {at("90 W", 90, 800.0, 115.0), at("75 W", 75, 750.0, 140.0)});
  Pass zeus{with_knobs(KnobGoal::zeus, std::nullopt), {device("cuda:0")}, {job("a", {gpu})}};
  zeus.policy.knobs.eta = 0.5;
  EXPECT_EQ(zeus.run().placements[0].setting->label, "90 W");  // 0.975 against 1.075 and 1.0
  zeus.policy.knobs.eta = 0.9;
  EXPECT_EQ(zeus.run().placements[0].setting->label, "75 W");  // 0.815 against 0.835
  Pass edp{with_knobs(KnobGoal::min_edp, std::nullopt), {device("cuda:0")}, {job("a", {gpu})}};
  EXPECT_EQ(edp.run().placements[0].setting->label, "90 W");  // 0.92 against 1.05
}

// A grid at 400 gCO2e/kWh now, 100 from two hours on, for a day.
GridSignal clean_later() {
  return GridSignal::from_points({{kNow, 400.0}, {kNow + 2 * 3'600'000, 100.0}}, kNow + 24 * 3'600'000).value();
}

Policy min_carbon() {
  Policy policy;
  policy.objective = Objective::min_carbon;
  return policy;
}

TEST(PlacementCarbonTest, a_job_with_a_deadline_waits_for_a_cleaner_window_and_says_how_much_cleaner) {
  const GridSignal grid = clean_later();
  Pass pass{min_carbon(), {device("cuda:0")}, {job("a", {on(0, 3.6e6, 3600.0)})}};
  pass.devices[0].carbon = &grid;
  pass.jobs[0].deadline = kNow + 6 * 3'600'000;
  auto result = pass.run();
  ASSERT_TRUE(result.placements.empty());
  const auto& why = reason_of(result, "a");
  EXPECT_EQ(why.kind, WaitReason::Kind::cleaner_window);
  EXPECT_EQ(why.retry_at, kNow + 2 * 3'600'000);
  EXPECT_EQ(result.next_retry, kNow + 2 * 3'600'000);
  EXPECT_EQ(why.message,
            "waiting for a cleaner window on n1/cuda:0 at 2026-11-26T12:00:00.000Z: 75% less carbon than now (100 "
            "against 400 gCO2e/kWh)");
  // When the window opens it runs, and its note says the grams.
  result = pass.run(kNow + 2 * 3'600'000);
  ASSERT_EQ(result.placements.size(), 1u);
  EXPECT_NE(result.placements[0].note.find("100.0 g CO2e expected at 100 gCO2e/kWh"), std::string::npos)
      << result.placements[0].note;
}

TEST(PlacementCarbonTest, two_jobs_do_not_both_count_on_one_clean_hour) {
  // One device, one clean hour (2-3 h from now), two 1-hour jobs that must end within 3.5 hours:
  // both waiting for the hour would leave the second to finish at 4 h. The first takes the
  // hour; the second, its window taken, runs now.
  const GridSignal grid =
      GridSignal::from_points({{kNow, 400.0}, {kNow + 2 * 3'600'000, 100.0}, {kNow + 3 * 3'600'000, 400.0}},
                              kNow + 24 * 3'600'000)
          .value();
  Pass pass{min_carbon(), {device("cuda:0")}, {job("a", {on(0, 3.6e6, 3600.0)}), job("b", {on(0, 3.6e6, 3600.0)})}};
  pass.devices[0].carbon = &grid;
  for (auto& each : pass.jobs) each.deadline = kNow + 3 * 3'600'000 + 1'800'000;
  const auto result = pass.run();
  EXPECT_EQ(reason_of(result, "a").kind, WaitReason::Kind::cleaner_window);
  EXPECT_EQ(reason_of(result, "a").retry_at, kNow + 2 * 3'600'000);
  ASSERT_EQ(result.placements.size(), 1u);
  EXPECT_EQ(result.placements[0].job, "b");
}

TEST(PlacementCarbonTest, no_deadline_or_too_little_slack_runs_now) {
  const GridSignal grid = clean_later();
  Pass pass{min_carbon(), {device("cuda:0")}, {job("a", {on(0, 3.6e6, 3600.0)})}};
  pass.devices[0].carbon = &grid;
  EXPECT_EQ(pass.run().placements.size(), 1u);   // never deferred without a deadline
  pass.jobs[0].deadline = kNow + 2 * 3'600'000;  // a 1-hour job that must end in 2 hours
  auto result = pass.run();
  ASSERT_EQ(result.placements.size(), 1u);
  EXPECT_NE(result.placements[0].note.find("at 400 gCO2e/kWh"), std::string::npos) << result.placements[0].note;
}

TEST(PlacementCarbonTest, grams_choose_the_device_and_without_any_signal_joules_do) {
  const GridSignal dirty = GridSignal::from_points({{kNow, 800.0}}, kNow + 24 * 3'600'000).value();
  const GridSignal clean = GridSignal::from_points({{kNow, 100.0}}, kNow + 24 * 3'600'000).value();
  // cuda:0 uses fewer joules on a dirty grid; cuda:1 more on a clean one.
  Pass pass{
      min_carbon(), {device("cuda:0", "n1"), device("cuda:1", "n2")}, {job("a", {on(0, 1000, 10), on(1, 2000, 10)})}};
  pass.devices[0].carbon = &dirty;
  pass.devices[1].carbon = &clean;
  EXPECT_EQ(pass.run().placements[0].device, 1u);
  pass.devices[0].carbon = nullptr;
  pass.devices[1].carbon = nullptr;
  EXPECT_EQ(pass.run().placements[0].device, 0u);
}

Policy with_budget_in(BudgetUnit unit, double limit, Objective objective = Objective::min_energy) {
  Policy policy = with_budget(limit, objective);
  policy.budgets[0].unit = unit;
  if (unit == BudgetUnit::money) policy.budgets[0].currency = "EUR";
  return policy;
}

TEST(PlacementBudgetUnitsTest, a_grams_budget_counts_each_job_at_the_carbon_over_its_run) {
  const GridSignal grid = clean_later();  // 400 g/kWh for two hours, then 100
  // 500 g a day; each job is 1 kWh (400 g now): the first fits, the second would take 800 g.
  Pass pass{with_budget_in(BudgetUnit::grams, 500.0),
            {device("cpu"), device("gpu")},
            {job("a", {on(0, 3.6e6, 3600.0)}), job("b", {on(1, 3.6e6, 3600.0)})}};
  pass.devices[0].carbon = &grid;
  pass.devices[1].carbon = &grid;
  auto result = pass.run();
  ASSERT_EQ(result.placements.size(), 1u);
  EXPECT_NEAR(*result.placements[0].rates.grams_per_joule * 3.6e6, 400.0, 1e-9);
  EXPECT_FALSE(result.placements[0].rates.cost_per_joule);  // no price signal
  const WaitReason& why = reason_of(result, "b");
  EXPECT_EQ(why.kind, WaitReason::Kind::budget);
  EXPECT_EQ(why.unit, BudgetUnit::grams);
  EXPECT_NEAR(*why.needed, 400.0, 1e-6);
  EXPECT_NEAR(*why.remaining, 100.0, 1e-6);
  EXPECT_NE(why.message.find("100 g CO2e left of 500 g CO2e"), std::string::npos) << why.message;
  // On a clean grid (100 g/kWh) both fit.
  const GridSignal clean = GridSignal::from_points({{kNow, 100.0}}, kNow + 24 * 3'600'000).value();
  pass.devices[0].carbon = &clean;
  pass.devices[1].carbon = &clean;
  EXPECT_EQ(pass.run().placements.size(), 2u);
}

TEST(PlacementBudgetUnitsTest, without_the_signal_a_grams_or_money_budget_holds_its_jobs_and_says_why) {
  Pass grams{with_budget_in(BudgetUnit::grams, 500.0), {device("cpu")}, {job("a", {on(0, 100.0, 10.0)})}};
  auto result = grams.run();
  ASSERT_TRUE(result.placements.empty());
  EXPECT_EQ(reason_of(result, "a").kind, WaitReason::Kind::no_estimate);
  EXPECT_EQ(reason_of(result, "a").message,
            "budget daily counts grams CO2e and n1/cpu has no carbon signal to count this job's joules at");
  Pass money{with_budget_in(BudgetUnit::money, 5.0), {device("cpu")}, {job("a", {on(0, 100.0, 10.0)})}};
  result = money.run();
  ASSERT_TRUE(result.placements.empty());
  EXPECT_NE(reason_of(result, "a").message.find("no price signal"), std::string::npos);
  // A joule budget needs no signal.
  Pass joules{with_budget(500.0), {device("cpu")}, {job("a", {on(0, 100.0, 10.0)})}};
  EXPECT_EQ(joules.run().placements.size(), 1u);
}

TEST(PlacementBudgetUnitsTest, a_money_budget_counts_at_the_price_and_whole_budgets_are_judged_at_the_lowest_price) {
  // 0.30 per kWh now, 0.10 from two hours on.
  const GridSignal price =
      GridSignal::from_points({{kNow, 0.30}, {kNow + 2 * 3'600'000, 0.10}}, kNow + 24 * 3'600'000).value();
  Policy policy = with_budget_in(BudgetUnit::money, 1.0);                    // 1 EUR a day
  Pass pass{policy, {device("cpu")}, {job("a", {on(0, 3.6e6 * 4, 60.0)})}};  // 4 kWh: 1.20 now
  pass.devices[0].price = &price;
  const auto result = pass.run();
  ASSERT_TRUE(result.placements.empty());
  const WaitReason& why = reason_of(result, "a");
  EXPECT_EQ(why.message,
            "budget daily (the cluster, calendar day): 1.00 EUR left of 1.00 EUR (0.00 EUR spent, 0.00 EUR reserved); "
            "the job needs 1.20 EUR on n1/cpu at 5% risk; the price signal falls at 2026-11-26T12:00:00.000Z, when it "
            "may fit");
  EXPECT_EQ(why.retry_at, kNow + 2 * 3'600'000);                    // the pass runs again then
  EXPECT_EQ(pass.run(kNow + 2 * 3'600'000).placements.size(), 1u);  // 0.40 EUR then
  // It could fit at 0.10 (0.40 EUR): not refused at submission. 12 kWh could not (1.20 at best).
  BudgetLedger ledger;
  ledger.set_budgets(policy.budgets);
  Placer placer(policy);
  EXPECT_EQ(placer.never_fits(kNow, pass.devices, pass.jobs[0], ledger), std::nullopt);
  const auto never = placer.never_fits(kNow, pass.devices, job("big", {on(0, 3.6e6 * 12, 60.0)}), ledger);
  ASSERT_TRUE(never);
  EXPECT_EQ(never->kind, WaitReason::Kind::budget);
  EXPECT_NE(never->message.find("1.20 EUR at 5% risk at the signal's lowest"), std::string::npos) << never->message;
}

TEST(PlacementBudgetUnitsTest, min_cost_waits_for_a_cheaper_window_within_the_deadline) {
  const GridSignal price =
      GridSignal::from_points({{kNow, 0.30}, {kNow + 2 * 3'600'000, 0.10}}, kNow + 24 * 3'600'000).value();
  Policy policy;
  policy.objective = Objective::min_cost;
  Pass pass{policy, {device("cpu")}, {job("a", {on(0, 3.6e6, 3600.0)})}};
  pass.devices[0].price = &price;
  EXPECT_EQ(pass.run().placements.size(), 1u);  // no deadline: never deferred
  pass.jobs[0].deadline = kNow + 6 * 3'600'000;
  auto result = pass.run();
  ASSERT_TRUE(result.placements.empty());
  const WaitReason& why = reason_of(result, "a");
  EXPECT_EQ(why.kind, WaitReason::Kind::cleaner_window);
  EXPECT_EQ(why.retry_at, kNow + 2 * 3'600'000);
  EXPECT_EQ(why.message,
            "waiting for a cheaper window on n1/cpu at 2026-11-26T12:00:00.000Z: 67% less cost than now (0.1 "
            "against 0.3 per kWh)");
  result = pass.run(kNow + 2 * 3'600'000);
  ASSERT_EQ(result.placements.size(), 1u);
  EXPECT_NE(result.placements[0].note.find("0.1 expected at 0.1 per kWh"), std::string::npos)
      << result.placements[0].note;
}

}  // namespace
TEST(PlacementTest, a_job_is_not_placed_before_its_not_before_and_says_until_when) {
  Pass pass{{}, {device("cpu")}, {job("later", {on(0, 100.0, 60.0)})}};
  pass.jobs[0].not_before = kNow + 3'600'000;
  const auto held = pass.run();
  EXPECT_TRUE(held.placements.empty());
  const WaitReason& why = reason_of(held, "later");
  EXPECT_EQ(why.kind, WaitReason::Kind::not_before);
  EXPECT_EQ(to_string(why.kind), "not-before");
  EXPECT_EQ(why.retry_at, kNow + 3'600'000);
  EXPECT_EQ(held.next_retry, kNow + 3'600'000);
  EXPECT_EQ(pass.run(kNow + 3'600'000).placements.size(), 1u);
}

}  // namespace joule::schedulers
