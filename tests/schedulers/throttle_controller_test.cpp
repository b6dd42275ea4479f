#include "joule/schedulers/throttle_controller.hpp"

#include <gtest/gtest.h>

namespace joule::schedulers {
namespace {

const UnixMillis kNow = parse_rfc3339("2026-11-26T10:00:00Z").value();

DeviceStatus device(std::string name, double watts, std::string node = "n1") {
  DeviceStatus status;
  status.ref = DeviceRef{std::move(node), std::move(name), {}};
  status.busy = true;
  status.average_power_watts = watts;
  return status;
}

RunningJob running(std::string id, std::size_t device, int priority = 0) {
  RunningJob job;
  job.id = std::move(id);
  job.device = device;
  job.priority = priority;
  return job;
}

Policy capped(double watts) {
  Policy policy;
  policy.power_caps.push_back(PowerCap{"cap", ScopeTarget{Scope::node, "n1"}, watts, 60.0});
  return policy;
}

TEST(ThrottleControllerTest, an_exceeded_cap_lowers_the_gpu_limit_of_the_lowest_priority_job) {
  ThrottleController controller(capped(300.0));
  std::vector<DeviceStatus> devices = {device("cuda:0", 250.0), device("cuda:1", 150.0)};
  auto a = running("important", 0, 5);
  auto b = running("batch", 1, 0);
  for (auto* job : {&a, &b}) {
    job->can_limit_gpu = true;
    job->gpu_min_watts = 100.0;
  }
  a.power_watts = 250.0;
  b.power_watts = 150.0;
  std::vector<RunningJob> jobs = {a, b};
  BudgetLedger ledger;
  auto actions = controller.evaluate(kNow, devices, jobs, ledger);
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].kind, ThrottleAction::Kind::gpu_power_limit);
  EXPECT_EQ(actions[0].job, "batch");
  EXPECT_NEAR(actions[0].value, 150.0 * 300.0 / 400.0, 1e-9);
  EXPECT_EQ(actions[0].rule, "cap");

  // Still over with the GPU at its lowest limit: pause it.
  jobs[1].gpu_limit_watts = 100.0;
  actions = controller.evaluate(kNow, devices, jobs, ledger);
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].kind, ThrottleAction::Kind::pause);
  EXPECT_EQ(actions[0].job, "batch");

  // Below 90% of the cap: undo one control at a time, then let go.
  jobs[1].paused = true;
  devices[0].average_power_watts = 200.0;
  devices[1].average_power_watts = 0.0;
  actions = controller.evaluate(kNow, devices, jobs, ledger);
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].kind, ThrottleAction::Kind::resume);
  jobs[1].paused = false;
  actions = controller.evaluate(kNow, devices, jobs, ledger);
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].kind, ThrottleAction::Kind::clear_gpu_power_limit);
  jobs[1].gpu_limit_watts.reset();
  EXPECT_TRUE(controller.evaluate(kNow, devices, jobs, ledger).empty());
}

TEST(ThrottleControllerTest, a_cpu_job_gets_a_quota_in_proportion_and_pauses_below_the_smallest) {
  ThrottleController controller(capped(50.0));
  std::vector<DeviceStatus> devices = {device("cpu", 100.0)};
  auto job = running("a", 0);
  job.can_limit_cpu = true;
  job.cpus = 4.0;
  std::vector<RunningJob> jobs = {job};
  BudgetLedger ledger;
  auto actions = controller.evaluate(kNow, devices, jobs, ledger);
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].kind, ThrottleAction::Kind::cpu_quota);
  EXPECT_NEAR(actions[0].value, 2.0, 1e-9);

  jobs[0].cpu_quota = 0.15;
  actions = controller.evaluate(kNow, devices, jobs, ledger);
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].kind, ThrottleAction::Kind::pause);
}

TEST(ThrottleControllerTest, without_any_control_an_over_cap_job_is_paused_and_the_band_between_does_nothing) {
  ThrottleController controller(capped(100.0));
  std::vector<DeviceStatus> devices = {device("cpu", 120.0)};
  std::vector<RunningJob> jobs = {running("a", 0)};
  BudgetLedger ledger;
  EXPECT_EQ(controller.evaluate(kNow, devices, jobs, ledger).at(0).kind, ThrottleAction::Kind::pause);
  jobs[0].paused = true;
  devices[0].average_power_watts = 95.0;  // under the cap, above 90 %: hold
  EXPECT_TRUE(controller.evaluate(kNow, devices, jobs, ledger).empty());
}

