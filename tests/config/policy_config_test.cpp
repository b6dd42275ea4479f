#include "joule/config/policy_config.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "temp_dir.hpp"

using joule::config::load_policy_directory;
using joule::config::parse_policy_files;
using joule::schedulers::BudgetWindow;
using joule::schedulers::Objective;
using joule::schedulers::Scope;

namespace {

joule::Result<joule::config::LoadedPolicy> parse(const std::string& text, const std::string& name = "50-a.toml") {
  return parse_policy_files({{name, text}});
}

// The problems of a set that must be refused, one per line.
std::string problems(const std::vector<std::pair<std::string, std::string>>& files) {
  auto loaded = parse_policy_files(files);
  if (loaded) return "(accepted)";
  return loaded.error().message;
}
std::string problems(const std::string& text) { return problems({{"50-a.toml", text}}); }

std::string budget(const std::string& body) { return "[[budgets]]\nname = \"b\"\nscope = \"cluster\"\n" + body; }

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A shipped example file with its examples uncommented: prose lines start with "##", example
// lines with a single "# ", which a user removes.
std::string uncommented_example(const std::string& name) {
  std::stringstream in(read_file(std::filesystem::path(JOULE_SOURCE_DIR) / "config/policies.d" / name));
  std::string text;
  for (std::string line; std::getline(in, line);) text += (line.rfind("# ", 0) == 0 ? line.substr(2) : line) + "\n";
  return text;
}

}  // namespace

TEST(PolicyConfigTest, no_files_and_empty_files_keep_the_embedded_defaults) {
  for (const auto& files : {std::vector<std::pair<std::string, std::string>>{}, {{"00-empty.toml", ""}}}) {
    auto loaded = parse_policy_files(files);
    ASSERT_TRUE(loaded) << loaded.error().message;
    EXPECT_EQ(loaded->policy.objective, Objective::min_energy);
    EXPECT_DOUBLE_EQ(loaded->policy.risk, 0.05);
    EXPECT_EQ(loaded->policy.warmup_epochs, 1);
    EXPECT_TRUE(loaded->policy.admission);
    EXPECT_TRUE(loaded->policy.budgets.empty());
    EXPECT_TRUE(loaded->warnings.empty());
  }
  EXPECT_EQ(parse_policy_files({})->policy.source, "embedded defaults");
  EXPECT_EQ(parse("", "00-empty.toml")->policy.source, "00-empty.toml");
}

TEST(PolicyConfigTest, placement_keys_are_read) {
  auto loaded = parse("[placement]\nobjective = \"min-edp\"\nrisk = 0.2\nwarmup_epochs = 0\n");
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->policy.objective, Objective::min_edp);
  EXPECT_DOUBLE_EQ(loaded->policy.risk, 0.2);
  EXPECT_EQ(loaded->policy.warmup_epochs, 0);
  EXPECT_TRUE(loaded->warnings.empty());
}

TEST(PolicyConfigTest, placement_values_are_checked) {
  EXPECT_EQ(problems("[placement]\nobjective = \"greenest\"\n"),
            "50-a.toml:2: placement.objective \"greenest\" is not one of min-energy, min-edp, earliest-finish, "
            "min-carbon, fifo, "
            "round-robin, least-loaded, flops-greedy");
  EXPECT_EQ(problems("[placement]\nrisk = 1\n"),
            "50-a.toml:2: placement.risk must be between 0 and 1 (exclusive), got 1");
  EXPECT_NE(problems("[placement]\nrisk = 0\n"), "(accepted)");
  EXPECT_EQ(problems("[placement]\nrisk = \"low\"\n"), "50-a.toml:2: placement.risk must be a number");
  EXPECT_EQ(problems("[placement]\nrisk = nan\n"), "50-a.toml:2: placement.risk must be a finite number");
  EXPECT_EQ(problems("[placement]\nwarmup_epochs = 1.5\n"), "50-a.toml:2: placement.warmup_epochs must be an integer");
  EXPECT_EQ(problems("[placement]\nwarmup_epochs = 1001\n"),
            "50-a.toml:2: placement.warmup_epochs must be between 0 and 1000, got 1001");
  EXPECT_EQ(problems("placement = 3\n"), "50-a.toml:1: placement must be a table: [placement]");
}

