#pragma once
// Placement: which waiting job runs on which device now, and why the others wait.
//
// One pass considers queued jobs in priority order. For each, every eligible device is scored
// from the job's estimate there (energy mean and std, seconds) and the work ahead of it; a
// device is feasible only if the job's deadline holds, its max_energy constraint and every
// energy budget covering the device would be overrun with probability below the policy's risk
// (energy_risk.hpp), no power cap over the device is exceeded, and no battery floor is
// reached. The best feasible device by the objective gets the job if it is free; if it is
// busy, the job waits for it (min-energy prefers waiting for an efficient device to running
// now on a wasteful one, as long as the deadline holds) and the device's expected free time
// moves on. The baselines (fifo, round-robin, least-loaded) take a free device only.
// A device may share its cores (DeviceStatus::cores): jobs asking for cores (PendingJob::cores)
// are packed onto it side by side while its cores last, and it is free for such a job while
// enough are left; a job that asks for none holds the whole device, waiting for all of them.
// A job asking for N GPUs (PendingJob::gpus) runs on N devices of one group at once: it is
// weighed on each as the first of them, starts when it and N - 1 others are free, and holds them
// all; budgets, caps and floors are judged on the first, which carries the whole job's energy.
// A job whose core count placement chooses (resources.cores {min, max}) has a candidate per count
// on such a device, each weighed at its count like another device.
// With a knob goal in the policy, each device is scored at the setting the goal prefers
// there among those within the job's allowed slowdown and deadline, so device and setting are
// chosen together: a slower, cheaper setting may win a device, a deadline may forbid it.
// Pure: the caller passes time, devices, the queue and the ledger, and applies the decisions.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "joule/schedulers/budget_ledger.hpp"
#include "joule/schedulers/energy_risk.hpp"
#include "joule/schedulers/grid_signal.hpp"
#include "joule/schedulers/policy.hpp"
#include "joule/schedulers/time_format.hpp"

namespace joule::schedulers {

/// A job's expected cost on one device.
struct Estimate {
  double joules_mean = 0.0;
  double joules_std = 0.0;
  double seconds_mean = 0.0;
  EnergyDistribution energy() const { return EnergyDistribution::from_std(joules_mean, joules_std); }
};

/// A knob setting of a device other than its default, with what the job would cost at it.
struct SettingOption {
  std::string knob;    ///< the job's knob field: gpu_power_limit_watts, power_mode, cpu_max_frequency_mhz
  double value = 0.0;  ///< what would be set: watts, MHz, a power mode's id
  std::string label;   ///< "90 W", "MODE_30W", "3000 MHz"
  Estimate estimate;
  /// How unsure the predicted slowdown is (log-space std of seconds at the setting / at the
  /// defaults): a setting is allowed only if the slowdown holds at the policy's risk.
  double slowdown_log_std = 0.0;
  /// How unsure its saving is (log-space std of joules at the setting / at the defaults): a
  /// setting is chosen only if it saves energy at the policy's risk, so a saving the readings
  /// cannot tell from their noise does not change the device's settings.
  double saving_log_std = 0.0;
};

/// A device a job may run on (its constraints allow it), with what the job would cost there.
struct Candidate {
  std::size_t device = 0;           ///< index into the devices of the pass
  std::optional<Estimate> estimate;    ///< at the device's default settings; nullopt: no energy model yet
  std::optional<double> flops_joules;  ///< the FLOPs baseline's joules (flops-greedy)
  /// Settings placement may choose instead of the default (policy knobs.goal): empty where the
  /// device has no knobs the job may be given, or the job asked for settings of its own.
  std::vector<SettingOption> settings;
  /// The cores it would hold on the device (a job that lets placement choose its count has a
  /// candidate per count, each with its estimate at that count); 0: the job's own `cores`.
  int cores = 0;
};

/// The setting `knobs`' goal prefers for a job estimated `base` at the device's defaults: only
/// settings whose slowdown holds within `max_slowdown` at `risk`, that save energy at `risk`,
/// and that `allowed` accepts (placement: a deadline the defaults keep) are considered; one
/// wins only by beating the defaults. nullptr: the defaults (or goal off).
const SettingOption* preferred_setting(const KnobPolicy& knobs, double risk, std::optional<double> max_slowdown,
                                       const Estimate& base, const std::vector<SettingOption>& settings,
                                       const std::function<bool(const SettingOption&)>& allowed = {});

/// The lowest score a min-energy or flops-greedy pass could give a candidate: its joules at the
/// defaults or at its cheapest setting (infinity where it has none).
double score_floor(const Candidate& candidate, Objective objective);

/// Whether a pass under this objective scores a candidate by its joules alone (min-energy,
/// flops-greedy): it can then walk them cheapest first and stop early.
bool walks_cheapest_first(Objective objective);

/// The order in which a min-energy or flops-greedy pass walks a job's candidates, so that it
/// can stop at the first one whose floor is above the best found.
struct CandidateOrder {
  Objective objective = Objective::min_energy;
  std::vector<std::uint32_t> cheapest_first;  ///< indices into the candidates, by score_floor
  double widest_std = 0.0;                    ///< the largest joules std among them and their settings
  bool by_device = false;  ///< the candidates are in increasing device order (a pass can look one up)
};

/// A queued job as placement sees it.
struct PendingJob {
  std::string id;
  int priority = 0;
  std::string owner;    ///< "token:alice", "uid:1000": whose quota it counts against
  std::string project;  ///< the project it is accounted to; empty: none
  std::optional<UnixMillis> deadline;
  std::optional<UnixMillis> not_before;  ///< its constraints.not_before: not placed before then
  std::optional<double> max_energy_joules;
  std::optional<double> max_slowdown;  ///< its constraints.max_slowdown: replaces the policy's
  /// Its resources.cores: on a device that shares its cores (DeviceStatus::cores) it holds that
  /// many, side by side with other such jobs; 0, or on any other device: the whole device.
  int cores = 0;
  /// Its resources.gpus: 0, any one device its candidates allow; N, N devices of one group
  /// (DeviceStatus::group: GPUs of one kind on one node) at once, each held whole, the first
  /// the candidate chosen. Its candidates' estimates are then for its whole run on N.
  int gpus = 0;
  std::vector<Candidate> candidates;
  /// Built by `order_candidates` for the pass's objective; empty or for another objective: a
  /// pass walks every candidate in turn (the same decisions, only slower on many devices).
  CandidateOrder order;
};

/// Orders a job's candidates for `objective` (min-energy and flops-greedy; others: cleared).
void order_candidates(PendingJob& job, Objective objective);

/// A device as placement sees it at the start of a pass.
struct DeviceStatus {
  DeviceRef ref;
  bool accepts_work = true;  ///< false: lost, draining or estimation-only
  /// Held whole: a job that takes the whole device is placed or running on it, or a probe.
  bool busy = false;
  /// Cores it shares among jobs that ask for cores (PendingJob::cores), each holding its own;
  /// 0: one job at a time, whatever it asks.
  int cores = 0;
  int cores_held = 0;  ///< of those, held by the jobs placed or running on it
  /// The devices a job asking for GPUs (PendingJob::gpus) may hold together with it: a node's
  /// GPUs of one kind share a group ("node-a: NVIDIA H200"); empty: not a GPU.
  std::string group;
  /// When it is expected to be wholly free: its jobs' latest expected end.
  std::optional<UnixMillis> busy_until;
  double average_power_watts = 0.0;    ///< metered, over the power caps' averaging period
  std::optional<double> battery_percent;
  std::optional<double> battery_capacity_joules;  ///< full charge, for the floor's headroom
  double work_seconds = 0.0;  ///< seconds of work it has run (least-loaded)
  /// The carbon intensity of the grid it draws from (min-carbon, grams budgets); nullptr: none known.
  const GridSignal* carbon = nullptr;
  /// The price per kWh it pays (min-cost, money budgets); nullptr: none known.
  const GridSignal* price = nullptr;

