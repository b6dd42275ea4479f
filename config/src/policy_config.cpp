#include "joule/config/policy_config.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "joule/config/device_names.hpp"
#include "joule/config/grid_signal_file.hpp"
#include "toml_checker.hpp"

namespace joule::config {
namespace {

using detail::Checker;
using schedulers::Scope;

constexpr std::int64_t kMaxWindowSeconds = 366LL * 86400;
const char* const kObjectives =
    "min-energy, min-edp, earliest-finish, min-carbon, fifo, round-robin, least-loaded, flops-greedy";

struct Place {
  std::string file;
  int line = 0;
};

std::string describe(const ConfigProblem& problem) {
  // Line 0: a problem with the file as a whole (it cannot be read).
  return problem.line > 0 ? problem.describe() : fmt::format("{}: {}", problem.file, problem.message);
}

bool is_rule_name(std::string_view name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
  });
}

bool is_node_name(std::string_view name) {
  return !name.empty() && std::none_of(name.begin(), name.end(), [](char c) {
    return c == '/' || std::isspace(static_cast<unsigned char>(c)) || std::iscntrl(static_cast<unsigned char>(c));
  });
}

// "90m", "24h", "7d": a positive integer and one unit, nothing else.
enum class DurationError { none, not_a_duration, zero, too_long };
DurationError parse_duration(std::string_view text, std::int64_t& seconds) {
  if (text.size() < 2) return DurationError::not_a_duration;
  std::int64_t unit = 0;
  switch (text.back()) {
    case 's':
      unit = 1;
      break;
    case 'm':
      unit = 60;
      break;
    case 'h':
      unit = 3600;
      break;
    case 'd':
      unit = 86400;
      break;
    default:
      return DurationError::not_a_duration;
  }
  const std::string_view digits = text.substr(0, text.size() - 1);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return DurationError::not_a_duration;
  std::int64_t count = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), count);
  if (error == std::errc::result_out_of_range || count > kMaxWindowSeconds / unit) return DurationError::too_long;
  if (count == 0) return DurationError::zero;
  seconds = count * unit;
  return DurationError::none;
}

// The state of a set of files being read, in order.
struct Accumulator {
  schedulers::Policy policy;
  std::map<std::string, Place> placement_keys;
  std::map<std::string, Place> knob_keys;
  std::map<std::string, Place> tenancy_keys;
  struct ProjectUse {
    std::string project;
    std::string owner;  // the owner whose default it is; empty: the default project
    std::string what;   // "owners[0].project"
    Place place;
  };
  std::vector<ProjectUse> project_uses;
  std::map<std::string, std::map<std::string, Place>> names;  // kind -> rule name -> where defined
  struct GroupUse {
    std::string group;
    std::string what;  // "budgets[0].target"
    Place place;
  };
  std::vector<GroupUse> group_uses;
  std::vector<ConfigProblem> problems;
  std::vector<ConfigProblem> warnings;
  bool every_file_read = true;  // otherwise a group may be defined in the file that failed
};

class FileParser {
 public:
  FileParser(std::string file, Accumulator& acc) : check_(std::move(file)), acc_(acc) {}

  void parse(const toml::table& root) {
    check_.reject_unknown(
        root, "",
        {"placement", "knobs", "groups", "budgets", "power_caps", "battery_floors", "tenancy", "projects", "owners"});
    if (const toml::node* placement = root.get("placement")) {
      if (const auto* table = placement->as_table())
        parse_placement(*table);
      else
        check_.problem(*placement, "placement must be a table: [placement]");
    }
    if (const toml::node* knobs = root.get("knobs")) {
      if (const auto* table = knobs->as_table())
        parse_knobs(*table);
      else
        check_.problem(*knobs, "knobs must be a table: [knobs]");
    }
    for_each_table(root, "groups", [&](const toml::table& t, const std::string& what) { parse_group(t, what); });
    for_each_table(root, "budgets", [&](const toml::table& t, const std::string& what) { parse_budget(t, what); });
    for_each_table(root, "power_caps", [&](const toml::table& t, const std::string& what) { parse_cap(t, what); });
    for_each_table(root, "battery_floors",
                   [&](const toml::table& t, const std::string& what) { parse_floor(t, what); });
    if (const toml::node* tenancy = root.get("tenancy")) {
      if (const auto* table = tenancy->as_table())
        parse_tenancy(*table);
      else
        check_.problem(*tenancy, "tenancy must be a table: [tenancy]");
    }
    for_each_table(root, "projects", [&](const toml::table& t, const std::string& what) { parse_project(t, what); });
    for_each_table(root, "owners", [&](const toml::table& t, const std::string& what) { parse_owner(t, what); });
    finish();
  }

