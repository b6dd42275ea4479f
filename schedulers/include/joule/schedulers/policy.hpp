#pragma once
// A placement policy: the objective, the risk Joule accepts, and the budgets, power caps and
// battery floors that must hold. Parsed from /etc/jouled/policies.d/*.toml (config module) and
// by joule-sim; the scheduler only reads it. Pure data.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace joule::schedulers {

/// How a job's device is chosen among the feasible ones.
enum class Objective {
  min_energy,       ///< fewest expected joules (default); ties by earliest finish
  min_edp,          ///< smallest energy-delay product: joules x (wait + run seconds)
  earliest_finish,  ///< earliest expected finish, energy ignored
  /// fewest expected grams CO2e at the device's carbon signal: a job with a deadline may wait
  /// for a cleaner window that still meets it; without a signal, as min_energy
  min_carbon,
  /// the least expected cost at the device's price signal, deferring like min_carbon; without a
  /// price signal, as min_energy
  min_cost,
  fifo,  ///< the first free eligible device in device order: ignores estimates
  // Baselines for the simulator (also accepted by jouled, for comparison runs):
  round_robin,   ///< free eligible devices in turn
  least_loaded,  ///< the free eligible device that has run the fewest seconds of work
  flops_greedy,  ///< fewest FLOPs-baseline joules (the estimate a FLOPs counter would give)
};

std::string_view to_string(Objective objective);
std::optional<Objective> objective_from_string(std::string_view text);
/// Whether the objective reads energy estimates (the baselines do not).
bool uses_estimates(Objective objective);

/// What a budget, cap or floor applies to.
enum class Scope { device, node, group, cluster };
std::string_view to_string(Scope scope);
std::optional<Scope> scope_from_string(std::string_view text);

/// Where a device is: its node and the node's groups. `name` is the node-local device name.
struct DeviceRef {
  std::string node;
  std::string name;
  std::vector<std::string> groups;
  /// "node/name": the one name that is unique across a cluster.
  std::string qualified() const { return node + "/" + name; }
};

/// Which devices a rule covers: for `device` scope, target is "NODE/DEVICE" or a bare device
/// name (matching that device on any node, all of them sharing one allowance); for `node` a
/// node name; for `group` a group name; `cluster` covers every device (target is empty).
struct ScopeTarget {
  Scope scope = Scope::cluster;
  std::string target;
  bool covers(const DeviceRef& device) const;
  std::string describe() const;  ///< "node lab-1", "device jetson/cuda:0", "the cluster"
};

/// The time an energy budget counts over.
struct BudgetWindow {
  enum class Kind { rolling, day, week, month };
  Kind kind = Kind::rolling;
  std::int64_t rolling_seconds = 86400;  ///< for rolling windows
  std::string describe() const;           ///< "rolling 24h", "calendar day"
};

/// What a budget counts: the joules of the work, the grams CO2e they emitted at the carbon
/// signal, or what they cost at the price signal.
enum class BudgetUnit { joules, grams, money };
std::string_view to_string(BudgetUnit unit);

/// An allowance for a scope over a window, of the work Joule runs there (jobs and probes): in
/// joules, metered where a meter exists, or in grams CO2e or money, those joules at the signal in
/// force while they were drawn. A budget for an owner or a project counts only that owner's or
/// project's jobs in its scope (never probes).
struct EnergyBudget {
  std::string name;
  ScopeTarget scope;
  double limit = 0.0;  ///< in its unit: joules, grams CO2e, or money in `currency`
  BudgetWindow window;
  std::string owner{};    ///< "token:alice" or "uid:1000": only this owner's jobs; empty: anyone's work
  std::string project{};  ///< only this project's jobs; empty: any project's work
  /// A template (policies.d `owner = "*"`): every owner gets a budget of its own like this one,
  /// named "NAME (OWNER)" (budgets_for_owners); the template itself counts nothing.
  bool each_owner = false;
  std::string template_name{};  ///< an owner's budget made from an each_owner template: the template's name
  BudgetUnit unit = BudgetUnit::joules;
  std::string currency{};  ///< money budgets: the price signal's currency ("EUR"); empty: whatever it is

  /// Whether it counts the work of `owner` in `project` (a probe's are both empty), wherever
  /// its scope covers.
  bool counts_work_of(std::string_view work_owner, std::string_view work_project) const {
    return !each_owner && (owner.empty() || owner == work_owner) && (project.empty() || project == work_project);
  }
  /// "project vision on the cluster", "owner token:alice on node lab-1", "device cpu".
  std::string describe_scope() const;
  /// An amount in its unit for people: "1.2 MJ", "350 g CO2e", "4.20 EUR".
  std::string amount_text(double amount) const;
};

/// A cap on the moving average of metered power of a scope.
struct PowerCap {
  std::string name;
  ScopeTarget scope;
  double watts = 0.0;
  double average_seconds = 60.0;
};

