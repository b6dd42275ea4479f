#include "joule/schedulers/budget_ledger.hpp"

#include <cmath>

#include <gtest/gtest.h>

namespace joule::schedulers {
namespace {

constexpr UnixMillis kHour = 3'600'000;

UnixMillis at(const char* text) { return parse_rfc3339(text).value(); }

DeviceRef device(std::string node, std::string name, std::vector<std::string> groups = {}) {
  return DeviceRef{std::move(node), std::move(name), std::move(groups)};
}

EnergyBudget budget(std::string name, Scope scope, std::string target, double joules, BudgetWindow window) {
  return EnergyBudget{std::move(name), ScopeTarget{scope, std::move(target)}, joules, window};
}

BudgetWindow rolling_hours(int hours) { return {BudgetWindow::Kind::rolling, hours * 3600}; }

TEST(BudgetLedgerTest, rolling_window_counts_the_share_of_a_use_inside_it) {
  BudgetLedger ledger;
  ledger.set_budgets({budget("hourly", Scope::cluster, "", 1000.0, rolling_hours(1))});
  const UnixMillis t0 = at("2026-11-26T10:00:00Z");
  ledger.record({device("n1", "cpu"), "job-1", t0, t0 + 2 * kHour, 100.0, "rapl"});
  auto states = ledger.states(t0 + 2 * kHour);
  ASSERT_EQ(states.size(), 1u);
  EXPECT_NEAR(states[0].spent, 50.0, 1e-9);
  EXPECT_NEAR(states[0].remaining(), 950.0, 1e-9);
  EXPECT_EQ(states[0].resets_at, t0 + 2 * kHour);  // the oldest counted part leaves from then on
  EXPECT_NEAR(ledger.states(t0 + 3 * kHour)[0].spent, 0.0, 1e-9);
}

TEST(BudgetLedgerTest, calendar_day_splits_a_use_across_local_midnight) {
  BudgetLedger ledger(60);  // UTC+01:00
  ledger.set_budgets({budget("daily", Scope::node, "n1", 1000.0, {BudgetWindow::Kind::day})});
  // 22:00-00:00 UTC is 23:00-01:00 local: half before local midnight.
  ledger.record({device("n1", "cpu"), "job-1", at("2026-11-26T22:00:00Z"), at("2026-11-27T00:00:00Z"), 200.0, "rapl"});
  const auto states = ledger.states(at("2026-11-27T00:00:00Z"));
  EXPECT_EQ(states[0].window_start, at("2026-11-26T23:00:00Z"));
  EXPECT_EQ(states[0].resets_at, at("2026-11-27T23:00:00Z"));
  EXPECT_NEAR(states[0].spent, 100.0, 1e-9);
}

TEST(BudgetLedgerTest, calendar_weeks_start_on_monday_and_months_on_the_first) {
  BudgetLedger ledger;
  const UnixMillis thursday = at("2026-11-26T15:30:00Z");
  EXPECT_EQ(ledger.calendar_window(BudgetWindow::Kind::week, thursday),
            std::make_pair(at("2026-11-23T00:00:00Z"), at("2026-11-30T00:00:00Z")));
  EXPECT_EQ(ledger.calendar_window(BudgetWindow::Kind::month, thursday),
            std::make_pair(at("2026-11-01T00:00:00Z"), at("2026-12-01T00:00:00Z")));
  EXPECT_EQ(ledger.calendar_window(BudgetWindow::Kind::month, at("2026-12-31T23:59:59Z")),
            std::make_pair(at("2026-12-01T00:00:00Z"), at("2027-01-01T00:00:00Z")));
  EXPECT_EQ(ledger.calendar_window(BudgetWindow::Kind::month, at("2028-02-29T12:00:00Z")).second,
            at("2028-03-01T00:00:00Z"));
}

TEST(BudgetLedgerTest, scopes_count_only_the_devices_they_cover) {
  BudgetLedger ledger;
  const BudgetWindow day{BudgetWindow::Kind::day};
  ledger.set_budgets({budget("gpu", Scope::device, "n1/cuda:0", 1e6, day), budget("any-cpu", Scope::device, "cpu", 1e6, day),
                      budget("edge", Scope::group, "edge", 1e6, day), budget("all", Scope::cluster, "", 1e6, day)});
  const UnixMillis t = at("2026-11-26T10:00:00Z");
  ledger.record({device("n1", "cuda:0"), "a", t, t + 1000, 10.0, "nvml"});
  ledger.record({device("n1", "cpu"), "b", t, t + 1000, 20.0, "rapl"});
  ledger.record({device("pi", "cpu", {"edge"}), "c", t, t + 1000, 40.0, "ina3221"});
  const auto states = ledger.states(t + kHour);
  EXPECT_NEAR(states[0].spent, 10.0, 1e-9);
  EXPECT_NEAR(states[1].spent, 60.0, 1e-9);
  EXPECT_NEAR(states[2].spent, 40.0, 1e-9);
  EXPECT_NEAR(states[3].spent, 70.0, 1e-9);
}

TEST(BudgetLedgerTest, reservations_add_up_and_settle_into_metered_energy) {
  BudgetLedger ledger;
  ledger.set_budgets({budget("daily", Scope::cluster, "", 1000.0, {BudgetWindow::Kind::day})});
  const UnixMillis t = at("2026-11-26T10:00:00Z");
  ledger.reserve("a", device("n1", "cpu"), EnergyDistribution::from_std(100.0, 10.0));
  ledger.reserve("b", device("n1", "cuda:0"), EnergyDistribution::from_std(200.0, 20.0));
  auto state = ledger.states(t)[0];
  EXPECT_NEAR(state.reserved.mean_joules, 300.0, 1e-9);
  EXPECT_NEAR(state.reserved.variance, 500.0, 1e-9);
  EXPECT_NEAR(state.remaining(), 700.0, 1e-9);

  // a has used 80 J so far and is projected to need 40 J more.
  ledger.update_running("a", t - kHour, t, 80.0, EnergyDistribution::from_std(40.0, 5.0));
  state = ledger.states(t)[0];
  EXPECT_NEAR(state.spent, 80.0, 1e-9);
  EXPECT_NEAR(state.reserved.mean_joules, 240.0, 1e-9);

  ledger.settle("a", EnergyUse{device("n1", "cpu"), "a", t - kHour, t + 1000, 130.0, "rapl"});
  ledger.settle("b", std::nullopt);  // cancelled before it ran
  state = ledger.states(t + 1000)[0];
  EXPECT_NEAR(state.spent, 130.0, 1e-9);
  EXPECT_NEAR(state.reserved.mean_joules, 0.0, 1e-9);
  EXPECT_FALSE(ledger.has_reservation("a"));
}

TEST(BudgetLedgerTest, frees_by_finds_when_enough_energy_has_left_a_rolling_window) {
  BudgetLedger ledger;
  ledger.set_budgets({budget("4h", Scope::cluster, "", 1000.0, rolling_hours(4))});
  const UnixMillis t = at("2026-11-26T10:00:00Z");
  ledger.record({device("n1", "cpu"), "a", t, t + 1000, 300.0, "rapl"});
  ledger.record({device("n1", "cpu"), "b", t + kHour, t + kHour + 1000, 500.0, "rapl"});
  const UnixMillis now = t + 2 * kHour;
  const auto state = ledger.states(now)[0];
  EXPECT_NEAR(state.spent, 800.0, 1e-9);
  EXPECT_EQ(ledger.frees_by(state, 200.0, now), t + 1000 + 4 * kHour);
  EXPECT_EQ(ledger.frees_by(state, 700.0, now), t + kHour + 1000 + 4 * kHour);
  EXPECT_EQ(ledger.frees_by(state, 900.0, now), std::nullopt);
  EXPECT_EQ(ledger.frees_by(state, 0.0, now), now);
}

TEST(BudgetLedgerTest, calendar_budgets_free_everything_at_the_reset) {
  BudgetLedger ledger;
  ledger.set_budgets({budget("daily", Scope::cluster, "", 1000.0, {BudgetWindow::Kind::day})});
  const UnixMillis t = at("2026-11-26T10:00:00Z");
  ledger.record({device("n1", "cpu"), "a", t, t + 1000, 900.0, "rapl"});
  const auto state = ledger.states(t + kHour)[0];
  EXPECT_EQ(ledger.frees_by(state, 500.0, t + kHour), at("2026-11-27T00:00:00Z"));
}

TEST(BudgetLedgerTest, short_work_of_one_minute_adds_up_in_one_use_per_device_and_counts_the_same) {
  BudgetLedger ledger;
  ledger.set_budgets({budget("day", Scope::cluster, "", 1e6, {BudgetWindow::Kind::day, 0}),
                      budget("n1", Scope::node, "n1", 1e6, rolling_hours(24))});
  const UnixMillis t = at("2026-11-20T10:00:00Z");
  // 120 jobs of a second each in two minutes on n1/cpu, interleaved with n2/cpu's, and a probe
  // metered by another source.
  for (int i = 0; i < 120; ++i) {
    const UnixMillis start = t + i * 1000;
    ledger.record({device("n1", "cpu"), "job-" + std::to_string(i), start, start + 900, 2.0, "rapl"});
    ledger.record({device("n2", "cpu"), "other-" + std::to_string(i), start, start + 900, 1.0, "rapl"});
  }
  ledger.record({device("n1", "cpu"), "probe", t + 5000, t + 5500, 3.0, "modelled"});
  EXPECT_EQ(ledger.uses(), 5u);  // two minutes on each device, and the probe's other source
  // A use across a minute's end stays whole, and the next short one starts a use of its own.
  ledger.record({device("n1", "cpu"), "long", t + 119'500, t + 121'000, 4.0, "rapl"});
  ledger.record({device("n1", "cpu"), "after", t + 121'500, t + 122'000, 1.0, "rapl"});
  EXPECT_EQ(ledger.uses(), 7u);
  const auto states = ledger.states(t + kHour);
  EXPECT_NEAR(states[0].spent, 120 * 3.0 + 3.0 + 4.0 + 1.0, 1e-9);
  EXPECT_NEAR(states[1].spent, 120 * 2.0 + 3.0 + 4.0 + 1.0, 1e-9);
}

TEST(BudgetLedgerTest, prune_keeps_what_the_longest_window_still_counts) {
  BudgetLedger ledger;
  ledger.set_budgets({budget("2d", Scope::cluster, "", 1e6, rolling_hours(48))});
  const UnixMillis t = at("2026-11-20T10:00:00Z");
  ledger.record({device("n1", "cpu"), "old", t, t + 1000, 1.0, "rapl"});
  ledger.record({device("n1", "cpu"), "new", t + 40 * kHour, t + 40 * kHour + 1000, 1.0, "rapl"});
  ledger.prune(t + 47 * kHour);
  EXPECT_EQ(ledger.uses(), 2u);
  ledger.prune(t + 49 * kHour);
  EXPECT_EQ(ledger.uses(), 1u);
}

}  // namespace
}  // namespace joule::schedulers