  void syntax_error(const toml::parse_error& error) {
    acc_.problems.push_back(ConfigProblem{check_.file(), static_cast<int>(error.source().begin.line),
                                          fmt::format("TOML syntax: {}", error.description())});
    acc_.every_file_read = false;
  }

 private:
  Place place_of(const toml::node& node) const {
    return Place{check_.file(), static_cast<int>(node.source().begin.line)};
  }

  void finish() {
    for (auto& p : check_.problems_) acc_.problems.push_back(std::move(p));
    for (auto& w : check_.warnings_) acc_.warnings.push_back(std::move(w));
  }

  template <class F>
  void for_each_table(const toml::table& root, const char* key, F&& parse_one) {
    const toml::node* node = root.get(key);
    if (!node) return;
    const auto* array = node->as_array();
    if (!array) {
      check_.problem(*node, fmt::format("{} must be an array of tables: [[{}]]", key, key));
      return;
    }
    for (std::size_t i = 0; i < array->size(); ++i) {
      const std::string what = fmt::format("{}[{}]", key, i);
      if (const auto* table = (*array)[i].as_table())
        parse_one(*table, what);
      else
        check_.problem((*array)[i], fmt::format("{} must be a table", what));
    }
  }

  // A finite number, or nullopt (and a problem if the key is there but not a finite number).
  std::optional<double> number(const toml::table& table, const char* key, const std::string& what) {
    auto value = check_.get<double>(table, key, fmt::format("{}.{}", what, key));
    if (value && !std::isfinite(*value)) {
      check_.problem(*table.get(key), fmt::format("{}.{} must be a finite number", what, key));
      return std::nullopt;
    }
    return value;
  }

  // A number the rule must have, in the range `valid` accepts (`range` says it in words);
  // nullopt, with the problem noted, when it is missing, not a finite number or out of range.
  template <class Valid>
  std::optional<double> required_number(const toml::table& table, const char* key, const std::string& what,
                                        const std::string& missing, Valid valid, const char* range) {
    if (!table.get(key)) {
      check_.problem(table, missing);
      return std::nullopt;
    }
    auto value = number(table, key, what);
    if (value && valid(*value)) return value;
    if (value) check_.problem(*table.get(key), fmt::format("{}.{} must be {}, got {}", what, key, range, *value));
    return std::nullopt;
  }

  // A duration such as "24h" or "7d" (up to 366 days) at `key`, or nullopt with the problem noted
  // (`name` as the message names it: "budgets[0].window").
  std::optional<std::int64_t> duration(const toml::table& table, const char* key, const std::string& name) {
    const toml::node* node = table.get(key);
    auto text = check_.get<std::string>(table, key, name);
    if (!node || !text) return std::nullopt;
    std::int64_t seconds = 0;
    switch (parse_duration(*text, seconds)) {
      case DurationError::none:
        return seconds;
      case DurationError::not_a_duration:
        check_.problem(*node, fmt::format("{} \"{}\" is not a duration: use a number and s, m, h or d (\"24h\", "
                                          "\"7d\")",
                                          name, *text));
        break;
      case DurationError::zero:
        check_.problem(*node, fmt::format("{} \"{}\" must be longer than 0", name, *text));
        break;
      case DurationError::too_long:
        check_.problem(*node, fmt::format("{} \"{}\" is longer than 366d", name, *text));
        break;
    }
    return std::nullopt;
  }

