#pragma once
// The discrete-event replay: one policy, one World, a virtual clock.
//
// Events are submissions, job finishes, the moments the scheduler asks to be woken at (a budget
// window that resets, a retry placement asked for) and, where batteries or throttling are
// simulated, a tick every `tick_seconds` (battery and solar update, throttle check). The
// scheduler is jouled's: schedulers::SchedulingCore (queue, placer, budget ledger, STEP
// projections, throttle controller), driven as jouled drives it. At each event time the replay
// tells it what happened, asks it for a placement pass and starts what it places. A running job
// progresses at its true pace and draws its true power (joules / seconds); every epoch it reports
// progress, and with admission on the ledger holds its STEP projection of what it has still to
// use. The core sees only what jouled would: estimates, reports and metered energy, never the
// true remaining time. A job that ends is settled with its true energy over its whole run, as a
// meter would read it.
//
// Throttling (runs with `throttle`): the core's throttle controller is evaluated at every event;
// a pause stops a job's progress and energy, a resume continues it. The simulated devices offer
// no GPU power limit or CPU quota, so every throttle action is a pause or a resume.
//
// Batteries: a node's battery discharges by what its devices draw (a running job's power, or
// idle_watts for a device with no running job) and charges from its solar panel, clamped to
// [0, capacity]; integrated between events, so with a battery present events are at most
// tick_seconds apart. An empty battery stops its node: its jobs make no progress and it accepts
// no work until it has charged to 5 %.
//
// The replay ends when every job is done; when the trace is exhausted and nothing can progress
// (no event is left, or no job has made progress for the longest budget window plus a day, at
// least two days: a job held by a floor that no sun will lift); or at the horizon.
// Deterministic: the same World and run give the same metrics (but the wall-time fields).

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "joule/schedulers/policy.hpp"
#include "joule/simulator/world.hpp"

namespace joule::simulator {

/// What a policy is told about job costs.
enum class Knowledge {
  estimates,  ///< the device models' estimates (and the FLOPs baseline): what jouled knows
  none,       ///< nothing: schedulers that ignore energy (fifo, round-robin, least-loaded)
  truth,      ///< the true cost with no uncertainty: the oracle
};

/// One row of a comparison: a name, the policy it runs and what it knows.
struct PolicyRun {
  std::string name;
  schedulers::Policy policy;
  Knowledge knowledge = Knowledge::estimates;
  bool throttle = false;
  /// Zeus-like: each job on a device with GPU power limits profiles them in its first steps
  /// and runs the rest at the one with the least Zeus cost (no estimates).
  bool jit_power_limit = false;
  /// Carbon-only: a job with a deadline is held until the signal's lowest value before its
  /// deadline, knowing nothing of how long it runs (no estimates), then placed least-loaded.
  bool carbon_only = false;
  /// Devices that share their cores run one job at a time all the same (the jobs keep their own
  /// cores' cost), and a job asking for several GPUs runs on one (at its one-GPU truth): what
  /// the policy is worth without packing or data parallelism.
  bool one_job_per_device = false;
};

/// The comparison joule-sim runs: the policy file as written, the same choosing knob settings
/// too (`NAME+knobs`, knobs.goal min-energy, where the file leaves knobs off), then the baselines fifo,
/// round-robin, least-loaded (admission off, no estimates, no throttling), flops-greedy (ranks
/// devices by the FLOPs baseline; admits and throttles with the same GP estimates and risk as
/// the policy, so its row shows what the ranking alone is worth), zeus-like (least-loaded
/// placement, each GPU job tuning its power limit just in time as Zeus does) and oracle (min-energy on the
/// true costs, admission and throttling on), and oracle+knobs (the oracle choosing settings
/// from their true costs: the ceiling for +knobs). Baselines keep the policy's budgets, caps and
/// floors, for the violation counts. With a carbon signal (`carbon`): min-carbon beside
/// min-energy (whichever the file is not), and carbon-only (see PolicyRun) after fifo. Where a
/// device shares its cores or a job asks for several GPUs (`shared_cores`): the policy again with
/// one job per device, second.
std::vector<PolicyRun> standard_runs(const schedulers::Policy& policy, bool carbon = false, bool shared_cores = false,
                                     bool price = false);

struct ReplayOptions {
  double tick_seconds = 60.0;
  std::optional<double> horizon_hours;  ///< from the virtual start; nullopt: until nothing can progress
  /// A bound for runs that could go on (a job waiting on solar charge that never comes).
  double max_days = 365.0;
  /// Called with every start, finish, throttle action and budget wait, in time order (for
  /// `joule-sim --events`); empty: no log.
  std::function<void(schedulers::UnixMillis, const std::string&)> on_event;
  /// Called with every placement as it starts (device: index into World::devices); empty: none.
  std::function<void(schedulers::UnixMillis, const schedulers::Placement&)> on_placement;
};

/// A budget window whose true spent amount (joules, or grams or money at the cluster's signals)
/// exceeded its limit.
struct Violation {
  std::string budget;
  schedulers::UnixMillis window_start = 0;
  schedulers::UnixMillis window_end = 0;  ///< rolling: the end of the worst moment's window
  double spent = 0.0;                     ///< in the budget's unit
  double limit = 0.0;
  schedulers::BudgetUnit unit = schedulers::BudgetUnit::joules;
  double overrun() const { return spent - limit; }
};

/// What one device did under a policy.
struct DeviceUsage {
  std::size_t jobs = 0;       ///< jobs started there
  double busy_seconds = 0.0;  ///< seconds a job progressed there
  double joules = 0.0;        ///< jobs' true energy there
};

/// What one policy did. Joules are simulated (the truth of the World), never measured.
/// One owner's jobs in a run (for traces whose jobs name an owner).
struct OwnerMetrics {
  std::size_t jobs = 0;
  std::size_t started = 0;
  std::size_t completed = 0;
  double energy_joules = 0.0;      ///< their true energy, completed or not
  double wait_mean_seconds = 0.0;  ///< submit → start, over started jobs
  double wait_max_seconds = 0.0;
};

struct PolicyMetrics {
  std::string name;
  std::string objective;
  bool admission = true;
  bool throttle = false;
  std::string knowledge;  ///< "estimates", "none", "truth"