  /// Whether it shares its cores, so that a job asking for `job_cores` holds only those.
  bool shares_cores_with(int job_cores) const { return cores > 0 && job_cores > 0; }
  /// Whether some job could start on it now.
  bool takes_work() const { return accepts_work && !busy && cores_held < std::max(cores, 1); }
  /// Whether a job asking for `job_cores` (0: the whole device) could start on it now.
  bool fits_now(int job_cores) const;
  /// Records a job placed on it, as its driver will tell it from now on.
  void hold(int job_cores);
};

/// What a joule drawn on `device` over [from, to) emits and costs at its signals (their edges
/// persisting; the value at `from` when to <= from).
UseRates rates_over(const DeviceStatus& device, UnixMillis from, UnixMillis to);

/// Why a job is not running. `message` is one line for people; the rest for programs.
struct WaitReason {
  enum class Kind {
    behind,          ///< the pass stopped before reaching it (earlier jobs first)
    device_busy,     ///< waiting for its best device, which is busy
    no_free_device,  ///< a baseline policy: every eligible device is busy
    budget,          ///< an energy budget would likely be overrun
    max_energy,      ///< the job's own max_energy_joules would likely be overrun
    power_cap,       ///< a power cap over the device is exceeded
    battery_floor,   ///< a battery is at or near its floor
    deadline,        ///< no device can finish it before its deadline
    no_estimate,     ///< a budget applies but the device has no energy model for the job
    unavailable,     ///< no eligible device accepts work
    cleaner_window,  ///< min-carbon, min-cost: waiting for a cleaner or cheaper window that still meets its deadline
    not_before,      ///< its constraints.not_before has not come yet
    quota,           ///< its owner or project runs as many jobs as its quota allows
  };
  WaitReason() = default;
  WaitReason(Kind kind, std::string message, std::string device = {}, std::string rule = {})
      : kind(kind), message(std::move(message)), device(std::move(device)), rule(std::move(rule)) {}