  void parse_placement(const toml::table& table) {
    check_.reject_unknown(table, "placement.", {"objective", "risk", "warmup_epochs"});
    for (const auto& [key, node] : table) {
      const std::string name(key.str());
      if (name != "objective" && name != "risk" && name != "warmup_epochs") continue;
      const auto [first, inserted] = acc_.placement_keys.try_emplace(name, place_of(node));
      if (!inserted)
        check_.problem(node, fmt::format("placement.{} is also set at {}:{}; set each [placement] key in one file only",
                                         name, first->second.file, first->second.line));
    }
    if (auto objective = check_.get<std::string>(table, "objective", "placement.objective")) {
      if (auto parsed = schedulers::objective_from_string(*objective)) {
        acc_.policy.objective = *parsed;
        if (*parsed == schedulers::Objective::round_robin || *parsed == schedulers::Objective::least_loaded ||
            *parsed == schedulers::Objective::flops_greedy)
          check_.warning(*table.get("objective"),
                         fmt::format("placement.objective \"{}\" is a baseline for comparison runs: it places jobs "
                                     "without reading energy estimates",
                                     *objective));
      } else {
        check_.problem(*table.get("objective"),
                       fmt::format("placement.objective \"{}\" is not one of {}", *objective, kObjectives));
      }
    }
    if (auto risk = number(table, "risk", "placement")) {
      if (*risk <= 0.0 || *risk >= 1.0)
        check_.problem(*table.get("risk"),
                       fmt::format("placement.risk must be between 0 and 1 (exclusive), got {}", *risk));
      else
        acc_.policy.risk = *risk;
    }
    acc_.policy.warmup_epochs = static_cast<int>(
        check_.integer_in(table, "warmup_epochs", "placement.warmup_epochs", 0, 1000, acc_.policy.warmup_epochs));
  }

  // [knobs]: the goal for devices' knob settings, the slowdown allowed and Zeus's eta.
  void parse_knobs(const toml::table& table) {
    check_.reject_unknown(table, "knobs.", {"goal", "max_slowdown", "eta"});
    for (const auto& [key, node] : table) {
      const std::string name(key.str());
      if (name != "goal" && name != "max_slowdown" && name != "eta") continue;
      const auto [first, inserted] = acc_.knob_keys.try_emplace(name, place_of(node));
      if (!inserted)
        check_.problem(node, fmt::format("knobs.{} is also set at {}:{}; set each [knobs] key in one file only", name,
                                         first->second.file, first->second.line));
    }
    if (auto goal = check_.get<std::string>(table, "goal", "knobs.goal")) {
      if (auto parsed = schedulers::knob_goal_from_string(*goal))
        acc_.policy.knobs.goal = *parsed;
      else
        check_.problem(*table.get("goal"),
                       fmt::format("knobs.goal \"{}\" is not one of off, min-energy, zeus, min-edp", *goal));
    }
    if (auto slowdown = number(table, "max_slowdown", "knobs")) {
      // 0 allows no slowdown at all, so no setting could be chosen: impossible, not a policy.
      if (*slowdown <= 0.0 || *slowdown > 10.0)
        check_.problem(
            *table.get("max_slowdown"),
            fmt::format("knobs.max_slowdown must be above 0 and at most 10 (0.1: 10 % slower), got {}", *slowdown));
      else
        acc_.policy.knobs.max_slowdown = *slowdown;
    }
    if (auto eta = number(table, "eta", "knobs")) {
      if (*eta < 0.0 || *eta > 1.0)
        check_.problem(*table.get("eta"), fmt::format("knobs.eta must be between 0 and 1, got {}", *eta));
      else
        acc_.policy.knobs.eta = *eta;
    }
  }

  // name: required, [A-Za-z0-9_.-]+, unique among rules of the kind across all files.
  std::string rule_name(const toml::table& table, const std::string& what, const std::string& kind) {
    const toml::node* node = table.get("name");
    if (!node) {
      check_.problem(table, fmt::format("{} needs a name, e.g. name = \"lab-daily\"", what));
      return {};
    }
    auto name = check_.get<std::string>(table, "name", what + ".name");
    if (!name) return {};
    if (!is_rule_name(*name)) {
      check_.problem(*node, fmt::format("{}.name \"{}\" may use only letters, digits, '_', '.' and '-'", what, *name));
      return *name;
    }
    const auto [first, inserted] = acc_.names[kind].try_emplace(*name, place_of(*node));
    if (!inserted)
      check_.problem(*node, fmt::format("{}.name \"{}\" is already used by the {} at {}:{}", what, *name, kind,
                                        first->second.file, first->second.line));
    return *name;
  }

