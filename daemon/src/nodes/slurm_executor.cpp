#include "joule/daemon/slurm_executor.hpp"

#include <pwd.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>

#include "jobs/progress_token.hpp"
#include "joule/common/energy_source.hpp"
#include "joule/daemon/run_on_loop.hpp"
#include "joule/daemon/thread_settings.hpp"

namespace joule::daemon {

namespace asio = boost::asio;
using nlohmann::json;

namespace {

std::string node_name(const config::SlurmNodeType& type) { return "slurm:" + type.name; }

// Where a job's run claim lives, under its working directory (adapters::batch_script).
constexpr std::string_view kRunClaimDir = ".joule-runs";
// How often Joule releases one job from Slurm's launch-failure hold before leaving it to an operator.
constexpr int kMaxReleases = 3;

// Whether Slurm requeued and held a job after its batch launch failed on the node (a node still
// running an old job of the same id after a controller lost its state, say). scontrol writes
// the reason with underscores, squeue with spaces.
bool held_after_failed_launch(const adapters::SlurmJob& job) {
  return job.state == "PENDING" &&
         (job.reason == "launch_failed_requeued_held" || job.reason == "launch failed requeued held");
}

std::string current_user() {
  const passwd* entry = ::getpwuid(::geteuid());
  return entry ? entry->pw_name : std::string();
}

// A Slurm phase as the job book names the state of a run: waiting to start is placed, suspended
// is throttled (paused, by Joule or by hand).
schedulers::JobState job_state(adapters::SlurmPhase phase) {
  using P = adapters::SlurmPhase;
  using S = schedulers::JobState;
  switch (phase) {
    case P::waiting:
      return S::placed;
    case P::running:
      return S::running;
    case P::suspended:
      return S::throttled;
    case P::completed:
      return S::succeeded;
    case P::failed:
      return S::failed;
    case P::cancelled:
      return S::cancelled;
  }
  return S::placed;
}

adapters::SlurmOptions slurm_options(const config::SlurmConfig& config) {
  adapters::SlurmOptions options;
  options.bin_dir = config.bin_dir;
  options.timeout_seconds = config.timeout_seconds;
  if (!config.conf.empty()) options.env.push_back("SLURM_CONF=" + config.conf.string());
  return options;
}

}  // namespace

SlurmExecutor::SlurmExecutor(asio::io_context& io, NodeJobs& nodes, config::SlurmConfig config, const Clock& clock)
    : io_(io),
      nodes_(nodes),
      clock_(clock),
      config_(std::move(config)),
      cli_(slurm_options(config_)),
      user_(current_user()) {
  nodes_.add_node_changed_hook([this, alive = alive_](const std::string& node) {
    if (*alive && owns(node)) wake();
  });
}

SlurmExecutor::~SlurmExecutor() {
  *alive_ = false;
  stop();
}

bool SlurmExecutor::owns(const std::string& node) const {
  for (const auto& type : config_.node_types)
    if (node_name(type) == node) return true;
  return false;
}

std::map<std::string, std::string> slurm_model_sources(const config::SlurmConfig& config) {
  std::map<std::string, std::string> out;
  for (const auto& type : config.node_types) {
    // A simulated model is learnt once, under the node's name; an agent's is its device's.
    const std::string source = type.model.rfind("sim:", 0) == 0 ? node_name(type) : type.model;
    for (int slot = 0; slot < type.slots; ++slot) out[fmt::format("{}/{}", node_name(type), slot)] = source;
  }
  return out;
}

void SlurmExecutor::start() {
  for (const auto& type : config_.node_types) {
    std::vector<cluster::ReportedDevice> slots;
    for (int slot = 0; slot < type.slots; ++slot) {
      cluster::ReportedDevice device;
      device.name = std::to_string(slot);
      device.source = type.model.rfind("sim:", 0) == 0 ? "simulated" : "modelled";
      slots.push_back(device);
    }
    nodes_.update_node(node_name(type), slots);
    spdlog::info("slurm: node type {} ({} slot{}, partition {}{}), energy model from {}", type.name, type.slots,
                 type.slots == 1 ? "" : "s", type.partition.empty() ? "(default)" : type.partition,
                 type.constraint.empty() ? "" : ", constraint " + type.constraint, type.model);
  }
  // Jobs report progress to JOULE_URL: a loopback address reaches only jobs Slurm runs on this host.
  const std::string url = job_url();
  if (url.find("://127.") != std::string::npos || url.find("://[::1]") != std::string::npos ||
      url.find("://localhost") != std::string::npos)
    spdlog::warn(
        "slurm: jobs get JOULE_URL={}, which reaches this jouled only from this host: set [slurm] joule_url to an "
        "address the compute nodes reach (and [server] listen on it) for progress reports from other nodes",
        url);
  else if (!url.empty())
    spdlog::info("slurm: jobs report progress to {}", url);
  thread_ = std::thread([this] { run(); });
}

void SlurmExecutor::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void SlurmExecutor::wake() {
  {
    std::lock_guard lock(mutex_);
    wake_wanted_ = true;
  }
  wake_.notify_all();
}

bool SlurmExecutor::on_loop(const std::function<void()>& work) { return run_on_loop(io_, work, stopping_); }

void SlurmExecutor::set_api_url(std::string url) { api_url_ = std::move(url); }

std::string SlurmExecutor::job_url() const { return config_.joule_url.empty() ? api_url_ : config_.joule_url; }

void SlurmExecutor::run() {
  while (!stopping_) {
    cycle();
    std::unique_lock lock(mutex_);
    wake_.wait_for(lock, std::chrono::duration<double>(config_.poll_seconds),
                   [this] { return stopping_.load() || wake_wanted_; });
    wake_wanted_ = false;
  }
}

adapters::SlurmSubmission SlurmExecutor::submission_for(const cluster::Assignment& assignment,
                                                        const config::SlurmNodeType& type) const {
  adapters::SlurmSubmission submission;
  submission.joule_id = fmt::format("{}.{}", assignment.id, assignment.epoch);
  submission.name = assignment.name.empty() ? submission.joule_id : assignment.name;
  submission.partition = type.partition;
  submission.nodelist = type.nodelist;
  submission.constraint = type.constraint;
  const auto& run = assignment.spec.value("run", json::object());
  submission.argv = run.value("command", std::vector<std::string>{});
  submission.workdir = run.value("workdir", config_.workdir);
  // As on a local device: the thread count and allocator the model was probed under, unless
  // the job's own run.env says otherwise.
  set_thread_variables(submission.env, type.threads);
  set_allocator_variables(submission.env);
  if (run.contains("env") && run["env"].is_object())
    for (const auto& [name, value] : run["env"].items()) submission.env[name] = value.get<std::string>();
  submission.env["JOULE_JOB_ID"] = assignment.id;
  if (const std::string url = job_url(); !url.empty()) submission.env["JOULE_URL"] = url;
  submission.env["JOULE_DEVICE"] = fmt::format("{}/{}", node_name(type), assignment.device);
  if (!submission.workdir.empty()) {
    submission.stdout_path = fmt::format("{}/joule-{}.out", submission.workdir, submission.joule_id);
    submission.stderr_path = fmt::format("{}/joule-{}.err", submission.workdir, submission.joule_id);
  }
  // Beside the output files (relative: in the job's working directory): a copy Joule submits
  // after a controller crash reports the first one's end instead of running the command again.
  submission.run_claim_dir =
      submission.workdir.empty() ? std::string(kRunClaimDir) : fmt::format("{}/{}", submission.workdir, kRunClaimDir);
  return submission;
}

cluster::ReportedJob SlurmExecutor::report_of(const Handed& handed) const {
  cluster::ReportedJob report;
  report.id = handed.job;
  report.epoch = handed.epoch;
  if (handed.failure) {
    report.state = "failed";
    report.reason = *handed.failure;
    return report;
  }
  if (handed.lost) {
    report.state = "failed";
    report.reason = "Slurm lost it after it had started (slurmctld restarted without its state)";
    return report;
  }
  const auto& job = *handed.last;
  const auto state = job_state(adapters::slurm_phase(job.state).value_or(adapters::SlurmPhase::waiting));
  report.state = std::string(schedulers::to_string(state));
  report.started_ms = job.start_ms;
  report.finished_ms = job.end_ms;
  if (job.exit_signal)
    report.exit_code = 128 + *job.exit_signal;
  else
    report.exit_code = job.exit_code;
  report.reason = fmt::format("Slurm job {} {}{}", job.slurm_id, job.state,
                              job.reason.empty() || job.reason == "None" ? "" : " (" + job.reason + ")");
  if (state == schedulers::JobState::succeeded) report.reason = fmt::format("exit code 0 (Slurm job {})", job.slurm_id);
  if (handed.energy_joules) {
    report.energy_joules = handed.energy_joules;
    report.energy_source = std::string(to_string(EnergySource::slurm));
  } else if (handed.running_joules && !schedulers::is_terminal(state)) {
    report.energy_joules = handed.running_joules;  // so far, by sstat
    report.energy_source = std::string(to_string(EnergySource::slurm));
  }
  if (handed.record.resubmissions > 0 && state == schedulers::JobState::failed && !job.exit_signal &&
      job.exit_code == adapters::kSecondCopyExit)
    report.reason = fmt::format(
        "Slurm lost it after its command had started, and that run left no exit status; it was not run twice "
        "(Slurm job {})",
        job.slurm_id);
  return report;
}

void SlurmExecutor::cycle() {
  // 1. What the coordinator wants of each node type now.
  std::map<std::string, std::vector<cluster::Assignment>> desired;
  if (!on_loop([&] {
    for (const auto& type : config_.node_types) desired[node_name(type)] = nodes_.desired_for(node_name(type));
      }))
    return;

  // 2. Slurm's view. Nothing is submitted before it has been read once: after a restart the
  //    jobs already handed over are found by their Joule id, not submitted twice.
  auto listing = cli_.list();
  if (!listing) {
    std::lock_guard lock(mutex_);
    if (last_error_ != listing.error().message) spdlog::warn("slurm: {}", listing.error().message);
    last_error_ = listing.error().message;
    return;
  }
  {
    std::lock_guard lock(mutex_);
    last_error_.clear();
    last_listing_ms_ = clock_.unix_ms();
  }
  if (!energy_plugin_) {
    if (auto plugin = cli_.energy_plugin()) {
      energy_plugin_ = *plugin;
      if (plugin->empty())
        spdlog::info(
            "slurm: no energy accounting (AcctGatherEnergyType): jobs there are charged their estimate, "
            "labelled modelled");
      else
        spdlog::info(
            "slurm: energy accounting acct_gather_energy/{}: running jobs' energy is read from sstat and "
            "ended jobs' from sacct (ConsumedEnergyRaw), labelled slurm",
            *plugin);
    }
  }
  std::map<std::string, const adapters::SlurmJob*> by_joule_id;
  for (const auto& job : *listing)
    if (!job.joule_id.empty() && (user_.empty() || job.user.empty() || job.user == user_))
      by_joule_id[job.joule_id] = &job;
  for (const auto& [node, assignments] : desired) {
    for (const auto& assignment : assignments) {
      const std::string joule_id = fmt::format("{}.{}", assignment.id, assignment.epoch);
      if (handed_.contains(joule_id)) continue;
      const auto found = by_joule_id.find(joule_id);
      if (found == by_joule_id.end()) continue;
      Handed adopted;
      adopted.record = {joule_id, found->second->slurm_id, found->second->start_ms.value_or(clock_.unix_ms()),
                        adapters::has_started(*found->second), 0};
      adopted.job = assignment.id;
      adopted.epoch = assignment.epoch;
      adopted.node = node;
      handed_[joule_id] = adopted;
      spdlog::info("slurm: job {} found as Slurm job {} (by its comment)", joule_id, found->second->slurm_id);
    }
  }

  // 3. Reconcile what was handed over with the listing: keep, resubmit once, lost, strays.
  std::vector<adapters::HandedJob> records;
  for (const auto& [id, handed] : handed_)
    if (!handed.failure && !handed.lost && !(handed.last && adapters::is_final_slurm_state(handed.last->state)))
      records.push_back(handed.record);
  adapters::ReconcileOptions options;
  options.now_ms = clock_.unix_ms();
  options.user = user_;
  options.guarded = true;  // every submission carries a run claim (submission_for)
  for (const auto& decision : adapters::reconcile(records, *listing, options)) {
    auto it = handed_.find(decision.joule_id);
    switch (decision.action) {
      case adapters::ReconcileAction::keep:
        if (it == handed_.end()) break;
        it->second.record.slurm_id = decision.slurm_id;
        it->second.last = decision.job;
        if (decision.job && adapters::has_started(*decision.job)) it->second.record.seen_running = true;
        // Joule's own job, held by Slurm and not by anyone's choice: its run claim makes a
        // launch that did happen harmless, so it is released (it then waits for a usable node).
        // A few times only: a node that fails every launch needs its operator, not a loop.
        if (decision.job && held_after_failed_launch(*decision.job) && it->second.releases < kMaxReleases) {
          it->second.releases += 1;
          spdlog::warn("slurm: {}: Slurm job {} is held ({}); releasing it ({} of {})", decision.joule_id,
                       decision.slurm_id, decision.job->reason, it->second.releases, kMaxReleases);
          if (auto released = cli_.release(decision.slurm_id); !released)
            spdlog::warn("slurm: releasing {}: {}", decision.slurm_id, released.error().message);
        }
        break;
      case adapters::ReconcileAction::resubmit:
        if (it == handed_.end()) break;
        spdlog::warn("slurm: {}: {}; submitting it again, once", decision.joule_id, decision.reason);
        it->second.record.slurm_id.clear();
        it->second.record.resubmissions += 1;
        it->second.last.reset();
        break;
      case adapters::ReconcileAction::lost:
        if (it == handed_.end()) break;
        spdlog::warn("slurm: {}: {}", decision.joule_id, decision.reason);
        it->second.lost = true;
        // Its Slurm id may already name another job (a controller that lost its state hands
        // ids out again): nothing is ever cancelled or suspended by it.
        it->second.record.slurm_id.clear();
        it->second.last.reset();
        break;
      case adapters::ReconcileAction::stray:
        spdlog::warn("slurm: cancelling Slurm job {} ({}): {}", decision.slurm_id, decision.joule_id, decision.reason);
        (void)cli_.cancel(decision.slurm_id);
        break;
    }
  }

  // 4. Act: submit what is wanted and not yet handed (or lost before it started), cancel what
  //    is no longer wanted or was cancelled, suspend and resume as the policy says.
  std::set<std::string> wanted;
  for (const auto& type : config_.node_types) {
    for (const auto& assignment : desired[node_name(type)]) {
      const std::string joule_id = fmt::format("{}.{}", assignment.id, assignment.epoch);
      wanted.insert(joule_id);
      auto it = handed_.find(joule_id);
      if (assignment.stop) {
        if (it != handed_.end() && !it->second.cancel_sent && !it->second.record.slurm_id.empty()) {
          if (auto cancelled = cli_.cancel(it->second.record.slurm_id); cancelled) it->second.cancel_sent = true;
        }
        if (it == handed_.end()) {
          // Cancelled before Slurm had it: nothing to stop.
          Handed ended;
          ended.job = assignment.id;
          ended.epoch = assignment.epoch;
          ended.node = node_name(type);
          ended.failure = "cancelled before it was handed to Slurm";
          handed_[joule_id] = ended;
        }
        continue;
      }
      if (it == handed_.end() || (it->second.record.slurm_id.empty() && !it->second.failure && !it->second.lost)) {
        Handed& handed = handed_[joule_id];
        if (assignment.spec.value("run", json::object()).contains("builtin")) {
          // The built-in trainer is joule-worker on a node that runs jouled; a Slurm node may
          // have neither, and the job's files live under this node's state directory.
          handed.job = assignment.id;
          handed.epoch = assignment.epoch;
          handed.node = node_name(type);
          handed.failure =
              "run.builtin is not run on Slurm partitions; give run.command (for instance "
              "joule-worker train --job FILE) or a device of a node running jouled";
          continue;
        }
        auto submission = submission_for(assignment, type);
        // Its own progress token, as a local job gets one: the book keeps its hash before the job can use it.
        if (const auto token = new_progress_token()) {
          submission.env["JOULE_JOB_TOKEN"] = token->token;
          if (!on_loop([&] { nodes_.set_progress_token(assignment.id, assignment.epoch, token->sha256); })) return;
        }
        auto submitted = cli_.submit(submission);
        handed.job = assignment.id;
        handed.epoch = assignment.epoch;
        handed.node = node_name(type);
        handed.record.joule_id = joule_id;
        handed.record.submitted_ms = clock_.unix_ms();
        if (submitted) {
          handed.record.slurm_id = *submitted;
          spdlog::info("slurm: job {} submitted as Slurm job {}", joule_id, *submitted);
        } else if (submitted.error().code == ErrorCode::unavailable) {
          // Retried next cycle; a submission that did get through is found by its comment then.
          spdlog::warn("slurm: job {}: {} (will retry)", joule_id, submitted.error().message);
          handed_.erase(joule_id);
        } else {
          handed.failure = "Slurm refused it: " + submitted.error().message;
        }
        continue;
      }
      Handed& handed = it->second;
      if (!handed.last || handed.record.slurm_id.empty()) continue;
      const auto phase = adapters::slurm_phase(handed.last->state);
      if (assignment.paused && phase == adapters::SlurmPhase::running && !handed.suspended_by_us) {
        if (auto done = cli_.suspend(handed.record.slurm_id); done)
          handed.suspended_by_us = true;
        else
          spdlog::warn("slurm: suspending {}: {}", joule_id, done.error().message);
      } else if (!assignment.paused && handed.suspended_by_us && phase == adapters::SlurmPhase::suspended) {
        if (auto done = cli_.resume(handed.record.slurm_id); done)
          handed.suspended_by_us = false;
        else
          spdlog::warn("slurm: resuming {}: {}", joule_id, done.error().message);
      }
    }
  }
  for (auto& [joule_id, handed] : handed_) {
    // Placed elsewhere, ended or cancelled on the coordinator meanwhile: Slurm's copy is stopped.
    const bool live = handed.last && !adapters::is_final_slurm_state(handed.last->state);
    if (!wanted.contains(joule_id) && live && !handed.cancel_sent && !handed.record.slurm_id.empty()) {
      spdlog::info("slurm: cancelling Slurm job {} ({}): no longer placed there", handed.record.slurm_id, joule_id);
      if (cli_.cancel(handed.record.slurm_id)) handed.cancel_sent = true;
    }
  }

  // 4b. Where the cluster meters energy: the running jobs' energy so far (one sstat for them all),
  //     which budgets and progress projections read instead of the estimate pro rata.
  if (energy_plugin_ && !energy_plugin_->empty()) {
    std::vector<std::string> running;
    for (const auto& [joule_id, handed] : handed_)
      if (handed.last && !handed.record.slurm_id.empty() &&
          adapters::slurm_phase(handed.last->state) == adapters::SlurmPhase::running)
        running.push_back(handed.record.slurm_id);
    if (!running.empty()) {
      if (auto energy = cli_.running_energy(running)) {
        for (auto& [joule_id, handed] : handed_)
          if (const auto found = energy->find(handed.record.slurm_id); found != energy->end())
            handed.running_joules = found->second;
      } else {
        spdlog::debug("slurm: running jobs' energy (sstat): {}", energy.error().message);
      }
    }
  }

  // 5. Tell the JobService, per node type; what it has recorded is forgotten here.
  std::map<std::string, std::vector<cluster::ReportedJob>> reports;
  for (auto& [joule_id, handed] : handed_)
    if ((handed.last || handed.failure || handed.lost) && !awaits_energy(handed))
      reports[handed.node].push_back(report_of(handed));
  std::vector<std::pair<std::string, std::int64_t>> recorded;
  on_loop([&] {
    for (const auto& [node, node_reports] : reports) {
      auto done = nodes_.apply_reports(node, node_reports);
      recorded.insert(recorded.end(), done.begin(), done.end());
    }
  });
  for (const auto& [job, epoch] : recorded) {
    auto it = handed_.find(fmt::format("{}.{}", job, epoch));
    // Kept until Slurm has let go of it as well (a cancelled job may still be completing).
    if (it != handed_.end() && (!it->second.last || adapters::is_final_slurm_state(it->second.last->state)))
      handed_.erase(it);
  }
  std::lock_guard lock(mutex_);
  live_ = handed_.size();
}

bool SlurmExecutor::awaits_energy(Handed& handed) {
  // Three asks, a poll apart: slurmdbd stores the figure shortly after the end; without it the
  // job is charged its estimate, labelled modelled.
  constexpr int kAsks = 3;
  if (handed.energy_settled || !energy_plugin_ || energy_plugin_->empty() || handed.failure || handed.lost ||
      !handed.last || !adapters::is_final_slurm_state(handed.last->state) || !handed.last->start_ms ||
      handed.record.slurm_id.empty())
    return false;
  auto energy = cli_.consumed_energy(handed.record.slurm_id);
  if (energy && *energy) {
    handed.energy_joules = **energy;
    handed.energy_settled = true;
    return false;
  }
  if (++handed.energy_asks < kAsks) return true;
  spdlog::warn(
      "slurm: no energy for Slurm job {} from sacct after {} asks ({}): its estimate stands, labelled modelled",
      handed.record.slurm_id, kAsks, energy ? "no ConsumedEnergyRaw" : energy.error().message);
  handed.energy_settled = true;
  return false;
}

json SlurmExecutor::describe() const {
  json types = json::array();
  for (const auto& type : config_.node_types)
    types.push_back({{"node", node_name(type)},
                     {"partition", type.partition},
                     {"constraint", type.constraint},
                     {"nodelist", type.nodelist},
                     {"slots", type.slots},
                     {"model", type.model}});
  std::lock_guard lock(mutex_);
  return {{"node_types", types},
          {"jobs_handed_over", live_},
          {"last_listing_ms", last_listing_ms_},
          {"error", last_error_.empty() ? json(nullptr) : json(last_error_)}};
}

}  // namespace joule::daemon