namespace joule::schedulers {
namespace {

TEST(BudgetLedgerTest, a_paused_job_counts_its_energy_in_the_stretches_it_ran) {
  // 100 J from 22:00 to 23:00, paused until 01:00, then 60 J until 02:00: the first day gets
  // 100 J, the second 60 J (spread over the whole run it would have been 32 + 128).
  BudgetLedger ledger;
  ledger.set_budgets({EnergyBudget{"daily", ScopeTarget{Scope::cluster, ""}, 1000.0, BudgetWindow{BudgetWindow::Kind::day}}});
  const DeviceRef cpu{"n1", "cpu", {}};
  const UnixMillis start = parse_rfc3339("2026-11-26T22:00:00Z").value();
  ledger.reserve("a", cpu, EnergyDistribution::from_std(200.0, 20.0));
  ledger.update_running("a", start, start + 3'600'000, 100.0, {});
  const auto stretch = ledger.pause_running("a", start + 3'600'000);
  ASSERT_TRUE(stretch);
  EXPECT_EQ(stretch->joules, 100.0);
  ledger.update_running("a", start, start + 7'000'000, 100.0, {});  // paused: nothing moves
  ledger.resume_running("a", start + 3 * 3'600'000);
  ledger.update_running("a", start, start + 3 * 3'600'000 + 1000, 100.5, {});
  const auto last = ledger.settle("a", EnergyUse{cpu, "a", start, start + 4 * 3'600'000, 160.0, "rapl"});
  ASSERT_TRUE(last);
  EXPECT_EQ(last->start, start + 3 * 3'600'000);
  EXPECT_NEAR(last->joules, 60.0, 1e-9);
  EXPECT_NEAR(ledger.states(start + 3'600'000 + 1)[0].spent, 100.0, 1e-9);
  EXPECT_NEAR(ledger.states(start + 4 * 3'600'000)[0].spent, 60.0, 1e-9);
}

}  // namespace
}  // namespace joule::schedulers

