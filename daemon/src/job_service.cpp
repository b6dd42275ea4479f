#include "joule/daemon/job_service.hpp"

#include "job_record.hpp"

#include <signal.h>
#include <sys/stat.h>

#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>
#include <boost/uuid/random_generator.hpp>
#include <boost/uuid/uuid_io.hpp>
#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "joule/adapters/job_controls.hpp"
#include "joule/common/energy_source.hpp"
#include "joule/common/sha256.hpp"
#include "joule/common/text.hpp"
#include "joule/daemon/thread_settings.hpp"
#include "joule/schedulers/step_projection.hpp"

namespace joule::daemon {

namespace asio = boost::asio;
using adapters::StoredEvent;
using adapters::StoredJob;
using nlohmann::json;
using schedulers::JobState;


namespace {

Error invalid(std::string message, std::string where) {
  return make_error(ErrorCode::invalid_argument, std::move(message), std::move(where));
}

bool is_executable_file(const std::filesystem::path& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::string daemon_path() {
  const char* path = std::getenv("PATH");
  return path && *path ? path : "/usr/local/bin:/usr/bin:/bin";
}

// A STEP projection as the API shows it; `source` is the meter source of the joules it projects.
json projection_json(const schedulers::Projection& projection, const std::string& source) {
  return {{"joules", {{"mean", projection.total.mean_joules}, {"std", std::sqrt(projection.total.variance)}}},
          {"method", projection.method},
          {"stable_epochs", projection.stable_epochs},
          {"seconds_remaining", projection.seconds_remaining},
          {"source", source.empty() ? json(nullptr) : json(source)}};
}

json optional_json(const std::optional<std::int64_t>& millis) {
  return millis ? json(schedulers::format_rfc3339(*millis)) : json(nullptr);
}

}  // namespace

JobService::JobService(asio::io_context& io, adapters::StorageWriter& storage, Metrics& metrics,
                       std::vector<Device> devices, JobServiceOptions options)
    : io_(io),
      storage_(storage),
      metrics_(metrics),
      devices_(std::move(devices)),
      options_(std::move(options)),
      budgets_(storage, metrics, options_.node_name, options_.utc_offset_minutes),
      retry_timer_(std::make_unique<asio::steady_timer>(io)) {
  for (auto& device : devices_) {
    metrics_.add_device_energy(device.name, std::string(device.meter->source()), 0.0);
    metrics_.set_device_power(device.name, std::string(device.meter->source()), 0.0);
    if (const auto* gpu = device.meter->gpu_power_control()) {
      if (auto range = gpu->power_limit_range_watts()) {
        device.can_limit_gpu = range->second > 0;
        device.gpu_min_watts = range->first;
      }
    }
  }
}

JobService::~JobService() { *alive_ = false; }

std::int64_t JobService::now_ms() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::filesystem::path JobService::job_directory(const std::string& id) const {
  return options_.state_directory / "jobs" / id;
}

std::filesystem::path JobService::work_directory(const std::string& id) const {
  return options_.work_directory.empty() ? job_directory(id) : options_.work_directory / id;
}

Status JobService::prepare_work_directory(const std::string& id,
                                          const std::optional<adapters::JobIdentity>& identity) const {
  const auto dir = work_directory(id);
  for (const auto& path : {dir, dir / "tmp"}) {
    // mkdir, not create_directories: an existing entry (a job id's leftover, or a link
    // planted by someone) is checked below rather than followed.
    if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
      return make_error(ErrorCode::io, fmt::format("cannot create {}: {}", path.string(), std::strerror(errno)));
    struct stat info {};
    if (::lstat(path.c_str(), &info) != 0 || !S_ISDIR(info.st_mode))
      return make_error(ErrorCode::io, fmt::format("{} is not a directory", path.string()));
    if (identity && ::lchown(path.c_str(), identity->uid, identity->gid) != 0) {
      return make_error(ErrorCode::io, fmt::format("cannot hand {} to uid {}: {}", path.string(), identity->uid,
                                                   std::strerror(errno)));
    }
  }
  return {};
}

Device* JobService::find_device(const std::string& name) {
  for (auto& device : devices_) {
    if (device.name == name) return &device;
  }
  return nullptr;
}

void JobService::persist(Write write, std::function<void(Status)> done) {
  ++writes_in_flight_;
  storage_.submit(std::move(write), [this, alive = alive_, done = std::move(done)](Status status) mutable {
    asio::post(io_, [this, alive, done = std::move(done), status = std::move(status)] {
      if (!*alive) return;
      --writes_in_flight_;
      if (!status) spdlog::error("storage: {}", status.error().message);
      if (done) done(status);
    });
  });
}

void JobService::transition(Job& job, JobState to, const std::string& message, std::function<void(Status)> done) {
  if (!schedulers::can_transition(job.state, to)) {
    spdlog::error("job {}: refusing transition {} -> {}", job.row.id, schedulers::to_string(job.state),
                  schedulers::to_string(to));
    if (done) done(make_error(ErrorCode::internal, "invalid state transition"));
    return;
  }
  count_state(job.state, -1);
  count_state(to, +1);
  job.state = to;
  job.row.state = std::string(schedulers::to_string(to));
  StoredEvent event{job.row.id, now_ms(), job.row.state, message};
  job.events.push_back(event);
  // Names and messages (a program's words, Slurm's) are escaped: a newline must not forge a line.
  spdlog::info("job {} ({}): {}{}", job.row.id, printable(job.row.name), job.row.state,
               message.empty() ? "" : ": " + printable(message));
  refresh_state_metrics();
  if (!job.row.origin.empty() && assignment_changed_) assignment_changed_();
  persist(
      [row = job.row, event](adapters::Database& db) -> Status {
        if (auto s = db.update_job(row); !s) return s;
        return db.insert_event(event);
      },
      std::move(done));
}

void JobService::count_state(JobState state, int delta) {
  auto& count = state_counts_[static_cast<std::size_t>(state)];
  count = delta < 0 && count == 0 ? 0 : count + static_cast<std::size_t>(static_cast<long>(delta));
}

void JobService::refresh_state_metrics() {
  // O(1): the counts are kept as jobs change state, never recomputed from all jobs.
  for (std::size_t i = 0; i < state_counts_.size(); ++i) {
    const auto state = static_cast<JobState>(i);
    metrics_.set_jobs_in_state(schedulers::to_string(state), static_cast<double>(state_counts_[i]));
  }
}

std::optional<adapters::JobIdentity> JobService::job_identity(std::int64_t sequence,
                                                              const std::optional<std::int64_t>& owner_uid) const {
  if (options_.accounts.mode == JobAccounts::Mode::daemon) return std::nullopt;
  // A local user's job runs as that user: it reaches what they may, and no more.
  if (owner_uid && options_.user_identity) {
    if (auto own = options_.user_identity(*owner_uid)) return own;
  }
  return options_.accounts.identity_for(sequence);
}

Result<std::string> JobService::owner_of(const std::string& id) const {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return make_error(ErrorCode::not_found, fmt::format("no job {}", id), "id");
  return it->second->row.owner;
}

Status JobService::check_runnable(const schedulers::JobSpec& spec,
                                  const std::optional<adapters::JobIdentity>& identity) const {
  const bool any_device = std::any_of(devices_.begin(), devices_.end(), [&](const Device& d) {
    return d.runs_jobs && schedulers::device_allowed(spec.constraints, d.name);
  });
  if (!any_device) {
    std::string names;
    for (const auto& d : devices_)
      if (d.runs_jobs) names += (names.empty() ? "" : ", ") + d.name;
    return invalid(fmt::format("constraints.devices matches no device that runs jobs (there are: {}; simulated "
                               "devices without runs_jobs only estimate)",
                               names.empty() ? "none" : names),
                   "/constraints/devices");
  }
  if (spec.constraints.deadline && *spec.constraints.deadline <= now_ms())
    return invalid("the deadline has already passed", "/constraints/deadline");
  // Where it can only run on agents, the agent checks its program and workdir, and a job
  // that cannot start there fails with the agent's reason.
  const bool any_local = std::any_of(devices_.begin(), devices_.end(), [&](const Device& d) {
    return d.runs_jobs && d.node.empty() && schedulers::device_allowed(spec.constraints, d.name);
  });
  if (!any_local) return {};

  std::filesystem::path workdir = spec.run.workdir;
  if (!workdir.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_directory(workdir, ec))
      return invalid(fmt::format("run.workdir {} does not exist or is not a directory", workdir.string()),
                     "/run/workdir");
    if (::access(workdir.c_str(), X_OK) != 0)
      return invalid(fmt::format("run.workdir {} is not accessible to jouled", workdir.string()), "/run/workdir");
  }
  // Jobs run under accounts of their own: a workdir or program in a private home or temp
  // directory is refused now, with the directory in the way, rather than failing at start.
  auto reachable = [&](const std::filesystem::path& path, const char* what, const char* pointer) -> Status {
    if (!identity) return {};
    if (auto why = adapters::unreachable_by(path, *identity)) {
      return invalid(fmt::format("{} {} is out of reach of the job's account (uid {}): {}; give others access "
                                 "(chmod o+x) or use another directory",
                                 what, path.string(), identity->uid, *why),
                     pointer);
    }
    return {};
  };
  if (!workdir.empty()) {
    if (auto status = reachable(workdir, "run.workdir", "/run/workdir"); !status) return status;
  }
  const std::string& program = spec.run.argv.front();
  if (program.find('/') != std::string::npos) {
    std::filesystem::path path = program;
    if (path.is_relative()) path = (workdir.empty() ? work_directory("_") : workdir) / path;
    if (workdir.empty() && std::filesystem::path(program).is_relative())
      return invalid("a relative program path needs run.workdir", "/run/command/0");
    if (!is_executable_file(path))
      return invalid(fmt::format("program {} does not exist or is not executable", path.string()), "/run/command/0");
    return reachable(path, "program", "/run/command/0");
  }
  const auto env_path = spec.run.env.find("PATH");
  const std::string search = env_path != spec.run.env.end() ? env_path->second : daemon_path();
  std::size_t start = 0;
  while (start <= search.size()) {
    const auto end = search.find(':', start);
    const std::string dir = search.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!dir.empty() && is_executable_file(std::filesystem::path(dir) / program)) return {};
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return invalid(fmt::format("program \"{}\" is not found in PATH ({})", program, search), "/run/command/0");
}

void JobService::submit(const json& body, Submitter submitter, Done done) {
  if (!options_.refuse_submissions.empty()) return done(make_error(ErrorCode::conflict, options_.refuse_submissions));
  auto spec = schedulers::parse_job_spec(body);
  if (!spec) return done(spec.error());
  if (auto runnable = check_runnable(*spec, job_identity(next_sequence_, submitter.uid)); !runnable)
    return done(runnable.error());
  if (queue_.size() + submissions_in_flight_ >= options_.max_queued_jobs) {
    return done(
        make_error(ErrorCode::too_many, fmt::format("{} jobs are already waiting (the limit is {}); retry later",
                                                    queue_.size() + submissions_in_flight_, options_.max_queued_jobs)));
  }
  auto job = std::make_unique<Job>();
  static thread_local boost::uuids::random_generator make_uuid;
  job->row.id = boost::uuids::to_string(make_uuid());
  job->row.sequence = next_sequence_++;
  job->row.name = spec->name.empty() ? fmt::format("job-{}", job->row.sequence) : spec->name;
  job->row.spec_json = schedulers::to_json(*spec).dump();
  job->row.state = "queued";
  job->row.priority = spec->priority;
  job->row.submitted_ms = now_ms();
  job->row.owner = std::move(submitter.name);
  job->row.owner_uid = submitter.uid;
  job->spec = std::move(spec).value();
  if (estimator_ && job->spec.model && job->spec.training) job->row.estimate_json = estimator_(job->spec).dump();
  job->pending = pending_job(job->row.id, job->spec, job->row.estimate_json);
  if (auto never = budgets_.never_fits(now_ms(), device_statuses(), job->pending)) {
    const char* where = never->kind == schedulers::WaitReason::Kind::deadline     ? "/constraints/deadline"
                        : never->kind == schedulers::WaitReason::Kind::max_energy ? "/constraints/max_energy_joules"
                                                                                  : "/training";
    return done(invalid(fmt::format("the job can never run on this node: {}", never->message), where));
  }
  StoredEvent event{job->row.id, job->row.submitted_ms, "queued", "submitted"};
  job->events.push_back(event);

  ++submissions_in_flight_;
  std::shared_ptr<Job> pending = std::move(job);
  Write write = [row = pending->row, event](adapters::Database& db) -> Status {
    if (auto s = db.insert_job(row); !s) return s;
    return db.insert_event(event);
  };
  persist(std::move(write), [this, job = std::move(pending), done = std::move(done)](Status status) mutable {
    --submissions_in_flight_;
    if (!status) {
      return done(
          make_error(ErrorCode::unavailable,
                     fmt::format("the job could not be stored, so it was not accepted: {}", status.error().message)));
    }
    const std::string id = job->row.id;
    auto owned = std::make_unique<Job>(std::move(*job));
    queue_.push(id, owned->row.priority, owned->row.sequence);
    by_sequence_.emplace(owned->row.sequence, owned.get());
    count_state(JobState::queued, +1);
    jobs_.emplace(id, std::move(owned));
    metrics_.count_submission();
    refresh_state_metrics();
    spdlog::info("job {} ({}): accepted", id, printable(jobs_.at(id)->row.name));
    done(to_json(*jobs_.at(id), true));
    schedule();
  });
}

void JobService::schedule() {
  if (!scheduling_) return;
  const auto now = now_ms();
  const auto statuses = device_statuses();
  std::vector<const schedulers::PendingJob*> queue;
  for (const auto& id : queue_.first(1000)) queue.push_back(&jobs_.at(id)->pending);
  const auto pass = budgets_.place(now, statuses, queue);
  for (const auto& placement : pass.placements) {
    Job& job = *jobs_.at(placement.job);
    Device& device = devices_[placement.device];
    budgets_.reserve(job.row.id, device.name, placement.reserve);
    // What it is expected to use: its estimate there, else its own max_energy_joules.
    job.prior = placement.reserve.mean_joules > 0 ? std::optional(placement.reserve) : std::nullopt;
    job.waiting.reset();
    place(job, device, placement.note);
  }
  for (const auto& [id, reason] : pass.waiting) note_waiting(*jobs_.at(id), reason);
  // The pass stopped before the rest: say whether they wait for a device or for their turn.
  for (std::size_t i = pass.considered; i < queue.size(); ++i) {
    Job& job = *jobs_.at(queue[i]->id);
    const bool all_busy = std::all_of(job.pending.candidates.begin(), job.pending.candidates.end(),
                                      [&](const auto& c) { return devices_[c.device].job.has_value(); });
    if (all_busy && !job.pending.candidates.empty())
      note_waiting(job, schedulers::WaitReason(schedulers::WaitReason::Kind::no_free_device,
                                               "every device it may run on is busy"));
    else
      job.waiting.reset();
  }
  // Why the queue waits, for joule_jobs_waiting: a queued job without a reason waits its turn.
  std::map<std::string, double> waiting;
  for (const auto* pending : queue) {
    const Job& job = *jobs_.at(pending->id);
    if (job.state != JobState::queued) continue;
    waiting[job.waiting ? std::string(schedulers::to_string(job.waiting->kind)) : "behind"] += 1.0;
  }
  if (queue_.size() > queue.size()) waiting["behind"] += static_cast<double>(queue_.size() - queue.size());
  metrics_.set_jobs_waiting(waiting);
  if (pass.next_retry) schedule_retry(*pass.next_retry);
}

void JobService::schedule_retry(schedulers::UnixMillis at) {
  // One timer: the earliest moment a waiting job may fit (a budget window moving on).
  if (retry_at_ && *retry_at_ <= at && *retry_at_ > now_ms()) return;
  retry_at_ = at;
  retry_timer_->expires_after(std::chrono::milliseconds(std::max<std::int64_t>(at - now_ms(), 0) + 10));
  retry_timer_->async_wait([this, alive = alive_](boost::system::error_code ec) {
    if (ec || !*alive) return;
    retry_at_.reset();
    schedule();
  });
}

void JobService::note_waiting(Job& job, schedulers::WaitReason reason) {
  // An event when the reason changes in kind or rule, not on every pass.
  const bool changed = !job.waiting || job.waiting->kind != reason.kind || job.waiting->rule != reason.rule ||
                       job.waiting->device != reason.device;
  using Kind = schedulers::WaitReason::Kind;
  const bool worth_an_event = reason.kind != Kind::behind && reason.kind != Kind::no_free_device &&
                              reason.kind != Kind::device_busy;
  if (changed && worth_an_event) {
    job.events.push_back(StoredEvent{job.row.id, now_ms(), job.row.state, "waiting: " + reason.message});
    persist([event = job.events.back()](adapters::Database& db) { return db.insert_event(event); });
  }
  job.waiting = std::move(reason);
}

std::vector<schedulers::DeviceStatus> JobService::device_statuses() const {
  double longest_cap = 60.0;
  for (const auto& cap : budgets_.policy().power_caps) longest_cap = std::max(longest_cap, cap.average_seconds);
  std::vector<schedulers::DeviceStatus> out;
  out.reserve(devices_.size());
  for (const auto& device : devices_) {
    schedulers::DeviceStatus status;
    status.ref = budgets_.device_ref(device.name);
    status.accepts_work = device.runs_jobs && scheduling_ && device.node_ready;
    status.busy = device.job.has_value() || device.reported_busy;
    status.average_power_watts = average_power(device, longest_cap);
    status.work_seconds = device.work_seconds;
    status.battery_percent = device.battery_percent;
    if (device.job) {
      const auto it = jobs_.find(*device.job);
      if (it != jobs_.end() && it->second->row.started_ms) {
        const Job& job = *it->second;
        for (const auto& candidate : job.pending.candidates)
          if (candidate.estimate && devices_[candidate.device].name == device.name)
            status.busy_until = *job.row.started_ms + static_cast<std::int64_t>(candidate.estimate->seconds_mean * 1000);
        if (job.projection && job.projection->seconds_remaining > 0)
          status.busy_until = now_ms() + static_cast<std::int64_t>(job.projection->seconds_remaining * 1000);
      }
    }
    out.push_back(std::move(status));
  }
  return out;
}

double JobService::average_power(const Device& device, double seconds) const {
  if (device.history.size() < 2) return device.power_watts;
  const auto newest = device.history.back();
  const auto since = newest.first - std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                        std::chrono::duration<double>(seconds));
  auto oldest = device.history.front();
  for (const auto& entry : device.history)
    if (entry.first >= since) {
      oldest = entry;
      break;
    }
  const double span = std::chrono::duration<double>(newest.first - oldest.first).count();
  return span > 0 ? (newest.second - oldest.second) / span : device.power_watts;
}