  // scope and target; false when either is unusable (a problem has been recorded).
  bool scope_target(const toml::table& table, const std::string& what, schedulers::ScopeTarget& out) {
    const toml::node* scope_node = table.get("scope");
    if (!scope_node) {
      check_.problem(table, fmt::format("{} needs a scope: \"device\", \"node\", \"group\" or \"cluster\"", what));
      return false;
    }
    auto scope_text = check_.get<std::string>(table, "scope", what + ".scope");
    if (!scope_text) return false;
    auto scope = schedulers::scope_from_string(*scope_text);
    if (!scope) {
      check_.problem(*scope_node,
                     fmt::format("{}.scope \"{}\" is not one of device, node, group, cluster", what, *scope_text));
      return false;
    }
    out.scope = *scope;
    const toml::node* target_node = table.get("target");
    if (*scope == Scope::cluster) {
      if (target_node) {
        check_.problem(*target_node,
                       fmt::format("{}.target must be left out: scope \"cluster\" covers every device", what));
        return false;
      }
      return true;
    }
    if (!target_node) {
      check_.problem(table, fmt::format("{} has scope \"{}\" and needs a target ({})", what, *scope_text,
                                        *scope == Scope::device ? "\"cpu\" or \"NODE/cuda:0\""
                                        : *scope == Scope::node ? "a node name"
                                                                : "a [[groups]] name"));
      return false;
    }
    auto target = check_.get<std::string>(table, "target", what + ".target");
    if (!target) return false;
    bool ok = true;
    if (*scope == Scope::device) {
      const auto slash = target->find('/');
      const std::string device = slash == std::string::npos ? *target : target->substr(slash + 1);
      ok = is_device_name(device) && (slash == std::string::npos || is_node_name(target->substr(0, slash)));
      if (!ok)
        check_.problem(*target_node, fmt::format("{}.target \"{}\" is not a device: use \"cpu\", \"cuda:N\" or "
                                                 "\"sim:PROFILE\", alone (on every node) or as \"NODE/cuda:0\"",
                                                 what, *target));
    } else if (*scope == Scope::node) {
      ok = is_node_name(*target);
      if (!ok)
        check_.problem(*target_node,
                       fmt::format("{}.target \"{}\" is not a node name (no spaces or '/')", what, *target));
    } else {
      acc_.group_uses.push_back({*target, what + ".target", place_of(*target_node)});
    }
    out.target = *target;
    return ok;
  }

  void parse_group(const toml::table& table, const std::string& what) {
    check_.reject_unknown(table, what + ".", {"name", "nodes"});
    schedulers::NodeGroup group;
    group.name = rule_name(table, what, "group");
    const toml::node* nodes = table.get("nodes");
    const auto* array = nodes ? nodes->as_array() : nullptr;
    if (!nodes) {
      check_.problem(table, fmt::format("{} needs nodes, e.g. nodes = [\"jetson-1\", \"pi-1\"]", what));
      return;
    }
    if (!array) {
      check_.problem(*nodes, fmt::format("{}.nodes must be an array of node names", what));
      return;
    }
    if (array->empty()) check_.problem(*nodes, fmt::format("{}.nodes is empty: a group needs at least one node", what));
    for (const auto& element : *array) {
      auto node = element.value<std::string>();
      if (!element.is_string() || !is_node_name(*node)) {
        check_.problem(element, fmt::format("{}.nodes entries must be node names (strings, no spaces or '/')", what));
      } else if (std::find(group.nodes.begin(), group.nodes.end(), *node) != group.nodes.end()) {
        check_.warning(element, fmt::format("{}.nodes lists \"{}\" twice", what, *node));
      } else {
        group.nodes.push_back(*node);
      }
    }
    acc_.policy.groups.push_back(std::move(group));
  }