namespace joule::schedulers {
namespace {

TEST(BudgetLedgerTest, a_reload_that_moves_a_node_into_a_group_counts_its_past_energy_there) {
  BudgetLedger ledger;
  Policy policy;
  policy.budgets = {EnergyBudget{"edge", ScopeTarget{Scope::group, "edge"}, 1000.0, BudgetWindow{BudgetWindow::Kind::day}}};
  ledger.set_policy(policy);
  const UnixMillis t = parse_rfc3339("2026-11-26T10:00:00Z").value();
  ledger.record({DeviceRef{"pi", "cpu", {}}, "a", t, t + 1000, 40.0, "ina3221"});
  EXPECT_EQ(ledger.states(t + 2000)[0].spent, 0.0);
  policy.groups = {NodeGroup{"edge", {"pi"}}};
  ledger.set_policy(policy);
  EXPECT_NEAR(ledger.states(t + 2000)[0].spent, 40.0, 1e-9);
}

}  // namespace
}  // namespace joule::schedulers

namespace joule::schedulers {
namespace {

TEST(BudgetLedgerTest, calendar_windows_follow_a_new_utc_offset) {
  BudgetLedger ledger(60);  // winter in Berlin
  const UnixMillis now = parse_rfc3339("2026-03-29T12:00:00Z").value();
  EXPECT_EQ(ledger.calendar_window(BudgetWindow::Kind::day, now).first, parse_rfc3339("2026-03-28T23:00:00Z"));
  ledger.set_utc_offset_minutes(120);  // summer time began that night
  EXPECT_EQ(ledger.calendar_window(BudgetWindow::Kind::day, now).first, parse_rfc3339("2026-03-28T22:00:00Z"));
}

EnergyBudget grams_budget(double grams) {
  EnergyBudget b = budget("grams", Scope::cluster, "", grams, rolling_hours(24));
  b.unit = BudgetUnit::grams;
  return b;
}

TEST(BudgetLedgerTest, a_grams_budget_counts_the_grams_of_its_uses_and_shows_the_joules_it_could_not) {
  BudgetLedger ledger;
  EnergyBudget money = budget("money", Scope::cluster, "", 10.0, rolling_hours(24));
  money.unit = BudgetUnit::money;
  ledger.set_budgets({grams_budget(500.0), money, budget("joules", Scope::cluster, "", 1e9, rolling_hours(24))});
  const UnixMillis t0 = at("2026-11-26T10:00:00Z");
  EnergyUse priced{device("n1", "cpu"), "job-1", t0, t0 + kHour, 3.6e6, "rapl"};
  priced.grams = 300.0;
  priced.cost = 0.25;
  ledger.record(priced);
  ledger.record({device("n1", "cpu"), "probe", t0 + kHour, t0 + 2 * kHour, 1000.0, "rapl"});  // no signal then
  const auto states = ledger.states(t0 + 2 * kHour);
  EXPECT_NEAR(states[0].spent, 300.0, 1e-9);
  EXPECT_NEAR(states[0].uncounted_joules, 1000.0, 1e-9);
  EXPECT_NEAR(states[0].remaining(), 200.0, 1e-9);
  EXPECT_NEAR(states[1].spent, 0.25, 1e-12);
  EXPECT_NEAR(states[2].spent, 3.6e6 + 1000.0, 1e-6);
  EXPECT_NEAR(states[2].uncounted_joules, 0.0, 1e-12);
}

TEST(BudgetLedgerTest, a_running_job_counts_in_grams_at_its_rates_through_a_pause_and_its_end) {
  BudgetLedger ledger;
  ledger.set_budgets({grams_budget(10'000.0)});
  const UnixMillis t0 = at("2026-11-26T10:00:00Z");
  const UseRates at_400{400.0 / 3.6e6, std::nullopt};
  const UseRates at_100{100.0 / 3.6e6, std::nullopt};
  ledger.reserve("a", device("n1", "cpu"), EnergyDistribution::from_std(7.2e6, 3.6e5), "", "", at_400);
  auto state = ledger.states(t0)[0];
  EXPECT_NEAR(state.reserved.mean_joules, 800.0, 1e-6);  // 2 kWh at 400 g/kWh
  EXPECT_NEAR(std::sqrt(state.reserved.variance), 40.0, 1e-6);
  // An hour in: 1 kWh used at 400, 1 kWh still to come at 100.
  ledger.update_running("a", t0, t0 + kHour, 3.6e6, EnergyDistribution::from_std(3.6e6, 0.0), at_400, at_100);
  state = ledger.states(t0 + kHour)[0];
  EXPECT_NEAR(state.spent, 400.0, 1e-6);
  EXPECT_NEAR(state.reserved.mean_joules, 100.0, 1e-6);
  // Paused: the stretch is recorded with its grams; resumed and ended with 2 kWh, 450 g in all.
  const auto stretch = ledger.pause_running("a", t0 + kHour);
  ASSERT_TRUE(stretch);
  EXPECT_NEAR(stretch->grams.value(), 400.0, 1e-6);
  ledger.resume_running("a", t0 + 2 * kHour);
  EnergyUse whole{device("n1", "cpu"), "a", t0, t0 + 3 * kHour, 7.2e6, "rapl"};
  whole.grams = 450.0;
  const auto settled = ledger.settle("a", whole);
  ASSERT_TRUE(settled);
  EXPECT_NEAR(settled->joules, 3.6e6, 1e-6);  // the last stretch alone
  EXPECT_NEAR(settled->grams.value(), 50.0, 1e-6);
  state = ledger.states(t0 + 3 * kHour)[0];
  EXPECT_NEAR(state.spent, 450.0, 1e-6);
  EXPECT_NEAR(state.reserved.mean_joules, 0.0, 1e-9);
}

}  // namespace
}  // namespace joule::schedulers
