// The shipped scenarios (simulator/scenarios/*): each parses, replays, and min-energy at the
// policy's default risk overruns no budget, leaves no job behind and runs nothing below a
// battery floor; choosing knob settings from measured networks saves energy without slowing a
// job beyond what it allowed; and on a solar-shaped grid min-carbon emits less than running now. The figures themselves
// are the benchmark's (bench/sim_scenarios.sh), not asserted here.

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "joule/config/policy_config.hpp"
#include "joule/simulator/replay.hpp"
#include "joule/simulator/world.hpp"

namespace joule::simulator {
namespace {

struct Scenario {
  ClusterSpec cluster;
  Trace trace;
  schedulers::Policy policy;
};

Scenario load(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(JOULE_SOURCE_DIR) / "simulator/scenarios" / name;
  std::ifstream in(dir / "policy.toml");
  std::stringstream text;
  text << in.rdbuf();
  auto policy = config::parse_policy_files({{"policy.toml", text.str()}});
  auto cluster = load_cluster(dir / "cluster.toml");
  auto trace = load_trace(dir / "trace.jsonl");
  if (!policy || !cluster || !trace)
    throw std::runtime_error(!policy    ? policy.error().message
                             : !cluster ? cluster.error().message
                                        : trace.error().message);
  return Scenario{*cluster, *trace, policy->policy};
}

const PolicyRun& run_named(const std::vector<PolicyRun>& runs, const std::string& name) {
  for (const auto& run : runs)
    if (run.name == name) return run;
  throw std::runtime_error("no run " + name);
}

class ScenarioTest : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(ScenarioTest, min_energy_at_the_default_risk_keeps_every_budget_and_floor) {
  const Scenario scenario = load(GetParam());
  ASSERT_EQ(scenario.policy.risk, 0.05) << "the shipped policies use the default risk";
  WorldOptions options;
  options.threads = 2;
  // Each device learns from the scenario's own probe count; refitting the GPs every 30 probes
  // instead of jouled's 10 keeps the test to a second or two (the benchmark uses 10).
  options.refit_every = 30;
  auto world = build_world(scenario.cluster, scenario.trace, scenario.policy, options);
  ASSERT_TRUE(world) << world.error().message;
  EXPECT_EQ(world->jobs.size(), scenario.trace.jobs.size());

  const auto runs = standard_runs(scenario.policy);
  const PolicyMetrics policy = replay(*world, runs.front());
  EXPECT_EQ(policy.objective, "min-energy");
  EXPECT_TRUE(policy.violations.empty()) << policy.violations.size() << " budget windows overrun, the worst by "
                                         << policy.max_overrun_joules << " J";
  EXPECT_EQ(policy.completed, policy.jobs) << policy.end_reason;
  EXPECT_EQ(policy.rejected, 0u);
  for (const auto& [floor, seconds] : policy.floor_violation_seconds) EXPECT_EQ(seconds, 0.0) << floor;
  for (const auto& [node, seconds] : policy.battery_empty_seconds) EXPECT_EQ(seconds, 0.0) << node;