  void parse_budget(const toml::table& table, const std::string& what) {
    check_.reject_unknown(table, what + ".",
                          {"name", "scope", "target", "joules", "wh", "kwh", "grams", "kg", "cost", "currency",
                           "window", "calendar", "owner", "project"});
    schedulers::EnergyBudget budget;
    budget.name = rule_name(table, what, "budget");
    bool ok = budget_tenant(table, what, budget);
    // An owner's or project's budget counts their jobs everywhere unless it names a scope.
    const bool for_tenant = table.get("owner") || table.get("project");
    if (!for_tenant || table.get("scope")) ok = scope_target(table, what, budget.scope) && ok;

    // The allowance: energy, grams CO2e at the carbon signal, or money at the price signal.
    using Unit = schedulers::BudgetUnit;
    struct Amount {
      const char* key;
      Unit unit;
      double per_key;  // in the unit
    };
    static constexpr Amount kAmounts[] = {{"joules", Unit::joules, 1.0}, {"wh", Unit::joules, 3600.0},
                                          {"kwh", Unit::joules, 3.6e6},  {"grams", Unit::grams, 1.0},
                                          {"kg", Unit::grams, 1000.0},   {"cost", Unit::money, 1.0}};
    int amounts_set = 0;
    for (const auto& [key, unit, per_key] : kAmounts) {
      if (!table.get(key)) continue;
      if (++amounts_set > 1) {
        check_.problem(
            *table.get(key),
            fmt::format("{} sets its allowance twice: set exactly one of joules, wh, kwh, grams, kg, cost", what));
        ok = false;
        continue;
      }
      auto amount = number(table, key, what);
      if (amount && *amount <= 0.0)
        check_.problem(*table.get(key), fmt::format("{}.{} must be > 0, got {}", what, key, *amount));
      if (!amount || *amount <= 0.0) {
        ok = false;
      } else {
        budget.unit = unit;
        budget.limit = *amount * per_key;
      }
    }
    if (amounts_set == 0) {
      check_.problem(table, fmt::format("{} needs an allowance: one of joules, wh or kwh (e.g. kwh = 10), grams or kg "
                                        "of CO2e, or cost (money)",
                                        what));
      ok = false;
    }
    if (const toml::node* currency = table.get("currency")) {
      auto text = check_.get<std::string>(table, "currency", what + ".currency");
      if (!table.get("cost")) {
        check_.problem(*currency, fmt::format("{}.currency applies only to a budget in money (cost = ...)", what));
        ok = false;
      } else if (text && !is_currency_code(*text)) {
        check_.problem(*currency, fmt::format("{}.currency must be a currency code of 3 letters (\"EUR\"), got \"{}\"",
                                              what, *text));
        ok = false;
      } else if (text) {
        budget.currency = *text;
      } else {
        ok = false;
      }
    }

    const toml::node* window = table.get("window");
    const toml::node* calendar = table.get("calendar");
    if (window && calendar) {
      check_.problem(*calendar, fmt::format("{} sets both window and calendar: set exactly one", what));
      ok = false;
    } else if (!window && !calendar) {
      check_.problem(table, fmt::format("{} needs a window (rolling, e.g. window = \"24h\") or a calendar "
                                        "(calendar = \"day\", \"week\" or \"month\")",
                                        what));
      ok = false;
    } else if (window) {
      const auto seconds = duration(table, "window", what + ".window");
      ok = ok && seconds.has_value();
      budget.window.kind = schedulers::BudgetWindow::Kind::rolling;
      budget.window.rolling_seconds = seconds.value_or(0);
    } else {
      auto text = check_.get<std::string>(table, "calendar", what + ".calendar");
      using Kind = schedulers::BudgetWindow::Kind;
      if (text == "day")
        budget.window.kind = Kind::day;
      else if (text == "week")
        budget.window.kind = Kind::week;
      else if (text == "month")
        budget.window.kind = Kind::month;
      else {
        if (text)
          check_.problem(*calendar, fmt::format("{}.calendar \"{}\" is not one of day, week, month", what, *text));
        ok = false;
      }
    }
    if (ok) acc_.policy.budgets.push_back(std::move(budget));
  }

  // A budget's owner and project, where it is for one; false when either is unusable.
  bool budget_tenant(const toml::table& table, const std::string& what, schedulers::EnergyBudget& budget) {
    bool ok = true;
    if (const toml::node* owner = table.get("owner")) {
      auto name = check_.get<std::string>(table, "owner", what + ".owner");
      if (!name) {
        ok = false;
      } else if (*name == "*") {
        budget.each_owner = true;  // a budget of this size for every owner
      } else if (!is_owner_name(*name)) {
        check_.problem(*owner, fmt::format("{}.owner \"{}\" is not an owner as jobs name them: \"token:NAME\" (a "
                                           "bearer token's owner), \"uid:N\" (a local user) or \"*\" (each owner)",
                                           what, *name));
        ok = false;
      } else {
        budget.owner = *name;
      }
    }
    if (const toml::node* project = table.get("project")) {
      if (auto name = check_.get<std::string>(table, "project", what + ".project")) {
        budget.project = *name;
        acc_.project_uses.push_back({*name, budget.owner, what + ".project", place_of(*project)});
      } else {
        ok = false;
      }
    }
    return ok;
  }

