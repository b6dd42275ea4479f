#pragma once
// The node's energy policy at run time: the placement policy and its budgets, caps and floors
// (from policies.d, replaced whole on reload), the budget ledger kept in SQLite, and the
// throttle controller. Wraps the pure schedulers:: logic with persistence, metrics and the
// GET /v1/budgets view. Lives on the daemon's io_context thread.

#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "joule/adapters/database.hpp"
#include "joule/adapters/storage_writer.hpp"
#include "joule/daemon/metrics.hpp"
#include "joule/schedulers/budget_ledger.hpp"
#include "joule/schedulers/placement.hpp"
#include "joule/schedulers/policy.hpp"
#include "joule/schedulers/throttle_controller.hpp"

namespace joule::daemon {

class BudgetService {
 public:
  /// `node`: this node's name (budgets and caps name it); `utc_offset_minutes`: local time for
  /// calendar windows.
  BudgetService(adapters::StorageWriter& storage, Metrics& metrics, std::string node, int utc_offset_minutes);

  /// Installs a policy (at start and on a reload that validated).
  void set_policy(schedulers::Policy policy);
  const schedulers::Policy& policy() const { return policy_; }
  const std::string& node() const { return node_; }
  /// Where a device of this node sits for the policy's scopes.
  schedulers::DeviceRef device_ref(const std::string& device) const;

  /// Restores the ledger's stored entries (at start).
  void load(const std::vector<adapters::StoredEnergyUse>& uses);
  /// How far back the ledger must be loaded: the longest window anyone may configure.
  static schedulers::UnixMillis history_needed(schedulers::UnixMillis now);

  schedulers::PassResult place(schedulers::UnixMillis now, std::span<const schedulers::DeviceStatus> devices,
                               std::span<const schedulers::PendingJob* const> queue);
  std::optional<schedulers::WaitReason> never_fits(schedulers::UnixMillis now,
                                                   std::span<const schedulers::DeviceStatus> devices,
                                                   const schedulers::PendingJob& job) const;

  void reserve(const std::string& job, const std::string& device, schedulers::EnergyDistribution expected);
  void update_running(const std::string& job, schedulers::UnixMillis start, schedulers::UnixMillis now,
                      double used_joules, schedulers::EnergyDistribution still_expected);
  /// A job paused or resumed by throttling: the ledger counts its energy in stretches.
  void pause_running(const std::string& job, schedulers::UnixMillis now, const std::string& source);
  void resume_running(const std::string& job, schedulers::UnixMillis now);
  /// Ends a job's reservation and, when it was metered, records and stores its energy.
  void settle(const std::string& job, std::optional<adapters::StoredEnergyUse> metered);
  /// Records and stores the metered energy of probing.
  void record(const adapters::StoredEnergyUse& use);

  std::vector<schedulers::ThrottleAction> throttle(schedulers::UnixMillis now,
                                                   std::span<const schedulers::DeviceStatus> devices,
                                                   std::span<const schedulers::RunningJob> jobs);
  void forget(const std::string& job) { throttle_.forget(job); }

  /// GET /v1/budgets: the policy, each budget's limit, spent, reserved and remaining, caps with
  /// their scope's power now, floors with the charge now.
  nlohmann::json describe(schedulers::UnixMillis now, std::span<const schedulers::DeviceStatus> devices) const;
  /// Refreshes the joule_budget_* gauges.
  void publish(schedulers::UnixMillis now);
  /// Local time's offset from UTC now, for calendar windows (it changes with daylight saving).
  void set_utc_offset_minutes(int minutes) { ledger_.set_utc_offset_minutes(minutes); }

 private:
  void store(const adapters::StoredEnergyUse& row);

  adapters::StorageWriter& storage_;
  Metrics& metrics_;
  std::string node_;
  schedulers::Policy policy_;
  schedulers::BudgetLedger ledger_;
  schedulers::Placer placer_;
  schedulers::ThrottleController throttle_;
  schedulers::UnixMillis last_prune_ = 0;
};

}  // namespace joule::daemon