TEST(PolicyConfigTest, knob_keys_are_read_and_checked) {
  auto loaded = parse("[knobs]\ngoal = \"zeus\"\nmax_slowdown = 0.25\neta = 0.8\n");
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->policy.knobs.goal, joule::schedulers::KnobGoal::zeus);
  EXPECT_DOUBLE_EQ(*loaded->policy.knobs.max_slowdown, 0.25);
  EXPECT_DOUBLE_EQ(loaded->policy.knobs.eta, 0.8);
  EXPECT_TRUE(loaded->warnings.empty());
  EXPECT_EQ(parse_policy_files({})->policy.knobs.goal, joule::schedulers::KnobGoal::off);

  EXPECT_EQ(problems("[knobs]\ngoal = \"cheapest\"\n"),
            "50-a.toml:2: knobs.goal \"cheapest\" is not one of off, min-energy, zeus, min-edp");
  EXPECT_EQ(problems("[knobs]\nmax_slowdown = 0\n"),
            "50-a.toml:2: knobs.max_slowdown must be above 0 and at most 10 (0.1: 10 % slower), got 0");
  EXPECT_EQ(problems("[knobs]\nmax_slowdown = -0.1\n"),
            "50-a.toml:2: knobs.max_slowdown must be above 0 and at most 10 (0.1: 10 % slower), got -0.1");
  EXPECT_EQ(problems("[knobs]\neta = 1.5\n"), "50-a.toml:2: knobs.eta must be between 0 and 1, got 1.5");
  EXPECT_EQ(problems("[knobs]\nspeed = 1\n"), "50-a.toml:2: unknown key knobs.speed (known: goal, max_slowdown, eta)");
  EXPECT_EQ(problems("knobs = 3\n"), "50-a.toml:1: knobs must be a table: [knobs]");
  EXPECT_EQ(problems({{"00-a.toml", "[knobs]\neta = 0.1\n"}, {"60-b.toml", "[knobs]\neta = 0.2\n"}}),
            "60-b.toml:2: knobs.eta is also set at 00-a.toml:2; set each [knobs] key in one file only");
}

TEST(PolicyConfigTest, a_baseline_objective_is_accepted_with_a_warning) {
  auto loaded = parse("[placement]\nobjective = \"round-robin\"\n");
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->policy.objective, Objective::round_robin);
  ASSERT_EQ(loaded->warnings.size(), 1u);
  EXPECT_EQ(loaded->warnings[0].line, 2);
  EXPECT_TRUE(parse("[placement]\nobjective = \"fifo\"\n")->warnings.empty());
}

TEST(PolicyConfigTest, budget_in_wh_is_converted_to_joules) {
  auto loaded = parse(budget("wh = 2000\ncalendar = \"week\"\n") +
                      "[[budgets]]\nname = \"k\"\nscope = \"node\"\ntarget = \"lab-1\"\nkwh = 1.5\nwindow = \"90m\"\n"
                      "[[budgets]]\nname = \"j\"\nscope = \"device\"\ntarget = \"lab-1/cuda:0\"\njoules = 36_000_000\n"
                      "window = \"7d\"\n");
  ASSERT_TRUE(loaded) << loaded.error().message;
  const auto& budgets = loaded->policy.budgets;
  ASSERT_EQ(budgets.size(), 3u);
  EXPECT_DOUBLE_EQ(budgets[0].limit, 7.2e6);
  EXPECT_EQ(budgets[0].window.kind, BudgetWindow::Kind::week);
  EXPECT_EQ(budgets[0].scope.scope, Scope::cluster);
  EXPECT_EQ(budgets[1].name, "k");
  EXPECT_DOUBLE_EQ(budgets[1].limit, 5.4e6);
  EXPECT_EQ(budgets[1].window.kind, BudgetWindow::Kind::rolling);
  EXPECT_EQ(budgets[1].window.rolling_seconds, 5400);
  EXPECT_EQ(budgets[1].scope.target, "lab-1");
  EXPECT_DOUBLE_EQ(budgets[2].limit, 3.6e7);
  EXPECT_EQ(budgets[2].window.rolling_seconds, 7 * 86400);
  EXPECT_EQ(budgets[2].scope.describe(), "device lab-1/cuda:0");
}

TEST(PolicyConfigTest, a_budget_may_count_grams_of_co2e_or_money_instead_of_joules) {
  auto loaded = parse(budget("kg = 2.5\ncalendar = \"day\"\n") +
                      "[[budgets]]\nname = \"g\"\nscope = \"cluster\"\ngrams = 300\nwindow = \"24h\"\n"
                      "[[budgets]]\nname = \"m\"\nscope = \"cluster\"\ncost = 12.5\ncurrency = \"EUR\"\n"
                      "calendar = \"month\"\n"
                      "[[budgets]]\nname = \"n\"\nscope = \"cluster\"\ncost = 3\ncalendar = \"week\"\n");
  ASSERT_TRUE(loaded) << loaded.error().message;
  const auto& budgets = loaded->policy.budgets;
  ASSERT_EQ(budgets.size(), 4u);
  EXPECT_EQ(budgets[0].unit, joule::schedulers::BudgetUnit::grams);
  EXPECT_DOUBLE_EQ(budgets[0].limit, 2500.0);
  EXPECT_EQ(budgets[0].amount_text(1234.0), "1.23 kg CO2e");
  EXPECT_EQ(budgets[1].unit, joule::schedulers::BudgetUnit::grams);
  EXPECT_DOUBLE_EQ(budgets[1].limit, 300.0);
  EXPECT_EQ(budgets[2].unit, joule::schedulers::BudgetUnit::money);
  EXPECT_DOUBLE_EQ(budgets[2].limit, 12.5);
  EXPECT_EQ(budgets[2].currency, "EUR");
  EXPECT_EQ(budgets[2].amount_text(4.2), "4.20 EUR");
  EXPECT_EQ(budgets[3].currency, "");  // the price signal's, whatever it is
  EXPECT_EQ(problems(budget("cost = 3\ncurrency = \"euro\"\nwindow = \"1d\"\n")),
            "50-a.toml:5: budgets[0].currency must be a currency code of 3 letters (\"EUR\"), got \"euro\"");
  EXPECT_EQ(problems(budget("kwh = 3\ncurrency = \"EUR\"\nwindow = \"1d\"\n")),
            "50-a.toml:5: budgets[0].currency applies only to a budget in money (cost = ...)");
  EXPECT_EQ(problems(budget("grams = -1\nwindow = \"1d\"\n")), "50-a.toml:4: budgets[0].grams must be > 0, got -1");
}