  Kind kind = Kind::behind;
  std::string message;
  std::string device;  ///< qualified device name the reason is about, if one
  std::string rule;    ///< budget, cap or floor name
  std::optional<double> limit;             ///< the budget's unit (budget), watts (cap), percent (floor)
  std::optional<double> remaining;         ///< budget: limit - spent - reserved, in its unit
  std::optional<double> needed;            ///< budget: what the job needs at the policy's risk, in its unit
  std::optional<BudgetUnit> unit;          ///< budget: its unit
  std::optional<UnixMillis> retry_at;      ///< when the condition is expected to clear
};
std::string_view to_string(WaitReason::Kind kind);

/// A job placed on a device; the caller reserves `reserve` in the ledger and starts it.
struct Placement {
  std::string job;
  std::size_t device = 0;
  std::optional<Estimate> estimate;  ///< at the setting chosen
  /// The knob setting chosen for it (nullopt: the device's defaults), and what the job was
  /// expected to cost at the defaults, for the saving it is expected to make.
  std::optional<SettingOption> setting;
  std::optional<Estimate> at_default;
  EnergyDistribution reserve;  ///< what to reserve in the budget ledger
  UseRates rates;              ///< what a joule of it emits and costs over its expected run, at the signals
  int cores = 0;               ///< cores it holds on a device that shares them; 0: the whole device
  /// A job on several GPUs: the others it holds beside `device`, each whole (same group).
  std::vector<std::size_t> companions;
  std::string note;            ///< why this device: "fewest joules: 12.3 kJ (cpu 30.1 kJ)"
  bool misses_deadline = false;  ///< no device could meet it; placed anyway, earliest finish
};

struct PassResult {
  std::vector<Placement> placements;
  std::vector<std::pair<std::string, WaitReason>> waiting;  ///< jobs considered and not placed
  std::size_t considered = 0;  ///< jobs scanned (the rest are `behind`)
  /// The earliest retry_at among the reasons: when a pass is worth running again.
  std::optional<UnixMillis> next_retry;
  std::size_t weighed = 0;  ///< candidates weighed: the pass's work, counted (tests, benchmarks)
  /// The scheduling core continued its last pass with jobs queued since, and decided only those.
  bool continued = false;
};

struct PlacementOptions {
  /// At most this many queued jobs are scanned per pass (a bound on one pass's cost with a
  /// long queue; jobs beyond wait for the next pass).
  std::size_t max_scan = 1000;
  /// Once no device is free, this many more jobs are still looked at so that they say why they
  /// wait (a budget, a cap...) rather than only "every device is busy".
  std::size_t max_explain = 64;
};

/// Jobs running now per owner and per project, for the policy's running-job quotas.
struct RunningByTenant {
  std::unordered_map<std::string, std::size_t> owners;
  std::unordered_map<std::string, std::size_t> projects;
};

/// A pass under way: the devices it has taken, the work it expects ahead of each, and what it
/// has reserved of budgets and caps. `Placer::extend` continues it with more jobs.
class PassState {
 public:
  PassState();
  ~PassState();
  PassState(PassState&&) noexcept;
  PassState& operator=(PassState&&) noexcept;

 private:
  friend class Placer;
  struct Data;
  std::unique_ptr<Data> data_;
};

class Placer {
 public:
  explicit Placer(Policy policy, PlacementOptions options = {});
  void set_policy(Policy policy);
  const Policy& policy() const { return policy_; }

  /// One placement pass. `queue` is in priority order. Devices and ledger are not changed.
  PassResult decide(UnixMillis now, std::span<const DeviceStatus> devices, std::span<const PendingJob* const> queue,
                    const BudgetLedger& ledger);
  /// The same pass in two parts: `begin` reads the devices and the ledger; `extend` decides jobs
  /// in order against what the pass has handed out so far, and may be called again with jobs
  /// queued after them (the same devices and ledger; `now` no earlier than at `begin`).
  /// `running`: the jobs running now per owner and project, where the policy limits them.
  PassState begin(UnixMillis now, std::span<const DeviceStatus> devices, const BudgetLedger& ledger,
                  const RunningByTenant& running = {}) const;
  PassResult extend(PassState& pass, UnixMillis now, std::span<const DeviceStatus> devices,
                    std::span<const PendingJob* const> queue, const BudgetLedger& ledger);

  /// Whether a job could ever run here under this policy: some eligible device where a budget's
  /// whole limit (not what is left of it), the job's max_energy and its deadline could hold.
  /// nullopt if it can; otherwise the reason, for a rejection at submit.
  std::optional<WaitReason> never_fits(UnixMillis now, std::span<const DeviceStatus> devices, const PendingJob& job,
                                       const BudgetLedger& ledger) const;

 private:
  /// Why a job may not run now for its owner's or project's running-job quota, or nullopt.
  std::optional<WaitReason> quota_hold(const PendingJob& job, const RunningByTenant& running) const;

  Policy policy_;
  PlacementOptions options_;
  std::size_t round_robin_next_ = 0;
};

}  // namespace joule::schedulers
