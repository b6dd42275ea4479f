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

/// An energy allowance for a scope over a window, in joules of the work Joule runs there
/// (jobs and probes), metered where a meter exists.
struct EnergyBudget {
  std::string name;
  ScopeTarget scope;
  double limit_joules = 0.0;
  BudgetWindow window;
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
  /// Where it came from, for logs and GET /v1/budgets ("embedded defaults", file list).
  std::string source = "embedded defaults";

  /// The groups a node belongs to.
  std::vector<std::string> groups_of(std::string_view node) const;
};

}  // namespace joule::schedulers
