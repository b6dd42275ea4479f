#include "joule/schedulers/policy.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace joule::schedulers {
namespace {

constexpr std::array<std::pair<Objective, std::string_view>, 9> kObjectives{{
    {Objective::min_energy, "min-energy"},
    {Objective::min_edp, "min-edp"},
    {Objective::earliest_finish, "earliest-finish"},
    {Objective::min_carbon, "min-carbon"},
    {Objective::min_cost, "min-cost"},
    {Objective::fifo, "fifo"},
    {Objective::round_robin, "round-robin"},
    {Objective::least_loaded, "least-loaded"},
    {Objective::flops_greedy, "flops-greedy"},
}};

constexpr std::array<std::pair<Scope, std::string_view>, 4> kScopes{{
    {Scope::device, "device"},
    {Scope::node, "node"},
    {Scope::group, "group"},
    {Scope::cluster, "cluster"},
}};

constexpr std::array<std::pair<KnobGoal, std::string_view>, 4> kKnobGoals{{
    {KnobGoal::off, "off"},
    {KnobGoal::min_energy, "min-energy"},
    {KnobGoal::zeus, "zeus"},
    {KnobGoal::min_edp, "min-edp"},
}};

}  // namespace

std::string_view to_string(KnobGoal goal) {
  for (const auto& [value, name] : kKnobGoals)
    if (value == goal) return name;
  return "?";
}

std::optional<KnobGoal> knob_goal_from_string(std::string_view text) {
  for (const auto& [value, name] : kKnobGoals)
    if (name == text) return value;
  return std::nullopt;
}

std::string_view to_string(Objective objective) {
  for (const auto& [value, name] : kObjectives)
    if (value == objective) return name;
  return "?";
}

std::optional<Objective> objective_from_string(std::string_view text) {
  for (const auto& [value, name] : kObjectives)
    if (name == text) return value;
  return std::nullopt;
}

bool uses_estimates(Objective objective) {
  return objective == Objective::min_energy || objective == Objective::min_edp ||
         objective == Objective::earliest_finish || objective == Objective::min_carbon ||
         objective == Objective::min_cost;
}

std::string_view to_string(Scope scope) {
  for (const auto& [value, name] : kScopes)
    if (value == scope) return name;
  return "?";
}

std::optional<Scope> scope_from_string(std::string_view text) {
  for (const auto& [value, name] : kScopes)
    if (name == text) return value;
  return std::nullopt;
}

bool ScopeTarget::covers(const DeviceRef& device) const {
  switch (scope) {
    case Scope::cluster:
      return true;
    case Scope::node:
      return device.node == target;
    case Scope::group:
      return std::find(device.groups.begin(), device.groups.end(), target) != device.groups.end();
    case Scope::device:
      // "node/name" compared in place: this runs for every use and candidate of a pass.
      return target == device.name ||
             (target.size() == device.node.size() + 1 + device.name.size() && target.starts_with(device.node) &&
              target[device.node.size()] == '/' && target.ends_with(device.name));
  }
  return false;
}

std::string ScopeTarget::describe() const {
  if (scope == Scope::cluster) return "the cluster";
  return fmt::format("{} {}", to_string(scope), target);
}

std::vector<EnergyBudget> budgets_for_owners(const std::vector<EnergyBudget>& budgets,
                                             const std::vector<std::string>& owners) {
  std::vector<EnergyBudget> out;
  for (const auto& budget : budgets) {
    if (!budget.each_owner) {
      out.push_back(budget);
      continue;
    }
    for (const auto& owner : owners) {
      if (owner.empty()) continue;
      EnergyBudget own = budget;
      own.each_owner = false;
      own.owner = owner;
      own.name = fmt::format("{} ({})", budget.name, owner);
      own.template_name = budget.name;
      out.push_back(std::move(own));
    }
  }
  return out;
}

std::string EnergyBudget::describe_scope() const {
  std::string whose;
  if (each_owner) whose = "each owner";
  if (!owner.empty()) whose = "owner " + owner;
  if (!project.empty()) whose += (whose.empty() ? "project " : " in project ") + project;
  if (whose.empty()) return scope.describe();
  return fmt::format("{} on {}", whose, scope.describe());
}

std::string_view to_string(BudgetUnit unit) {
  switch (unit) {
    case BudgetUnit::joules:
      return "joules";
    case BudgetUnit::grams:
      return "grams";
    case BudgetUnit::money:
      return "money";
  }
  return "?";
}