TEST(PolicyConfigTest, a_budget_needs_exactly_one_positive_energy) {
  EXPECT_EQ(problems(budget("window = \"1d\"\n")),
            "50-a.toml:1: budgets[0] needs an allowance: one of joules, wh or kwh (e.g. kwh = 10), grams or kg of "
            "CO2e, or cost (money)");
  EXPECT_EQ(problems(budget("wh = 5\nkwh = 1\nwindow = \"1d\"\n")),
            "50-a.toml:5: budgets[0] sets its allowance twice: set exactly one of joules, wh, kwh, grams, kg, cost");
  EXPECT_EQ(problems(budget("kwh = 5\ngrams = 100\nwindow = \"1d\"\n")),
            "50-a.toml:5: budgets[0] sets its allowance twice: set exactly one of joules, wh, kwh, grams, kg, cost");
  EXPECT_EQ(problems(budget("kwh = 0\nwindow = \"1d\"\n")), "50-a.toml:4: budgets[0].kwh must be > 0, got 0");
  EXPECT_EQ(problems(budget("kwh = -3\nwindow = \"1d\"\n")), "50-a.toml:4: budgets[0].kwh must be > 0, got -3");
  EXPECT_EQ(problems(budget("kwh = \"10 kWh\"\nwindow = \"1d\"\n")), "50-a.toml:4: budgets[0].kwh must be a number");
  // A unit that does not exist is an unknown key, and the budget has no energy.
  EXPECT_EQ(problems(budget("kj = 5\nwindow = \"1d\"\n")),
            "50-a.toml:1: budgets[0] needs an allowance: one of joules, wh or kwh (e.g. kwh = 10), grams or kg of "
            "CO2e, or cost (money)\n"
            "50-a.toml:4: unknown key budgets[0].kj (known: name, scope, target, joules, wh, kwh, grams, kg, cost, "
            "currency, window, calendar, owner, project)");
}

TEST(PolicyConfigTest, bad_windows_are_problems_on_their_line) {
  for (const std::string bad : {"24 h", "1y", "-1d", "h", "1.5h", "24H", ""}) {
    EXPECT_EQ(problems(budget("kwh = 1\nwindow = \"" + bad + "\"\n")),
              "50-a.toml:5: budgets[0].window \"" + bad +
                  "\" is not a duration: use a number and s, m, h or d (\"24h\", \"7d\")");
  }
  EXPECT_EQ(problems(budget("kwh = 1\nwindow = \"0h\"\n")),
            "50-a.toml:5: budgets[0].window \"0h\" must be longer than 0");
  EXPECT_EQ(problems(budget("kwh = 1\nwindow = \"367d\"\n")),
            "50-a.toml:5: budgets[0].window \"367d\" is longer than 366d");
  EXPECT_EQ(problems(budget("kwh = 1\nwindow = 24\n")), "50-a.toml:5: budgets[0].window must be a string");
  EXPECT_EQ(problems(budget("kwh = 1\ncalendar = \"year\"\n")),
            "50-a.toml:5: budgets[0].calendar \"year\" is not one of day, week, month");
  EXPECT_EQ(problems(budget("kwh = 1\nwindow = \"1d\"\ncalendar = \"day\"\n")),
            "50-a.toml:6: budgets[0] sets both window and calendar: set exactly one");
  EXPECT_EQ(problems(budget("kwh = 1\n")),
            "50-a.toml:1: budgets[0] needs a window (rolling, e.g. window = \"24h\") or a calendar (calendar = "
            "\"day\", \"week\" or \"month\")");
  auto loaded = parse(budget("kwh = 1\nwindow = \"30s\"\n"));
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->policy.budgets[0].window.rolling_seconds, 30);
}

TEST(PolicyConfigTest, the_rule_is_named_by_its_index_in_its_file) {
  const std::string text = budget("kwh = 1\nwindow = \"1d\"\n") +
                           "\n[[budgets]]\nname = \"c\"\nscope = \"cluster\"\nkwh = 1\nwindow = \"1y\"\n";
  EXPECT_EQ(problems({{"50-budgets.toml", text}}),
            "50-budgets.toml:11: budgets[1].window \"1y\" is not a duration: use a number and s, m, h or d "
            "(\"24h\", \"7d\")");
}