  void parse_cap(const toml::table& table, const std::string& what) {
    check_.reject_unknown(table, what + ".", {"name", "scope", "target", "watts", "average_seconds"});
    schedulers::PowerCap cap;
    cap.name = rule_name(table, what, "power cap");
    bool ok = scope_target(table, what, cap.scope);
    if (auto watts = required_number(table, "watts", what, fmt::format("{} needs watts, e.g. watts = 250", what),
                                     [](double w) { return w > 0.0; }, "> 0"))
      cap.watts = *watts;
    else
      ok = false;
    if (auto seconds = number(table, "average_seconds", what)) {
      if (*seconds <= 0.0) {
        check_.problem(*table.get("average_seconds"),
                       fmt::format("{}.average_seconds must be > 0, got {}", what, *seconds));
        ok = false;
      }
      cap.average_seconds = *seconds;
    } else if (table.get("average_seconds")) {
      ok = false;
    }
    if (ok) acc_.policy.power_caps.push_back(std::move(cap));
  }

  void parse_floor(const toml::table& table, const std::string& what) {
    check_.reject_unknown(table, what + ".", {"name", "scope", "target", "percent", "margin_percent"});
    schedulers::BatteryFloor floor;
    floor.name = rule_name(table, what, "battery floor");
    bool ok = scope_target(table, what, floor.scope);
    if (auto percent = required_number(table, "percent", what,
                                       fmt::format("{} needs a percent, e.g. percent = 30", what),
                                       [](double p) { return p >= 0.0 && p < 100.0; }, "at least 0 and below 100"))
      floor.percent = *percent;
    else
      ok = false;
    if (auto margin = number(table, "margin_percent", what)) {
      if (*margin < 0.0) {
        check_.problem(*table.get("margin_percent"),
                       fmt::format("{}.margin_percent must be >= 0, got {}", what, *margin));
        ok = false;
      } else if (ok && floor.percent + *margin >= 100.0) {
        check_.problem(
            *table.get("margin_percent"),
            fmt::format("{}: percent + margin_percent must be below 100, got {} + {}", what, floor.percent, *margin));
        ok = false;
      }
      floor.margin_percent = *margin;
    } else if (table.get("margin_percent")) {
      ok = false;
    } else if (ok && floor.percent + floor.margin_percent >= 100.0) {
      check_.problem(table, fmt::format("{}: percent + margin_percent (default {}) must be below 100, got {}", what,
                                        floor.margin_percent, floor.percent));
      ok = false;
    }
    if (ok) acc_.policy.battery_floors.push_back(std::move(floor));
  }

  // A quota's limits from a rule's table (prefix "" for [[projects]] and [[owners]],
  // "_per_owner" for [tenancy]); false where one is unusable (a problem has been recorded).
  bool quota(const toml::table& table, const std::string& what, const std::string& suffix, schedulers::Quota& out) {
    bool ok = true;
    auto limit = [&](const std::string& name, std::int64_t high, std::optional<std::int64_t>& slot) {
      const std::string key = name + suffix;
      if (!table.get(key)) return;
      auto value = check_.get<std::int64_t>(table, key.c_str(), fmt::format("{}.{}", what, key));
      if (!value) {
        ok = false;
      } else if (*value < 0 || *value > high) {
        check_.problem(*table.get(key), fmt::format("{}.{} must be between 0 and {}, got {}", what, key, high, *value));
        ok = false;
      } else {
        slot = *value;
      }
    };
    limit("max_queued_jobs", 10000000, out.max_queued_jobs);
    limit("max_running_jobs", 1000000, out.max_running_jobs);
    return ok;
  }

