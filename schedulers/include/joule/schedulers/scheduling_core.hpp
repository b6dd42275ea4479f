#pragma once
// The scheduler jouled and joule-sim both drive: events in, decisions and the next wake-up out.
//
// It keeps the run queue (priority, then submission), what it expects of every job it has
// placed or been told runs (its reservation, its estimated seconds, its epoch reports and STEP
// projection), the budget ledger, the placer and the throttle controller. A driver tells it what
// happened (a submission, a report, a meter sample, a pause, an end) with the time, asks it for a
// placement pass and throttle actions, carries those out in its world (processes and agents in
// jouled, simulated devices in joule-sim), and wakes it again at `wake_at`. Pure: no clock, no
// I/O; time is passed in, and the same events give the same decisions.

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "joule/schedulers/budget_ledger.hpp"
#include "joule/schedulers/job_queue.hpp"
#include "joule/schedulers/placement.hpp"
#include "joule/schedulers/policy.hpp"
#include "joule/schedulers/step_projection.hpp"
#include "joule/schedulers/throttle_controller.hpp"

namespace joule::schedulers {

/// What the core expects of a job that runs (placed by a pass, or recovered, adopted or
/// reported running by the driver).
struct TrackedRun {
  std::string id;
  std::size_t device = 0;  ///< index into the driver's device statuses
  std::vector<std::size_t> companions;  ///< a job on several GPUs: the others it holds
  int priority = 0;
  std::string owner;       ///< whose running-job quota it counts against
  std::string project;     ///< its project; empty: none
  UnixMillis started = 0;  ///< when it was placed or started (the ledger counts its use from here)
  /// Its estimate where it runs, reserved in the ledger; nullopt: nothing was expected of it.
  std::optional<EnergyDistribution> prior;
  std::optional<double> expected_seconds;  ///< its estimated run time there
  std::vector<EpochReport> reports;
  std::optional<Projection> projection;  ///< from the reports, once there is one
  double used_joules = 0.0;              ///< metered so far, as of the last sample
};

/// A running job as the driver samples it: its energy so far and the controls in force. The
/// core fills in its device, priority and what it is still expected to use.
struct RunningSample {
  std::string id;
  /// When it began to run, where that is after its placement (a process or an agent starts it
  /// a little later): its energy so far is counted from then.
  std::optional<UnixMillis> started;
  std::optional<double> used_joules;  ///< nullopt: its meter could not be read (counts as 0)
  RunningJob controls;                ///< power, pause and limits now, and which limits exist
};

/// What one owner or one project has in the core now.
struct TenantUse {
  std::size_t queued = 0;
  std::size_t running = 0;
};

/// Recent energy use of one owner or project: joules that halve every half-life.
struct DecayedUse {
  double joules = 0.0;
  UnixMillis as_of = 0;
  /// What it amounts to at `now` (never more than as of its last addition).
  double at(UnixMillis now, std::int64_t half_life_seconds) const;
  void add(double more, UnixMillis when, std::int64_t half_life_seconds);
};

struct CoreOptions {
  std::size_t max_scan = PlacementOptions{}.max_scan;  ///< queued jobs a pass looks at (the rest wait their turn)
  /// Queued jobs a pass looks at while no device is free: the placer explains that many and
  /// stops, so a longer scan would only cost time that grows with the queue.
  std::size_t max_explain = PlacementOptions{}.max_explain;
  /// Whether `track` asks the throttle controller for actions (joule-sim's baselines: off).
  bool throttle = true;
  /// For this long after a full pass, a pass that finds only jobs queued at the tail since (the
  /// devices, the ledger and the running jobs as they were) continues that pass with them
  /// instead of deciding the whole queue again; 0: every pass is a full one. The earlier jobs'
  /// decisions are the full pass's at the moment it ran; the next full pass looks again.
  UnixMillis continue_within_ms = 1000;
};

class SchedulingCore {
 public:
  explicit SchedulingCore(Policy policy = {}, int utc_offset_minutes = 0, CoreOptions options = {});

