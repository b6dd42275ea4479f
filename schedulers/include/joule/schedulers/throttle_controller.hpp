#pragma once
// Throttling: what to do to running jobs so that power caps, budgets and battery floors hold.
//
// Three conditions, checked on every meter sample:
//  - a power cap's scope draws more than its cap (moving average): the lowest-priority running
//    job there is slowed — a GPU job by lowering the GPU's power limit, a CPU job by a cgroup
//    CPU quota — in proportion to the excess, step by step, and paused once it is at the
//    smallest setting or no control is available; released (in reverse) once the scope is
//    below `release_fraction` of the cap;
//  - a budget is projected to overrun: what its running jobs have still to use (their STEP
//    projections) makes an overrun more likely than `overrun_probability`: the lowest-priority
//    running job it covers is paused; it resumes when it fits again at the policy's risk (a new
//    window, or other work finished under its estimate);
//  - a battery is within `margin_percent` of its floor: every job on the battery's devices is
//    paused; they resume once the charge is `resume_above_percent` above the margin.
// Each action names its rule and why. Pure: the daemon (or the simulator) applies the actions
// and reports back the jobs' states at the next call.

#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "joule/schedulers/budget_ledger.hpp"
#include "joule/schedulers/placement.hpp"
#include "joule/schedulers/policy.hpp"

namespace joule::schedulers {

/// A running job as the controller sees it.
struct RunningJob {
  std::string id;
  std::size_t device = 0;  ///< index into the devices of the call
  int priority = 0;
  std::string owner{};                ///< whose budgets count it
  std::string project{};              ///< which project's budgets count it
  EnergyDistribution still_expected;  ///< what it will still use (ledger's view)
  UseRates rates;                     ///< what a joule of that emits and costs, at the signals
  double power_watts = 0.0;           ///< its recent metered draw
  bool paused = false;
  std::optional<double> cpu_quota;       ///< CPUs it is limited to, if limited
  std::optional<double> gpu_limit_watts;  ///< GPU power limit set for it, if set
  bool can_limit_cpu = false;  ///< a cgroup CPU quota is available for it
  bool can_limit_gpu = false;  ///< its device is a GPU whose power limit can be set
  double cpus = 1.0;           ///< CPUs it may use unthrottled (for the first quota step)
  double gpu_min_watts = 0.0;  ///< the GPU's lowest settable limit
};

struct ThrottleAction {
  enum class Kind { pause, resume, cpu_quota, clear_cpu_quota, gpu_power_limit, clear_gpu_power_limit };
  Kind kind = Kind::pause;
  std::string job;
  double value = 0.0;  ///< CPUs (cpu_quota) or watts (gpu_power_limit)
  std::string rule;    ///< the cap, budget or floor
  std::string reason;  ///< one line for the job's events
};
std::string_view to_string(ThrottleAction::Kind kind);

struct ThrottleOptions {
  double release_fraction = 0.9;       ///< a cap releases below this share of it
  double overrun_probability = 0.5;    ///< a budget acts when an overrun is more likely than this
  double resume_above_percent = 2.0;   ///< battery hysteresis above floor + margin
  double min_cpu_quota = 0.1;          ///< CPUs: below this, pause instead
};

class ThrottleController {
 public:
  explicit ThrottleController(Policy policy, ThrottleOptions options = {});
  void set_policy(Policy policy);

  /// The actions to take now. `devices[i].average_power_watts` is the metered average over the
  /// caps' period; battery fields as for placement.
  std::vector<ThrottleAction> evaluate(UnixMillis now, std::span<const DeviceStatus> devices,
                                       std::span<const RunningJob> jobs, const BudgetLedger& ledger);

  /// Forgets a job that ended.
  void forget(const std::string& job) { holds_.erase(job); }

 private:
  enum class Hold { cap, budget, battery };
  struct Held {
    Hold hold;
    std::string rule;
  };
  Policy policy_;
  ThrottleOptions options_;
  std::map<std::string, Held> holds_;  // job → what throttles it
};

}  // namespace joule::schedulers