  std::size_t jobs = 0;
  std::size_t completed = 0;
  std::size_t started_not_completed = 0;  ///< running or paused at the end (horizon)
  std::size_t never_started = 0;
  std::size_t rejected = 0;    ///< refused at submission: could never run under the policy (as jouled does)
  double energy_joules = 0.0;  ///< every job's true energy, completed or not
  double energy_per_completed_job_joules = 0.0;  ///< completed jobs' energy / completed
  double idle_joules_not_counted = 0.0;          ///< devices' idle draw until the end: NOT in energy
  double makespan_seconds = 0.0;                 ///< first submission to last completion
  double wait_mean_seconds = 0.0;                ///< submit → start, over started jobs
  double wait_p95_seconds = 0.0;
  double turnaround_mean_seconds = 0.0;  ///< submit → finish, over completed jobs
  std::size_t deadline_misses = 0;      ///< finished late, or unfinished with its deadline past at the end
  std::size_t max_energy_exceeded = 0;  ///< jobs whose true energy exceeded their max_energy_joules
  std::vector<Violation> violations;    ///< budget windows overrun (true spent > limit)
  double max_overrun_joules = 0.0;
  std::map<std::string, std::size_t> throttle_actions;  ///< by kind ("pause", "resume")
  std::size_t throttle_action_count = 0;
  /// Grams CO2e of the jobs' energy at the cluster's carbon signal (nullopt: no signal); energy
  /// drawn where the signal has no value is left out and counted apart.
  std::optional<double> carbon_grams;
  double joules_outside_carbon_signal = 0.0;
  /// The same at the cluster's price signal: what the jobs' energy cost (nullopt: no signal).
  std::optional<double> cost;
  double joules_outside_price_signal = 0.0;
  std::size_t jobs_at_settings = 0;   ///< jobs that ran at a knob setting other than their device's default
  std::size_t slowdown_exceeded = 0;  ///< of those, jobs truly slowed beyond their allowed max_slowdown
  /// Under the min-energy goal and objective, against an exhaustive sweep of each job's device (what Zeus's
  /// per-job profiling would find with perfect meters): the jobs whose device had settings, and
  /// those whose energy as run was within 5 % of the least any setting (or the defaults) within
  /// their allowed slowdown truly costs there, without running slower than allowed;
  /// `setting_regret` sums max(0, chosen / best - 1).
  std::size_t jobs_swept = 0;
  std::size_t jobs_within_5pct_of_best = 0;
  double setting_regret = 0.0;
  std::map<std::string, DeviceUsage> devices;           ///< by qualified device name
  std::map<std::string, double> battery_min_percent;    ///< by node
  std::map<std::string, double> battery_empty_seconds;  ///< by node: time with the battery at 0
  /// By battery floor: seconds in which a job ran on a device the floor covers while the charge
  /// was below the floor (what the floor forbids; idle draw below it is not the scheduler's).
  std::map<std::string, double> floor_violation_seconds;
  /// By power cap: seconds in which the jobs' power in the cap's scope was over the cap.
  std::map<std::string, double> cap_violation_seconds;
  std::map<std::string, OwnerMetrics> owners;  ///< by owner, where the trace names owners
  std::size_t placement_passes = 0;
  std::size_t placements = 0;
  double placer_wall_seconds = 0.0;  ///< wall time inside Placer::decide (not deterministic)
  double wall_seconds = 0.0;         ///< wall time of the whole replay (not deterministic)
  schedulers::UnixMillis ended_at = 0;
  std::string end_reason;                              ///< "all jobs done", "nothing can progress", "horizon"
  std::map<std::string, std::size_t> waiting_reasons;  ///< never-started jobs' last wait reason kinds
};

/// Replays the World's trace under one policy from scratch.
PolicyMetrics replay(const World& world, const PolicyRun& run, const ReplayOptions& options = {});

}  // namespace joule::simulator