schedulers::PendingJob JobService::pending_job(const std::string& id, const schedulers::JobSpec& spec,
                                               const std::string& estimate_json) const {
  schedulers::PendingJob pending;
  pending.id = id;
  pending.priority = spec.priority;
  pending.deadline = spec.constraints.deadline;
  pending.max_energy_joules = spec.constraints.max_energy_joules;
  const json estimates = estimate_json.empty() ? json(nullptr) : json::parse(estimate_json, nullptr, false);
  // Indexed once: with a thousand agents' devices a search per device made this quadratic.
  std::unordered_map<std::string, const json*> usable;
  if (estimates.is_array())
    for (const auto& row : estimates)
      if (row.value("status", "") == "ok") usable[row.value("device", "")] = &row;
  for (std::size_t d = 0; d < devices_.size(); ++d) {
    const Device& device = devices_[d];
    if (!device.runs_jobs || !schedulers::device_allowed(spec.constraints, device.name)) continue;
    schedulers::Candidate candidate{d, std::nullopt, std::nullopt};
    if (const auto it = usable.find(device.name); it != usable.end()) {
      const json& row = *it->second;
      candidate.estimate = schedulers::Estimate{row["joules"].value("mean", 0.0), row["joules"].value("std", 0.0),
                                                row["seconds"].value("mean", 0.0)};
      if (row.contains("baseline")) candidate.flops_joules = row["baseline"].value("joules", 0.0);
    }
    pending.candidates.push_back(std::move(candidate));
  }
  return pending;
}