/// The charge below which a battery-powered scope runs no new work, and where throttling starts.
struct BatteryFloor {
  std::string name;
  ScopeTarget scope;
  double percent = 20.0;
  double margin_percent = 5.0;  ///< throttling starts this far above the floor
};

/// `budgets` with each `each_owner` template replaced by one budget per owner of `owners` (in
/// their order), each counting only that owner's jobs; the other budgets as they are.
std::vector<EnergyBudget> budgets_for_owners(const std::vector<EnergyBudget>& budgets,
                                             const std::vector<std::string>& owners);

/// A named set of nodes, for group-scoped rules.
struct NodeGroup {
  std::string name;
  std::vector<std::string> nodes;
};

/// What placement wants of a device's knob settings (power limit, clocks, power mode) for a
/// job that does not ask for settings of its own.
enum class KnobGoal {
  off,         ///< jobs run at the device's defaults
  min_energy,  ///< fewest expected joules within the slowdown allowed
  zeus,        ///< Zeus's cost, η·energy + (1 − η)·time, each relative to the default setting
  min_edp,     ///< smallest energy × time, within the slowdown allowed
};
std::string_view to_string(KnobGoal goal);
std::optional<KnobGoal> knob_goal_from_string(std::string_view text);

struct KnobPolicy {
  KnobGoal goal = KnobGoal::off;
  /// How much slower than at the device's default a setting may make a job (0.1: 10 %);
  /// nullopt: no limit. A job's constraints.max_slowdown takes its place.
  std::optional<double> max_slowdown = 0.10;
  double eta = 0.5;  ///< Zeus's weight on energy against time, in [0, 1]
};

/// Limits on what one owner or one project has at once; nullopt: no limit of that kind.
struct Quota {
  std::optional<std::int64_t> max_queued_jobs;
  /// A job holds one device while it runs: this is also the devices in use at once.
  std::optional<std::int64_t> max_running_jobs;
  bool any() const { return max_queued_jobs || max_running_jobs; }
};

/// A project jobs are accounted to: who may submit to it, and its limits.
struct Project {
  std::string name;
  /// The owners who may use it ("token:alice", "uid:1000"); empty: every owner.
  std::vector<std::string> owners;
  Quota quota;
  double shares = 1.0;  ///< its weight in fair share against other projects
  bool admits(std::string_view owner) const;
};

/// One owner's default project and limits.
struct OwnerRule {
  std::string name;     ///< "token:alice" (a bearer token's owner) or "uid:1000" (a local user)
  std::string project;  ///< its jobs' project where a job names none; empty: Tenancy::default_project
  Quota quota;          ///< each limit set here replaces Tenancy::owner_quota's
};

/// Who shares the scheduler: projects, owners and their quotas. Empty: no projects, no limits
/// beyond the daemon's own max_queued_jobs.
struct Tenancy {
  std::string default_project;  ///< the project of jobs that name none and whose owner has no default
  Quota owner_quota;            ///< every owner's limits, where its own rule sets none
  std::vector<Project> projects;
  std::vector<OwnerRule> owners;
  /// Fair share: among queued jobs of equal priority, those of owners and projects that used
  /// less energy lately go first. Recent use is a decaying sum of finished work's joules.
  bool fair_share = true;
  std::int64_t usage_half_life_seconds = 7 * 86400;

  const Project* project(std::string_view name) const;
  const OwnerRule* owner(std::string_view name) const;
  /// The limits that apply to `owner`: its rule's, else owner_quota's, limit by limit.
  Quota quota_of_owner(std::string_view owner) const;
  /// Whether any owner or project has a running-jobs limit (placement counts running jobs only then).
  bool limits_running() const;
};

/// A job's project: the one it names, else its owner's default, else the default project ("" where
/// there is none). An error (its message for people) where the project is not configured or
/// `owner` may not use it.
struct ProjectChoice {
  std::string project;
  std::string error;  ///< empty: `project` may be used
};
ProjectChoice choose_project(const Tenancy& tenancy, std::string_view owner, std::string_view asked);

struct Policy {
  Objective objective = Objective::min_energy;
  KnobPolicy knobs;
  /// Admit a job only if P(its energy overruns a budget's remaining joules) is below this.
  double risk = 0.05;
  /// Whether budgets, caps and floors are checked at placement (false only for simulator
  /// baselines, which model schedulers that know nothing of energy).
  bool admission = true;
  /// STEP projection: epochs a job's progress reports skip before projecting its energy.
  int warmup_epochs = 1;
  std::vector<NodeGroup> groups;
  std::vector<EnergyBudget> budgets;
  std::vector<PowerCap> power_caps;
  std::vector<BatteryFloor> battery_floors;
  Tenancy tenancy;
  /// Where it came from, for logs and GET /v1/budgets ("embedded defaults", file list).
  std::string source = "embedded defaults";

  /// The groups a node belongs to.
  std::vector<std::string> groups_of(std::string_view node) const;
};

}  // namespace joule::schedulers