  // The scenario is a real test of the policy: some baseline that ignores energy breaks a
  // budget or a floor, or uses more energy.
  const PolicyMetrics blind = replay(*world, run_named(runs, "round-robin"));
  double blind_floor_seconds = 0.0;
  for (const auto& [floor, seconds] : blind.floor_violation_seconds) blind_floor_seconds += seconds;
  EXPECT_TRUE(!blind.violations.empty() || blind_floor_seconds > 0.0 || blind.energy_joules > policy.energy_joules);
  EXPECT_EQ(blind.completed, blind.jobs);
}

TEST(ScenarioKnobsTest, with_the_queued_networks_measured_knob_settings_save_energy_and_keep_every_slowdown) {
  // Burst: where responses learnt from THOR's probe networks let Jetson jobs run slower than
  // they allowed (bench/README.md, "Knobs"); measured networks must not.
  const Scenario scenario = load("burst");
  WorldOptions options;
  options.threads = 2;
  options.refit_every = 30;
  options.knob_probes = WorldOptions::KnobProbes::networks;
  auto world = build_world(scenario.cluster, scenario.trace, scenario.policy, options);
  ASSERT_TRUE(world) << world.error().message;
  const auto runs = standard_runs(scenario.policy);
  const PolicyMetrics alone = replay(*world, runs.front());
  const PolicyMetrics knobs = replay(*world, run_named(runs, "min-energy+knobs"));
  EXPECT_GT(knobs.jobs_at_settings, 0u);
  EXPECT_EQ(knobs.slowdown_exceeded, 0u);
  EXPECT_LT(knobs.energy_joules, alone.energy_joules);
  EXPECT_EQ(knobs.completed, knobs.jobs);
  EXPECT_TRUE(knobs.violations.empty());
  EXPECT_LE(knobs.deadline_misses, alone.deadline_misses);
}

TEST(ScenarioCarbonTest, on_a_solar_grid_min_carbon_emits_less_than_running_now_and_misses_no_more_deadlines) {
  const Scenario scenario = load("carbon-solar");
  ASSERT_EQ(scenario.policy.objective, schedulers::Objective::min_carbon);
  WorldOptions options;
  options.threads = 2;
  options.refit_every = 30;
  auto world = build_world(scenario.cluster, scenario.trace, scenario.policy, options);
  ASSERT_TRUE(world) << world.error().message;
  ASSERT_TRUE(world->carbon);
  const auto runs = standard_runs(scenario.policy, true);
  const PolicyMetrics carbon = replay(*world, runs.front());
  const PolicyMetrics now = replay(*world, run_named(runs, "min-energy"));
  ASSERT_TRUE(carbon.carbon_grams && now.carbon_grams);
  EXPECT_LT(*carbon.carbon_grams, *now.carbon_grams);
  EXPECT_EQ(carbon.completed, carbon.jobs);
  EXPECT_LE(carbon.deadline_misses, now.deadline_misses);
  EXPECT_EQ(carbon.joules_outside_carbon_signal, 0.0);
  // Carbon-only holds jobs by the signal alone and still runs them all.
  const PolicyMetrics only = replay(*world, run_named(runs, "carbon-only"));
  EXPECT_EQ(only.completed, only.jobs);
}

TEST(ScenarioCarbonTest, a_budget_in_grams_holds_where_placement_admits_by_it_and_breaks_where_nothing_does) {
  const Scenario scenario = load("carbon-budget");
  ASSERT_EQ(scenario.policy.budgets.at(0).unit, schedulers::BudgetUnit::grams);
  WorldOptions options;
  options.threads = 2;
  options.refit_every = 30;
  auto world = build_world(scenario.cluster, scenario.trace, scenario.policy, options);
  ASSERT_TRUE(world) << world.error().message;
  const auto runs = standard_runs(scenario.policy, true);
  // min-energy runs every job at once where it costs fewest joules, but admits each only while
  // the day's grams hold at the policy's risk; fifo knows nothing of the budget.
  const PolicyMetrics admitted = replay(*world, run_named(runs, "min-energy"));
  EXPECT_TRUE(admitted.violations.empty()) << admitted.violations.front().spent << " g";
  EXPECT_EQ(admitted.completed, admitted.jobs);
  const PolicyMetrics blind = replay(*world, run_named(runs, "fifo"));
  ASSERT_FALSE(blind.violations.empty());
  EXPECT_EQ(blind.violations.front().unit, schedulers::BudgetUnit::grams);
  EXPECT_GT(blind.violations.front().spent, scenario.policy.budgets.at(0).limit);
}

TEST(ScenarioPriceTest, min_cost_pays_less_than_running_now_and_misses_no_more_deadlines) {
  const Scenario scenario = load("price-dayahead");
  ASSERT_EQ(scenario.policy.objective, schedulers::Objective::min_cost);
  WorldOptions options;
  options.threads = 2;
  options.refit_every = 30;
  auto world = build_world(scenario.cluster, scenario.trace, scenario.policy, options);
  ASSERT_TRUE(world) << world.error().message;
  ASSERT_TRUE(world->price);
  const auto runs = standard_runs(scenario.policy, false, false, true);
  const PolicyMetrics cost = replay(*world, runs.front());
  const PolicyMetrics now = replay(*world, run_named(runs, "min-energy"));
  ASSERT_TRUE(cost.cost && now.cost);
  EXPECT_LT(*cost.cost, *now.cost);
  EXPECT_EQ(cost.completed, cost.jobs);
  EXPECT_LE(cost.deadline_misses, now.deadline_misses);
  EXPECT_EQ(cost.joules_outside_price_signal, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Shipped, ScenarioTest, ::testing::Values("mixed-fleet", "solar-edge", "burst"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace joule::simulator