std::optional<schedulers::EnergyDistribution> JobService::estimate_on(const Job& job, const std::string& device) const {
  for (const auto& candidate : job.pending.candidates)
    if (devices_[candidate.device].name == device && candidate.estimate) return candidate.estimate->energy();
  if (job.spec.constraints.max_energy_joules) return schedulers::EnergyDistribution{*job.spec.constraints.max_energy_joules, 0.0};
  return std::nullopt;
}

void JobService::refresh_estimates(std::size_t limit) {
  if (!estimator_ || !scheduling_) return;
  std::vector<adapters::StoredJob> changed;
  for (const auto& id : queue_.first(limit)) {
    Job& job = *jobs_.at(id);
    if (!job.spec.model || !job.spec.training) continue;
    std::string estimate = estimator_(job.spec).dump();
    if (estimate == job.row.estimate_json) continue;
    job.row.estimate_json = std::move(estimate);
    job.pending = pending_job(id, job.spec, job.row.estimate_json);
    changed.push_back(job.row);
  }
  if (changed.empty()) return;
  spdlog::info("estimated {} queued job{} again with the new energy model", changed.size(), changed.size() == 1 ? "" : "s");
  persist([rows = std::move(changed)](adapters::Database& db) -> Status {
    for (const auto& row : rows)
      if (auto s = db.update_job(row); !s) return s;
    return {};
  });
  schedule();
}

void JobService::set_policy(schedulers::Policy policy) {
  budgets_.set_policy(std::move(policy));
  budgets_.publish(now_ms());
  schedule();
}

json JobService::budgets_view() const { return budgets_.describe(now_ms(), device_statuses()); }

bool JobService::device_idle(const std::string& name) const {
  for (const auto& device : devices_)
    if (device.name == name) return device.runs_jobs && !device.job;
  return false;
}

bool JobService::work_waiting_for(const std::string& device) const {
  if (!scheduling_) return false;
  // Jobs held back by a budget, cap, floor or a missing model do not claim the device: probing
  // it is what gives them a model.
  using Kind = schedulers::WaitReason::Kind;
  return queue_
      .next([&](const std::string& id) {
        const Job& job = *jobs_.at(id);
        if (!schedulers::device_allowed(job.spec.constraints, device)) return false;
        return !job.waiting || job.waiting->kind == Kind::behind || job.waiting->kind == Kind::device_busy ||
               job.waiting->kind == Kind::no_free_device;
      })
      .has_value();
}

std::vector<estimator::WorkloadItem> JobService::workload(std::size_t recent) const {
  std::vector<estimator::WorkloadItem> out;
  std::size_t finished = 0;
  for (auto it = by_sequence_.rbegin(); it != by_sequence_.rend(); ++it) {
    const Job& job = *it->second;
    if (!job.spec.model || !job.spec.training) continue;
    const bool terminal = schedulers::is_terminal(job.state);
    if (terminal && finished >= recent) continue;
    if (terminal) ++finished;
    out.push_back(estimator::WorkloadItem{*job.spec.model, job.spec.training->batch_size, job.spec.training->optimizer});
    if (out.size() >= 4 * recent + 256) break;  // bounded: the planner needs the mix, not every copy
  }
  return out;
}

void JobService::place(Job& job, Device& device, const std::string& note) {
  if (!device.node.empty()) return place_remote(job, device, note);
  if (on_claim_) on_claim_(device.name);
  queue_.erase(job.row.id);
  device.job = job.row.id;
  job.row.device = device.name;
  // The placement is committed before the process starts: a crash in between leaves a
  // "placed" job that no process ran, which recovery safely queues again.
  transition(job, JobState::placed, fmt::format("placed on {}: {}", device.name, note), [this, id = job.row.id](Status status) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return;
    Job& placed = *it->second;
    if (placed.cancel_requested) {
      finish(placed, JobState::cancelled, "cancelled before it started", std::nullopt);
      return;
    }
    if (!status) {
      finish(placed, JobState::failed, "could not record the placement: " + status.error().message, std::nullopt);
      return;
    }
    if (!scheduling_) return;  // shutting down: the next daemon finds it placed and queues it again
    launch(id);
  });
}

