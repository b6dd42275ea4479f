#pragma once
// The job book of one node: jobs accepted durably, queued, placed one per device, metered,
// finished, cancelled, and reconciled after a restart. What runs a placed job is its device's
// executor (src/jobs/executors/): a process group here, or a placement another node's runner takes
// up. Lives on the daemon's io_context thread; every state change is persisted through the
// group-commit writer.

#include <array>
#include <chrono>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <nlohmann/json.hpp>

#include "joule/adapters/control_journal.hpp"
#include "joule/adapters/database.hpp"
#include "joule/adapters/energy_meter.hpp"
#include "joule/adapters/frequency_limits.hpp"
#include "joule/adapters/jetson_power_mode.hpp"
#include "joule/adapters/job_controls.hpp"
#include "joule/adapters/job_process.hpp"
#include "joule/adapters/storage_writer.hpp"
#include "joule/cluster/reconcile.hpp"
#include "joule/cluster/sync.hpp"
#include "joule/common/clock.hpp"
#include "joule/common/result.hpp"
#include "joule/daemon/agent_jobs.hpp"
#include "joule/daemon/budget_service.hpp"
#include "joule/daemon/clock_timer.hpp"
#include "joule/daemon/device_table.hpp"
#include "joule/daemon/grid_signal_feed.hpp"
#include "joule/daemon/job_accounts.hpp"
#include "joule/daemon/job_estimate.hpp"
#include "joule/daemon/job_links.hpp"
#include "joule/daemon/job_view.hpp"
#include "joule/daemon/local_run_options.hpp"
#include "joule/daemon/metrics.hpp"
#include "joule/daemon/node_jobs.hpp"
#include "joule/estimator/probe_campaign.hpp"
#include "joule/schedulers/job.hpp"
#include "joule/schedulers/job_queue.hpp"
#include "joule/schedulers/setting_check.hpp"

namespace joule::daemon {

struct JobRecord;
struct ShownRow;
class Executor;
class LocalExecutor;
class NodeExecutor;
class AgentRunner;

/// The book's settings; how its jobs run as processes here (LocalRunOptions) among them.
struct JobServiceOptions : LocalRunOptions {
  std::size_t max_queued_jobs = 10000;
  std::string node_name = "localhost";  ///< this node, as policies name it
  int utc_offset_minutes = 0;           ///< local time, for calendar budget windows
  /// Re-read on each meter sample where set (daylight saving time moves it).
  std::function<int()> current_utc_offset_minutes;
  /// An agent takes jobs only from its coordinator; POST /v1/jobs is refused with this message.
  std::string refuse_submissions;
  /// Finished jobs that ended longer ago than this leave the database, with their log and work
  /// directories ([jobs] keep_finished_days); 0 keeps them.
  int keep_finished_days = 0;
};

class JobService final : public JobDemand {
 public:
  /// Gets the job as committed, or why not; rendered at once (the view points into the book).
  using Done = std::function<void(Result<JobView>)>;

  /// `devices`: the node's device table, which the book places on and samples; on a
  /// coordinator it adds the agents' devices to it. `links`: the estimator, the listener and the
  /// carbon signal. `clock`: wall time for what is stored and shown, monotonic time for
  /// durations and meter rates.
  JobService(boost::asio::io_context& io, adapters::StorageWriter& storage, Metrics& metrics, DeviceTable& devices,
             JobServiceOptions options, JobServiceLinks links = {}, const Clock& clock = system_clock());
  ~JobService() override;

  /// Finished jobs leave memory, all but the latest `kept`, and are read back from `archive`: a
  /// read-only connection to the job database (Database::open_reader), used on this thread. Then
  /// memory holds the jobs that are not finished, however many have finished. Before recover(),
  /// which is then given the jobs Database::load_current_jobs(kept) reads. Without it, every job
  /// stays in memory (unit tests).
  void keep_finished_in(adapters::Database& archive, std::size_t kept = kFinishedKept);
  /// What fair share's recent use is read back from at start: the jobs that ended within 20 of
  /// the policy's half-lives (a year at most) before now, [since, until) in Unix ms.
  std::pair<std::int64_t, std::int64_t> recent_use_span() const;
  /// Adds that history to the owners' and projects' recent use (jobs that end from now on are
  /// added as they end).
  void remember_recent_use(const std::vector<adapters::RecentUse>& uses);
  static constexpr std::size_t kFinishedKept = 64;

  /// Loads the stored jobs and reconciles those that were placed or running when the last
  /// daemon stopped: finished ones get their recorded exit status, live ones are adopted,
  /// never-started ones are queued again, lost ones fail with the reason. Then schedules.
  Status recover(std::vector<adapters::StoredJob> jobs, std::vector<adapters::StoredEvent> events);

