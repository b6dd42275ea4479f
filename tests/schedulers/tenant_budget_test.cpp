// Owners' and projects' energy budgets: the ledger counts each one's jobs apart (used, running so
// far, reserved), placement holds a job that would overrun its own budget while others run, and
// the throttle controller pauses only the jobs a budget counts.
#include <map>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "joule/schedulers/scheduling_core.hpp"

namespace joule::schedulers {
namespace {

const UnixMillis kNow = parse_rfc3339("2026-11-29T10:00:30Z").value();

DeviceRef device(std::string name) { return DeviceRef{"n1", std::move(name), {}}; }

EnergyBudget budget(std::string name, double joules, std::string owner, std::string project) {
  EnergyBudget out{std::move(name), ScopeTarget{Scope::cluster, ""}, joules, BudgetWindow{BudgetWindow::Kind::day}};
  out.owner = std::move(owner);
  out.project = std::move(project);
  return out;
}

std::map<std::string, BudgetState> by_name(const std::vector<BudgetState>& states) {
  std::map<std::string, BudgetState> out;
  for (const auto& state : states) out[state.budget.name] = state;
  return out;
}

EnergyUse use(std::string work, double joules, std::string owner, std::string project) {
  EnergyUse out{device("cpu"), std::move(work), kNow - 20'000, kNow - 10'000, joules, "rapl"};
  out.owner = std::move(owner);
  out.project = std::move(project);
  return out;
}

TEST(TenantBudgetTest, an_owners_or_projects_budget_counts_only_their_jobs_used_running_and_reserved) {
  BudgetLedger ledger;
  ledger.set_budgets({budget("all", 10'000, "", ""), budget("vision", 1'000, "", "vision"),
                      budget("alice", 500, "token:alice", ""), budget("alice-vision", 400, "token:alice", "vision")});
  ledger.record(use("probe", 100, "", ""));  // probes count in everyone's budgets only
  ledger.record(use("b1", 300, "token:bob", "vision"));
  ledger.record(use("a1", 200, "token:alice", "vision"));
  ledger.record(use("a2", 50, "token:alice", "vision"));  // the same minute, owner and project: one use
  EXPECT_EQ(ledger.uses(), 3u);
  auto states = by_name(ledger.states(kNow));
  EXPECT_DOUBLE_EQ(states["all"].spent_joules, 650);
  EXPECT_DOUBLE_EQ(states["vision"].spent_joules, 550);
  EXPECT_DOUBLE_EQ(states["alice"].spent_joules, 250);
  EXPECT_DOUBLE_EQ(states["alice-vision"].spent_joules, 250);

  // Alice's job in another project: reserved, then running, then ended with a metered use that
  // names no owner (as a meter's does): the reservation's owner and project are its.
  ledger.reserve("a3", device("cuda:0"), EnergyDistribution::from_std(100, 10), "token:alice", "lab");
  states = by_name(ledger.states(kNow));
  EXPECT_DOUBLE_EQ(states["all"].reserved.mean_joules, 100);
  EXPECT_DOUBLE_EQ(states["alice"].reserved.mean_joules, 100);
  EXPECT_DOUBLE_EQ(states["vision"].reserved.mean_joules, 0);
  EXPECT_DOUBLE_EQ(states["alice-vision"].reserved.mean_joules, 0);
  ledger.update_running("a3", kNow - 5'000, kNow, 40, EnergyDistribution::from_std(60, 10));
  states = by_name(ledger.states(kNow));
  EXPECT_DOUBLE_EQ(states["alice"].spent_joules, 290);
  EXPECT_DOUBLE_EQ(states["vision"].spent_joules, 550);
  const auto settled = ledger.settle("a3", EnergyUse{device("cuda:0"), "a3", kNow - 5'000, kNow, 90, "nvml"});
  ASSERT_TRUE(settled);
  EXPECT_EQ(settled->owner, "token:alice");
  EXPECT_EQ(settled->project, "lab");
  states = by_name(ledger.states(kNow));
  EXPECT_DOUBLE_EQ(states["all"].spent_joules, 740);
  EXPECT_DOUBLE_EQ(states["alice"].spent_joules, 340);
  EXPECT_DOUBLE_EQ(states["alice"].reserved.mean_joules, 0);
  EXPECT_DOUBLE_EQ(states["alice-vision"].spent_joules, 250);
  EXPECT_EQ(states["alice-vision"].budget.describe_scope(), "owner token:alice in project vision on the cluster");
  EXPECT_EQ(states["vision"].budget.describe_scope(), "project vision on the cluster");
}

std::vector<DeviceStatus> free_devices(std::size_t count) {
  std::vector<DeviceStatus> devices;
  for (std::size_t d = 0; d < count; ++d) {
    DeviceStatus status;
    status.ref = DeviceRef{"n1", fmt::format("sim:{}", d), {}};
    devices.push_back(std::move(status));
  }
  return devices;
}

PendingJob job(std::string id, std::string owner, std::string project, double joules = 100) {
  PendingJob pending;
  pending.id = std::move(id);
  pending.owner = std::move(owner);
  pending.project = std::move(project);
  for (std::size_t d = 0; d < 4; ++d) pending.candidates.push_back(Candidate{d, Estimate{joules, 5, 60}, {}, {}});
  return pending;
}

TEST(TenantBudgetTest, a_job_that_would_overrun_its_projects_budget_waits_naming_it_while_other_projects_run) {
  Policy policy;
  policy.budgets.push_back(budget("vision-day", 250, "", "vision"));
  SchedulingCore core(policy, 0, CoreOptions{.continue_within_ms = 0});
  core.enqueue(job("v1", "token:alice", "vision"), 1);
  core.enqueue(job("v2", "token:bob", "vision"), 2);
  core.enqueue(job("v3", "token:alice", "vision"), 3);
  core.enqueue(job("l1", "token:alice", "lab"), 4);
  PassResult pass = core.place(kNow, free_devices(4));
  std::vector<std::string> placed;
  for (const auto& placement : pass.placements) placed.push_back(placement.job);
  EXPECT_EQ(placed, (std::vector<std::string>{"v1", "v2", "l1"}));
  ASSERT_EQ(pass.waiting.size(), 1u);
  const WaitReason& why = pass.waiting[0].second;
  EXPECT_EQ(pass.waiting[0].first, "v3");
  EXPECT_EQ(why.kind, WaitReason::Kind::budget);
  EXPECT_EQ(why.rule, "vision-day");
  EXPECT_NE(why.message.find("budget vision-day (project vision on the cluster, calendar day)"), std::string::npos)
      << why.message;
  EXPECT_DOUBLE_EQ(*why.limit, 250);
  // Only the project's jobs are reserved against it.
  EXPECT_DOUBLE_EQ(core.ledger().states(kNow).at(0).reserved.mean_joules, 200);

  // A vision job larger than the whole budget can never run: said at once, naming the project.
  const auto never = core.never_fits(kNow, free_devices(4), job("v4", "token:bob", "vision", 400));
  ASSERT_TRUE(never);
  EXPECT_EQ(never->rule, "vision-day");
  EXPECT_NE(never->message.find("budget vision-day (project vision on the cluster: 250 J per calendar day)"),
            std::string::npos)
      << never->message;
  EXPECT_FALSE(core.never_fits(kNow, free_devices(4), job("l2", "token:bob", "lab", 400)));
}

TEST(TenantBudgetTest, a_projects_projected_overrun_pauses_its_own_running_job_not_another_projects) {
  Policy policy;
  policy.budgets.push_back(budget("vision-day", 1'000, "", "vision"));
  ThrottleController controller(policy);
  BudgetLedger ledger;
  ledger.set_budgets(policy.budgets);
  std::vector<DeviceStatus> devices = free_devices(2);
  for (auto& status : devices) status.busy = true;
  const auto still = EnergyDistribution::from_std(800, 40);
  ledger.reserve("lab", devices[0].ref, {}, "token:bob", "lab");
  ledger.reserve("vision", devices[1].ref, {}, "token:alice", "vision");
  ledger.update_running("lab", kNow - 60'000, kNow, 600, still);
  ledger.update_running("vision", kNow - 60'000, kNow, 600, still);
  auto running = [&](std::string id, std::size_t on, int priority, std::string owner, std::string project) {
    RunningJob out;
    out.id = std::move(id);
    out.device = on;
    out.priority = priority;
    out.owner = std::move(owner);
    out.project = std::move(project);
    out.still_expected = still;
    return out;
  };
  const RunningJob lab = running("lab", 0, -5, "token:bob", "lab");
  const RunningJob vision = running("vision", 1, 0, "token:alice", "vision");
  const auto actions = controller.evaluate(kNow, devices, std::vector<RunningJob>{lab, vision}, ledger);
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].kind, ThrottleAction::Kind::pause);
  EXPECT_EQ(actions[0].job, "vision");  // the lower-priority lab job is not the project's
  EXPECT_EQ(actions[0].rule, "vision-day");
}

}  // namespace
}  // namespace joule::schedulers