std::vector<std::string> JobService::job_environment(const Job& job, const std::string& device) const {
  std::map<std::string, std::string> env;
  // A small, predictable base: what programs need to run, plus the BLAS/OpenMP settings that
  // decide how (and on some CPUs whether correctly) numerical code runs.
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string text = *entry;
    const auto eq = text.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = text.substr(0, eq);
    if (name == "PATH" || name == "HOME" || name == "USER" || name == "LOGNAME" || name == "LANG" || name == "LC_ALL" ||
        name == "TZ" || name.rfind("OPENBLAS_", 0) == 0 || name.rfind("OMP_", 0) == 0 || name.rfind("MKL_", 0) == 0)
      env[name] = text.substr(eq + 1);
  }
  if (!env.contains("PATH")) env["PATH"] = daemon_path();
  // systemd removes the service's private /tmp when jouled stops, but jobs outlive it.
  env["TMPDIR"] = (work_directory(job.row.id) / "tmp").string();
  if (const auto identity = job_identity(job.row.sequence, job.row.owner_uid)) {
    // The daemon's HOME is not the job's to read or write.
    env["HOME"] = work_directory(job.row.id).string();
    env["USER"] = env["LOGNAME"] =
        identity->user_name.empty() ? options_.accounts.user_name(*identity) : identity->user_name;
  }
  // The device's count, the one its model is learnt at; the job's own run.env may ask otherwise
  // (its estimate then says so).
  const auto placed = std::find_if(devices_.begin(), devices_.end(), [&](const Device& d) { return d.name == device; });
  if (placed != devices_.end()) set_thread_variables(env, placed->threads);
  for (const auto& [name, value] : job.spec.run.env) env[name] = value;
  if (!options_.python_path.empty()) {
    // Before the job's own entries: the package that speaks this jouled's API comes first.
    const auto own = env.find("PYTHONPATH");
    env["PYTHONPATH"] =
        options_.python_path.string() + (own != env.end() && !own->second.empty() ? ":" + own->second : "");
  }
  env["JOULE_JOB_ID"] = job.row.id;
  env["JOULE_DEVICE"] = device;
  if (device.rfind("cuda:", 0) == 0) env["CUDA_VISIBLE_DEVICES"] = device.substr(5);
  if (!api_url_.empty()) env["JOULE_URL"] = api_url_;
  std::vector<std::string> out;
  for (const auto& [name, value] : env) out.push_back(name + "=" + value);
  return out;
}

void JobService::launch(const std::string& id) {
  Job& job = *jobs_.at(id);
  Device* device = find_device(job.row.device);
  // The job's logs and status stay in the state directory, which only jouled may enter; what
  // the job itself may write is its work directory, owned by its own account.
  const auto dir = job_directory(id);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return finish(job, JobState::failed, fmt::format("cannot create {}: {}", dir.string(), ec.message()), std::nullopt);
  const auto identity = job_identity(job.row.sequence, job.row.owner_uid);
  if (auto prepared = prepare_work_directory(id, identity); !prepared)
    return finish(job, JobState::failed, prepared.error().message, std::nullopt);

  adapters::LaunchSpec spec;
  spec.argv = job.spec.run.argv;
  spec.identity = identity;
  spec.workdir = job.spec.run.workdir.empty() ? work_directory(id) : std::filesystem::path(job.spec.run.workdir);
  spec.env = job_environment(job, job.row.device);
  // The job's own token for POST /v1/jobs/{id}/progress: only its hash is stored.
  std::array<unsigned char, 24> secret{};
  if (RAND_bytes(secret.data(), static_cast<int>(secret.size())) == 1) {
    std::string token;
    for (const unsigned char byte : secret) token += fmt::format("{:02x}", byte);
    job.row.token_sha256 = joule::sha256_hex(token);
    spec.env.push_back("JOULE_JOB_TOKEN=" + token);
  }
  spec.stdout_path = dir / "stdout.log";
  spec.stderr_path = dir / "stderr.log";
  spec.status_path = dir / "status";
  spec.runner = options_.runner;
  job.energy_at_start = device ? read_device_energy(*device) : std::nullopt;
  auto process = adapters::launch_job(spec);
  if (!process) return finish(job, JobState::failed, process.error().message, std::nullopt);
  if (auto* modelled = device ? device->meter->modelled_load() : nullptr) {
    // A simulated device that runs jobs draws, while this one runs, the power its model
    // expects of it (estimated joules over estimated seconds): simulated joules, labelled so.
    double watts = 0.0;
    for (const auto& candidate : job.pending.candidates)
      if (devices_[candidate.device].name == device->name && candidate.estimate && candidate.estimate->seconds_mean > 0)
        watts = candidate.estimate->joules_mean / candidate.estimate->seconds_mean;
    modelled->set_load_watts(watts);
  }
  job.row.pid = process->pid;
  job.row.pid_start_ticks = process->start_ticks;
  job.row.boot_id = options_.boot_id;
  job.row.started_ms = now_ms();
  if (options_.cgroups && options_.cgroups->usable()) {
    if (auto cgroup = options_.cgroups->create_for(id, process->pid))
      job.cgroup = *cgroup;
    else
      spdlog::warn("job {}: no cgroup of its own ({}); it can be paused (SIGSTOP) but gets no CPU quota", id,
                   cgroup.error().message);
  }
  transition(job, JobState::running, fmt::format("started as process group {}", process->pid));
  watch_exit(id);
}

void JobService::watch_exit(const std::string& id) {
  Job& job = *jobs_.at(id);
  auto pidfd = adapters::open_pidfd(static_cast<pid_t>(job.row.pid));
  if (!pidfd) {
    // Already gone (an adopted process that ended in between): handle it now.
    asio::post(io_, [this, alive = alive_, id] {
      if (*alive) on_exit(id);
    });
    return;
  }
  job.exit_watch = std::make_unique<asio::posix::stream_descriptor>(io_, *pidfd);
  job.exit_watch->async_wait(asio::posix::stream_descriptor::wait_read,
                             [this, alive = alive_, id](boost::system::error_code ec) {
                               if (!*alive || ec == asio::error::operation_aborted) return;
                               on_exit(id);
                             });
}

void JobService::on_exit(const std::string& id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end() || schedulers::is_terminal(it->second->state)) return;
  Job& job = *it->second;
  job.exit_watch.reset();
  if (job.kill_timer) job.kill_timer->cancel();
  const auto runner_status = adapters::reap_child(static_cast<pid_t>(job.row.pid));
  auto exit = adapters::read_status_file(job_directory(id) / "status");
  if (!exit) exit = runner_status;  // the runner itself was killed (KILL after the grace period)
  if (job.cancel_requested) {
    finish(job, JobState::cancelled, exit ? "cancelled; the job ended with " + exit->describe() : "cancelled", exit);
  } else if (!exit) {
    finish(job, JobState::failed, "the job's process ended but left no exit status", std::nullopt);
  } else if (exit->success()) {
    finish(job, JobState::succeeded, "exit code 0", exit);
  } else {
    finish(job, JobState::failed, exit->describe(), exit);
  }
}