TEST(PolicyConfigTest, scopes_and_targets_are_checked) {
  const std::string tail = "kwh = 1\nwindow = \"1d\"\n";
  auto rule = [&](const std::string& scope_lines) { return "[[budgets]]\nname = \"b\"\n" + scope_lines + tail; };
  EXPECT_EQ(problems(rule("scope = \"rack\"\ntarget = \"r1\"\n")),
            "50-a.toml:3: budgets[0].scope \"rack\" is not one of device, node, group, cluster");
  EXPECT_EQ(problems(rule("")),
            "50-a.toml:1: budgets[0] needs a scope: \"device\", \"node\", \"group\" or \"cluster\"");
  EXPECT_EQ(problems(rule("scope = \"node\"\n")),
            "50-a.toml:1: budgets[0] has scope \"node\" and needs a target (a node name)");
  EXPECT_EQ(problems(rule("scope = \"cluster\"\ntarget = \"all\"\n")),
            "50-a.toml:4: budgets[0].target must be left out: scope \"cluster\" covers every device");
  EXPECT_EQ(problems(rule("scope = \"device\"\ntarget = \"gpu0\"\n")),
            "50-a.toml:4: budgets[0].target \"gpu0\" is not a device: use \"cpu\", \"cuda:N\" or \"sim:PROFILE\", "
            "alone (on every node) or as \"NODE/cuda:0\"");
  EXPECT_NE(problems(rule("scope = \"device\"\ntarget = \"a/b/cpu\"\n")), "(accepted)");
  EXPECT_NE(problems(rule("scope = \"node\"\ntarget = \"lab 1\"\n")), "(accepted)");
  for (const std::string good : {"cpu", "cuda:1", "sim:jetson", "lab-1/cpu", "lab-1.local/cuda:0"}) {
    auto loaded = parse(rule("scope = \"device\"\ntarget = \"" + good + "\"\n"));
    ASSERT_TRUE(loaded) << good << ": " << loaded.error().message;
    EXPECT_EQ(loaded->policy.budgets[0].scope.target, good);
  }
}

TEST(PolicyConfigTest, a_group_target_must_be_defined_in_some_file) {
  const std::string uses = "[[power_caps]]\nname = \"edge-cap\"\nscope = \"group\"\ntarget = \"edge\"\nwatts = 40\n";
  const std::string defines = "[[groups]]\nname = \"edge\"\nnodes = [\"jetson-1\", \"pi-1\"]\n";
  auto loaded = parse_policy_files({{"10-caps.toml", uses}, {"90-groups.toml", defines}});
  ASSERT_TRUE(loaded) << loaded.error().message;
  ASSERT_EQ(loaded->policy.groups.size(), 1u);
  EXPECT_EQ(loaded->policy.groups_of("pi-1"), std::vector<std::string>{"edge"});
  EXPECT_EQ(loaded->policy.power_caps[0].scope.scope, Scope::group);
  EXPECT_EQ(problems({{"10-caps.toml", uses}}),
            "10-caps.toml:4: power_caps[0].target \"edge\" is not a group: define it in any policy file with "
            "[[groups]] name = \"edge\"");
  EXPECT_EQ(problems("[[groups]]\nname = \"g\"\nnodes = []\n"),
            "50-a.toml:3: groups[0].nodes is empty: a group needs at least one node");
  EXPECT_EQ(problems("[[groups]]\nname = \"g\"\n"),
            "50-a.toml:1: groups[0] needs nodes, e.g. nodes = [\"jetson-1\", \"pi-1\"]");
  EXPECT_NE(problems("[[groups]]\nname = \"g\"\nnodes = [\"a\", 3]\n"), "(accepted)");
}

TEST(PolicyConfigTest, unknown_keys_and_tables_are_errors_not_warnings) {
  EXPECT_EQ(problems(budget("kwh = 1\nwindow = \"1d\"\nwindwo = \"2d\"\n")),
            "50-a.toml:6: unknown key budgets[0].windwo (known: name, scope, target, joules, wh, kwh, grams, kg, cost, "
            "currency, window, calendar, owner, project)");
  EXPECT_EQ(problems("[budget]\nkwh = 1\n"),
            "50-a.toml:1: unknown key budget (known: placement, knobs, groups, budgets, power_caps, battery_floors, "
            "tenancy, projects, owners)");
  EXPECT_EQ(problems("[placement]\nrisc = 0.1\n"),
            "50-a.toml:2: unknown key placement.risc (known: objective, risk, warmup_epochs)");
  EXPECT_EQ(problems("[budgets]\nname = \"b\"\n"), "50-a.toml:1: budgets must be an array of tables: [[budgets]]");
}

TEST(PolicyConfigTest, duplicate_names_name_both_places) {
  const std::string cap = "[[power_caps]]\nname = \"cap\"\nscope = \"cluster\"\nwatts = 100\n";
  EXPECT_EQ(problems({{"10-a.toml", cap}, {"20-b.toml", "\n" + cap}}),
            "20-b.toml:3: power_caps[0].name \"cap\" is already used by the power cap at 10-a.toml:2");
  // Names are unique per kind: a budget may share a cap's name.
  EXPECT_TRUE(parse_policy_files({{"10-a.toml", cap}, {"20-b.toml", budget("kwh = 1\nwindow = \"1d\"\n")}}));
  EXPECT_EQ(problems(budget("kwh = 1\nwindow = \"1d\"\n") + budget("kwh = 2\nwindow = \"1d\"\n")),
            "50-a.toml:7: budgets[1].name \"b\" is already used by the budget at 50-a.toml:2");
  EXPECT_EQ(problems("[[budgets]]\nname = \"lab daily\"\nscope = \"cluster\"\nkwh = 1\nwindow = \"1d\"\n"),
            "50-a.toml:2: budgets[0].name \"lab daily\" may use only letters, digits, '_', '.' and '-'");
}

