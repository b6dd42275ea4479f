#pragma once
// The node's energy policy at run time: the placement policy and its budgets, caps and floors
// (from policies.d, replaced whole on reload), installed in the scheduling core the job book
// owns and drives (queue, placer, budget ledger, STEP projections, throttle controller; the same
// core joule-sim drives). Adds what the pure core leaves out: the ledger's uses kept in SQLite,
// metrics and what GET /v1/budgets shows (BudgetsView). Lives on the daemon's io_context thread.

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "joule/adapters/database.hpp"
#include "joule/adapters/storage_writer.hpp"
#include "joule/daemon/grid_signal_feed.hpp"
#include "joule/daemon/metrics.hpp"
#include "joule/schedulers/policy.hpp"
#include "joule/schedulers/scheduling_core.hpp"

namespace joule::daemon {

/// The node's energy policy at one moment, as GET /v1/budgets shows it: the policy in force,
/// each budget's state, each power cap with its scope's power now, each battery floor with its
/// scope's charge now.
struct BudgetsView {
  struct Budget {
    schedulers::BudgetState state;
    bool covers_this_node = false;  ///< whether one of this node's devices counts against it
  };
  struct Cap {
    schedulers::PowerCap cap;
    double power_watts = 0.0;  ///< its scope's devices' average power now
  };
  struct Floor {
    schedulers::BatteryFloor floor;
    std::optional<double> charge_percent;  ///< its scope's battery now, where one reports a charge
  };
  std::string node;
  std::string policy_source;
  schedulers::Objective objective = schedulers::Objective::min_energy;
  double risk = 0.0;
  int warmup_epochs = 1;
  std::vector<Budget> budgets;
  std::vector<Cap> caps;
  std::vector<Floor> floors;
};

class BudgetService {
 public:
  /// `node`: this node's name (budgets and caps name it); `core`: the job book's scheduling
  /// core, whose policy and ledger this keeps; `signals`: what probes' energy is counted at in
  /// budgets in grams and money.
  BudgetService(adapters::StorageWriter& storage, Metrics& metrics, std::string node, schedulers::SchedulingCore& core,
                SignalFeeds signals = {});

  /// Installs a policy (at start and on a reload that validated).
  void set_policy(schedulers::Policy policy);
  const schedulers::Policy& policy() const { return core_.policy(); }
  const std::string& node() const { return node_; }
  /// Where a device of this node sits for the policy's scopes.
  schedulers::DeviceRef device_ref(const std::string& device) const;

  /// Restores the ledger's stored entries (at start).
  void load(const std::vector<adapters::StoredEnergyUse>& uses);
  /// How far back the ledger must be loaded: the longest window anyone may configure.
  static schedulers::UnixMillis history_needed(schedulers::UnixMillis now);

  /// A job paused or resumed by throttling: the ledger counts its energy in stretches.
  void pause_running(const std::string& job, schedulers::UnixMillis now, const std::string& source);
  void resume_running(const std::string& job, schedulers::UnixMillis now);
  /// Ends a job's tracking and reservation and, when it was metered, records and stores its
  /// energy (with the grams and cost the book found for it).
  void settle(const std::string& job, std::optional<adapters::StoredEnergyUse> metered);
  /// Records and stores the metered energy of probing, at the signals over it.
  void record(adapters::StoredEnergyUse use);

  /// The policy, each budget's limit, spent, reserved and remaining, caps with their scope's
  /// power now, floors with the charge now (`devices`: this node's, as placement sees them).
  BudgetsView view(schedulers::UnixMillis now, std::span<const schedulers::DeviceStatus> devices) const;
  /// Refreshes the joule_budget_* gauges.
  void publish(schedulers::UnixMillis now);

 private:
  void store(const adapters::StoredEnergyUse& row);

  adapters::StorageWriter& storage_;
  Metrics& metrics_;
  std::string node_;
  schedulers::SchedulingCore& core_;  // what the core records in its ledger goes through here
  SignalFeeds signals_;
  schedulers::UnixMillis last_prune_ = 0;
};

}  // namespace joule::daemon