void JobService::finish(Job& job, JobState state, const std::string& reason, std::optional<adapters::ExitStatus> exit) {
  if (exit) job.row.exit_code = exit->signaled ? 128 + exit->value : exit->value;
  job.row.reason = reason;
  job.row.finished_ms = now_ms();
  queue_.erase(job.row.id);
  if (Device* device = find_device(job.row.device); device && device->node.empty()) {
    if (auto* modelled = device->meter->modelled_load()) modelled->set_load_watts(0.0);
  }
  if (Device* device = find_device(job.row.device); device && !device->node.empty()) {
    // Metered on the agent: finish_remote has set the energy and its source from the report.
    if (job.row.energy_joules) metrics_.add_job_energy(device->name, job.row.energy_source, *job.row.energy_joules);
  } else if (device && job.row.started_ms) {
    if (job.energy_at_start) {
      if (auto end = energy_used(job, *device, exit ? &*exit : nullptr)) {
        job.row.energy_joules = *end;
        job.row.energy_source = std::string(device->meter->source());
        metrics_.add_job_energy(device->name, job.row.energy_source, *job.row.energy_joules);
        if (on_finished_ && state == JobState::succeeded && !job.row.estimate_json.empty()) {
          const auto estimates = nlohmann::json::parse(job.row.estimate_json, nullptr, false);
          if (estimates.is_array()) {
            for (const auto& row : estimates)
              if (row.value("device", "") == device->name)
                on_finished_(Feedback{device->name, row, *job.row.energy_joules, job.row.energy_source,
                                      job.row.energy_partial, job.row.id, job.row.finished_ms.value_or(0)});
          }
        }
      }
    }
  }
  // The budget ledger trades the job's reservation for what it was metered to use.
  std::optional<adapters::StoredEnergyUse> metered;
  if (job.row.energy_joules && job.row.started_ms)
    metered = adapters::StoredEnergyUse{budgets_.device_ref(job.row.device).node, budgets_.device_ref(job.row.device).name,
                                        job.row.id, *job.row.started_ms,
                                        job.row.finished_ms.value_or(now_ms()), *job.row.energy_joules,
                                        job.row.energy_source};
  budgets_.settle(job.row.id, metered);
  if (Device* device = find_device(job.row.device); device && job.row.started_ms)
    device->work_seconds += static_cast<double>(*job.row.finished_ms - *job.row.started_ms) / 1000.0;
  release_controls(job);
  // Also for a job adopted after a restart, whose cgroup this daemon did not make.
  if (options_.cgroups && options_.cgroups->usable() && !is_remote(job)) {
    if (auto removed = options_.cgroups->remove(job.row.id); !removed)
      spdlog::warn("job {}: its cgroup stays: {}", job.row.id, removed.error().message);
    job.cgroup.reset();
  }
  release_device(job);
  if (job.kill_timer) job.kill_timer->cancel();
  job.exit_watch.reset();
  transition(job, state, reason);
  schedule();
}

void JobService::release_device(Job& job) {
  for (auto& device : devices_) {
    if (device.job == job.row.id) device.job.reset();
  }
}

void JobService::cancel(const std::string& id, Done done) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return done(make_error(ErrorCode::not_found, fmt::format("no job {}", id), "id"));
  Job& job = *it->second;
  if (schedulers::is_terminal(job.state)) {
    return done(make_error(ErrorCode::conflict, fmt::format("job {} has already {}", id, job.row.state)));
  }
  if (job.state == JobState::queued) {
    queue_.erase(id);
    job.row.finished_ms = now_ms();
    job.row.reason = "cancelled while queued";
    transition(job, JobState::cancelled, job.row.reason, [this, id, done = std::move(done)](Status status) {
      if (!status) return done(status.error());
      done(to_json(*jobs_.at(id), true));
    });
    return;
  }
  if (!job.cancel_requested && is_remote(job)) {
    job.cancel_requested = true;
    if (!job.agent_seen) {
      // The agent has not taken it up: it ends here, and leaves the node's desired state.
      finish(job, JobState::cancelled, "cancelled before it started", std::nullopt);
    } else {
      job.events.push_back(StoredEvent{id, now_ms(), job.row.state, "cancel requested; the agent stops it"});
      persist([event = job.events.back()](adapters::Database& db) { return db.insert_event(event); });
      changed(job.row.device);
    }
  } else if (!job.cancel_requested) {
    job.cancel_requested = true;
    job.events.push_back(StoredEvent{id, now_ms(), job.row.state, "cancel requested"});
    persist([event = job.events.back()](adapters::Database& db) { return db.insert_event(event); });
    if (job.state == JobState::running || job.state == JobState::throttled) {
      const auto pgid = static_cast<pid_t>(job.row.pid);
      (void)adapters::signal_process_group(pgid, SIGTERM);
      (void)adapters::signal_process_group(pgid, SIGCONT);  // a stopped job must run to see TERM
      job.kill_timer = std::make_unique<asio::steady_timer>(io_);
      job.kill_timer->expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(options_.kill_grace_seconds)));
      job.kill_timer->async_wait([this, alive = alive_, id](boost::system::error_code ec) {
        if (*alive && !ec) send_kill(id);
      });
    }
  }
  done(to_json(job, true));
}

void JobService::send_kill(const std::string& id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end() || schedulers::is_terminal(it->second->state)) return;
  spdlog::warn("job {}: still running {} s after TERM; sending KILL", id, options_.kill_grace_seconds);
  (void)adapters::signal_process_group(static_cast<pid_t>(it->second->row.pid), SIGKILL);
}

std::optional<double> JobService::energy_used(Job& job, Device& device, const adapters::ExitStatus* exit) {
  if (const auto* model = device.meter->cpu_time_model(); model && job.row.started_ms && job.row.pid > 0) {
    // The runner's wait4 at the end counts every descendant it waited for; while running, the
    // group's live processes are read. CPU time never goes back: the largest reading stands.
    const auto cpu = exit && exit->cpu_seconds
                         ? exit->cpu_seconds
                         : adapters::process_group_cpu_seconds(static_cast<pid_t>(job.row.pid), options_.proc_root);
    if (cpu) job.cpu_seconds = std::max(job.cpu_seconds.value_or(0.0), *cpu);
    const auto until = job.row.finished_ms.value_or(now_ms());
    const double wall = static_cast<double>(std::max<std::int64_t>(0, until - *job.row.started_ms)) / 1000.0;
    return model->joules(wall, job.cpu_seconds.value_or(0.0));
  }
  if (!job.energy_at_start) return std::nullopt;
  auto now = read_device_energy(device);
  if (!now) return std::nullopt;
  return std::max(0.0, *now - *job.energy_at_start);
}

std::optional<double> JobService::read_device_energy(Device& device) {
  auto reading = device.meter->read();
  if (!reading) {
    device.meter_error = reading.error().message;
    return std::nullopt;
  }
  device.meter_error.reset();
  return reading->value;
}

void JobService::sample_meters() {
  const auto now = std::chrono::steady_clock::now();
  for (auto& device : devices_) {
    const double before = device.energy_joules;
    auto reading = device.meter->read();
    const std::string source(device.meter->source());
    if (!reading) {
      if (device.meter_error != reading.error().message)
        spdlog::warn("device {}: meter {} failed: {}", device.name, source, reading.error().message);
      device.meter_error = reading.error().message;
      continue;
    }
    device.meter_error.reset();
    device.energy_joules = reading->value;
    const double delta = device.energy_joules - before;
    metrics_.add_device_energy(device.name, source, delta);
    if (device.last_sample && device.node.empty()) {
      const double seconds = std::chrono::duration<double>(now - *device.last_sample).count();
      device.power_watts = seconds > 0 ? delta / seconds : 0.0;
      metrics_.set_device_power(device.name, source, device.power_watts);
    }
    if (!device.node.empty()) device.power_watts = device.reported_power_watts;
    device.last_sample = now;
    device.history.emplace_back(now, device.energy_joules);
    if (const auto* battery = device.meter->battery_gauge()) {
      auto percent = battery->capacity_percent();
      device.battery_percent = percent ? std::optional(*percent) : std::nullopt;
    }
    // Enough history for the longest averaging period a cap may use (an hour).
    while (device.history.size() > 2 && now - device.history.front().first > std::chrono::hours(1))
      device.history.pop_front();
  }
  if (!scheduling_) return;
  const auto now_millis = now_ms();
  if (options_.current_utc_offset_minutes) budgets_.set_utc_offset_minutes(options_.current_utc_offset_minutes());
  track_running(now_millis);
  budgets_.publish(now_millis);
  schedule();
}

void JobService::track_running(schedulers::UnixMillis now) {
  // Each running job's energy so far and what it should still need feed the ledger; then the
  // throttle controller looks at caps, budgets and floors.
  std::vector<schedulers::RunningJob> running;
  for (std::size_t d = 0; d < devices_.size(); ++d) {
    Device& device = devices_[d];
    if (!device.job) continue;
    auto it = jobs_.find(*device.job);
    if (it == jobs_.end()) continue;
    Job& job = *it->second;
    if (job.state != JobState::running && job.state != JobState::throttled) continue;
    std::optional<double> metered;
    if (device.node.empty() && device.meter->cpu_time_model())
      metered = energy_used(job, device);
    else if (job.energy_at_start && !device.meter_error)
      metered = std::max(0.0, device.energy_joules - *job.energy_at_start);
    if (!device.node.empty()) metered = job.reported_used;
    job.used_joules = metered;  // shown as energy_so_far
    const double used = metered.value_or(0.0);
    const auto expected = job.projection ? std::optional(job.projection->total) : job.prior;
    schedulers::EnergyDistribution still;
    if (expected) still = {std::max(0.0, expected->mean_joules - used), expected->variance};
    if (job.row.started_ms) budgets_.update_running(job.row.id, *job.row.started_ms, now, used, still);
    schedulers::RunningJob view;
    view.id = job.row.id;
    view.device = d;
    view.priority = job.row.priority;
    view.still_expected = still;
    view.power_watts = device.power_watts;
    view.paused = job.paused;
    view.cpu_quota = job.cpu_quota;
    view.gpu_limit_watts = job.gpu_limit_watts;
    view.can_limit_cpu = job.cgroup && !job.cgroup->cpu_dir.empty();
    view.can_limit_gpu = device.can_limit_gpu;
    view.gpu_min_watts = device.gpu_min_watts;
    view.cpus = static_cast<double>(std::max(1u, std::thread::hardware_concurrency()));
    running.push_back(std::move(view));
  }
  if (running.empty()) return;
  for (const auto& action : budgets_.throttle(now, device_statuses(), running)) apply(action);
}