TEST(PolicyConfigTest, a_placement_key_in_two_files_is_an_error_naming_both) {
  EXPECT_EQ(problems({{"00-placement.toml", "[placement]\nrisk = 0.1\n"},
                      {"60-mine.toml", "[placement]\nobjective = \"fifo\"\n\nrisk = 0.2\n"}}),
            "60-mine.toml:4: placement.risk is also set at 00-placement.toml:2; set each [placement] key in one "
            "file only");
  auto split = parse_policy_files(
      {{"00-placement.toml", "[placement]\nrisk = 0.1\n"}, {"60-mine.toml", "[placement]\nobjective = \"fifo\"\n"}});
  ASSERT_TRUE(split) << split.error().message;
  EXPECT_DOUBLE_EQ(split->policy.risk, 0.1);
  EXPECT_EQ(split->policy.objective, Objective::fifo);
}

TEST(PolicyConfigTest, power_caps_and_battery_floors_are_read_and_checked) {
  auto loaded = parse(
      "[[power_caps]]\nname = \"gpu\"\nscope = \"device\"\ntarget = \"cuda:0\"\nwatts = 250\n"
      "[[power_caps]]\nname = \"node\"\nscope = \"node\"\ntarget = \"lab-1\"\nwatts = 400.5\naverage_seconds = 5\n"
      "[[battery_floors]]\nname = \"solar\"\nscope = \"node\"\ntarget = \"jetson-1\"\npercent = 30\n"
      "[[battery_floors]]\nname = \"laptop\"\nscope = \"device\"\ntarget = \"cpu\"\npercent = 0\n"
      "margin_percent = 0\n");
  ASSERT_TRUE(loaded) << loaded.error().message;
  const auto& policy = loaded->policy;
  ASSERT_EQ(policy.power_caps.size(), 2u);
  EXPECT_DOUBLE_EQ(policy.power_caps[0].watts, 250.0);
  EXPECT_DOUBLE_EQ(policy.power_caps[0].average_seconds, 60.0);
  EXPECT_DOUBLE_EQ(policy.power_caps[1].average_seconds, 5.0);
  ASSERT_EQ(policy.battery_floors.size(), 2u);
  EXPECT_DOUBLE_EQ(policy.battery_floors[0].percent, 30.0);
  EXPECT_DOUBLE_EQ(policy.battery_floors[0].margin_percent, 5.0);
  EXPECT_DOUBLE_EQ(policy.battery_floors[1].percent, 0.0);

  const std::string cap = "[[power_caps]]\nname = \"c\"\nscope = \"cluster\"\n";
  EXPECT_EQ(problems(cap), "50-a.toml:1: power_caps[0] needs watts, e.g. watts = 250");
  EXPECT_EQ(problems(cap + "watts = 0\n"), "50-a.toml:4: power_caps[0].watts must be > 0, got 0");
  EXPECT_EQ(problems(cap + "watts = 9\naverage_seconds = 0\n"),
            "50-a.toml:5: power_caps[0].average_seconds must be > 0, got 0");
  const std::string floor = "[[battery_floors]]\nname = \"f\"\nscope = \"cluster\"\n";
  EXPECT_EQ(problems(floor), "50-a.toml:1: battery_floors[0] needs a percent, e.g. percent = 30");
  EXPECT_EQ(problems(floor + "percent = 100\n"),
            "50-a.toml:4: battery_floors[0].percent must be at least 0 and below 100, got 100");
  EXPECT_EQ(problems(floor + "percent = 20\nmargin_percent = -1\n"),
            "50-a.toml:5: battery_floors[0].margin_percent must be >= 0, got -1");
  EXPECT_EQ(problems(floor + "percent = 90\nmargin_percent = 10\n"),
            "50-a.toml:5: battery_floors[0]: percent + margin_percent must be below 100, got 90 + 10");
  EXPECT_EQ(problems(floor + "percent = 96\n"),
            "50-a.toml:1: battery_floors[0]: percent + margin_percent (default 5) must be below 100, got 96");
}

TEST(PolicyConfigTest, a_syntax_error_names_its_file_and_line_and_other_files_are_still_checked) {
  const std::string message =
      problems({{"10-bad.toml", "[placement]\nrisk = 0.1\nobjective = \n"}, {"20-also.toml", "[[budgets]]\n"}});
  EXPECT_EQ(message.rfind("10-bad.toml:3: TOML syntax: ", 0), 0u) << message;
  EXPECT_NE(message.find("\n20-also.toml:1: budgets[0] needs a name"), std::string::npos) << message;
}