  /// A new policy (a reload): budgets, caps and floors apply from the next pass; spent energy,
  /// reservations and the queue are kept.
  void set_policy(Policy policy);
  const Policy& policy() const { return policy_; }
  void set_utc_offset_minutes(int minutes) { ledger_.set_utc_offset_minutes(minutes); }
  BudgetLedger& ledger() { return ledger_; }
  const BudgetLedger& ledger() const { return ledger_; }

  // --- The queue ---
  /// Why the job could never run here (refuse it at submission), or nullopt.
  std::optional<WaitReason> never_fits(UnixMillis now, std::span<const DeviceStatus> devices,
                                       const PendingJob& job) const;
  /// A job waits for placement; `sequence` orders equal priorities (unique, increasing). A job
  /// is queued or running, never both: a run it had (requeued, unplaced) ends without a use.
  void enqueue(PendingJob job, std::int64_t sequence);
  /// A queued job's candidates changed (it was estimated again); a no-op if it is not queued.
  void update_pending(PendingJob job);
  /// A job leaves the queue without being placed (cancelled, or placed by someone else).
  void dequeue(const std::string& id);
  const JobQueue& queue() const { return queue_; }
  const PendingJob* pending(const std::string& id) const;

  // --- Passes ---
  /// One placement pass over the first `max_scan` queued jobs. Placed jobs leave the queue and
  /// are tracked as running from `now` with their reservation in the ledger. A pass runs even
  /// with every device busy: it still says why each job waits (a budget, not only a busy device).
  /// Where only jobs queued at the tail changed since the last full pass (a submission), it
  /// continues that pass with them (`PassResult::continued`; `continue_within_ms`): a
  /// submission's work does not grow with the queue or with the jobs ahead of it.
  PassResult place(UnixMillis now, std::vector<DeviceStatus> devices);
  /// The queued jobs the last pass looked at, in order, nullptr where it placed one: a driver
  /// says why those after `PassResult::considered` wait without asking the queue again. After a
  /// continued pass, only the jobs it continued with. Valid until the next call that changes
  /// the queue.
  const std::vector<const PendingJob*>& scanned() const { return scanned_; }
  /// The running jobs' energy so far and projections feed the ledger; then, with throttling on,
  /// the controller's actions (the driver applies them and reports `paused` / `resumed`).
  std::vector<ThrottleAction> track(UnixMillis now, std::vector<DeviceStatus> devices,
                                    std::vector<RunningSample> samples);
  /// When a pass should run again though nothing happens: the last pass's retry, or a budget
  /// window moving on while work waits. nullopt: only an event can change anything.
  std::optional<UnixMillis> wake_at(UnixMillis now) const;

  // --- Running jobs ---
  /// A job runs without this core's pass having placed it (recovered at start, adopted, or
  /// reported by an agent): it is tracked, and its prior reserved.
  void track_run(TrackedRun run, const DeviceRef& device);
  /// An epoch report: the job's STEP projection is updated and returned (nullptr if the job is
  /// not tracked).
  const Projection* report(const std::string& id, EpochReport report);
  /// Throttling paused a job: the stretch it ran is recorded (returned, for the driver to store).
  std::optional<EnergyUse> paused(const std::string& id, UnixMillis now);
  void resumed(const std::string& id, UnixMillis now);
  /// A job stopped running (ended, requeued, lost): its reservation ends and its metered use,
  /// if any, is recorded (returned, for the driver to store).
  std::optional<EnergyUse> end(const std::string& id, std::optional<EnergyUse> metered);
  const TrackedRun* running(const std::string& id) const;
  /// Queued and running jobs of one owner, or of one project (the policy's quotas count them).
  TenantUse owner_use(const std::string& owner) const;
  TenantUse project_use(const std::string& project) const;
  /// Recent energy use (fair share): the joules of finished and paused work, decayed.
  double recent_joules_of_owner(const std::string& owner, UnixMillis now) const;
  /// Adds work's joules to an owner's and project's recent use, as if it ended `at` (runs the
  /// core tracks are added when they pause or end; this is for history read back at start).
  void add_recent_use(const std::string& owner, const std::string& project, double joules, UnixMillis at);
  double recent_joules_of_project(const std::string& project, UnixMillis now) const;
  /// The fair-share factors of these jobs' owners and projects multiplied, in (0, 1]: 1 for
  /// those that used nothing lately, halving as their share of recent use passes their share of
  /// the shares (Slurm's classic factor, 2^(−use share / shares share)); every owner among those
  /// with recent use or a job here has an equal share, projects their configured `shares`.
  std::vector<double> fair_share_factors(std::span<const PendingJob* const> jobs, UnixMillis now) const;
  std::size_t running_count() const { return running_.size(); }