  /// Who submits a job: the owner's name ("token:alice", "uid:1000") and, for a local user the
  /// kernel named, the uid.
  struct Submitter {
    std::string name;
    std::optional<std::int64_t> uid;
  };
  /// Validates and stores a submission; `done` gets the job (201) once it is committed.
  void submit(const nlohmann::json& body, Submitter submitter, Done done);
  /// Cancels: a queued job at once; a running one by TERM then KILL after the grace period.
  void cancel(const std::string& id, Done done);
  /// Pauses or resumes a running job by hand (POST /v1/jobs/{id}/pause, /resume): SIGSTOP here,
  /// on its agent, or `scontrol suspend` on Slurm. The policy's throttling leaves it as it is.
  Result<JobView> pause(const std::string& id, bool pause);
  /// A running job's "epoch k of N done" (POST /v1/jobs/{id}/progress; the route checks the
  /// token handed to it in JOULE_JOB_TOKEN): its energy so far and its projection.
  Result<ProgressAnswer> report_progress(const std::string& id, const ProgressReport& report);
  /// The URL jobs reach the API at (JOULE_URL), known once the server listens.
  void set_api_url(std::string url);

  /// The policy and budget ledger of this node.
  BudgetService& budgets() { return budgets_; }
  /// Installs a (re)loaded policy and runs a placement pass under it.
  void set_policy(schedulers::Policy policy);
  /// The policy and the budgets, caps and floors now, over this node's devices (GET /v1/budgets).
  BudgetsView budgets_view() const;
  /// A job in memory or in the database (its events read back only `with_events`), or not_found.
  Result<JobView> job(const std::string& id, bool with_events = true) const;
  /// One page of jobs in submission order (newest first with `newest_first`), optionally only
  /// those in `state`: at most `limit`, starting after the job `after` in that order (a cursor
  /// from the previous page's `next`).
  Result<JobPage> jobs(const std::optional<std::string>& state, std::size_t limit,
                       const std::optional<std::string>& after = std::nullopt, bool newest_first = false) const;
  /// One line for systemd's STATUS=: jobs waiting and running, and each device's power.
  std::string summary() const;

  /// Reads every device's meter and updates power and energy metrics.
  void sample_meters();
  /// Stops starting new jobs (running ones go on and are adopted by the next daemon).
  void stop_scheduling();
  std::size_t writes_in_flight() const { return writes_in_flight_; }
  /// Why the database takes no writes, while its last write failed (a full disk, a damaged
  /// file); nothing once a write succeeds again. /readyz is not ready meanwhile.
  const std::optional<std::string>& storage_failure() const { return storage_failure_; }

  /// A device model changed: the first `limit` queued jobs are estimated again (and stored), so
  /// that jobs submitted before a model existed can be admitted under budgets. One job at a
  /// time, its predictions and text off the loop; a job whose estimate moved is stored and a
  /// pass runs. A change while it works starts it again from the queue's head.
  void refresh_estimates(std::size_t limit = 256);
  /// Whether a refresh is still working through its jobs (tests wait for it).
  bool refreshing_estimates() const { return refreshing_; }

  using Feedback = JobFeedback;
  /// The feedback of the jobs that succeeded (rebuilding what finished jobs taught, at start), in
  /// the order they ended: every one in memory, or the latest kFeedbackRows from the archive. Jobs
  /// adopted after a restart count as partial.
  std::vector<Feedback> finished_feedback() const;
  /// Enough for every device's outcome rows (estimator::OutcomeCalibration::kMaxRows each) on a
  /// node of ten devices; read with each one's estimate, so bounded.
  static constexpr std::size_t kFeedbackRows = 2000;
  /// The carbon or price signal was replaced: a placement pass now, since a waiting job's window
  /// may have moved or gone.
  void signal_changed() { schedule(); }
  // --- Coordinator: agents' devices and the jobs placed on them ---
  /// What other nodes' runners (agents, the Slurm executor) meet: the node executor.
  NodeJobs& nodes();

  // --- Agent: the jobs this node runs for its coordinator ---
  /// What ClusterAgent meets: the agent runner.
  AgentJobs& agent();

  // --- JobDemand: what probing asks of the queue ---
  bool work_waiting_for(const std::string& device) const override;
  std::vector<estimator::WorkloadItem> workload(std::size_t recent) const override;
  bool chooses_settings() const override;
  /// A job that lets placement choose its core count, on a device that shares its cores: a
  /// candidate per count in its range with figures there (the estimate's own at the device's
  /// thread count, the measured counts' lines), each with its `cores`; with none, its least.
  static std::vector<schedulers::Candidate> core_options(
      const schedulers::JobSpec& spec, const Device& device, const schedulers::Candidate& candidate,
      const std::unordered_map<std::string, const DeviceEstimate*>& usable);
  std::vector<int> core_counts(const std::string& device) const override;

