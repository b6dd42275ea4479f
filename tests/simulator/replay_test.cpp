// The replay on hand-made worlds whose every figure can be checked by hand.

#include "joule/simulator/replay.hpp"

#include <map>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "example_models.hpp"
#include "joule/simulator/report.hpp"

namespace joule::simulator {
namespace {

using schedulers::UnixMillis;

const UnixMillis kStart = schedulers::parse_rfc3339("2026-11-26T00:00:00Z").value();
constexpr double kHour = 3600.0;

// A job's cost on a device: the estimate is exact (std 0), so every decision is hand-checkable.
JobCost on(std::size_t device, double joules, double seconds) {
  JobCost cost;
  cost.device = device;
  cost.estimate = schedulers::Estimate{joules, 0.0, seconds};
  cost.flops_joules = joules;
  cost.truth = TrueCost{joules, seconds};
  return cost;
}

SimJob job(std::string id, double at_seconds, std::vector<JobCost> costs) {
  SimJob out;
  out.id = out.name = std::move(id);
  out.submit = kStart + static_cast<UnixMillis>(at_seconds * 1000.0);
  out.costs = std::move(costs);
  return out;
}

World world_of(std::vector<std::string> devices, std::vector<SimJob> jobs) {
  World world;
  world.start = kStart;
  world.nodes.push_back(SimNode{"n1", std::nullopt, std::nullopt});
  for (auto& name : devices) world.devices.push_back(SimDevice{{"n1", name, {}}, 0, "test", 0.0});
  world.jobs = std::move(jobs);
  return world;
}

PolicyRun min_energy(schedulers::Policy policy = {}) {
  return PolicyRun{"min-energy", policy, Knowledge::estimates, true};
}

PolicyRun fifo(schedulers::Policy policy = {}) {
  policy.objective = schedulers::Objective::fifo;
  policy.admission = false;
  return PolicyRun{"fifo", policy, Knowledge::none, false};
}

schedulers::Policy with_budget(double joules, schedulers::BudgetWindow window) {
  schedulers::Policy policy;
  policy.budgets.push_back(schedulers::EnergyBudget{"b", {schedulers::Scope::cluster, ""}, joules, window});
  return policy;
}

// A battery node with one device, and a floor at 40 % (throttling from 45 %).
World battery_world(std::optional<SolarSpec> solar) {
  World world = world_of({"a"}, {job("j1", 0, {on(0, 2100.0, 210.0)})});
  world.nodes[0].battery = BatterySpec{1.0, 100.0};  // 3600 J
  world.nodes[0].solar = solar;
  return world;
}
schedulers::Policy battery_floor() {
  schedulers::Policy policy;
  policy.battery_floors.push_back({"floor", {schedulers::Scope::node, "n1"}, 40.0, 5.0});
  return policy;
}

nlohmann::json deterministic(const PolicyMetrics& metrics) {
  nlohmann::json json = to_json(metrics);
  json.erase("wall_seconds");
  json["placement"].erase("placer_wall_seconds");
  json["placement"].erase("passes_per_second");
  return json;
}

}  // namespace

TEST(ReplayTest, min_energy_waits_for_the_efficient_device_and_the_figures_add_up) {
  // j1 and j2 at t=0 cost 100 J on a and 300 J on b (10 s each); j3 at t=5 runs on a only.
  const World world =
      world_of({"a", "b"}, {job("j1", 0, {on(0, 100, 10), on(1, 300, 10)}),
                            job("j2", 0, {on(0, 100, 10), on(1, 300, 10)}), job("j3", 5, {on(0, 100, 10)})});
  // min-energy: everything on a, one after the other: starts at 0, 10, 20.
  const PolicyMetrics m = replay(world, min_energy());
  EXPECT_EQ(m.completed, 3u);
  EXPECT_DOUBLE_EQ(m.energy_joules, 300.0);
  EXPECT_DOUBLE_EQ(m.energy_per_completed_job_joules, 100.0);
  EXPECT_DOUBLE_EQ(m.makespan_seconds, 30.0);
  EXPECT_DOUBLE_EQ(m.wait_mean_seconds, (0.0 + 10.0 + 15.0) / 3.0);
  EXPECT_DOUBLE_EQ(m.wait_p95_seconds, 14.5);  // linear between the ranked waits 10 and 15
  EXPECT_EQ(m.devices.at("n1/a").jobs, 3u);
  EXPECT_DOUBLE_EQ(m.devices.at("n1/a").busy_seconds, 30.0);
  EXPECT_EQ(m.devices.at("n1/b").jobs, 0u);
  EXPECT_EQ(m.end_reason, "all jobs done");
  EXPECT_TRUE(m.violations.empty());

  // fifo: j1 on a, j2 on b at once; j3 waits for a until t=10.
  const PolicyMetrics f = replay(world, fifo());
  EXPECT_DOUBLE_EQ(f.energy_joules, 500.0);
  EXPECT_DOUBLE_EQ(f.makespan_seconds, 20.0);
  EXPECT_DOUBLE_EQ(f.wait_mean_seconds, 5.0 / 3.0);
  EXPECT_EQ(f.devices.at("n1/b").jobs, 1u);
}

TEST(ReplayTest, carbon_is_each_stretchs_energy_at_the_signals_mean_over_it) {
  // j1 runs 0-10 s and j2 10-20 s on a: 100 J each. The grid is 3.6e6 g/kWh (1 g per J) for
  // the first 15 s, then 0: j1 counts whole, j2 half.
  World world = world_of({"a"}, {job("j1", 0, {on(0, 100, 10)}), job("j2", 0, {on(0, 100, 10)})});
  world.carbon =
      schedulers::GridSignal::from_points({{kStart, 3.6e6}, {kStart + 15'000, 0.0}}, kStart + 60'000).value();
  const PolicyMetrics m = replay(world, min_energy());
  ASSERT_TRUE(m.carbon_grams);
  EXPECT_NEAR(*m.carbon_grams, 150.0, 1e-6);
  EXPECT_DOUBLE_EQ(m.joules_outside_carbon_signal, 0.0);
  // A signal that ends at 12 s leaves j2's energy out, counted apart.
  world.carbon = schedulers::GridSignal::from_points({{kStart, 3.6e6}}, kStart + 12'000).value();
  const PolicyMetrics short_signal = replay(world, min_energy());
  EXPECT_NEAR(*short_signal.carbon_grams, 100.0, 1e-6);
  EXPECT_DOUBLE_EQ(short_signal.joules_outside_carbon_signal, 100.0);
  world.carbon.reset();
  EXPECT_FALSE(replay(world, min_energy()).carbon_grams);
}

TEST(ReplayTest, carbon_only_holds_a_job_with_a_deadline_until_the_lowest_step_before_it) {
  // The grid is dirty for 100 s, clean from 100 s to 200 s, dirtier still after. j1 (deadline
  // 300 s) is held to 100 s; j2 has no deadline and runs at once; j3's deadline (50 s) leaves
  // it nothing to wait for.
  World world = world_of({"a", "b", "c"}, {job("j1", 0, {on(0, 100, 10)}), job("j2", 0, {on(1, 100, 10)}),
                                           job("j3", 0, {on(2, 100, 10)})});
  world.jobs[0].deadline = kStart + 300'000;
  world.jobs[2].deadline = kStart + 50'000;
  world.carbon = schedulers::GridSignal::from_points(
                     {{kStart, 400.0}, {kStart + 100'000, 50.0}, {kStart + 200'000, 500.0}}, kStart + 400'000)
                     .value();
  schedulers::Policy least_loaded;
  least_loaded.objective = schedulers::Objective::least_loaded;
  least_loaded.admission = false;
  PolicyRun only{"carbon-only", least_loaded, Knowledge::none, false};
  only.carbon_only = true;
  std::map<std::string, UnixMillis> started;
  ReplayOptions options;
  options.on_event = [&](UnixMillis at, const std::string& text) {
    if (text.starts_with("start ")) started[text.substr(6, 2)] = at - kStart;
  };
  const PolicyMetrics m = replay(world, only, options);
  EXPECT_EQ(m.completed, 3u);
  EXPECT_EQ(started["j1"], 100'000);
  EXPECT_EQ(started["j2"], 0);
  EXPECT_EQ(started["j3"], 0);
  EXPECT_EQ(m.deadline_misses, 0u);

  // With a signal, the standard runs add min-carbon beside min-energy, and carbon-only.
  std::vector<std::string> names;
  for (const auto& run : standard_runs(schedulers::Policy{}, true)) names.push_back(run.name);
  EXPECT_EQ(names, (std::vector<std::string>{"min-energy", "min-energy+knobs", "min-carbon", "fifo", "carbon-only",
                                             "round-robin", "least-loaded", "flops-greedy", "zeus-like", "oracle",
                                             "oracle+knobs"}));
}

TEST(ReplayTest, a_job_starts_no_earlier_than_its_not_before) {
  World world = world_of({"a"}, {job("j1", 0, {on(0, 100, 10)})});
  world.jobs[0].not_before = kStart + 30'000;
  const PolicyMetrics m = replay(world, min_energy());
  EXPECT_EQ(m.completed, 1u);
  EXPECT_DOUBLE_EQ(m.makespan_seconds, 40.0);
  EXPECT_DOUBLE_EQ(m.wait_mean_seconds, 30.0);
}

TEST(ReplayTest, a_deadline_sends_a_job_to_the_costlier_free_device) {
  SimJob late = job("j2", 0, {on(0, 100, 10), on(1, 300, 10)});
  late.deadline = kStart + 15'000;  // waiting for a would finish at 20 s
  const World world = world_of({"a", "b"}, {job("j1", 0, {on(0, 100, 10), on(1, 300, 10)}), late});
  const PolicyMetrics m = replay(world, min_energy());
  EXPECT_DOUBLE_EQ(m.energy_joules, 400.0);
  EXPECT_EQ(m.deadline_misses, 0u);
  EXPECT_DOUBLE_EQ(m.makespan_seconds, 10.0);
}

TEST(ReplayTest, calendar_budget_violations_count_windows_over_their_limit_with_energy_split_at_midnight) {
  // 100 J jobs at 00:00, 01:00 and 23:59:10 (half of it after midnight), a 150 J day budget.
  const World world = world_of({"a"}, {job("j1", 0, {on(0, 100, 100)}), job("j2", kHour, {on(0, 100, 100)}),
                                       job("j3", 86350, {on(0, 100, 100)})});
  const auto policy = with_budget(150.0, {schedulers::BudgetWindow::Kind::day});
  const PolicyMetrics f = replay(world, fifo(policy));
  ASSERT_EQ(f.violations.size(), 1u);  // day 1: 250 J; day 2: 50 J
  EXPECT_NEAR(f.violations[0].spent, 250.0, 1e-9);
  EXPECT_NEAR(f.max_overrun_joules, 100.0, 1e-9);
  EXPECT_EQ(f.violations[0].window_start, kStart);

  // Admission holds j2 until midnight and j3 until the day after: no window overrun.
  const PolicyMetrics m = replay(world, min_energy(policy));
  EXPECT_TRUE(m.violations.empty());
  EXPECT_EQ(m.completed, 3u);
  EXPECT_DOUBLE_EQ(m.energy_joules, 300.0);
  EXPECT_DOUBLE_EQ(m.makespan_seconds, 2 * 86400.0 + 100.0);
  EXPECT_DOUBLE_EQ(m.wait_mean_seconds, (0.0 + (86400.0 - kHour) + (2 * 86400.0 - 86350.0)) / 3.0);
}

TEST(ReplayTest, rolling_budget_violations_are_counted_once_per_episode) {
  // Two 100 J jobs 200 s apart overrun a 150 J hourly window once; a third, hours later, does not.
  const World world = world_of(
      {"a"}, {job("j1", 0, {on(0, 100, 100)}), job("j2", 200, {on(0, 100, 100)}), job("j3", 10000, {on(0, 100, 100)})});
  schedulers::BudgetWindow hourly{schedulers::BudgetWindow::Kind::rolling, 3600};
  const PolicyMetrics f = replay(world, fifo(with_budget(150.0, hourly)));
  ASSERT_EQ(f.violations.size(), 1u);
  EXPECT_NEAR(f.max_overrun_joules, 50.0, 1e-9);
  EXPECT_TRUE(replay(world, min_energy(with_budget(150.0, hourly))).violations.empty());
}

TEST(ReplayTest, a_throttle_pause_stops_progress_and_energy_until_the_battery_recovers) {
  ReplayOptions options;
  options.tick_seconds = 10.0;
  // 2100 J at 10 W from a 3600 J battery: at 200 s the charge is 44 %, within the 5-point margin
  // of the 40 % floor, so the job is paused with 100 J still to run. Without sun it never resumes.
  const PolicyMetrics dark = replay(battery_world(std::nullopt), min_energy(battery_floor()), options);
  EXPECT_EQ(dark.completed, 0u);
  EXPECT_EQ(dark.started_not_completed, 1u);
  EXPECT_NEAR(dark.energy_joules, 2000.0, 1e-6);
  EXPECT_EQ(dark.throttle_actions.at("pause"), 1u);
  EXPECT_NEAR(dark.battery_min_percent.at("n1"), 100.0 * 1600.0 / 3600.0, 1e-6);
  EXPECT_EQ(dark.end_reason, "nothing can progress");

  // With a panel, the morning sun brings the charge back over 47 % and the job finishes.
  const PolicyMetrics sunny = replay(battery_world(SolarSpec{10.0, 6.0, 18.0}), min_energy(battery_floor()), options);
  EXPECT_EQ(sunny.completed, 1u);
  EXPECT_NEAR(sunny.energy_joules, 2100.0, 1e-6);
  EXPECT_EQ(sunny.throttle_actions.at("pause"), 1u);
  EXPECT_EQ(sunny.throttle_actions.at("resume"), 1u);
  EXPECT_GT(sunny.makespan_seconds, 6 * kHour);
  EXPECT_EQ(sunny.floor_violation_seconds.at("floor"), 0.0);

  // fifo knows no floor: it runs the job through, below the floor's throttling margin.
  const PolicyMetrics blind = replay(battery_world(std::nullopt), fifo(battery_floor()), options);
  EXPECT_EQ(blind.completed, 1u);
  EXPECT_EQ(blind.throttle_action_count, 0u);
}

TEST(ReplayTest, the_horizon_ends_a_replay_with_the_unfinished_work_counted) {
  const World world = world_of({"a"}, {job("j1", 0, {on(0, 100, 7200)}), job("j2", 60, {on(0, 100, 10)})});
  ReplayOptions options;
  options.horizon_hours = 1.0;
  const PolicyMetrics m = replay(world, min_energy(), options);
  EXPECT_EQ(m.end_reason, "horizon");
  EXPECT_EQ(m.completed, 0u);
  EXPECT_EQ(m.started_not_completed, 1u);
  EXPECT_EQ(m.never_started, 1u);
  EXPECT_NEAR(m.energy_joules, 50.0, 1e-9);
  EXPECT_EQ(m.ended_at, kStart + 3'600'000);
}

TEST(ReplayTest, the_standard_runs_are_the_policy_with_and_without_knobs_and_the_baselines) {
  const auto runs = standard_runs(schedulers::Policy{});
  std::vector<std::string> names;
  for (const auto& run : runs) names.push_back(run.name);
  EXPECT_EQ(names, (std::vector<std::string>{"min-energy", "min-energy+knobs", "fifo", "round-robin", "least-loaded",
                                             "flops-greedy", "zeus-like", "oracle", "oracle+knobs"}));
  EXPECT_EQ(runs[0].policy.knobs.goal, schedulers::KnobGoal::off);
  EXPECT_EQ(runs[1].policy.knobs.goal, schedulers::KnobGoal::min_energy);
  for (std::size_t i = 2; i <= 4; ++i) {
    EXPECT_FALSE(runs[i].policy.admission);
    EXPECT_EQ(runs[i].knowledge, Knowledge::none);
  }
  EXPECT_TRUE(runs[5].policy.admission);
  EXPECT_TRUE(runs[6].jit_power_limit);
  EXPECT_EQ(runs[6].knowledge, Knowledge::none);
  EXPECT_EQ(runs[7].knowledge, Knowledge::truth);
  EXPECT_EQ(runs[7].policy.objective, schedulers::Objective::min_energy);
  EXPECT_EQ(runs[7].policy.knobs.goal, schedulers::KnobGoal::off);
  EXPECT_EQ(runs[8].knowledge, Knowledge::truth);
  EXPECT_EQ(runs[8].policy.knobs.goal, schedulers::KnobGoal::min_energy);

  // A policy that already chooses settings is not run twice.
  schedulers::Policy choosing;
  choosing.knobs.goal = schedulers::KnobGoal::zeus;
  EXPECT_EQ(standard_runs(choosing)[1].name, "fifo");
}

TEST(ReplayTest, a_seed_fixes_the_world_and_every_run) {
  auto cluster = parse_cluster(R"([[nodes]]
name = "n"
devices = [{name = "cuda:0", profile = "jetson-orin", probes = 40}, {name = "cpu", profile = "laptop-cpu", probes = 40}]
)",
                               "c.toml");
  std::string text;
  for (int i = 0; i < 6; ++i)
    text += nlohmann::json{{"at", 30 * i},
                           {"model", testing::example_model(i % 2 ? "mlp" : "lenet5")},
                           {"training", {{"batch_size", 32 << (i % 3)}, {"epochs", 2}, {"samples_per_epoch", 20000}}}}
                .dump() +
            "\n";
  auto trace = parse_trace(text, "t.jsonl", nullptr);
  ASSERT_TRUE(cluster && trace);
  auto build = [&](std::uint64_t seed, std::size_t threads) {
    WorldOptions options;
    options.seed = seed;
    options.threads = threads;
    return build_world(*cluster, *trace, schedulers::Policy{}, options).value();
  };
  const World a = build(3, 1), b = build(3, 2), c = build(4, 1);
  int estimated = 0;
  for (std::size_t j = 0; j < a.jobs.size(); ++j)
    for (std::size_t k = 0; k < a.jobs[j].costs.size(); ++k) {
      const auto& ea = a.jobs[j].costs[k].estimate;
      const auto& eb = b.jobs[j].costs[k].estimate;
      ASSERT_EQ(ea.has_value(), eb.has_value());
      if (ea) {
        EXPECT_EQ(ea->joules_mean, eb->joules_mean);
      }
      estimated += ea ? 1 : 0;
      EXPECT_EQ(a.jobs[j].costs[k].truth.joules, b.jobs[j].costs[k].truth.joules);
      EXPECT_NE(a.jobs[j].costs[k].truth.joules, c.jobs[j].costs[k].truth.joules);
    }
  EXPECT_GT(estimated, 0);
  for (const auto& run : standard_runs(schedulers::Policy{}))
    EXPECT_EQ(deterministic(replay(a, run)), deterministic(replay(b, run))) << run.name;
}

TEST(ReplayTest, every_setting_has_its_truth_and_an_estimate_learnt_from_probes_or_the_networks_themselves) {
  auto cluster = parse_cluster(R"([[nodes]]
name = "n"
devices = [{name = "cuda:0", profile = "server-gpu", probes = 60}, {name = "cpu", profile = "laptop-cpu", probes = 60}]
)",
                               "c.toml");
  std::string text;
  for (int i = 0; i < 4; ++i)
    text += nlohmann::json{{"at", 30 * i},
                           {"model", testing::example_model(i % 2 ? "mlp" : "lenet5")},
                           {"training", {{"batch_size", 64}, {"epochs", 2}, {"samples_per_epoch", 20000}}}}
                .dump() +
            "\n";
  auto trace = parse_trace(text, "t.jsonl", nullptr);
  ASSERT_TRUE(cluster && trace);
  for (const auto probes : {WorldOptions::KnobProbes::layers, WorldOptions::KnobProbes::networks}) {
    WorldOptions options;
    options.knob_probes = probes;
    const World world = build_world(*cluster, *trace, schedulers::Policy{}, options).value();
    double worst = 0.0;
    std::size_t estimated = 0;
    for (const auto& job : world.jobs)
      for (const auto& cost : job.costs) {
        ASSERT_EQ(cost.settings.size(), cost.device == 0 ? 6u : 4u);  // the profile's settings but the default
        for (const auto& setting : cost.settings) {
          EXPECT_GT(setting.truth.seconds, 0.0);
          if (!setting.estimate || !cost.estimate) continue;
          ++estimated;
          const double predicted = setting.estimate->joules_mean / cost.estimate->joules_mean;
          worst = std::max(worst, std::abs(predicted / (setting.truth.joules / cost.truth.joules) - 1.0));
        }
      }
    EXPECT_GT(estimated, 0u);
    // The workload's own networks measured at every setting: within the measurement noise.
    if (probes == WorldOptions::KnobProbes::networks) {
      EXPECT_LT(worst, 0.08);
    }
    // Each job as run against an exhaustive sweep of its device by true costs: with true costs
    // the choice is the sweep's best; with estimates, the jobs within 5 % of it are counted.
    const auto runs = standard_runs(schedulers::Policy{});
    const PolicyMetrics oracle = replay(world, runs.back());
    ASSERT_EQ(runs.back().name, "oracle+knobs");
    EXPECT_EQ(oracle.jobs_swept, 4u);
    EXPECT_EQ(oracle.jobs_within_5pct_of_best, 4u);
    EXPECT_NEAR(oracle.setting_regret, 0.0, 1e-9);
    const PolicyMetrics estimated_run = replay(world, runs[1]);
    EXPECT_EQ(estimated_run.jobs_swept, 4u);
    EXPECT_EQ(replay(world, runs[0]).jobs_swept, 0u) << "placement alone chooses no setting";
  }
}

}  // namespace joule::simulator

namespace joule::simulator {
namespace {

// One device; a heavy owner queues four jobs, a light one two a moment later.
World shared_world() {
  std::vector<SimJob> jobs;
  for (int i = 0; i < 4; ++i) {
    jobs.push_back(job(fmt::format("heavy-{}", i), i, {on(0, 1000.0, 100.0)}));
    jobs.back().owner = "heavy";
  }
  for (int i = 0; i < 2; ++i) {
    jobs.push_back(job(fmt::format("light-{}", i), 10 + i, {on(0, 1000.0, 100.0)}));
    jobs.back().owner = "light";
  }
  return world_of({"a"}, std::move(jobs));
}

TEST(ReplayTest, fair_share_runs_the_light_owners_jobs_before_the_heavy_owners_queue_and_says_per_owner) {
  schedulers::Policy policy;
  const PolicyMetrics fair = replay(shared_world(), fifo(policy));
  policy.tenancy.fair_share = false;
  const PolicyMetrics in_order = replay(shared_world(), fifo(policy));
  ASSERT_EQ(fair.owners.size(), 2u);
  // In submission order the light owner waits for all four heavy jobs (390 s and 489 s). With fair
  // share its first job follows the heavy job running when it came (90 s); then both owners have
  // used as much, so submission order puts one heavy job before its second (289 s).
  EXPECT_NEAR(in_order.owners.at("light").wait_mean_seconds, (390.0 + 489.0) / 2, 1e-6);
  EXPECT_NEAR(fair.owners.at("light").wait_mean_seconds, (90.0 + 289.0) / 2, 1e-6);
  EXPECT_GT(fair.owners.at("heavy").wait_mean_seconds, in_order.owners.at("heavy").wait_mean_seconds);
  EXPECT_EQ(fair.owners.at("heavy").completed, 4u);
  EXPECT_DOUBLE_EQ(fair.owners.at("light").energy_joules, 2000.0);
  EXPECT_DOUBLE_EQ(fair.energy_joules, in_order.energy_joules);  // the same work, in another order
  const auto json = to_json(fair);
  EXPECT_EQ(json["owners"]["light"]["jobs"], 2);
  EXPECT_FALSE(to_json(replay(world_of({"a"}, {job("j", 0, {on(0, 1.0, 1.0)})}), fifo())).contains("owners"));
}

TEST(ReplayTest, a_projects_budget_counts_and_holds_only_its_jobs) {
  // Two projects' 100 J jobs on two devices; vision may use 150 J an hour.
  std::vector<SimJob> jobs;
  for (int i = 0; i < 2; ++i) {
    jobs.push_back(job(fmt::format("vision-{}", i), i, {on(0, 100, 100), on(1, 100, 100)}));
    jobs.back().owner = "alice";
    jobs.back().project = "vision";
    jobs.push_back(job(fmt::format("lab-{}", i), i, {on(0, 100, 100), on(1, 100, 100)}));
    jobs.back().owner = "bob";
    jobs.back().project = "lab";
  }
  const World world = world_of({"a", "b"}, std::move(jobs));
  schedulers::Policy policy = with_budget(150.0, {schedulers::BudgetWindow::Kind::rolling, 3600});
  policy.budgets[0].project = "vision";
  // Without admission both vision jobs run within the hour: one overrun, of vision's 200 J only.
  const PolicyMetrics f = replay(world, fifo(policy));
  ASSERT_EQ(f.violations.size(), 1u);
  EXPECT_NEAR(f.violations[0].spent, 200.0, 1e-9);
  // With it the second vision job waits for the first's energy to leave the window, while the
  // lab jobs run at once.
  const PolicyMetrics m = replay(world, min_energy(policy));
  EXPECT_TRUE(m.violations.empty());
  EXPECT_EQ(m.completed, 4u);
  EXPECT_DOUBLE_EQ(m.owners.at("bob").wait_max_seconds, 99.0);  // for a device, not for the budget
  EXPECT_GT(m.owners.at("alice").wait_max_seconds, 3000.0);
}

}  // namespace
}  // namespace joule::simulator

namespace joule::simulator {
namespace {

// A device sharing 16 cores, two jobs asking for 8 each: 100 s alone, 40 W static of 100 W.
World packing_world() {
  World world = world_of({"cpu"}, {});
  world.devices[0].cores = 16;
  for (const char* id : {"a", "b"}) {
    JobCost cost = on(0, 10'000.0, 100.0);
    cost.static_watts = 40.0;
    SimJob sim = job(id, 0, {cost});
    sim.cores = 8;
    world.jobs.push_back(sim);
  }
  return world;
}

TEST(ReplaySharedCoresTest, jobs_on_cores_of_one_device_run_side_by_side_and_split_its_static_power_by_cores) {
  const World world = packing_world();
  const PolicyMetrics packed = replay(world, min_energy(), {});
  EXPECT_EQ(packed.completed, 2u);
  EXPECT_DOUBLE_EQ(packed.makespan_seconds, 100.0) << "both at once";
  // Each: 60 W of its own for 100 s, and half of the 40 W static: 8,000 J.
  EXPECT_NEAR(packed.energy_per_completed_job_joules, 8'000.0, 1e-6);

  PolicyRun alone = min_energy();
  alone.one_job_per_device = true;
  const PolicyMetrics one_by_one = replay(world, alone, {});
  EXPECT_EQ(one_by_one.completed, 2u);
  EXPECT_DOUBLE_EQ(one_by_one.makespan_seconds, 200.0) << "one after the other";
  EXPECT_NEAR(one_by_one.energy_per_completed_job_joules, 10'000.0, 1e-6) << "each with all of the static power";
  const auto runs = standard_runs(schedulers::Policy{}, false, true);
  ASSERT_GE(runs.size(), 2u);
  EXPECT_EQ(runs[1].name, "min-energy, one job per device");
  EXPECT_TRUE(runs[1].one_job_per_device);
}

// Two GPUs of one group and a job asking for both: 50 s on the two (100 s on one alone), 10 W of
// idle draw each; a one-GPU job after it waits for it.
World gang_world() {
  World world = world_of({"cuda:0", "cuda:1"}, {});
  for (auto& device : world.devices) {
    device.group = "n1: test";
    device.idle_watts = 10.0;
  }
  std::vector<JobCost> costs;
  for (std::size_t d = 0; d < 2; ++d) {
    JobCost cost = on(d, 11'000.0, 55.0);  // both GPUs' energy, 10 % for their all-reduce
    cost.alone_truth = TrueCost{10'000.0, 100.0};
    cost.alone_estimate = schedulers::Estimate{10'000.0, 0.0, 100.0};
    costs.push_back(cost);
  }
  SimJob ddp = job("ddp", 0, costs);
  ddp.gpus = 2;
  world.jobs.push_back(ddp);
  world.jobs.push_back(job("one", 1, {on(0, 1'000.0, 10.0), on(1, 1'000.0, 10.0)}));
  return world;
}

TEST(ReplayGpuGangTest, a_job_on_two_gpus_holds_both_and_its_energy_counts_them_both) {
  const World world = gang_world();
  std::vector<std::pair<UnixMillis, std::vector<std::size_t>>> placed;
  ReplayOptions options;
  options.on_placement = [&](UnixMillis at, const schedulers::Placement& placement) {
    std::vector<std::size_t> held = placement.companions;
    held.push_back(placement.device);
    placed.emplace_back(at, held);
  };
  const PolicyMetrics m = replay(world, min_energy(), options);
  EXPECT_EQ(m.completed, 2u);
  ASSERT_EQ(placed.size(), 2u);
  EXPECT_EQ(placed[0].second.size(), 2u) << "both GPUs";
  EXPECT_EQ(placed[1].first, kStart + 55'000) << "the one-GPU job waits for the pair to end";
  EXPECT_NEAR(m.energy_joules, 12'000.0, 1e-6);
  // Nothing idles while the pair runs; then the GPU the second job leaves idles 10 s.
  EXPECT_NEAR(m.idle_joules_not_counted, 100.0, 1e-6);

  PolicyRun alone = min_energy();
  alone.one_job_per_device = true;
  const PolicyMetrics single = replay(world, alone, {});
  EXPECT_EQ(single.completed, 2u);
  EXPECT_NEAR(single.energy_joules, 11'000.0, 1e-6) << "the pair's job on one GPU, at its one-GPU truth";
  EXPECT_DOUBLE_EQ(single.makespan_seconds, 100.0) << "the other job ran beside it on the second GPU";
}

TEST(ReplaySharedCoresTest, a_job_with_a_range_of_cores_runs_at_the_count_placement_chose_and_at_its_truth) {
  World world = world_of({"cpu"}, {});
  world.devices[0].cores = 16;
  JobCost cost = on(0, 10'000.0, 100.0);  // at 4 cores
  cost.static_watts = 40.0;
  cost.cores_options = {CoresOption{4, TrueCost{10'000.0, 100.0}, schedulers::Estimate{10'000.0, 0.0, 100.0}},
                        CoresOption{8, TrueCost{7'000.0, 50.0}, schedulers::Estimate{7'000.0, 0.0, 50.0}}};
  SimJob ranged = job("ranged", 0, {cost});
  ranged.cores = 4;
  ranged.cores_max = 8;
  world.jobs.push_back(ranged);
  int chosen = 0;
  ReplayOptions options;
  options.on_placement = [&](UnixMillis, const schedulers::Placement& placement) { chosen = placement.cores; };
  const PolicyMetrics m = replay(world, min_energy(), options);
  EXPECT_EQ(chosen, 8);
  EXPECT_DOUBLE_EQ(m.makespan_seconds, 50.0) << "at the 8-core truth";
  EXPECT_NEAR(m.energy_joules, 7'000.0, 1e-6);
}

}  // namespace
}  // namespace joule::simulator