std::string EnergyBudget::amount_text(double amount) const {
  const double magnitude = std::abs(amount);
  switch (unit) {
    case BudgetUnit::joules:
      if (magnitude >= 1e9) return fmt::format("{:.3g} GJ", amount / 1e9);
      if (magnitude >= 1e6) return fmt::format("{:.3g} MJ", amount / 1e6);
      if (magnitude >= 1e3) return fmt::format("{:.3g} kJ", amount / 1e3);
      return fmt::format("{:.3g} J", amount);
    case BudgetUnit::grams:
      if (magnitude >= 1e6) return fmt::format("{:.3g} t CO2e", amount / 1e6);
      if (magnitude >= 1e3) return fmt::format("{:.3g} kg CO2e", amount / 1e3);
      return fmt::format("{:.3g} g CO2e", amount);
    case BudgetUnit::money:
      return fmt::format("{:.2f}{}{}", amount, currency.empty() ? "" : " ", currency);
  }
  return fmt::format("{:g}", amount);
}

std::string BudgetWindow::describe() const {
  switch (kind) {
    case Kind::day:
      return "calendar day";
    case Kind::week:
      return "calendar week";
    case Kind::month:
      return "calendar month";
    case Kind::rolling:
      break;
  }
  if (rolling_seconds % 86400 == 0) return fmt::format("rolling {}d", rolling_seconds / 86400);
  if (rolling_seconds % 3600 == 0) return fmt::format("rolling {}h", rolling_seconds / 3600);
  if (rolling_seconds % 60 == 0) return fmt::format("rolling {}m", rolling_seconds / 60);
  return fmt::format("rolling {}s", rolling_seconds);
}

std::vector<std::string> Policy::groups_of(std::string_view node) const {
  std::vector<std::string> out;
  for (const auto& group : groups)
    if (std::find(group.nodes.begin(), group.nodes.end(), node) != group.nodes.end()) out.push_back(group.name);
  return out;
}

bool Project::admits(std::string_view owner) const {
  return owners.empty() || std::find(owners.begin(), owners.end(), owner) != owners.end();
}

const Project* Tenancy::project(std::string_view name) const {
  const auto it = std::find_if(projects.begin(), projects.end(), [&](const Project& p) { return p.name == name; });
  return it == projects.end() ? nullptr : &*it;
}

const OwnerRule* Tenancy::owner(std::string_view name) const {
  const auto it = std::find_if(owners.begin(), owners.end(), [&](const OwnerRule& o) { return o.name == name; });
  return it == owners.end() ? nullptr : &*it;
}

Quota Tenancy::quota_of_owner(std::string_view name) const {
  Quota quota = owner_quota;
  if (const OwnerRule* rule = owner(name)) {
    if (rule->quota.max_queued_jobs) quota.max_queued_jobs = rule->quota.max_queued_jobs;
    if (rule->quota.max_running_jobs) quota.max_running_jobs = rule->quota.max_running_jobs;
  }
  return quota;
}

bool Tenancy::limits_running() const {
  return owner_quota.max_running_jobs ||
         std::any_of(owners.begin(), owners.end(), [](const OwnerRule& o) { return o.quota.max_running_jobs; }) ||
         std::any_of(projects.begin(), projects.end(), [](const Project& p) { return p.quota.max_running_jobs; });
}

ProjectChoice choose_project(const Tenancy& tenancy, std::string_view owner, std::string_view asked) {
  if (asked.empty()) {
    const OwnerRule* rule = tenancy.owner(owner);
    const std::string& fallback = rule && !rule->project.empty() ? rule->project : tenancy.default_project;
    // A default the owner may not use (the policy checks its own rules; an owner without a
    // rule falls to the default project) is an error for that owner's jobs, not a way in.
    if (!fallback.empty())
      if (const Project* project = tenancy.project(fallback); project && !project->admits(owner))
        return {fallback, fmt::format("{} may not use the default project \"{}\": name a project it belongs to", owner,
                                      fallback)};
    return {fallback, {}};
  }
  if (tenancy.projects.empty())
    return {std::string(asked), fmt::format("no projects are configured (policies.d [[projects]]), so a job may "
                                            "not name one; \"{}\" is not one",
                                            asked)};
  const Project* project = tenancy.project(asked);
  if (!project) {
    std::vector<std::string> names;
    for (const auto& p : tenancy.projects)
      if (p.admits(owner)) names.push_back(p.name);
    return {std::string(asked),
            fmt::format("\"{}\" is not a project; {} may use: {}", asked, owner,
                        names.empty() ? std::string("none") : fmt::format("{}", fmt::join(names, ", ")))};
  }
  if (!project->admits(owner))
    return {std::string(asked), fmt::format("{} is not one of project \"{}\"'s owners", owner, asked)};
  return {std::string(asked), {}};
}

}  // namespace joule::schedulers