TEST(PolicyConfigTest, every_problem_is_listed_in_file_then_line_order) {
  auto loaded = parse_policy_files({{"10-a.toml", "[placement]\nrisk = 2\n\nobjective = \"x\"\n"},
                                    {"20-b.toml", budget("kwh = -1\nwindow = \"0h\"\n")}});
  ASSERT_FALSE(loaded);
  EXPECT_EQ(loaded.error().code, joule::ErrorCode::invalid_argument);
  EXPECT_EQ(loaded.error().where, "10-a.toml:2");
  EXPECT_EQ(
      loaded.error().message,
      "10-a.toml:2: placement.risk must be between 0 and 1 (exclusive), got 2\n"
      "10-a.toml:4: placement.objective \"x\" is not one of min-energy, min-edp, earliest-finish, min-carbon, fifo, "
      "round-robin, least-loaded, flops-greedy\n"
      "20-b.toml:4: budgets[0].kwh must be > 0, got -1\n"
      "20-b.toml:5: budgets[0].window \"0h\" must be longer than 0");
}

TEST(PolicyConfigTest, a_directory_is_read_in_lexical_order_and_accumulates) {
  joule::testing::TempDir dir;
  dir.write("50-budgets.toml", budget("kwh = 10\ncalendar = \"day\"\n") +
                                   "[[budgets]]\nname = \"edge\"\nscope = \"group\"\ntarget = \"edge\"\n"
                                   "wh = 500\nwindow = \"24h\"\n");
  dir.write("00-placement.toml", "[placement]\nobjective = \"earliest-finish\"\n");
  dir.write("10-groups.toml", "[[groups]]\nname = \"edge\"\nnodes = [\"pi-1\"]\n");
  dir.write("README", "not a policy");
  dir.write("60-old.toml.disabled", "[bad");
  dir.write(".#50-budgets.toml", "[bad");
  std::filesystem::create_directory(dir / "70-dir.toml");
  auto loaded = load_policy_directory(dir.path());
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->policy.source, "00-placement.toml, 10-groups.toml, 50-budgets.toml");
  EXPECT_EQ(loaded->files, (std::vector<std::filesystem::path>{dir / "00-placement.toml", dir / "10-groups.toml",
                                                               dir / "50-budgets.toml"}));
  EXPECT_EQ(loaded->policy.objective, Objective::earliest_finish);
  ASSERT_EQ(loaded->policy.budgets.size(), 2u);
  EXPECT_DOUBLE_EQ(loaded->policy.budgets[1].limit, 1.8e6);
  EXPECT_EQ(loaded->policy.budgets[1].scope.describe(), "group edge");
}

TEST(PolicyConfigTest, an_error_in_one_file_of_a_directory_returns_nothing) {
  joule::testing::TempDir dir;
  dir.write("00-placement.toml", "[placement]\nobjective = \"min-edp\"\n");
  dir.write("50-budgets.toml", budget("kwh = 10\nwindow = \"1y\"\n"));
  auto loaded = load_policy_directory(dir.path());
  ASSERT_FALSE(loaded);
  EXPECT_EQ(loaded.error().message,
            "50-budgets.toml:5: budgets[0].window \"1y\" is not a duration: use a number and s, m, h or d "
            "(\"24h\", \"7d\")");
}

TEST(PolicyConfigTest, a_missing_directory_is_the_embedded_defaults_and_an_unreadable_file_an_error) {
  joule::testing::TempDir dir;
  auto missing = load_policy_directory(dir / "policies.d");
  ASSERT_TRUE(missing) << missing.error().message;
  EXPECT_EQ(missing->policy.source, "embedded defaults");
  EXPECT_TRUE(missing->files.empty());
  auto empty = load_policy_directory(dir.path());
  ASSERT_TRUE(empty) << empty.error().message;
  EXPECT_EQ(empty->policy.source, "embedded defaults");

  dir.write("00-placement.toml", "[placement]\nrisk = 0.1\n");
  std::filesystem::create_symlink(dir / "nowhere.toml", dir / "20-gone.toml");  // unreadable, even by root
  auto unreadable = load_policy_directory(dir.path());
  ASSERT_FALSE(unreadable);
  EXPECT_EQ(unreadable.error().message, "20-gone.toml: cannot be read: No such file or directory");

  auto not_a_directory = load_policy_directory(dir / "00-placement.toml");
  ASSERT_FALSE(not_a_directory);
}

TEST(PolicyConfigTest, the_shipped_policy_files_are_valid_and_change_nothing) {
  const auto shipped = std::filesystem::path(JOULE_SOURCE_DIR) / "config/policies.d";
  auto loaded = load_policy_directory(shipped);
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_TRUE(loaded->warnings.empty());
  EXPECT_EQ(loaded->policy.source, "00-placement.toml, 50-budgets-example.toml, 60-tenancy-example.toml");
  const joule::schedulers::Policy defaults;
  EXPECT_EQ(loaded->policy.objective, defaults.objective);
  EXPECT_DOUBLE_EQ(loaded->policy.risk, defaults.risk);
  EXPECT_EQ(loaded->policy.warmup_epochs, defaults.warmup_epochs);
  EXPECT_TRUE(loaded->policy.groups.empty());
  EXPECT_TRUE(loaded->policy.budgets.empty());
  EXPECT_TRUE(loaded->policy.power_caps.empty());
  EXPECT_TRUE(loaded->policy.battery_floors.empty());
  EXPECT_TRUE(loaded->policy.tenancy.projects.empty());
  EXPECT_TRUE(loaded->policy.tenancy.owners.empty());
  EXPECT_FALSE(loaded->policy.tenancy.owner_quota.any());
}

