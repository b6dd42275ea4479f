#pragma once
// Keeps the energy models of this node's real devices current (docs/design.md, "Probing real
// devices").
//
// When a device is idle (no job on it or waiting for it, idle for `idle_seconds`) and probing
// is allowed (enabled, inside the configured hours, under the day's joule cap), joule-worker
// trains the 1-, 2- and 3-layer networks that the ProbePlanner chooses for the workload of
// queued and recent jobs. jouled never links LibTorch: the worker is a child process in its
// own process group, started through the job runner, and its one JSON result is read back.
// Each probe is decomposed into a layer sample, stored in SQLite, and the GPs are refitted on
// a worker thread (never on the event loop) every few probes; the fitted model replaces the
// device's model for estimates and is saved as a snapshot with its version, sample count,
// last probe time and held-out error.
//
// A probe is pre-empted the moment a job is placed on its device: its process group is
// killed and the interrupted measurement discarded. Re-probing starts on drift (finished
// jobs' metered energy outside the estimate's own 2σ band in 2 of the last 3 jobs), on age
// (model older than `max_model_age_hours`), and when joule-worker reports another software
// environment (LibTorch, BLAS, threads, meter source) than the model was learnt under: that
// model is withdrawn at once, since its figures describe other conditions.
//
// Once a device's layer models are seeded, the networks of queued jobs and of a requested run's
// `models` are candidates too: measured whole for a few steps (joule-worker probe with the
// network itself), weighed against the next layer probe by the same rule (the expected fall of
// the workload's estimate error per √cost). A network measured whole is estimated from that
// measurement; the ones not measured are scaled by their family's whole-to-layers gap
// (estimator/whole_network.hpp). A measurement that fails is not tried again this campaign and
// stores nothing. Every [probing] reference_minutes the first network measured whole is measured
// again: the spread of those readings is how much the device's own speed moves, shown in GET
// /v1/devices and taken as the least spread of any estimate on the device.
//
// Before the first layer probe of a campaign, `joule-worker runtime` meters what the configured
// Python interpreter ([probing] python) costs: its start-up and its training loop's per-step
// work beyond LibTorch's (estimator/runtime_cost.hpp). The model keeps it, so jobs whose command
// runs Python are estimated with it from the first one; a failed runtime probe stores nothing
// and says why in GET /v1/devices and in those jobs' estimates.
//
// While the policy has a knobs.goal, a network measured whole is also measured at each of its
// device's knob settings (device_knobs.hpp: a few power limits or clock caps), set for the
// worker's run and put back after (journalled like a job's): the model learns each setting's
// ratios, and placement chooses among them. Only while no job holds a device of the node.

#include <chrono>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include "joule/adapters/control_journal.hpp"
#include "joule/adapters/database.hpp"
#include "joule/adapters/jetson_power_mode.hpp"
#include "joule/adapters/job_process.hpp"
#include "joule/adapters/storage_writer.hpp"
#include "joule/common/clock.hpp"
#include "joule/config/daemon_config.hpp"
#include "joule/daemon/budget_service.hpp"
#include "joule/daemon/child_process.hpp"
#include "joule/daemon/device_table.hpp"
#include "joule/daemon/job_links.hpp"
#include "joule/daemon/metrics.hpp"
#include "joule/daemon/model_service.hpp"
#include "joule/daemon/probe_cycle.hpp"
#include "joule/estimator/probe_campaign.hpp"

namespace joule::daemon {

struct ProbeServiceOptions {
  config::ProbingConfig probing;
  std::filesystem::path state_directory;
  std::filesystem::path worker;  ///< the joule-worker executable
  std::filesystem::path runner;  ///< jouled itself (--job-runner)
  double tick_seconds = 1.0;
  /// Where the originals of knob settings a measurement sets are noted first (the executor's
  /// journal: a kill -9 mid-measurement is put back at the next start); null: none.
  adapters::ControlJournal* control_journal = nullptr;
  adapters::CommandRunner run_tool;  ///< runs nvpmodel; empty: the system's
};

/// What was stored about a device's probing, loaded at start.
struct StoredProbeState {
  std::vector<adapters::StoredModelSnapshot> snapshots;
  std::map<std::string, std::vector<adapters::StoredProbeSample>> samples;  ///< by device
  std::vector<adapters::StoredProbeRun> runs;
};

class ProbeService {
 public:
  /// `clock`: wall time for stored runs, snapshots and the local day of the daily cap;
  /// monotonic time for back-offs, idleness and requested runs' ends.
  /// `devices`: the node's device table; its real devices (cpu, cuda:N) are probed, with the
  /// meter and threads their [[devices]] tables name. `demand`: the queue, which probing yields
  /// to and learns for; `budgets`: the ledger probes' energy is recorded in.
  ProbeService(boost::asio::io_context& io, adapters::StorageWriter& storage, Metrics& metrics, ModelService& models,
               const JobDemand& demand, BudgetService& budgets, const DeviceTable& devices, ProbeServiceOptions options,
               const Clock& clock = system_clock());
  ~ProbeService();