TEST(ThrottleControllerTest, a_projected_budget_overrun_pauses_a_job_until_it_fits_again) {
  Policy policy;
  policy.budgets.push_back(
      EnergyBudget{"daily", ScopeTarget{Scope::cluster, ""}, 1000.0, BudgetWindow{BudgetWindow::Kind::day}});
  ThrottleController controller(policy);
  BudgetLedger ledger;
  ledger.set_budgets(policy.budgets);
  std::vector<DeviceStatus> devices = {device("cpu", 50.0), device("gpu", 50.0)};
  ledger.reserve("a", devices[0].ref, {});
  ledger.reserve("b", devices[1].ref, {});
  // Both ran longer than estimated: 300 J each so far and 400 J each still to come.
  const auto still = EnergyDistribution::from_std(400.0, 40.0);
  ledger.update_running("a", kNow - 60'000, kNow, 300.0, still);
  ledger.update_running("b", kNow - 60'000, kNow, 300.0, still);
  auto a = running("a", 0, 1);
  auto b = running("b", 1, 0);
  a.still_expected = b.still_expected = still;
  std::vector<RunningJob> jobs = {a, b};
  auto actions = controller.evaluate(kNow, devices, jobs, ledger);
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].kind, ThrottleAction::Kind::pause);
  EXPECT_EQ(actions[0].job, "b");

  jobs[1].paused = true;  // a alone fits: 600 + 400 ≈ 1000 is not more likely than not to overrun
  EXPECT_TRUE(controller.evaluate(kNow, devices, jobs, ledger).empty());

  // A new day: the budget has room again.
  const UnixMillis tomorrow = parse_rfc3339("2026-11-27T00:10:00Z").value();
  actions = controller.evaluate(tomorrow, devices, jobs, ledger);
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].kind, ThrottleAction::Kind::resume);
  EXPECT_EQ(actions[0].job, "b");
}

TEST(ThrottleControllerTest, a_battery_near_its_floor_pauses_its_jobs_and_charging_resumes_them) {
  Policy policy;
  policy.battery_floors.push_back(BatteryFloor{"solar", ScopeTarget{Scope::node, "jetson"}, 30.0, 5.0});
  ThrottleController controller(policy);
  std::vector<DeviceStatus> devices = {device("cuda:0", 10.0, "jetson"), device("cpu", 10.0, "server")};
  devices[0].battery_percent = 34.0;
  std::vector<RunningJob> jobs = {running("edge", 0), running("rack", 1)};
  BudgetLedger ledger;
  auto actions = controller.evaluate(kNow, devices, jobs, ledger);
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].job, "edge");
  EXPECT_EQ(actions[0].kind, ThrottleAction::Kind::pause);

  jobs[0].paused = true;
  devices[0].battery_percent = 36.0;  // inside the hysteresis band
  EXPECT_TRUE(controller.evaluate(kNow, devices, jobs, ledger).empty());
  devices[0].battery_percent = 37.5;
  actions = controller.evaluate(kNow, devices, jobs, ledger);
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].kind, ThrottleAction::Kind::resume);
}

TEST(ThrottleControllerTest, a_rule_dropped_by_a_reload_lets_go_of_its_jobs) {
  ThrottleController controller(capped(100.0));
  std::vector<DeviceStatus> devices = {device("cpu", 120.0)};
  std::vector<RunningJob> jobs = {running("a", 0)};
  BudgetLedger ledger;
  ASSERT_EQ(controller.evaluate(kNow, devices, jobs, ledger).at(0).kind, ThrottleAction::Kind::pause);
  jobs[0].paused = true;
  controller.set_policy(Policy{});
  const auto actions = controller.evaluate(kNow, devices, jobs, ledger);
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].kind, ThrottleAction::Kind::resume);
  EXPECT_EQ(actions[0].reason, "cap is no longer in the policy");
}

}  // namespace
}  // namespace joule::schedulers