TEST(PolicyConfigTest, the_shipped_examples_are_valid_when_uncommented) {
  const std::string text = uncommented_example("50-budgets-example.toml");
  auto loaded = parse(text, "50-budgets-example.toml");
  ASSERT_TRUE(loaded) << loaded.error().message << "\n" << text;
  EXPECT_TRUE(loaded->warnings.empty());
  EXPECT_EQ(loaded->policy.groups.size(), 1u);
  ASSERT_EQ(loaded->policy.budgets.size(), 6u);
  EXPECT_DOUBLE_EQ(loaded->policy.budgets[0].limit, 3.6e7);
  EXPECT_EQ(loaded->policy.budgets[0].window.describe(), "rolling 1d");
  EXPECT_EQ(loaded->policy.budgets[3].unit, joule::schedulers::BudgetUnit::grams);  // 2 kg a day
  EXPECT_DOUBLE_EQ(loaded->policy.budgets[3].limit, 2000.0);
  EXPECT_EQ(loaded->policy.budgets[4].unit, joule::schedulers::BudgetUnit::money);
  EXPECT_EQ(loaded->policy.budgets[4].currency, "EUR");
  EXPECT_EQ(loaded->policy.power_caps.size(), 1u);
  EXPECT_EQ(loaded->policy.battery_floors.size(), 1u);
}

TEST(PolicyConfigTest, the_shipped_tenancy_example_is_valid_when_uncommented) {
  const std::string text = uncommented_example("60-tenancy-example.toml");
  auto loaded = parse(text, "60-tenancy-example.toml");
  ASSERT_TRUE(loaded) << loaded.error().message << "\n" << text;
  const auto& tenancy = loaded->policy.tenancy;
  EXPECT_EQ(tenancy.default_project, "lab");
  EXPECT_EQ(tenancy.owner_quota.max_queued_jobs, 500);
  ASSERT_EQ(tenancy.projects.size(), 2u);
  EXPECT_EQ(tenancy.projects[1].owners, (std::vector<std::string>{"token:alice", "uid:1000"}));
  EXPECT_EQ(tenancy.projects[1].quota.max_running_jobs, 2);
  EXPECT_EQ(tenancy.projects[1].shares, 2.0);
  EXPECT_TRUE(tenancy.fair_share);
  EXPECT_EQ(tenancy.usage_half_life_seconds, 7 * 86400);
  ASSERT_EQ(tenancy.owners.size(), 1u);
  // Alice's own running limit replaces the default; her queued limit is the default's.
  const auto alice = tenancy.quota_of_owner("token:alice");
  EXPECT_EQ(alice.max_running_jobs, 1);
  EXPECT_EQ(alice.max_queued_jobs, 500);
  EXPECT_EQ(tenancy.quota_of_owner("uid:1000").max_running_jobs, 4);
  EXPECT_TRUE(tenancy.limits_running());
  ASSERT_EQ(loaded->policy.budgets.size(), 3u);
  EXPECT_EQ(loaded->policy.budgets[0].describe_scope(), "project vision on the cluster");
  EXPECT_DOUBLE_EQ(loaded->policy.budgets[0].limit, 50 * 3.6e6);
  EXPECT_TRUE(loaded->policy.budgets[1].each_owner);
  EXPECT_EQ(loaded->policy.budgets[2].describe_scope(), "owner token:alice on node jetson-1");
}

TEST(PolicyConfigTest, an_owners_or_projects_budget_is_read_and_checked_with_its_lines) {
  auto loaded =
      parse_policy_files({{"50-a.toml",
                           "[[budgets]]\nname = \"v\"\nproject = \"vision\"\nowner = \"uid:1000\"\njoules = 5\n"
                           "window = \"24h\"\n"},
                          {"60-b.toml", "[[projects]]\nname = \"vision\"\n"}});
  ASSERT_TRUE(loaded) << loaded.error().message;
  const auto& budget = loaded->policy.budgets.at(0);
  EXPECT_EQ(budget.project, "vision");
  EXPECT_EQ(budget.owner, "uid:1000");
  EXPECT_EQ(budget.scope.scope, Scope::cluster);  // everywhere, as no scope is named
  EXPECT_TRUE(budget.counts_work_of("uid:1000", "vision"));
  EXPECT_FALSE(budget.counts_work_of("uid:1000", "lab"));
  EXPECT_FALSE(budget.counts_work_of("", ""));  // a probe
  EXPECT_EQ(problems("[[budgets]]\nname = \"v\"\nproject = \"vision\"\njoules = 5\nwindow = \"24h\"\n"),
            "50-a.toml:3: budgets[0].project \"vision\" is not a project: define it in any policy file with "
            "[[projects]] name = \"vision\"");
  EXPECT_EQ(problems("[[projects]]\nname = \"vision\"\nowners = [\"uid:1\"]\n[[budgets]]\nname = \"v\"\n"
                     "owner = \"uid:2\"\nproject = \"vision\"\njoules = 5\nwindow = \"24h\"\n"),
            "50-a.toml:7: budgets[0].project \"vision\": uid:2 is not one of its owners");
  EXPECT_EQ(problems("[[budgets]]\nname = \"a\"\nowner = \"alice\"\njoules = 5\nwindow = \"24h\"\n"),
            "50-a.toml:3: budgets[0].owner \"alice\" is not an owner as jobs name them: \"token:NAME\" (a bearer "
            "token's owner), \"uid:N\" (a local user) or \"*\" (each owner)");
  // "*": a template, a budget of that size for every owner.
  auto each = parse("[[budgets]]\nname = \"each-week\"\nowner = \"*\"\nkwh = 1\ncalendar = \"week\"\n");
  ASSERT_TRUE(each) << each.error().message;
  EXPECT_TRUE(each->policy.budgets.at(0).each_owner);
  EXPECT_EQ(each->policy.budgets.at(0).describe_scope(), "each owner on the cluster");
  EXPECT_FALSE(each->policy.budgets.at(0).counts_work_of("uid:1000", ""));  // the template counts nothing itself
  EXPECT_EQ(problems("[[budgets]]\nname = \"a\"\nowner = \"uid:1\"\nscope = \"node\"\njoules = 5\nwindow = \"24h\"\n"),
            "50-a.toml:1: budgets[0] has scope \"node\" and needs a target (a node name)");
  // Without an owner or project a budget still needs its scope.
  EXPECT_EQ(problems("[[budgets]]\nname = \"a\"\njoules = 5\nwindow = \"24h\"\n"),
            "50-a.toml:1: budgets[0] needs a scope: \"device\", \"node\", \"group\" or \"cluster\"");
}