Status JobService::apply_here(Job& job, const schedulers::ThrottleAction& action) {
  const auto pgid = static_cast<pid_t>(job.row.pid);
  using Kind = schedulers::ThrottleAction::Kind;
  Status done;
  switch (action.kind) {
    case Kind::pause:
      // SIGSTOP, not the cgroup freezer: a jouled killed with -9 while a job is paused leaves
      // only a SIGCONT for the next one to send on adoption, which needs no cgroup path.
      if (!job.pauser) job.pauser = std::make_unique<adapters::JobPauser>(pgid, std::nullopt);
      done = job.pauser->pause();
      if (done) {
        job.paused = true;
        const Device* device = find_device(job.row.device);
        budgets_.pause_running(job.row.id, now_ms(), device ? std::string(device->meter->source()) : std::string());
      }
      break;
    case Kind::resume:
      done = job.pauser ? job.pauser->resume() : adapters::signal_process_group(pgid, SIGCONT);
      if (done) {
        job.paused = false;
        budgets_.resume_running(job.row.id, now_ms());
      }
      break;
    case Kind::cpu_quota:
      if (!job.cgroup) {
        done = make_error(ErrorCode::unavailable, "the job has no cgroup of its own");
        break;
      }
      if (!job.quota) job.quota = std::make_unique<adapters::CpuQuota>(*job.cgroup);
      done = job.quota->set_fraction(action.value);
      if (done) job.cpu_quota = action.value;
      break;
    case Kind::clear_cpu_quota:
      done = job.quota ? job.quota->clear() : Status{};
      if (done) job.cpu_quota.reset();
      break;
    case Kind::gpu_power_limit: {
      Device* device = find_device(job.row.device);
      const auto* gpu = device ? device->meter->gpu_power_control() : nullptr;
      if (!gpu) {
        done = make_error(ErrorCode::unavailable, fmt::format("{} has no NVML to set a power limit with", job.row.device));
        break;
      }
      if (!job.gpu_limit)
        job.gpu_limit = std::make_unique<adapters::GpuPowerLimit>(
            *gpu, static_cast<unsigned>(std::stoul(job.row.device.substr(5))));
      auto set = job.gpu_limit->set_watts(action.value);
      if (!set) {
        done = set.error();
        break;
      }
      job.gpu_limit_watts = set->applied_watts;
      break;
    }
    case Kind::clear_gpu_power_limit:
      done = job.gpu_limit ? job.gpu_limit->restore() : Status{};
      if (done) job.gpu_limit_watts.reset();
      break;
  }
  return done;
}

void JobService::apply(const schedulers::ThrottleAction& action) {
  auto it = jobs_.find(action.job);
  if (it == jobs_.end()) return;
  Job& job = *it->second;
  using Kind = schedulers::ThrottleAction::Kind;
  Status done;
  if (is_remote(job)) {
    // The agent pauses and resumes it as the node's desired state says on its next sync; CPU
    // quotas and GPU limits stay with the agent's own policy (track_running offers none here).
    if (action.kind != Kind::pause && action.kind != Kind::resume) return;
    job.paused = action.kind == Kind::pause;
    if (job.paused)
      budgets_.pause_running(job.row.id, now_ms(), std::string(find_device(job.row.device)->meter->source()));
    else
      budgets_.resume_running(job.row.id, now_ms());
    changed(job.row.device);
  } else {
    done = apply_here(job, action);
  }
  if (!done) {
    spdlog::warn("job {}: throttling ({}) failed: {}", job.row.id, schedulers::to_string(action.kind),
                 done.error().message);
    return;
  }
  metrics_.count_throttle_action(std::string(schedulers::to_string(action.kind)));
  const bool throttled = job.paused || job.cpu_quota || job.gpu_limit_watts;
  const std::string message = fmt::format("{}: {}", schedulers::to_string(action.kind), action.reason);
  if (throttled && job.state == JobState::running) {
    transition(job, JobState::throttled, message);
  } else if (!throttled && job.state == JobState::throttled) {
    transition(job, JobState::running, message);
  } else {
    job.events.push_back(StoredEvent{job.row.id, now_ms(), job.row.state, message});
    persist([event = job.events.back()](adapters::Database& db) { return db.insert_event(event); });
    spdlog::info("job {}: {}", job.row.id, message);
  }
}

void JobService::release_controls(Job& job) {
  // Nothing stays throttled once jouled lets go of a job (it ends, or jouled stops).
  if (!job.pauser && job.paused && job.row.pid > 0)
    (void)adapters::signal_process_group(static_cast<pid_t>(job.row.pid), SIGCONT);
  for (adapters::RestorableControl* control :
       std::initializer_list<adapters::RestorableControl*>{job.pauser.get(), job.quota.get(), job.gpu_limit.get()}) {
    if (!control) continue;
    if (auto restored = control->restore(); !restored) spdlog::warn("job {}: {}", job.row.id, restored.error().message);
  }
  job.pauser.reset();
  job.quota.reset();
  job.gpu_limit.reset();
  job.paused = false;
  job.cpu_quota.reset();
  job.gpu_limit_watts.reset();
  budgets_.forget(job.row.id);
}

void JobService::stop_scheduling() {
  scheduling_ = false;
  retry_timer_->cancel();
  for (auto& [id, job] : jobs_) {
    if (job->state == JobState::throttled) release_controls(*job);
    if (job->kill_timer) job->kill_timer->cancel();
    job->exit_watch.reset();
  }
}