 private:
  using Job = JobRecord;
  class Host;  // the ExecutorHost the executors report to (job_service.cpp)
  using Write = adapters::StorageWriter::Write;

  /// What the API shows of a job beside its record.
  JobView view_of(const Job& job) const;
  JobView view_of(std::unique_ptr<Job> archived) const;
  Status check_runnable(const schedulers::JobSpec& spec,
                        const std::optional<adapters::JobIdentity>& identity = std::nullopt) const;
  /// Whether a device of this node (not an agent's) may run it.
  bool runs_here(const schedulers::JobSpec& spec) const;
  /// A checked submission within the queue's limits and its quotas: estimated (the models'
  /// part off the loop), then admitted.
  void accept(schedulers::JobSpec spec, Submitter submitter, Done done);
  /// A job's estimates as it keeps them: the stored text and the figures it decides with.
  struct KeptEstimates {
    std::string stored;
    std::vector<DeviceEstimate> figures;
  };
  /// An accepted submission with its estimates (nullopt: it has nothing to estimate) stored and
  /// queued, unless it can never run here: `done` gets the job once it is committed.
  void admit(schedulers::JobSpec spec, Submitter submitter, std::optional<KeptEstimates> estimates, Done done);
  /// Estimates `spec` in three steps: the models' predictions on the estimating thread, their
  /// corrections and caveats on the loop (they read what it changes), the stored text and the
  /// figures on the thread again; `then` gets them on the loop (never once the book is gone).
  /// `what` names the loop's share in joule_loop_work_seconds.
  void estimate_off_loop(const schedulers::JobSpec& spec, std::string what, std::function<void(KeptEstimates)> then);
  /// The next job of a refresh (refresh_estimates), or its end.
  void refresh_next();
  /// A 429 where one more queued job of `owner` (in `project`) would pass its quota, or nothing.
  std::optional<Error> queued_quota_refusal(const std::string& owner, const std::string& project) const;
  void count_in_flight(const std::string& owner, const std::string& project, int change);
  void persist(Write write, std::function<void(Status)> done = {});
  /// Agent: stores a coordinator's assignment as a job of this node and queues it for the
  /// device it names (failed where it cannot run here); `done` gets whether it was stored.
  void take_assignment(const cluster::Assignment& assignment, std::function<void(bool)> done);
  /// Persists a write of `job`'s events, and of its row where `writes_row`; once it commits,
  /// that row and those events are what the API shows of the job.
  void persist_job(Job& job, bool writes_row, Write write, std::function<void(Status)> done = {});
  /// Writes again what persist_job could not store (a full disk): each such job's row as it
  /// stands and the events that were lost, then shows them. Without it a job that ended while
  /// the disk was full would be shown running until a restart.
  void store_unsaved();
  /// A commit's row (if it wrote one) and events become the job's shown ones, and its state in
  /// the indexes.
  void show(const std::string& id, const std::optional<ShownRow>& row, std::size_t events);
  /// An event in the job's history that changes no state (stored, and logged).
  void note(Job& job, const std::string& message);
  void transition(Job& job, schedulers::JobState to, const std::string& message, std::function<void(Status)> done = {});
  void schedule();
  void schedule_retry(schedulers::UnixMillis at);
  std::vector<schedulers::DeviceStatus> device_statuses() const;
  /// What placement sees of a queued job: its constraints and its estimate on each device.
  schedulers::PendingJob pending_job(const Job& job) const;
  /// The job waits in the scheduling core's queue.
  void enqueue(const Job& job);
  /// The core tracks a job that runs without its pass having placed it (adopted, recovered),
  /// with its estimate there reserved.
  void track_run(const Job& job, const Device& device, schedulers::UnixMillis started);
  /// The scheduler the book drives: the queue, placement passes, running jobs' projections and
  /// throttling; what it records in the ledger goes through budgets_, which stores it.
  schedulers::SchedulingCore& core() { return core_; }
  const schedulers::SchedulingCore& core() const { return core_; }
  /// Keeps a job's estimates: the stored text (the API shows it) and what the daemon decides with.
  void set_estimates(Job& job, const std::vector<EstimateRow>& rows);
  std::optional<schedulers::Estimate> estimate_for(const Job& job, const std::string& device) const;
  /// A run's estimate as it ran (on its row's device, at the cores placement chose for it), for
  /// what finished jobs teach; nullopt where it has none there.
  std::optional<DeviceEstimate> estimate_as_run(const std::vector<DeviceEstimate>& estimates,
                                                const adapters::StoredJob& row) const;
  std::optional<schedulers::EnergyDistribution> estimate_on(const Job& job, const std::string& device) const;
  /// What a finished, metered run teaches, against `estimate` (its estimate as it ran): on its
  /// row's device, with its GPUs (its own and its companions) and their model.
  Feedback feedback_of(const adapters::StoredJob& row, const DeviceEstimate& estimate,
                       std::optional<double> seconds) const;
  void note_waiting(Job& job, schedulers::WaitReason reason);
  void track_running(schedulers::UnixMillis now);
  void apply(const schedulers::ThrottleAction& action);
  void release_controls(Job& job, bool ended);
  void place(Job& job, Device& device, const schedulers::Placement& placement);
  /// A placement that could not be stored: the job waits in the queue again (as the database
  /// still has it) and placing pauses for a while, instead of the job failing.
  void unplace(Job& job, const std::string& why);
  /// The executor that runs jobs on `device`: this node's processes, or another node's runner.
  Executor& executor_for(const Device& device);
  /// The executor of a job placed or running on `device_name` (this node's when it is unknown).
  Executor& executor_for(const std::string& device_name);
  void adopt(Job& job, Device& device, const std::string& note, const std::string& report_state,
             std::optional<std::int64_t> started_ms);
  void requeue(Job& job, const std::string& why);
  /// A run on another node is gone (its node lost, or its runner fenced it): its reservation,
  /// controls and device are let go and it is queued again (failed where restart = fail).
  void queue_again(Job& job, Device& device, const std::string& why);
  void run_lost(Job& job, const std::string& why);
  void refresh_pending();
  /// An agent's device by name, added (not placeable until the agent is heard from) where it
  /// is known only from the stored state.
  Device& remote_device(const std::string& name);
  void finish(Job& job, schedulers::JobState state, const std::string& reason,
              std::optional<adapters::ExitStatus> exit);
  void release_device(Job& job);
  // A job that ended metered: its grams and cost under the signals over its run, on its row and
  // on `metered` (what the budget ledger records).
  void account_signals(Job& job, adapters::StoredEnergyUse& metered);
  void refresh_state_metrics();
  /// Takes a stored job into the book's indexes (submission order, jobs per shown state).
  void index(Job& job);
  // --- Finished jobs out of memory (job_service_archive.cpp) ---
  /// Finished jobs beyond the latest finished_kept_ leave memory (their rows are committed): an
  /// agent's stay while it reports their end to its coordinator.
  void evict_finished();
  /// A job that left memory, read back from the archive (with its events where asked): a
  /// record the API can show, detached from the book. Nothing where it is not stored.
  Result<std::unique_ptr<Job>> read_back(const std::string& id, bool with_events) const;
  std::unique_ptr<Job> record_of(adapters::StoredJob row, std::vector<adapters::StoredEvent> events) const;
  /// A page of GET /v1/jobs from the archive (every job, or a finished state), the jobs in
  /// memory shown as memory has them.
  Result<JobPage> archived_page(const std::optional<std::string>& state, std::size_t limit,
                                std::optional<std::int64_t> after_sequence, bool newest_first) const;
  /// Jobs shown in `state`, in memory and out of it.
  std::size_t count_in(schedulers::JobState state) const;
  std::vector<Feedback> archived_feedback() const;
  /// [jobs] keep_finished_days: deletes up to a batch of finished jobs older than that (rows,
  /// events, directories); again at the next meter sample while there are more, else a minute on.
  void forget_old_finished();
  /// Why a job that is not in memory cannot be acted on: finished (so `conflict`), or unknown.
  Error not_in_memory(const std::string& id, const std::string& finished_why) const;
  /// Moves a job to another state (no event, nothing stored: see transition).
  void set_state(Job& job, schedulers::JobState to);
  /// What a job's energy figure covers on `device`, as GET /v1/jobs/{id} says it.
  std::string energy_scope(const std::string& device, const std::string& source) const;
  std::int64_t now_ms() const { return clock_.unix_ms(); }
  /// How long a job has run (or ran): on the monotonic clock where this daemon timed it, else
  /// from its stored timestamps, never below zero.
  std::optional<double> run_seconds(const Job& job) const;