TEST(PolicyConfigTest, projects_and_owners_across_files_are_checked_with_their_lines) {
  // A default project may be defined in a later file; one that is nowhere is a problem.
  auto loaded = parse_policy_files(
      {{"50-a.toml", "[tenancy]\ndefault_project = \"lab\"\n"}, {"60-b.toml", "[[projects]]\nname = \"lab\"\n"}});
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->policy.tenancy.default_project, "lab");
  EXPECT_EQ(problems("[tenancy]\ndefault_project = \"lab\"\n"),
            "50-a.toml:2: tenancy.default_project \"lab\" is not a project: define it in any policy file with "
            "[[projects]] name = \"lab\"");
  EXPECT_EQ(problems("[[projects]]\nname = \"vision\"\nowners = [\"token:bob\"]\n\n[[owners]]\nname = "
                     "\"token:alice\"\nproject = \"vision\"\n"),
            "50-a.toml:7: owners[0].project \"vision\": token:alice is not one of its owners");
  EXPECT_EQ(problems("[[owners]]\nname = \"alice\"\n"),
            "50-a.toml:2: owners[0].name \"alice\" is not an owner as jobs name them: \"token:NAME\" (a bearer "
            "token's owner) or \"uid:N\" (a local user)");
  EXPECT_EQ(problems("[[owners]]\nname = \"uid:1000\"\n\n[[owners]]\nname = \"uid:1000\"\n"),
            "50-a.toml:5: owners[1].name \"uid:1000\" already has a rule at 50-a.toml:2");
  EXPECT_EQ(problems("[[projects]]\nname = \"p\"\nmax_queued_jobs = -1\n"),
            "50-a.toml:3: projects[0].max_queued_jobs must be between 0 and 10000000, got -1");
  EXPECT_EQ(problems("[[projects]]\nname = \"p\"\nmax_running_jobs = 1.5\n"),
            "50-a.toml:3: projects[0].max_running_jobs must be an integer");
  EXPECT_EQ(problems("[[projects]]\nname = \"p\"\nowners = [\"alice\"]\n"),
            "50-a.toml:3: projects[0].owners entries must be owners as jobs name them: \"token:NAME\" or \"uid:N\"");
  EXPECT_EQ(problems("[tenancy]\nmax_running_jobs_per_owner = 99999999\n"),
            "50-a.toml:2: tenancy.max_running_jobs_per_owner must be between 0 and 1000000, got 99999999");
  EXPECT_EQ(problems({{"50-a.toml", "[tenancy]\nmax_queued_jobs_per_owner = 5\n"},
                      {"60-b.toml", "[tenancy]\nmax_queued_jobs_per_owner = 6\n"}}),
            "60-b.toml:2: tenancy.max_queued_jobs_per_owner is also set at 50-a.toml:2; set each [tenancy] key in one "
            "file only");
  EXPECT_EQ(problems("[tenancy]\nmax_jobs = 5\n"),
            "50-a.toml:2: unknown key tenancy.max_jobs (known: default_project, max_queued_jobs_per_owner, "
            "max_running_jobs_per_owner, fair_share, usage_half_life)");
  EXPECT_EQ(
      problems("[tenancy]\nusage_half_life = \"a week\"\n"),
      "50-a.toml:2: tenancy.usage_half_life \"a week\" is not a duration: use a number and s, m, h or d (\"24h\", "
      "\"7d\")");
  EXPECT_EQ(problems("[tenancy]\nfair_share = 1\n"), "50-a.toml:2: tenancy.fair_share must be true or false");
  EXPECT_EQ(problems("[[projects]]\nname = \"p\"\nshares = 0\n"),
            "50-a.toml:3: projects[0].shares must be above 0 and at most 1000000, got 0");
}