Status JobService::recover(std::vector<StoredJob> rows, std::vector<StoredEvent> events) {
  std::map<std::string, std::vector<StoredEvent>> history;
  for (auto& event : events) history[event.job_id].push_back(std::move(event));
  std::vector<std::string> to_reconcile;
  // Agents' devices that stored placements name exist before the jobs' candidates are built.
  for (const auto& row : rows) {
    const auto state = schedulers::job_state_from_string(row.state);
    if (state && !schedulers::is_terminal(*state) && row.device.find('/') != std::string::npos)
      (void)remote_device(row.device);
  }
  for (auto& row : rows) {
    auto job = std::make_unique<Job>();
    auto state = schedulers::job_state_from_string(row.state);
    if (!state) return make_error(ErrorCode::internal, fmt::format("job {} has unknown state {}", row.id, row.state));
    json spec_json = json::parse(row.spec_json, nullptr, false);
    auto spec = schedulers::parse_job_spec(spec_json);
    if (!spec) {
      return make_error(ErrorCode::internal, fmt::format("stored job {} no longer parses: {} at {}", row.id,
                                                         spec.error().message, spec.error().where));
    }
    job->spec = std::move(spec).value();
    job->state = *state;
    job->events = std::move(history[row.id]);
    next_sequence_ = std::max(next_sequence_, row.sequence + 1);
    const std::string id = row.id;
    job->row = std::move(row);
    if (!schedulers::is_terminal(job->state)) job->pending = pending_job(id, job->spec, job->row.estimate_json);
    if (job->state == JobState::queued) queue_.push(id, job->row.priority, job->row.sequence);
    if (!schedulers::is_terminal(job->state) && job->state != JobState::queued) to_reconcile.push_back(id);
    by_sequence_.emplace(job->row.sequence, job.get());
    count_state(job->state, +1);
    jobs_.emplace(id, std::move(job));
  }

  for (const auto& id : to_reconcile) {
    Job& job = *jobs_.at(id);
    if (is_remote(job)) {
      recover_remote(job);
      continue;
    }
    const auto status_path = job_directory(id) / "status";
    std::optional<adapters::ProcessIdentity> process;
    const adapters::ProcessIdentity stored{static_cast<pid_t>(job.row.pid), job.row.pid_start_ticks};
    if (job.row.pid > 0 && job.row.boot_id == options_.boot_id && adapters::is_alive(stored, options_.proc_root))
      process = stored;
    else
      process = adapters::find_job_runner(status_path, options_.proc_root);

    if (process) {
      Device* device = find_device(job.row.device);
      if (!device || device->job) {
        spdlog::error("job {}: its process {} lives but device {} is unavailable; cancelling it", id, process->pid,
                      job.row.device);
        job.row.pid = process->pid;
        job.cancel_requested = true;
        (void)adapters::signal_process_group(process->pid, SIGKILL);
      }
      if (device && !device->job) device->job = id;
      job.row.pid = process->pid;
      job.row.pid_start_ticks = process->start_ticks;
      job.row.boot_id = options_.boot_id;
      if (!job.row.started_ms) job.row.started_ms = now_ms();
      job.row.energy_partial = true;
      job.energy_at_start = device ? read_device_energy(*device) : std::nullopt;
      // Its reservation again, from its estimate there (the energy it used before is unknown).
      job.prior = estimate_on(job, job.row.device);
      if (auto expected = job.prior) budgets_.reserve(id, job.row.device, *expected);
      if (job.state == JobState::throttled) {
        // The last daemon released its controls when it stopped: it runs freely now.
        (void)adapters::signal_process_group(process->pid, SIGCONT);
        transition(job, JobState::running, "throttling released: jouled restarted");
      }
      const std::string note = fmt::format(
          "adopted process group {} after a daemon restart; energy is metered from now on only", process->pid);
      if (job.state == JobState::placed)
        transition(job, JobState::running, note);
      else {
        job.events.push_back(StoredEvent{id, now_ms(), job.row.state, note});
        persist([event = job.events.back()](adapters::Database& db) { return db.insert_event(event); });
        spdlog::info("job {}: {}", id, note);
      }
      watch_exit(id);
    } else if (auto exit = adapters::read_status_file(status_path)) {
      const std::string reason =
          fmt::format("{} (finished while jouled was down; energy not metered)", exit->describe());
      if (job.state == JobState::placed) {  // it did run
        count_state(JobState::placed, -1);
        count_state(JobState::running, +1);
        job.state = JobState::running;
      }
      finish(job, exit->success() ? JobState::succeeded : JobState::failed, reason, exit);
    } else if (job.state == JobState::placed) {
      job.row.device.clear();
      job.row.pid = 0;
      transition(job, JobState::queued, "queued again: jouled stopped before starting it");
      job.pending = pending_job(id, job.spec, job.row.estimate_json);
      queue_.push(id, job.row.priority, job.row.sequence);
    } else {
      finish(job, JobState::failed, "lost: its process was gone after a daemon restart and no exit status was recorded",
             std::nullopt);
    }
  }
  refresh_state_metrics();
  schedule();
  return {};
}

bool JobService::job_token_matches(const std::string& id, const std::string& token) const {
  const auto it = jobs_.find(id);
  if (it == jobs_.end() || it->second->row.token_sha256.empty() || token.empty()) return false;
  const std::string presented = joule::sha256_hex(token);
  const std::string& stored = it->second->row.token_sha256;
  return stored.size() == presented.size() && CRYPTO_memcmp(stored.data(), presented.data(), stored.size()) == 0;
}

Result<json> JobService::report_progress(const std::string& id, const std::string& token, const json& body) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return make_error(ErrorCode::not_found, fmt::format("no job {}", id), "id");
  if (!job_token_matches(id, token))
    return make_error(ErrorCode::unauthorized, "progress needs the job's own token (JOULE_JOB_TOKEN) as the bearer token");
  Job& job = *it->second;
  if (job.state != JobState::running && job.state != JobState::throttled)
    return make_error(ErrorCode::conflict, fmt::format("job {} is {}, not running", id, job.row.state));
  if (!body.is_object()) return invalid("the body must be a JSON object {\"epoch\": k, \"epochs\": N}", "");
  const auto epoch_it = body.find("epoch");
  const auto epochs_it = body.find("epochs");
  if (epoch_it == body.end() || !epoch_it->is_number_integer() || epoch_it->get<std::int64_t>() < 1)
    return invalid("epoch must be an integer >= 1 (epochs finished so far)", "/epoch");
  if (epochs_it == body.end() || !epochs_it->is_number_integer() || epochs_it->get<std::int64_t>() < 1 ||
      epochs_it->get<std::int64_t>() > 1'000'000)
    return invalid("epochs must be an integer between 1 and 1000000 (the epochs the job will run)", "/epochs");
  const auto epoch = epoch_it->get<std::int64_t>();
  const auto epochs = epochs_it->get<std::int64_t>();
  if (epoch > epochs) return invalid(fmt::format("epoch {} is more than epochs {}", epoch, epochs), "/epoch");
  if (!job.progress.empty() && epoch <= job.progress.back().epoch)
    return invalid(fmt::format("epoch {} was already reported (last: {})", epoch, job.progress.back().epoch), "/epoch");

  Device* device = find_device(job.row.device);
  std::optional<double> used;
  if (device && job.energy_at_start) used = energy_used(job, *device);
  json out = {{"id", id}, {"epoch", epoch}, {"epochs", epochs}};
  if (!used) {
    out["energy"] = nullptr;
    out["note"] = "the device's meter could not be read: no projection from this report";
    return out;
  }
  const bool first_projection = !(job.projection && job.projection->step);
  job.progress.push_back({static_cast<int>(epoch), static_cast<int>(epochs), *used, now_ms()});
  schedulers::StepOptions step;
  step.warmup_epochs = budgets_.policy().warmup_epochs;
  job.projection = schedulers::project_energy(job.progress, job.prior, step);
  const std::string source(device->meter->source());
  out["energy"] = {{"joules", *used}, {"source", source}, {"partial", job.row.energy_partial}};
  out["projection"] = projection_json(*job.projection, source);
  if (first_projection && job.projection->step) {
    job.events.push_back(StoredEvent{id, now_ms(), job.row.state,
                                     fmt::format("STEP projection after epoch {} of {}: {:.0f} J ({} joules, {})",
                                                 epoch, epochs, job.projection->total.mean_joules, source,
                                                 job.projection->method)});
    persist([event = job.events.back()](adapters::Database& db) { return db.insert_event(event); });
  }
  return out;
}

Result<json> JobService::job(const std::string& id) const {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return make_error(ErrorCode::not_found, fmt::format("no job {}", id), "id");
  return to_json(*it->second, true);
}

Result<json> JobService::jobs(const std::optional<std::string>& state, std::size_t limit,
                              const std::optional<std::string>& after, bool newest_first) const {
  if (state && !schedulers::job_state_from_string(*state)) {
    return invalid(
        fmt::format("unknown state \"{}\"; use queued, placed, running, throttled, succeeded, failed or cancelled",
                    *state),
        "state");
  }
  std::optional<std::int64_t> after_sequence;
  if (after) {
    auto it = jobs_.find(*after);
    if (it == jobs_.end())
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("no job {} to list after; start again without \"after\"", *after), "after");
    after_sequence = it->second->row.sequence;
  }
  // by_sequence_ keeps submission order, so listing never sorts (newest first walks it
  // backwards). Counting the total walks every job but builds nothing; only the page is turned
  // into JSON.
  json out = json::array();
  std::size_t total = 0;
  const Job* last = nullptr;
  bool more = false;
  const auto visit = [&](std::int64_t sequence, const Job* job) {
    if (state && job->row.state != *state) return;
    ++total;
    if (after_sequence && (newest_first ? sequence >= *after_sequence : sequence <= *after_sequence)) return;
    if (out.size() < limit) {
      out.push_back(to_json(*job, false));
      last = job;
    } else {
      more = true;
    }
  };
  if (newest_first) {
    for (auto it = by_sequence_.rbegin(); it != by_sequence_.rend(); ++it) visit(it->first, it->second);
  } else {
    for (const auto& [sequence, job] : by_sequence_) visit(sequence, job);
  }
  return json{{"jobs", out}, {"total", total}, {"next", more && last ? json(last->row.id) : json(nullptr)}};
}