  /// Takes over the real devices (cpu, cuda:N) of the device table, resumes from what was
  /// stored, checks the worker's environment, and starts the probing timer.
  void start(StoredProbeState stored);
  /// Kills a probe in progress and stops the timer (the daemon is stopping).
  void stop();
  void set_config(const config::ProbingConfig& probing);

  /// A job is about to be placed on `device`: a probe there, or on a MIG device sharing its
  /// GPU's counter, is killed and discarded.
  void preempt(const std::string& device);
  /// The joule-worker that probes `device`: its own (Device::worker), else the node's.
  const std::filesystem::path& worker_for(const std::string& device) const;
  /// Whether a probe (not the environment check) runs on `device` now.
  bool probing(const std::string& device) const;
  /// Whether a device sharing `device`'s meter counter (a sibling MIG device) has a job or a
  /// probe: a probe here would read their work as its own.
  bool siblings_busy(const std::string& device) const;
  /// A finished job's metered energy beside its estimate: error metric and drift check.
  void feedback(const JobFeedback& feedback);
  /// The finished jobs of the stored history (at start): their energy is what probing's worth
  /// is weighed by (probe_pays).
  void remember_jobs(const std::vector<JobFeedback>& history);

  /// POST /v1/probes: {"device": "cpu", "seconds": 60}; 202 with the run.
  Result<nlohmann::json> request(const nlohmann::json& body);
  /// GET /v1/probes: the latest runs, newest last.
  nlohmann::json runs() const;
  Result<nlohmann::json> run(const std::string& id) const;
  /// Probing state of a device for GET /v1/devices (empty object for devices not probed here).
  nlohmann::json info(const std::string& device) const;
  /// Why `device`'s estimates have no Python runtime lines (not measured yet, the probe failed,
  /// no interpreter configured); nothing once measured, or for a device not probed here.
  std::optional<std::string> runtime_problem(const std::string& device) const;
  /// What an estimate of `model` on `device` should say of probing: that measuring the network
  /// whole failed (and why) while no measurement of it succeeded, that a knob setting could not be
  /// measured, and that the device's speed moves more than [probing] max_speed_spread.
  std::vector<std::string> estimate_caveats(const std::string& device, const estimator::ModelSpec& model,
                                            const estimator::TrainingConfig& training) const;

 private:
  void preempt_here(const std::string& device);
  struct Device;
  struct Running;