  // An owner as jobs name theirs: "token:NAME" (a bearer token's owner) or "uid:N" (a local user).
  static bool is_owner_name(std::string_view name) {
    if (name.starts_with("uid:"))
      return name.size() > 4 && std::all_of(name.begin() + 4, name.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (name.starts_with("token:"))
      return name.size() > 6 && std::all_of(name.begin() + 6, name.end(), [](char c) { return c > ' ' && c < 0x7f; });
    return false;
  }

  // [tenancy]: the default project and every owner's default limits.
  void parse_tenancy(const toml::table& table) {
    const std::vector<std::string> keys{"default_project", "max_queued_jobs_per_owner", "max_running_jobs_per_owner",
                                        "fair_share", "usage_half_life"};
    check_.reject_unknown(table, "tenancy.", keys);
    for (const auto& [key, node] : table) {
      const std::string name(key.str());
      if (std::find(keys.begin(), keys.end(), name) == keys.end()) continue;
      const auto [first, inserted] = acc_.tenancy_keys.try_emplace(name, place_of(node));
      if (!inserted)
        check_.problem(node, fmt::format("tenancy.{} is also set at {}:{}; set each [tenancy] key in one file only",
                                         name, first->second.file, first->second.line));
    }
    if (auto project = check_.get<std::string>(table, "default_project", "tenancy.default_project")) {
      acc_.policy.tenancy.default_project = *project;
      acc_.project_uses.push_back({*project, {}, "tenancy.default_project", place_of(*table.get("default_project"))});
    }
    quota(table, "tenancy", "_per_owner", acc_.policy.tenancy.owner_quota);
    if (const toml::node* fair = table.get("fair_share")) {
      if (const auto value = fair->value<bool>(); fair->is_boolean())
        acc_.policy.tenancy.fair_share = *value;
      else
        check_.problem(*fair, "tenancy.fair_share must be true or false");
    }
    if (table.get("usage_half_life"))
      if (const auto seconds = duration(table, "usage_half_life", "tenancy.usage_half_life"))
        acc_.policy.tenancy.usage_half_life_seconds = *seconds;
  }

  void parse_project(const toml::table& table, const std::string& what) {
    check_.reject_unknown(table, what + ".", {"name", "owners", "max_queued_jobs", "max_running_jobs", "shares"});
    schedulers::Project project;
    project.name = rule_name(table, what, "project");
    bool ok = !project.name.empty() && quota(table, what, "", project.quota);
    if (auto shares = number(table, "shares", what)) {
      if (*shares <= 0.0 || *shares > 1e6) {
        check_.problem(*table.get("shares"),
                       fmt::format("{}.shares must be above 0 and at most 1000000, got {}", what, *shares));
        ok = false;
      } else {
        project.shares = *shares;
      }
    } else if (table.get("shares")) {
      ok = false;
    }
    if (const toml::node* owners = table.get("owners")) {
      const auto* array = owners->as_array();
      if (!array) {
        check_.problem(*owners,
                       fmt::format("{}.owners must be an array, e.g. owners = [\"token:alice\", \"uid:1000\"]", what));
        ok = false;
      } else {
        if (array->empty())
          check_.problem(*owners,
                         fmt::format("{}.owners is empty: leave it out to let every owner use the project", what));
        for (const auto& element : *array) {
          auto owner = element.value<std::string>();
          if (!element.is_string() || !is_owner_name(*owner)) {
            check_.problem(element, fmt::format("{}.owners entries must be owners as jobs name them: \"token:NAME\" "
                                                "or \"uid:N\"",
                                                what));
            ok = false;
          } else {
            project.owners.push_back(*owner);
          }
        }
      }
    }
    if (ok) acc_.policy.tenancy.projects.push_back(std::move(project));
  }

  void parse_owner(const toml::table& table, const std::string& what) {
    check_.reject_unknown(table, what + ".", {"name", "project", "max_queued_jobs", "max_running_jobs"});
    schedulers::OwnerRule owner;
    const toml::node* name_node = table.get("name");
    if (!name_node) {
      check_.problem(table, fmt::format("{} needs a name, e.g. name = \"token:alice\" or \"uid:1000\"", what));
      return;
    }
    auto name = check_.get<std::string>(table, "name", what + ".name");
    if (!name) return;
    if (!is_owner_name(*name)) {
      check_.problem(*name_node, fmt::format("{}.name \"{}\" is not an owner as jobs name them: \"token:NAME\" (a "
                                             "bearer token's owner) or \"uid:N\" (a local user)",
                                             what, *name));
      return;
    }
    const auto [first, inserted] = acc_.names["owner"].try_emplace(*name, place_of(*name_node));
    if (!inserted) {
      check_.problem(*name_node, fmt::format("{}.name \"{}\" already has a rule at {}:{}", what, *name,
                                             first->second.file, first->second.line));
      return;
    }
    owner.name = *name;
    bool ok = quota(table, what, "", owner.quota);
    if (auto project = check_.get<std::string>(table, "project", what + ".project")) {
      owner.project = *project;
      acc_.project_uses.push_back({*project, owner.name, what + ".project", place_of(*table.get("project"))});
    } else if (table.get("project")) {
      ok = false;
    }
    if (ok) acc_.policy.tenancy.owners.push_back(std::move(owner));
  }

  Checker check_;
  Accumulator& acc_;
};

Result<LoadedPolicy> finish(Accumulator acc, const std::vector<std::string>& names) {
  if (acc.every_file_read) {
    for (const auto& use : acc.group_uses) {
      if (!acc.names["group"].contains(use.group))
        acc.problems.push_back(ConfigProblem{
            use.place.file, use.place.line,
            fmt::format("{} \"{}\" is not a group: define it in any policy file with [[groups]] name = \"{}\"",
                        use.what, use.group, use.group)});
    }
  }
  if (acc.every_file_read) {
    // A project named as a default must be one, and one the owner may use.
    for (const auto& use : acc.project_uses) {
      const schedulers::Project* project = acc.policy.tenancy.project(use.project);
      if (!project)
        acc.problems.push_back(ConfigProblem{
            use.place.file, use.place.line,
            fmt::format("{} \"{}\" is not a project: define it in any policy file with [[projects]] name = \"{}\"",
                        use.what, use.project, use.project)});
      else if (!use.owner.empty() && !project->admits(use.owner))
        acc.problems.push_back(
            ConfigProblem{use.place.file, use.place.line,
                          fmt::format("{} \"{}\": {} is not one of its owners", use.what, use.project, use.owner)});
    }
  }
  auto file_rank = [&](const std::string& file) { return std::find(names.begin(), names.end(), file) - names.begin(); };
  auto in_order = [&](const ConfigProblem& a, const ConfigProblem& b) {
    return std::pair(file_rank(a.file), a.line) < std::pair(file_rank(b.file), b.line);
  };
  std::stable_sort(acc.problems.begin(), acc.problems.end(), in_order);
  std::stable_sort(acc.warnings.begin(), acc.warnings.end(), in_order);
  if (!acc.problems.empty()) {
    std::string message;
    for (const auto& problem : acc.problems) {
      if (!message.empty()) message += '\n';
      message += describe(problem);
    }
    const auto& first = acc.problems.front();
    return make_error(ErrorCode::invalid_argument, message, fmt::format("{}:{}", first.file, first.line));
  }
  LoadedPolicy loaded{std::move(acc.policy), std::move(acc.warnings), {}};
  for (const auto& name : names) loaded.files.emplace_back(name);
  if (!names.empty()) loaded.policy.source = fmt::format("{}", fmt::join(names, ", "));
  return loaded;
}

void parse_into(Accumulator& acc, const std::string& name, const std::string& text) {
  FileParser parser(name, acc);
  toml::table root;
  try {
    root = toml::parse(text, name);
  } catch (const toml::parse_error& error) {
    parser.syntax_error(error);
    return;
  }
  parser.parse(root);
}

}  // namespace