  /// The devices as given, with each tracked run's device expected free at its start plus its
  /// estimated seconds, or by its STEP projection once there is one.
  std::vector<DeviceStatus> with_expectations(UnixMillis now, std::vector<DeviceStatus> devices) const;

 private:
  /// What a running job is still expected to use: its projection (or prior) less what it used.
  EnergyDistribution still_expected(const TrackedRun& run) const;
  /// Placed jobs leave the queue and run, their reservations in the ledger.
  void start_runs(UnixMillis now, const PassResult& result, std::span<const DeviceStatus> devices);
  /// The last full pass, if a pass at `now` on `devices` may continue it.
  bool continues(UnixMillis now, const std::vector<DeviceStatus>& devices) const;
  PassResult continue_pass(UnixMillis now);

  /// The last full pass as it ended, kept so that jobs queued after it can be decided alone.
  struct OpenPass {
    UnixMillis began = 0;
    UnixMillis until = 0;  ///< continued only before then: its wake-up, or the horizon
    std::uint64_t ledger_revision = 0;
    std::vector<DeviceStatus> given;     ///< the devices as the driver gave them
    std::vector<DeviceStatus> expected;  ///< with the running jobs' expected ends: the placer's
    PassState state;
    /// It looked at every queued job: jobs queued after them are next. Otherwise they are
    /// behind jobs it did not reach, and a continued pass has nothing to decide.
    bool reaches_tail = false;
    std::size_t scan_left = 0;              ///< jobs the pass may still look at
    std::vector<std::string> queued_since;  ///< at the tail, in order
  };

  /// Gives every owner of a queued or running job or of the ledger's work its own budget of each
  /// `each_owner` template, where one is new to them (or `always`): the ledger, placer and
  /// throttle controller then see the policy with the templates expanded.
  void expand_owner_budgets(bool always);
  bool has_owner_templates() const;
  /// Whether the policy has each-owner templates and `owner` has no budgets made from them yet.
  bool lacks_owner_budgets(const std::string& owner) const;

  // Counts a job's queued and running changes to its owner's and project's use.
  void count(const std::string& owner, const std::string& project, int queued, int running);
  RunningByTenant running_by_tenant() const;
  // Adds a run's joules to its owner's and project's recent use.
  void remember_use(const TrackedRun& run, const std::optional<EnergyUse>& use);
  // Puts the scanned jobs of equal priority in fair-share order (stable: submission order
  // among equal factors).
  void order_by_fair_share(UnixMillis now);

  Policy policy_;
  CoreOptions options_;
  BudgetLedger ledger_;
  Placer placer_;
  ThrottleController throttle_;
  JobQueue queue_;
  std::unordered_map<std::string, PendingJob> pending_;
  std::map<std::string, TrackedRun> running_;
  std::unordered_map<std::string, TenantUse> owner_use_;
  std::unordered_map<std::string, TenantUse> project_use_;
  std::unordered_map<std::string, DecayedUse> owner_recent_;
  std::unordered_map<std::string, DecayedUse> project_recent_;
  std::vector<const PendingJob*> scanned_;
  std::optional<OpenPass> open_;
  std::vector<std::string> budget_owners_;  // the owners the expanded policy has budgets for, sorted
  std::optional<UnixMillis> retry_at_;
  UnixMillis last_prune_ = 0;
};

}  // namespace joule::schedulers