  void tick();
  void schedule_tick();
  /// Steps the device's ProbeCycle and does what it says.
  void consider(Device& device);
  bool needs_probing(Device& device);
  /// Whether the planner's best next probe is worth its cost in a background run: its expected
  /// fall of the estimates' error (PlannedProbe::error_reduction, a share of the workload's
  /// energy) × the energy jobs estimated on the device used in the last day × the model's life
  /// in days (max_model_age_hours), against the mean joules of a probe plan here. Seeds and
  /// kinds with no model always pay. When it does not, GET /v1/devices says so.
  bool probe_pays(Device& device, double error_reduction);
  /// What probing would do next on the device, and what it is worth: the layer planner's next
  /// plan, or a network of the workload to measure whole where that is worth more per √cost.
  struct NextProbe {
    double error_reduction = 0.0;
    double cost = 1.0;
    std::optional<estimator::WorkloadItem> whole;  ///< set: measure this network whole
    std::optional<estimator::KnobSetting> setting;  ///< ... at this knob setting
  };
  std::optional<NextProbe> next_probe(Device& device);
  /// The workload's network most worth measuring whole now, if any (probe_whole.cpp).
  std::optional<NextProbe> next_whole(Device& device);
  void start_whole_probe(Device& device, const estimator::WorkloadItem& item,
                         const std::optional<estimator::KnobSetting>& setting = std::nullopt);
  /// The settings the workload's networks may be measured at on `device` now, while no job holds
  /// any of this node's devices (a setting reaches beyond the device: a CPU cap slows every
  /// process, and more threads take cores jobs would use): its knob_choices while placement
  /// chooses settings (policy knobs.goal), and on a device that shares its cores the thread
  /// counts queued jobs ask for (resources.cores) other than its own, up to its cores.
  std::vector<estimator::KnobSetting> settings_to_measure(const Device& device) const;
  /// Puts back the knob setting a measurement set, at once (the job that pre-empts it may set
  /// its own next).
  static void put_knobs_back(Running& probe);
  void on_whole_exit(Device& device, Running& probe, const std::optional<adapters::ExitStatus>& exit, double seconds);
  /// Whether the reference network is due for another reading ([probing] reference_minutes).
  bool reference_due(const Device& device) const;
  /// A whole measurement of `item` joins the reference readings (the first one measured becomes
  /// the reference); the device's speed spread follows them. Returns that spread.
  static double note_reference(Device& device, const estimator::WorkloadItem& item, std::int64_t at_ms,
                               double joules_per_step);
  /// A stored whole-network row back into the device's model (at start); whether it was one.
  static bool restore_whole(Device& device, const adapters::StoredProbeSample& row);
  /// What GET /v1/devices shows of the networks measured whole and the families' gaps.
  static nlohmann::json whole_info(const Device& device);
  static void remember_job_energy(Device& device, const JobFeedback& feedback);
  void start_probe(Device& device);
  /// Why a run is opened now: "requested", the campaign's reason, or "idle".
  std::string run_reason(const Device& device) const;
  /// What every probing worker (layer probes, the runtime probe) runs with: `directory` as its
  /// working and temp directory, the device's thread count, its output files there.
  void set_probe_launch(adapters::LaunchSpec& spec, const std::filesystem::path& directory, int threads,
                        const std::string& stdout_name) const;
  /// Whether the device's model lacks what the configured interpreter costs and its runtime
  /// probe has not been tried since the campaign (or the config) began.
  bool runtime_due(const Device& device) const;
  /// `joule-worker runtime`: the interpreter's start-up and per-step cost (runtime_cost.hpp).
  void start_runtime_probe(Device& device);
  void on_runtime_exit(Device& device, Running& probe, const std::optional<adapters::ExitStatus>& exit, double seconds);
  /// Serves `model` for the device's estimates as a new version and saves its snapshot.
  void install_model(Device& device, const std::shared_ptr<const estimator::DeviceEnergyModel>& model);
  /// A new directory for one worker run of the device's probe run (opened first if none is):
  /// <state>/probes/<run>-[<kind>-]<n>.
  std::filesystem::path open_probe_directory(Device& device, const std::string& kind);
  /// Starts the worker `spec` describes as the device's probe, `running` saying what it measures
  /// (its directory, plans or kind); one that cannot start backs probing off, and false.
  bool launch_probe(Device& device, const adapters::LaunchSpec& spec, const std::string& what, Running running);
  /// Starts joule-worker for `device`; its end comes to on_probe_exit.
  Result<std::unique_ptr<ChildProcess>> launch_worker(Device& device, const adapters::LaunchSpec& spec,
                                                      const std::string& what);
  void on_probe_exit(const std::string& device_name, const std::optional<adapters::ExitStatus>& exit);
  /// Learns from the result lines a probe's worker has written since the last look; whether
  /// there were any (the caller saves the run).
  bool take_results(Device& device, Running& probe);
  /// Learns from one plan's result line; the joules it metered and their source, if it read.
  std::optional<std::pair<double, std::string>> accept_result(Device& device, const std::string& run_id,
                                                              const estimator::ProbePlan& plan,
                                                              const nlohmann::json& result_json);
  void begin_campaign(Device& device, const std::string& reason);
  void refresh_workload(Device& device);
  void maybe_fit(Device& device, bool force);
  void on_fitted(const std::string& device_name, std::shared_ptr<estimator::DeviceEnergyModel> model,
                 std::size_t samples, double seconds);
  void check_environment(Device& device);
  std::string open_run(Device& device, const std::string& reason, std::optional<double> seconds);
  void close_run(Device& device, const std::string& state, const std::string& message);
  void save_run(const std::string& id);
  nlohmann::json run_json(const adapters::StoredProbeRun& run) const;
  nlohmann::json snapshot_meta(const Device& device) const;
  void publish_model_state(const Device& device, std::int64_t version);
  std::int64_t now_ms() const { return clock_.unix_ms(); }
  /// Minute of the local day, and the local calendar day (for probing hours and the daily cap).
  std::pair<int, int> local_minute_and_day() const;

  boost::asio::io_context& io_;
  adapters::StorageWriter& storage_;
  Metrics& metrics_;
  ModelService& models_;
  const JobDemand& demand_;
  BudgetService& budgets_;
  const DeviceTable& table_;
  ProbeServiceOptions options_;
  const Clock& clock_;
  std::map<std::string, std::unique_ptr<Device>> devices_;
  std::map<std::string, adapters::StoredProbeRun> runs_;
  std::deque<std::string> run_order_;
  boost::asio::steady_timer timer_;
  std::thread fitter_;
  bool fitting_ = false;
  bool stopped_ = false;
  std::uint64_t next_run_ = 1;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace joule::daemon