Result<LoadedPolicy> parse_policy_files(const std::vector<std::pair<std::string, std::string>>& files) {
  Accumulator acc;
  std::vector<std::string> names;
  for (const auto& [name, text] : files) {
    names.push_back(name);
    parse_into(acc, name, text);
  }
  return finish(std::move(acc), names);
}

Result<LoadedPolicy> load_policy_directory(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto status = fs::status(dir, ec);
  if (!fs::exists(status)) {
    if (ec && ec != std::errc::no_such_file_or_directory)
      return make_error(ErrorCode::unavailable, fmt::format("{}: {}", dir.string(), ec.message()), dir.string());
    return LoadedPolicy{};
  }
  if (!fs::is_directory(status))
    return make_error(ErrorCode::invalid_argument, fmt::format("{}: is not a directory", dir.string()), dir.string());

  std::vector<fs::path> paths;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.starts_with(".") || it->path().extension() != ".toml") continue;
    if (std::error_code dir_ec; fs::is_directory(it->path(), dir_ec)) continue;
    paths.push_back(it->path());
  }
  if (ec)
    return make_error(ErrorCode::unavailable, fmt::format("{}: cannot list: {}", dir.string(), ec.message()),
                      dir.string());
  std::sort(paths.begin(), paths.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename().string() < b.filename().string(); });

  Accumulator acc;
  std::vector<std::string> names;
  for (const auto& path : paths) {
    const std::string name = path.filename().string();
    names.push_back(name);
    if (std::error_code file_ec; fs::exists(path, file_ec) && !fs::is_regular_file(path, file_ec)) {
      acc.problems.push_back(ConfigProblem{name, 0, "is not a regular file"});
      acc.every_file_read = false;
      continue;
    }
    std::ifstream in(path);
    std::stringstream text;
    if (in) text << in.rdbuf();
    if (!in || in.bad()) {
      acc.problems.push_back(ConfigProblem{name, 0, fmt::format("cannot be read: {}", std::strerror(errno))});
      acc.every_file_read = false;
      continue;
    }
    parse_into(acc, name, text.str());
  }
  auto loaded = finish(std::move(acc), names);
  if (loaded) loaded->files = paths;
  return loaded;
}

}  // namespace joule::config