  boost::asio::io_context& io_;
  adapters::StorageWriter& storage_;
  Metrics& metrics_;
  DeviceTable& devices_;
  JobServiceOptions options_;
  const Clock& clock_;
  std::map<std::string, std::unique_ptr<Job>> jobs_;
  /// What jobs' first epochs measured of a setting chosen for them (setting_check.hpp), by
  /// "device|network key": placement weighs the next job of that network by it. Rebuilt at
  /// start from the rows of the jobs loaded (recall_checked_setting).
  std::map<std::string, schedulers::SettingCheckResult> checked_settings_;
  /// That key for `job` on `device` at `setting`; `signature`: its network's, where the caller
  /// has it already (else it is computed).
  static std::string checked_key(const Job& job, const std::string& device, const estimator::KnobSetting& setting,
                                 const std::string& signature = {});
  /// A progress report of a job at a chosen setting: the check's next step (switching its
  /// device's settings), and its result noted and remembered once decided.
  void check_setting(Job& job, Device& device);
  /// The job's chosen setting, its check's verdict and whether it is in force, into its row
  /// (StoredJob::chosen_setting; "" without one). The caller writes the row.
  void store_setting(Job& job) const;
  /// A stored row's decided check, remembered for the next job of its network.
  void recall_checked_setting(const Job& job);
  std::map<std::int64_t, Job*> by_sequence_;  // the same jobs in submission order
  // The submission numbers of the jobs in each shown (committed) state, kept as commits land:
  // counting and listing by state cost a page, not a walk over every job.
  std::array<std::set<std::int64_t>, 7> sequences_by_state_;
  std::int64_t next_sequence_ = 1;
  adapters::Database* archive_ = nullptr;
  std::size_t finished_kept_ = kFinishedKept;
  std::deque<std::string> finished_order_;         // ids of the finished jobs in memory, as they finished
  std::array<std::size_t, 7> evicted_by_state_{};  // finished jobs shown in each state, out of memory
  bool forgetting_ = false;                        // a batch of old finished jobs is being deleted
  std::int64_t forget_again_at_ms_ = 0;
  std::size_t submissions_in_flight_ = 0;
  // The same per owner and per project, for their queued-job quotas.
  std::unordered_map<std::string, std::size_t> in_flight_by_owner_;
  std::unordered_map<std::string, std::size_t> in_flight_by_project_;
  std::size_t writes_in_flight_ = 0;
  bool scheduling_ = true;
  const JobEstimator* estimator_;
  JobListener* listener_;
  const GridSignalFeed* carbon_;
  const GridSignalFeed* price_;
  schedulers::SchedulingCore core_;
  BudgetService budgets_;
  std::unique_ptr<ClockTimer> retry_timer_;
  std::optional<schedulers::UnixMillis> retry_at_;
  /// joule_jobs_waiting as of the last pass: queued jobs it looked at, by why they wait (a
  /// continued pass adds the jobs it decided; the rest of the queue is "behind").
  std::map<std::string_view, double> waiting_by_reason_;
  std::size_t waiting_counted_ = 0;
  std::optional<std::string> storage_failure_;
  struct Unsaved {
    bool row = false;
    std::vector<adapters::StoredEvent> events;
  };
  std::map<std::string, Unsaved> unsaved_;  // by job id: what its failed writes held
  bool storing_unsaved_ = false;
  std::optional<schedulers::UnixMillis> placing_paused_until_;  // after a placement could not be stored
  std::unique_ptr<Host> host_;
  std::unique_ptr<LocalExecutor> local_;  // jobs on this node's devices
  std::unique_ptr<NodeExecutor> nodes_;   // coordinator: jobs on agents' and Slurm's devices
  std::unique_ptr<AgentRunner> agent_;    // agent: the coordinator's assignments
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  /// Reads built-in jobs' datasets at submit, off the loop (at most kMaxDatasetChecks waiting),
  /// and removes the directories of finished jobs that leave the database.
  std::unique_ptr<boost::asio::thread_pool> dataset_checks_ = std::make_unique<boost::asio::thread_pool>(1);
  std::size_t dataset_checks_in_flight_ = 0;
  static constexpr std::size_t kMaxDatasetChecks = 64;
  /// Makes submissions' model predictions off the loop (a coordinator's cover every device of
  /// its cluster: ~15 ms a job at 1,500 devices), at most kMaxEstimatesInFlight waiting.
  std::unique_ptr<boost::asio::thread_pool> estimating_ = std::make_unique<boost::asio::thread_pool>(1);
  std::size_t estimates_in_flight_ = 0;
  static constexpr std::size_t kMaxEstimatesInFlight = 256;
  std::deque<std::string> refresh_left_;  // queued jobs a refresh has still to estimate
  bool refreshing_ = false;
  std::size_t refresh_changed_ = 0;  // jobs the refresh stored again
};

}  // namespace joule::daemon