std::vector<JobService::Feedback> JobService::finished_feedback() const {
  std::vector<const Job*> done;
  for (const auto& [sequence, job] : by_sequence_)
    if (job->state == JobState::succeeded && job->row.energy_joules && !job->row.estimate_json.empty() &&
        job->row.finished_ms)
      done.push_back(job);
  std::stable_sort(done.begin(), done.end(),
                   [](const Job* a, const Job* b) { return *a->row.finished_ms < *b->row.finished_ms; });
  std::vector<Feedback> out;
  for (const Job* job : done) {
    const auto estimates = json::parse(job->row.estimate_json, nullptr, false);
    if (!estimates.is_array()) continue;
    for (const auto& row : estimates)
      if (row.value("device", "") == job->row.device)
        out.push_back(Feedback{job->row.device, row, *job->row.energy_joules, job->row.energy_source,
                               job->row.energy_partial, job->row.id, *job->row.finished_ms});
  }
  return out;
}

Result<std::filesystem::path> JobService::log_path(const std::string& id, const std::string& stream) const {
  if (!jobs_.contains(id)) return make_error(ErrorCode::not_found, fmt::format("no job {}", id), "id");
  if (stream != "stdout" && stream != "stderr") return invalid("stream must be stdout or stderr", "stream");
  return job_directory(id) / (stream + ".log");
}

json JobService::devices() const {
  json out = json::array();
  for (const auto& device : devices_) {
    const std::string source(device.meter->source());
    const bool measured = is_measurement(source);
    out.push_back({{"name", device.name},
                   {"meter", {{"source", source}, {"measured", measured}, {"note", device.meter_note}}},
                   {"energy_joules", device.energy_joules},
                   {"power_watts", device.power_watts},
                   {"meter_error", device.meter_error ? json(*device.meter_error) : json(nullptr)},
                   {"job", device.job ? json(*device.job) : json(nullptr)},
                   {"runs_jobs", device.runs_jobs},
                   {"threads", device.threads > 0 ? nlohmann::json(device.threads) : nlohmann::json(nullptr)},
                   {"model", model_info_ ? model_info_(device.name) : json{{"state", "none"}, {"samples", 0}}}});
  }
  return json{{"devices", out}};
}

int JobService::device_threads(const std::string& device) const {
  for (const auto& candidate : devices_)
    if (candidate.name == device) return candidate.threads;
  return 0;
}

std::vector<std::string> JobService::device_names() const {
  std::vector<std::string> names;
  for (const auto& device : devices_) names.push_back(device.name);
  return names;
}

std::string JobService::summary() const {
  std::size_t running = 0;
  for (const auto& device : devices_) running += device.job ? 1 : 0;
  std::string text = fmt::format("{} queued, {} running", queue_.size(), running);
  for (const auto& device : devices_)
    text += fmt::format("; {} {:.1f} W ({})", device.name, device.power_watts, device.meter->source());
  return text;
}

std::string JobService::energy_scope(const std::string& device_name, const std::string& source) const {
  for (const auto& device : devices_) {
    if (device.name != device_name || !device.node.empty()) continue;
    if (const auto* model = device.meter->cpu_time_model(); model && source == device.meter->source())
      return model->describe();
  }
  return "device energy over the job's run";
}

json JobService::to_json(const Job& job, bool with_events) const {
  const auto& row = job.row;
  json energy = nullptr;
  if (row.energy_joules) {
    const bool measured = is_measurement(row.energy_source);
    energy = {{"joules", *row.energy_joules},
              {"source", row.energy_source},
              {"measured", measured},
              {"scope", energy_scope(row.device, row.energy_source)},
              {"partial", job.row.energy_partial}};
  }
  std::optional<double> seconds;
  if (row.started_ms) seconds = static_cast<double>(row.finished_ms.value_or(now_ms()) - *row.started_ms) / 1000.0;
  json out = {{"id", row.id},
              {"name", row.name},
              {"owner", row.owner},
              {"state", row.state},
              {"priority", row.priority},
              {"device", row.device.empty() ? json(nullptr) : json(row.device)},
              {"submitted_at", schedulers::format_rfc3339(row.submitted_ms)},
              {"started_at", optional_json(row.started_ms)},
              {"finished_at", optional_json(row.finished_ms)},
              {"seconds", seconds ? json(*seconds) : json(nullptr)},
              {"exit_code", row.exit_code ? json(*row.exit_code) : json(nullptr)},
              {"reason", row.reason},
              {"energy", energy},
              {"cancel_requested", job.cancel_requested},
              {"estimate", row.estimate_json.empty() ? json(nullptr) : json::parse(row.estimate_json, nullptr, false)}};
  // Feedback: the metered energy beside the estimate for the device the job ran on (only when
  // both come from the same source: modelled joules are not compared with measured ones).
  if (row.energy_joules && out["estimate"].is_array()) {
    for (const auto& estimate : out["estimate"]) {
      if (estimate.value("device", "") != row.device || estimate.value("status", "") != "ok") continue;
      const double mean = estimate["joules"].value("mean", 0.0);
      if (mean > 0.0 && estimate.value("source", "") == row.energy_source)
        out["estimate_error"] = {{"estimated_joules", mean},
                                 {"estimated_std", estimate["joules"].value("std", 0.0)},
                                 {"metered_joules", *row.energy_joules},
                                 {"relative", (*row.energy_joules - mean) / mean},
                                 {"source", row.energy_source}};
    }
  }
  if (job.state == JobState::queued) {
    // Why it waits: the last placement pass's reason, or its place in the queue.
    json waiting;
    if (job.waiting && job.waiting->kind != schedulers::WaitReason::Kind::behind) {
      const auto& why = *job.waiting;
      waiting = {{"reason", schedulers::to_string(why.kind)}, {"message", why.message}};
      if (!why.device.empty()) waiting["device"] = why.device;
      if (!why.rule.empty()) waiting["rule"] = why.rule;
      if (why.limit) waiting["limit"] = *why.limit;
      if (why.remaining_joules) waiting["remaining_joules"] = *why.remaining_joules;
      if (why.needed_joules) waiting["needed_joules"] = *why.needed_joules;
      if (why.retry_at) waiting["retry_at"] = schedulers::format_rfc3339(*why.retry_at);
    } else {
      const std::size_t ahead = queue_.position(row.id).value_or(0);
      waiting = {{"reason", "behind"},
                 {"message", ahead == 0 ? std::string("next in line; waiting for a placement pass")
                                        : fmt::format("{} job{} ahead of it in the queue", ahead, ahead == 1 ? "" : "s")}};
    }
    out["waiting"] = waiting;
  }
  if (!job.progress.empty()) {
    const auto& last = job.progress.back();
    out["progress"] = {{"epoch", last.epoch}, {"epochs", last.epochs}, {"reported_at", schedulers::format_rfc3339(last.at)}};
  }
  // While it runs the job has no energy source of its own yet: its device's meter is it.
  const auto running_source = [&] {
    std::string source = row.energy_source;
    for (const auto& device : devices_)
      if (source.empty() && device.name == row.device) source = std::string(device.meter->source());
    return source;
  };
  if (job.projection && job.projection->step) out["projection"] = projection_json(*job.projection, running_source());
  if (job.state == JobState::running || job.state == JobState::throttled) {
    if (const std::string source = running_source(); job.used_joules && !source.empty())
      out["energy_so_far"] = {{"joules", *job.used_joules}, {"source", source}, {"measured", is_measurement(source)}};
  }
  if (job.paused || job.cpu_quota || job.gpu_limit_watts) {
    out["throttle"] = {{"paused", job.paused},
                       {"cpu_quota", job.cpu_quota ? json(*job.cpu_quota) : json(nullptr)},
                       {"gpu_power_limit_watts", job.gpu_limit_watts ? json(*job.gpu_limit_watts) : json(nullptr)}};
  }
  if (with_events) {
    out["spec"] = json::parse(row.spec_json, nullptr, false);
    json events = json::array();
    for (const auto& event : job.events) {
      events.push_back(
          {{"at", schedulers::format_rfc3339(event.at_ms)}, {"state", event.state}, {"message", event.message}});
    }
    out["events"] = events;
  }
  return out;
}

}  // namespace joule::daemon
