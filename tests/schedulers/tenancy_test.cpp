// Projects, quotas and their budgets in the scheduling core: what each owner and project has
// queued and running, placement holding a job whose owner or project runs all its quota allows,
// fair share, and owners' and projects' energy budgets.
#include <cmath>
#include <map>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "joule/schedulers/scheduling_core.hpp"

namespace joule::schedulers {
namespace {

const UnixMillis kNow = parse_rfc3339("2026-11-29T10:00:00Z").value();

std::vector<DeviceStatus> free_devices(std::size_t count) {
  std::vector<DeviceStatus> devices;
  for (std::size_t d = 0; d < count; ++d) {
    DeviceStatus status;
    status.ref = DeviceRef{"n1", fmt::format("sim:{}", d), {}};
    devices.push_back(std::move(status));
  }
  return devices;
}

// A job of `owner` in `project` that may run on any of `devices` devices, equally dear on each.
PendingJob job(std::string id, std::string owner, std::string project = {}, std::size_t devices = 6) {
  PendingJob pending;
  pending.id = std::move(id);
  pending.owner = std::move(owner);
  pending.project = std::move(project);
  for (std::size_t d = 0; d < devices; ++d) pending.candidates.push_back(Candidate{d, Estimate{100, 10, 60}, {}, {}});
  return pending;
}

Policy quotas() {
  Policy policy;
  policy.tenancy.owner_quota.max_running_jobs = 2;
  policy.tenancy.owners.push_back(OwnerRule{"token:alice", "vision", Quota{std::nullopt, 1}});
  policy.tenancy.projects.push_back(Project{"vision", {"token:alice", "token:bob"}, Quota{std::nullopt, 2}});
  return policy;
}

std::map<std::string, WaitReason> waiting(const PassResult& pass) {
  std::map<std::string, WaitReason> out;
  for (const auto& [id, why] : pass.waiting) out[id] = why;
  return out;
}

std::vector<std::string> placed(const PassResult& pass) {
  std::vector<std::string> out;
  for (const auto& placement : pass.placements) out.push_back(placement.job);
  return out;
}

TEST(TenancyTest, a_job_without_a_project_gets_its_owners_default_else_the_default_project) {
  Tenancy tenancy;
  tenancy.default_project = "lab";
  tenancy.projects = {Project{"lab", {}, {}}, Project{"vision", {"token:alice"}, {}}};
  tenancy.owners = {OwnerRule{"token:alice", "vision", {}}};
  EXPECT_EQ(choose_project(tenancy, "token:alice", "").project, "vision");
  EXPECT_EQ(choose_project(tenancy, "uid:1000", "").project, "lab");
  EXPECT_EQ(choose_project(tenancy, "uid:1000", "lab").error, "");
  EXPECT_EQ(choose_project(tenancy, "uid:1000", "vision").error, "uid:1000 is not one of project \"vision\"'s owners");
  EXPECT_EQ(choose_project(tenancy, "uid:1000", "visoin").error, "\"visoin\" is not a project; uid:1000 may use: lab");
  EXPECT_EQ(choose_project(Tenancy{}, "uid:1000", "").project, "");
  EXPECT_EQ(choose_project(Tenancy{}, "uid:1000", "lab").error,
            "no projects are configured (policies.d [[projects]]), so a job may not name one; \"lab\" is not one");
  // A default project the owner may not use is that owner's error, not a way into it.
  tenancy.default_project = "vision";
  EXPECT_EQ(choose_project(tenancy, "uid:1000", "").error,
            "uid:1000 may not use the default project \"vision\": name a project it belongs to");
}

TEST(TenancyTest, the_core_counts_each_owners_and_projects_queued_and_running_jobs_through_every_change) {
  SchedulingCore core(quotas());
  core.enqueue(job("a1", "token:alice", "vision"), 1);
  core.enqueue(job("a2", "token:alice", "vision"), 2);
  core.enqueue(job("b1", "token:bob"), 3);
  EXPECT_EQ(core.owner_use("token:alice").queued, 2u);
  EXPECT_EQ(core.project_use("vision").queued, 2u);
  EXPECT_EQ(core.owner_use("token:bob").queued, 1u);
  core.dequeue("b1");  // cancelled
  EXPECT_EQ(core.owner_use("token:bob").queued, 0u);
  core.enqueue(job("a2", "token:alice", "vision"), 4);  // queued again under the same id: counted once
  EXPECT_EQ(core.owner_use("token:alice").queued, 2u);

  const PassResult pass = core.place(kNow, free_devices(6));
  EXPECT_EQ(placed(pass), (std::vector<std::string>{"a1"}));
  EXPECT_EQ(core.owner_use("token:alice").queued, 1u);
  EXPECT_EQ(core.owner_use("token:alice").running, 1u);
  EXPECT_EQ(core.project_use("vision").running, 1u);

  // A run the core did not place (recovered at start, reported by an agent) counts too.
  TrackedRun adopted;
  adopted.id = "b2";
  adopted.owner = "token:bob";
  adopted.project = "vision";
  core.track_run(adopted, DeviceRef{"n1", "sim:2", {}});
  EXPECT_EQ(core.project_use("vision").running, 2u);
  core.end("a1", std::nullopt);
  core.end("b2", std::nullopt);
  core.end("b2", std::nullopt);  // twice: nothing more
  EXPECT_EQ(core.owner_use("token:alice").running, 0u);
  EXPECT_EQ(core.project_use("vision").running, 0u);
  EXPECT_EQ(core.owner_use("token:bob").running, 0u);
  // A running job queued again (its node was lost) is queued, not running.
  const PassResult again = core.place(kNow + 1000, free_devices(6));
  EXPECT_EQ(placed(again), (std::vector<std::string>{"a2"}));
  core.enqueue(job("a2", "token:alice", "vision"), 5);
  EXPECT_EQ(core.owner_use("token:alice").running, 0u);
  EXPECT_EQ(core.owner_use("token:alice").queued, 1u);
}

TEST(TenancyTest, a_job_whose_owner_or_project_runs_its_quota_waits_and_others_run_past_it) {
  SchedulingCore core(quotas(), 0, CoreOptions{.continue_within_ms = 0});
  core.enqueue(job("a1", "token:alice", "vision"), 1);
  core.enqueue(job("a2", "token:alice", "vision"), 2);  // alice may run 1
  core.enqueue(job("b1", "token:bob", "vision"), 3);
  core.enqueue(job("b2", "token:bob", "vision"), 4);  // vision may run 2
  core.enqueue(job("c1", "uid:1000"), 5);
  core.enqueue(job("c2", "uid:1000"), 6);
  core.enqueue(job("c3", "uid:1000"), 7);  // every other owner may run 2
  PassResult pass = core.place(kNow, free_devices(6));
  EXPECT_EQ(placed(pass), (std::vector<std::string>{"a1", "b1", "c1", "c2"}));
  auto why = waiting(pass);
  ASSERT_TRUE(why.contains("a2"));
  EXPECT_EQ(why["a2"].kind, WaitReason::Kind::quota);
  EXPECT_EQ(why["a2"].rule, "owner token:alice");
  EXPECT_EQ(why["a2"].message, "owner token:alice runs 1 job, as many as its quota allows (max_running_jobs = 1)");
  EXPECT_EQ(why["a2"].limit, 1.0);
  EXPECT_EQ(why["b2"].rule, "project vision");
  EXPECT_EQ(why["c3"].message, "owner uid:1000 runs 2 jobs, as many as its quota allows (max_running_jobs = 2)");
  EXPECT_EQ(to_string(why["c3"].kind), "quota");

  // Alice's job ends: her next one runs; the project is full again.
  core.end("a1", std::nullopt);
  auto devices = free_devices(6);
  for (std::size_t d : {1, 2, 3}) devices[d].busy = true;
  pass = core.place(kNow + 1000, devices);
  EXPECT_EQ(placed(pass), (std::vector<std::string>{"a2"}));
  EXPECT_EQ(waiting(pass)["b2"].rule, "project vision");

  // A reload without quotas lets the rest run.
  core.set_policy(Policy{});
  devices[0].busy = true;
  pass = core.place(kNow + 2000, devices);
  EXPECT_EQ(placed(pass), (std::vector<std::string>{"b2", "c3"}));
}

TEST(TenancyTest, submissions_that_continue_a_pass_count_the_jobs_it_placed) {
  SchedulingCore core(quotas());  // continued passes on
  core.enqueue(job("c1", "uid:1000"), 1);
  PassResult pass = core.place(kNow, free_devices(6));
  EXPECT_EQ(placed(pass), (std::vector<std::string>{"c1"}));
  auto devices = free_devices(6);
  devices[0].busy = true;  // as the driver now tells it
  core.enqueue(job("c2", "uid:1000"), 2);
  pass = core.place(kNow + 10, devices);
  EXPECT_TRUE(pass.continued);
  EXPECT_EQ(placed(pass), (std::vector<std::string>{"c2"}));
  devices[1].busy = true;
  core.enqueue(job("c3", "uid:1000"), 3);
  pass = core.place(kNow + 20, devices);
  EXPECT_TRUE(pass.continued);
  EXPECT_TRUE(pass.placements.empty());
  EXPECT_EQ(waiting(pass)["c3"].kind, WaitReason::Kind::quota);
}

// Runs `job` on device 0 and ends it having used `joules` at `end`: its owner's recent use.
void ran(SchedulingCore& core, PendingJob job, double joules, UnixMillis end) {
  static std::int64_t sequence = 1000;
  const std::string id = job.id;
  core.enqueue(std::move(job), ++sequence);
  std::vector<DeviceStatus> devices = free_devices(6);
  for (std::size_t d = 1; d < devices.size(); ++d) devices[d].accepts_work = false;
  ASSERT_EQ(placed(core.place(end - 60'000, devices)), std::vector<std::string>{id});
  core.end(id, EnergyUse{devices[0].ref, id, end - 60'000, end, joules, "rapl"});
}

// One device: which of the queued jobs a pass places first.
std::string first_placed(SchedulingCore& core, UnixMillis now) {
  std::vector<DeviceStatus> devices = free_devices(6);
  for (std::size_t d = 1; d < devices.size(); ++d) devices[d].accepts_work = false;
  const PassResult pass = core.place(now, devices);
  return pass.placements.empty() ? "" : pass.placements.front().job;
}

TEST(TenancyTest, fair_share_puts_the_owner_who_used_less_lately_first_among_equal_priorities) {
  Policy policy;
  policy.tenancy.usage_half_life_seconds = 3600;
  SchedulingCore core(policy, 0, CoreOptions{.continue_within_ms = 0});
  ran(core, job("old", "token:alice"), 5000.0, kNow);  // Alice used 5 kJ just now; Bob nothing
  EXPECT_DOUBLE_EQ(core.recent_joules_of_owner("token:alice", kNow), 5000.0);
  EXPECT_NEAR(core.recent_joules_of_owner("token:alice", kNow + 3'600'000), 2500.0, 1e-9);  // one half-life
  core.enqueue(job("a1", "token:alice"), 1);
  core.enqueue(job("b1", "token:bob"), 2);
  const std::vector<const PendingJob*> queued{core.pending("a1"), core.pending("b1")};
  const auto factors = core.fair_share_factors(queued, kNow);
  EXPECT_DOUBLE_EQ(factors[0], 0.25);  // all the use, half the shares: 2^-2
  EXPECT_DOUBLE_EQ(factors[1], 1.0);
  EXPECT_EQ(first_placed(core, kNow), "b1");  // submitted after Alice's, placed before it

  // Priority still counts before fair share.
  SchedulingCore urgent(policy, 0, CoreOptions{.continue_within_ms = 0});
  ran(urgent, job("old", "token:alice"), 5000.0, kNow);
  auto important = job("a1", "token:alice");
  important.priority = 5;
  urgent.enqueue(important, 1);
  urgent.enqueue(job("b1", "token:bob"), 2);
  EXPECT_EQ(first_placed(urgent, kNow), "a1");

  // Ten half-lives on, Alice's use has faded: submission order again.
  SchedulingCore later(policy, 0, CoreOptions{.continue_within_ms = 0});
  ran(later, job("old", "token:alice"), 5000.0, kNow);
  later.enqueue(job("a1", "token:alice"), 1);
  later.enqueue(job("b1", "token:bob"), 2);
  EXPECT_EQ(first_placed(later, kNow + 40 * 3'600'000), "a1");

  // Off: submission order whatever was used.
  policy.tenancy.fair_share = false;
  SchedulingCore fifo(policy, 0, CoreOptions{.continue_within_ms = 0});
  ran(fifo, job("old", "token:alice"), 5000.0, kNow);
  fifo.enqueue(job("a1", "token:alice"), 1);
  fifo.enqueue(job("b1", "token:bob"), 2);
  EXPECT_EQ(first_placed(fifo, kNow), "a1");
}

TEST(TenancyTest, a_projects_shares_weigh_its_use_in_fair_share) {
  Policy policy;
  policy.tenancy.projects = {Project{"vision", {}, {}, 3.0}, Project{"nlp", {}, {}, 1.0}};
  SchedulingCore core(policy, 0, CoreOptions{.continue_within_ms = 0});
  // The same use by each project (and each owner); vision holds three times the shares.
  ran(core, job("v0", "token:alice", "vision"), 1000.0, kNow);
  ran(core, job("n0", "token:bob", "nlp"), 1000.0, kNow);
  core.enqueue(job("n1", "token:bob", "nlp"), 1);
  core.enqueue(job("v1", "token:alice", "vision"), 2);
  const std::vector<const PendingJob*> queued{core.pending("n1"), core.pending("v1")};
  const auto factors = core.fair_share_factors(queued, kNow);
  EXPECT_NEAR(factors[0], 0.5 * std::exp2(-0.5 / 0.25), 1e-12);  // owner 2^-1, project 2^-(0.5/0.25)
  EXPECT_NEAR(factors[1], 0.5 * std::exp2(-0.5 / 0.75), 1e-12);
  EXPECT_EQ(first_placed(core, kNow), "v1");
}

// ---- Owners' and projects' energy budgets: the ledger counts each one's jobs apart (used, running
// so far, reserved), placement holds a job that would overrun its own budget while others run,
// and the throttle controller pauses only the jobs a budget counts.

const UnixMillis kHalfMinuteIn = kNow + 30'000;  // short uses of one minute merge in the ledger

// `pending` at `joules` on every device.
PendingJob dear(PendingJob pending, double joules) {
  for (auto& candidate : pending.candidates) candidate.estimate->joules_mean = joules;
  return pending;
}

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
  EnergyUse out{device("cpu"), std::move(work), kHalfMinuteIn - 20'000, kHalfMinuteIn - 10'000, joules, "rapl"};
  out.owner = std::move(owner);
  out.project = std::move(project);
  return out;
}

TEST(TenancyTest, an_owners_or_projects_budget_counts_only_their_jobs_used_running_and_reserved) {
  BudgetLedger ledger;
  ledger.set_budgets({budget("all", 10'000, "", ""), budget("vision", 1'000, "", "vision"),
                      budget("alice", 500, "token:alice", ""), budget("alice-vision", 400, "token:alice", "vision")});
  ledger.record(use("probe", 100, "", ""));  // probes count in everyone's budgets only
  ledger.record(use("b1", 300, "token:bob", "vision"));
  ledger.record(use("a1", 200, "token:alice", "vision"));
  ledger.record(use("a2", 50, "token:alice", "vision"));  // the same minute, owner and project: one use
  EXPECT_EQ(ledger.uses(), 3u);
  auto states = by_name(ledger.states(kHalfMinuteIn));
  EXPECT_DOUBLE_EQ(states["all"].spent, 650);
  EXPECT_DOUBLE_EQ(states["vision"].spent, 550);
  EXPECT_DOUBLE_EQ(states["alice"].spent, 250);
  EXPECT_DOUBLE_EQ(states["alice-vision"].spent, 250);

  // Alice's job in another project: reserved, then running, then ended with a metered use that
  // names no owner (as a meter's does): the reservation's owner and project are its.
  ledger.reserve("a3", device("cuda:0"), EnergyDistribution::from_std(100, 10), "token:alice", "lab");
  states = by_name(ledger.states(kHalfMinuteIn));
  EXPECT_DOUBLE_EQ(states["all"].reserved.mean_joules, 100);
  EXPECT_DOUBLE_EQ(states["alice"].reserved.mean_joules, 100);
  EXPECT_DOUBLE_EQ(states["vision"].reserved.mean_joules, 0);
  EXPECT_DOUBLE_EQ(states["alice-vision"].reserved.mean_joules, 0);
  ledger.update_running("a3", kHalfMinuteIn - 5'000, kHalfMinuteIn, 40, EnergyDistribution::from_std(60, 10));
  states = by_name(ledger.states(kHalfMinuteIn));
  EXPECT_DOUBLE_EQ(states["alice"].spent, 290);
  EXPECT_DOUBLE_EQ(states["vision"].spent, 550);
  const auto settled =
      ledger.settle("a3", EnergyUse{device("cuda:0"), "a3", kHalfMinuteIn - 5'000, kHalfMinuteIn, 90, "nvml"});
  ASSERT_TRUE(settled);
  EXPECT_EQ(settled->owner, "token:alice");
  EXPECT_EQ(settled->project, "lab");
  states = by_name(ledger.states(kHalfMinuteIn));
  EXPECT_DOUBLE_EQ(states["all"].spent, 740);
  EXPECT_DOUBLE_EQ(states["alice"].spent, 340);
  EXPECT_DOUBLE_EQ(states["alice"].reserved.mean_joules, 0);
  EXPECT_DOUBLE_EQ(states["alice-vision"].spent, 250);
  EXPECT_EQ(states["alice-vision"].budget.describe_scope(), "owner token:alice in project vision on the cluster");
  EXPECT_EQ(states["vision"].budget.describe_scope(), "project vision on the cluster");
}

TEST(TenancyTest, a_job_that_would_overrun_its_projects_budget_waits_naming_it_while_other_projects_run) {
  Policy policy;
  policy.budgets.push_back(budget("vision-day", 250, "", "vision"));
  SchedulingCore core(policy, 0, CoreOptions{.continue_within_ms = 0});
  core.enqueue(job("v1", "token:alice", "vision"), 1);
  core.enqueue(job("v2", "token:bob", "vision"), 2);
  core.enqueue(job("v3", "token:alice", "vision"), 3);
  core.enqueue(job("l1", "token:alice", "lab"), 4);
  PassResult pass = core.place(kHalfMinuteIn, free_devices(6));
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
  EXPECT_DOUBLE_EQ(core.ledger().states(kHalfMinuteIn).at(0).reserved.mean_joules, 200);

  // A vision job larger than the whole budget can never run: said at once, naming the project.
  const auto never = core.never_fits(kHalfMinuteIn, free_devices(6), dear(job("v4", "token:bob", "vision"), 400));
  ASSERT_TRUE(never);
  EXPECT_EQ(never->rule, "vision-day");
  EXPECT_NE(never->message.find("budget vision-day (project vision on the cluster: 250 J per calendar day)"),
            std::string::npos)
      << never->message;
  EXPECT_FALSE(core.never_fits(kHalfMinuteIn, free_devices(6), dear(job("l2", "token:bob", "lab"), 400)));
}

TEST(TenancyTest, a_budget_for_each_owner_gives_every_owner_one_of_their_own_as_they_come) {
  Policy policy;
  EnergyBudget each = budget("each-day", 150, "", "");
  each.each_owner = true;
  policy.budgets.push_back(each);
  policy.budgets.push_back(budget("all", 10'000, "", ""));
  SchedulingCore core(policy, 0, CoreOptions{.continue_within_ms = 0});
  core.enqueue(job("a1", "token:alice"), 1);
  core.enqueue(job("a2", "token:alice"), 2);
  core.enqueue(job("b1", "token:bob"), 3);
  const PassResult pass = core.place(kHalfMinuteIn, free_devices(6));
  std::vector<std::string> placed;
  for (const auto& placement : pass.placements) placed.push_back(placement.job);
  EXPECT_EQ(placed, (std::vector<std::string>{"a1", "b1"}));  // bob's job counts in his budget, not alice's
  ASSERT_EQ(pass.waiting.size(), 1u);
  EXPECT_EQ(pass.waiting[0].first, "a2");
  EXPECT_EQ(pass.waiting[0].second.rule, "each-day (token:alice)");
  EXPECT_NE(pass.waiting[0].second.message.find("owner token:alice on the cluster"), std::string::npos)
      << pass.waiting[0].second.message;
  auto states = by_name(core.ledger().states(kHalfMinuteIn));
  ASSERT_EQ(states.size(), 3u);  // alice's, bob's and everyone's
  EXPECT_DOUBLE_EQ(states["each-day (token:alice)"].reserved.mean_joules, 100);
  EXPECT_DOUBLE_EQ(states["each-day (token:bob)"].reserved.mean_joules, 100);
  EXPECT_DOUBLE_EQ(states["all"].reserved.mean_joules, 200);
  // A reload keeps every owner's budget, with what they used.
  core.set_policy(policy);
  states = by_name(core.ledger().states(kHalfMinuteIn));
  EXPECT_DOUBLE_EQ(states["each-day (token:bob)"].reserved.mean_joules, 100);
  EXPECT_EQ(budgets_for_owners(policy.budgets, {"uid:1", ""}).size(), 2u);  // uid:1's, and everyone's
}

TEST(TenancyTest, a_projects_projected_overrun_pauses_its_own_running_job_not_another_projects) {
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
  ledger.update_running("lab", kHalfMinuteIn - 60'000, kHalfMinuteIn, 600, still);
  ledger.update_running("vision", kHalfMinuteIn - 60'000, kHalfMinuteIn, 600, still);
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
  const auto actions = controller.evaluate(kHalfMinuteIn, devices, std::vector<RunningJob>{lab, vision}, ledger);
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].kind, ThrottleAction::Kind::pause);
  EXPECT_EQ(actions[0].job, "vision");  // the lower-priority lab job is not the project's
  EXPECT_EQ(actions[0].rule, "vision-day");
}

}  // namespace
}  // namespace joule::schedulers
