#include "joule/daemon/job_service.hpp"

#include "executors/agent_runner.hpp"
#include "executors/local_executor.hpp"
#include "executors/node_executor.hpp"
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
#include <type_traits>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>
#include <boost/uuid/random_generator.hpp>
#include <boost/uuid/uuid_io.hpp>

#include "joule/adapters/job_controls.hpp"
#include "joule/common/energy_source.hpp"
#include "joule/common/sha256.hpp"
#include "joule/common/text.hpp"
#include "joule/daemon/thread_settings.hpp"
#include "joule/schedulers/step_projection.hpp"
#include "joule/worker/datasets.hpp"

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

// Why `device` cannot run a job at `knobs`, with the field at fault; nothing when it can.
std::optional<Error> knob_problem(const Device& device, const schedulers::Knobs& knobs) {
  if (!device.node.empty())
    return invalid(fmt::format("{} is on another node: knobs are set on the coordinator's own devices only in this "
                               "version",
                               device.name),
                   "/knobs");
  const auto cpu_missing = [&](const char* field) {
    return invalid(fmt::format("{} has no CPU frequency knob ({})", device.name,
                               device.name == "cpu" ? device.knob_note : "CPU knobs are the cpu device's"),
                   std::string("/knobs/") + field);
  };
  if (knobs.cpu_max_frequency_mhz) {
    if (!device.cpu_frequency) return cpu_missing("cpu_max_frequency_mhz");
    const auto& knob = *device.cpu_frequency;
    if (*knobs.cpu_max_frequency_mhz < knob.min_mhz || *knobs.cpu_max_frequency_mhz > knob.max_mhz)
      return invalid(fmt::format("{:g} MHz is outside {}'s range, {:g}-{:g} MHz ({})", *knobs.cpu_max_frequency_mhz,
                                 device.name, knob.min_mhz, knob.max_mhz, knob.driver),
                     "/knobs/cpu_max_frequency_mhz");
  }
  if (knobs.cpu_energy_preference) {
    if (!device.cpu_frequency) return cpu_missing("cpu_energy_preference");
    const auto& offered = device.cpu_frequency->energy_preferences;
    if (offered.empty())
      return invalid(
          fmt::format("{}'s {} driver has no energy-performance preference", device.name, device.cpu_frequency->driver),
          "/knobs/cpu_energy_preference");
    if (std::find(offered.begin(), offered.end(), *knobs.cpu_energy_preference) == offered.end())
      return invalid(fmt::format("\"{}\" is not one of {}'s energy preferences ({})", *knobs.cpu_energy_preference,
                                 device.name, fmt::join(offered, ", ")),
                     "/knobs/cpu_energy_preference");
  }
  if (knobs.power_mode) {
    if (!device.power_modes)
      return invalid(fmt::format("{} has no power modes (a Jetson's nvpmodel sets them)", device.name),
                     "/knobs/power_mode");
    if (!device.power_modes->find(*knobs.power_mode)) {
      std::vector<std::string> modes;
      for (const auto& mode : device.power_modes->table.modes)
        modes.push_back(fmt::format("{} {}", mode.id, mode.name));
      return invalid(fmt::format("\"{}\" is not one of {}'s power modes ({})", *knobs.power_mode, device.name,
                                 fmt::join(modes, ", ")),
                     "/knobs/power_mode");
    }
  }
  if (knobs.gpu_max_frequency_mhz) {
    if (!device.gpu_frequency)
      return invalid(fmt::format("{} has no GPU clock limit ({})", device.name,
                                 device.knob_note.empty() ? "a Jetson GPU's devfreq is one" : device.knob_note),
                     "/knobs/gpu_max_frequency_mhz");
    const auto& knob = *device.gpu_frequency;
    if (*knobs.gpu_max_frequency_mhz < knob.min_mhz || *knobs.gpu_max_frequency_mhz > knob.max_mhz)
      return invalid(fmt::format("{:g} MHz is outside {}'s clock range, {:g}-{:g} MHz", *knobs.gpu_max_frequency_mhz,
                                 device.name, knob.min_mhz, knob.max_mhz),
                     "/knobs/gpu_max_frequency_mhz");
  }
  if (knobs.gpu_power_limit_watts) {
    if (!device.can_limit_gpu)
      return invalid(
          fmt::format("{} has no settable GPU power limit (an NVIDIA GPU metered by NVML has one)", device.name),
          "/knobs/gpu_power_limit_watts");
    if (*knobs.gpu_power_limit_watts < device.gpu_min_watts || *knobs.gpu_power_limit_watts > device.gpu_max_watts)
      return invalid(fmt::format("{:g} W is outside {}'s power limit range, {:g}-{:g} W", *knobs.gpu_power_limit_watts,
                                 device.name, device.gpu_min_watts, device.gpu_max_watts),
                     "/knobs/gpu_power_limit_watts");
  }
  return std::nullopt;
}

// A STEP projection as the API shows it; `source` is the meter source of the joules it projects.
json projection_json(const schedulers::Projection& projection, const std::string& source) {
  return {{"joules", {{"mean", projection.total.mean_joules}, {"std", std::sqrt(projection.total.variance)}}},
          {"method", projection.method},
          {"stable_epochs", projection.stable_epochs},
          {"stable_from_epoch", projection.stable_from_epoch},
          {"seconds_remaining", projection.seconds_remaining},
          {"source", source.empty() ? json(nullptr) : json(source)}};
}

json optional_json(const std::optional<std::int64_t>& millis) {
  return millis ? json(schedulers::format_rfc3339(*millis)) : json(nullptr);
}

}  // namespace

// The executors' view of the book: every call lands on the event loop, as the executors do.
class JobService::Host final : public ExecutorHost, public AgentHost {
 public:
  explicit Host(JobService& book) : book_(book) {}
  const Clock& clock() const override { return book_.clock_; }
  void running(JobRecord& job, const std::string& note) override { book_.transition(job, JobState::running, note); }
  void ended(JobRecord& job, JobState state, const std::string& reason,
             std::optional<adapters::ExitStatus> exit) override {
    book_.finish(job, state, reason, std::move(exit));
  }
  void note(JobRecord& job, const std::string& message) override { book_.note(job, message); }
  void count_knobs(const std::string& device, const std::string& outcome) override {
    book_.metrics_.count_knobs(device, outcome);
  }
  void requeue(JobRecord& job, const std::string& why) override { book_.requeue(job, why); }
  void run_lost(JobRecord& job, const std::string& why) override { book_.run_lost(job, why); }
  void count_as_run(JobRecord& job) override { book_.set_state(job, JobState::running); }
  void reserve_again(JobRecord& job) override {
    if (const Device* device = book_.devices_.find(job.row.device))
      book_.track_run(job, *device, job.row.started_ms.value_or(book_.now_ms()));
  }
  std::optional<schedulers::Estimate> estimate_for(const JobRecord& job, const std::string& device) const override {
    return book_.estimate_for(job, device);
  }
  JobRecord* find_job(const std::string& id) override {
    const auto it = book_.jobs_.find(id);
    return it == book_.jobs_.end() ? nullptr : it->second.get();
  }
  std::string device_node(const std::string& device) const override { return book_.budgets_.device_ref(device).node; }
  void device_added(Device& device) override {
    device.ref = book_.budgets_.device_ref(device.name);
    book_.metrics_.add_device_energy(device.name, std::string(device.meter->source()), 0.0);
  }
  void devices_changed(bool added) override {
    if (added) book_.refresh_pending();
    book_.schedule();
  }
  void lost(JobRecord& job, Device& device, const std::string& why) override {
    if (job.cancel_requested)
      book_.finish(job, JobState::cancelled, why + "; it was being cancelled", std::nullopt);
    else
      book_.queue_again(job, device, why);
  }
  void adopt(JobRecord& job, Device& device, const std::string& note, const std::string& report_state,
             std::optional<std::int64_t> started_ms) override {
    book_.adopt(job, device, note, report_state, started_ms);
  }
  // AgentHost
  void for_each_assigned(const std::function<void(const JobRecord&)>& visit) const override {
    for (const auto& [id, job] : book_.jobs_)
      if (!job->row.origin.empty()) visit(*job);
  }
  void take_assignment(const cluster::Assignment& assignment, std::function<void(bool)> done) override {
    book_.take_assignment(assignment, std::move(done));
  }
  void cancel(const std::string& id) override {
    book_.cancel(id, [](Result<json>) {});
  }
  void throttle(const schedulers::ThrottleAction& action) override { book_.apply(action); }
  std::optional<double> sampled_energy(const JobRecord& job, const Device& device) const override {
    return book_.local_->sampled_energy(job, device);
  }
  void lease_runs_for(double seconds) override { book_.local_->set_lease_seconds(seconds); }

 private:
  JobService& book_;
};

JobService::JobService(asio::io_context& io, adapters::StorageWriter& storage, Metrics& metrics, DeviceTable& devices,
                       JobServiceOptions options, JobServiceLinks links, const Clock& clock)
    : io_(io),
      storage_(storage),
      metrics_(metrics),
      devices_(devices),
      options_(std::move(options)),
      clock_(clock),
      estimator_(links.estimator),
      listener_(links.listener),
      carbon_(links.carbon),
      core_(schedulers::Policy{}, options_.utc_offset_minutes),
      budgets_(storage, metrics, options_.node_name, core_),
      retry_timer_(std::make_unique<ClockTimer>(io, clock)),
      host_(std::make_unique<Host>(*this)),
      local_(std::make_unique<LocalExecutor>(io, *host_, options_)),
      nodes_(std::make_unique<NodeExecutor>(*host_, devices_)),
      agent_(std::make_unique<AgentRunner>(*host_, devices_)) {
  for (auto& device : devices_) {
    device.ref = budgets_.device_ref(device.name);
    metrics_.add_device_energy(device.name, std::string(device.meter->source()), 0.0);
    metrics_.set_device_power(device.name, std::string(device.meter->source()), 0.0);
  }
}

JobService::~JobService() {
  *alive_ = false;
  // A check still reading posts nothing once alive_ is false; those not started are dropped.
  dataset_checks_->stop();
  dataset_checks_->join();
}

void JobService::set_api_url(std::string url) { local_->set_api_url(std::move(url)); }

Executor& JobService::executor_for(const Device& device) {
  if (device.node.empty()) return *local_;
  return *nodes_;
}

Executor& JobService::executor_for(const std::string& device_name) {
  if (const Device* device = devices_.find(device_name)) return executor_for(*device);
  return *local_;
}

std::optional<double> JobService::run_seconds(const Job& job) const {
  if (job.run_seconds) return job.run_seconds;
  if (job.started_steady && !job.row.finished_ms)
    return std::chrono::duration<double>(clock_.steady() - *job.started_steady).count();
  if (!job.row.started_ms) return std::nullopt;
  return static_cast<double>(std::max<std::int64_t>(0, job.row.finished_ms.value_or(now_ms()) - *job.row.started_ms)) /
         1000.0;
}

void JobService::persist(Write write, std::function<void(Status)> done) {
  ++writes_in_flight_;
  // The completion runs on the storage thread, which may outlive this book (a daemon stopping, a
  // test's second book): only the io_context, which outlives both, is touched there.
  storage_.submit(std::move(write), [this, &io = io_, alive = alive_, done = std::move(done)](Status status) mutable {
    asio::post(io, [this, alive, done = std::move(done), status = std::move(status)] {
      if (!*alive) return;
      --writes_in_flight_;
      if (!status) {
        spdlog::error("storage: {}", status.error().message);
        storage_failure_ = status.error().message;
      } else if (storage_failure_) {
        spdlog::info("storage: writes succeed again");
        storage_failure_.reset();
      }
      if (done) done(status);
    });
  });
}

void JobService::persist_job(Job& job, bool writes_row, Write write, std::function<void(Status)> done) {
  std::optional<ShownRow> row;
  if (writes_row) row = ShownRow::of(job.row);
  // Every write of a job stores the event its caller just added (and the row, where it says so).
  std::optional<StoredEvent> event;
  if (!job.events.empty()) event = job.events.back();
  persist(std::move(write), [this, id = job.row.id, row = std::move(row), events = job.events.size(),
                             event = std::move(event), done = std::move(done)](Status status) {
    if (status) {
      show(id, row, events);
    } else {
      Unsaved& unsaved = unsaved_[id];
      unsaved.row = unsaved.row || row.has_value();
      if (event) unsaved.events.push_back(*event);
    }
    if (done) done(status);
  });
}

void JobService::store_unsaved() {
  if (unsaved_.empty() || storing_unsaved_) return;
  struct Again {
    std::string id;
    std::optional<StoredJob> row;  // as it stands now: later than the one that failed
    std::vector<StoredEvent> events;
    std::size_t events_known = 0;
  };
  std::vector<Again> again;
  for (auto& [id, unsaved] : unsaved_) {
    const auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    again.push_back(Again{id, unsaved.row ? std::optional(it->second->row) : std::nullopt, std::move(unsaved.events),
                          it->second->events.size()});
  }
  unsaved_.clear();
  if (again.empty()) return;
  storing_unsaved_ = true;
  auto shared = std::make_shared<std::vector<Again>>(std::move(again));
  persist(
      [shared](adapters::Database& db) -> Status {
        for (const auto& job : *shared) {
          if (job.row)
            if (auto s = db.update_job(*job.row); !s) return s;
          for (const auto& event : job.events)
            if (auto s = db.insert_event(event); !s) return s;
        }
        return {};
      },
      [this, shared](Status status) {
        storing_unsaved_ = false;
        for (auto& job : *shared) {
          if (!status) {
            Unsaved& unsaved = unsaved_[job.id];
            unsaved.row = unsaved.row || job.row.has_value();
            unsaved.events.insert(unsaved.events.begin(), job.events.begin(), job.events.end());
            continue;
          }
          spdlog::info("job {}: stored now that the database takes writes again", job.id);
          // Writes before this one have committed (the writer keeps their order): so have the
          // events the job had when it was taken.
          show(job.id, job.row ? std::optional(ShownRow::of(*job.row)) : std::nullopt, job.events_known);
        }
      });
}

void JobService::show(const std::string& id, const std::optional<ShownRow>& row, std::size_t events) {
  const auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  Job& job = *it->second;
  job.events_shown = std::max(job.events_shown, std::min(events, job.events.size()));
  if (!row) return;
  const auto before = schedulers::job_state_from_string(job.shown.state);
  const auto after = schedulers::job_state_from_string(row->state);
  const bool ends = after && schedulers::is_terminal(*after) && !(before && schedulers::is_terminal(*before));
  if (before && after && *before != *after) {
    sequences_by_state_[static_cast<std::size_t>(*before)].erase(job.row.sequence);
    sequences_by_state_[static_cast<std::size_t>(*after)].insert(job.row.sequence);
    refresh_state_metrics();
  }
  job.shown = *row;
  if (ends) {
    finished_order_.push_back(id);
    evict_finished();
  }
}

void JobService::note(Job& job, const std::string& message) {
  job.events.push_back(StoredEvent{job.row.id, now_ms(), job.row.state, message});
  persist_job(job, false, [event = job.events.back()](adapters::Database& db) { return db.insert_event(event); });
  spdlog::info("job {}: {}", job.row.id, printable(message));
}

void JobService::transition(Job& job, JobState to, const std::string& message, std::function<void(Status)> done) {
  if (!schedulers::can_transition(job.state, to)) {
    spdlog::error("job {}: refusing transition {} -> {}", job.row.id, schedulers::to_string(job.state),
                  schedulers::to_string(to));
    if (done) done(make_error(ErrorCode::internal, "invalid state transition"));
    return;
  }
  set_state(job, to);
  StoredEvent event{job.row.id, now_ms(), job.row.state, message};
  job.events.push_back(event);
  // Names and messages (a program's words, Slurm's) are escaped: a newline must not forge a line.
  spdlog::info("job {} ({}): {}{}", job.row.id, printable(job.row.name), job.row.state,
               message.empty() ? "" : ": " + printable(message));
  if (!job.row.origin.empty()) agent_->changed();
  persist_job(
      job, true,
      [row = job.row, event](adapters::Database& db) -> Status {
        if (auto s = db.update_job(row); !s) return s;
        return db.insert_event(event);
      },
      std::move(done));
}

void JobService::index(Job& job) {
  // Only stored jobs come here: what is stored is what is shown.
  job.shown = ShownRow::of(job.row);
  job.events_shown = job.events.size();
  by_sequence_.emplace(job.row.sequence, &job);
  sequences_by_state_[static_cast<std::size_t>(job.state)].insert(job.row.sequence);
}

void JobService::set_state(Job& job, JobState to) {
  job.state = to;
  job.row.state = std::string(schedulers::to_string(to));
}

void JobService::refresh_state_metrics() {
  // O(1): the indexes are kept as jobs change state, never recomputed from all jobs.
  for (std::size_t i = 0; i < sequences_by_state_.size(); ++i) {
    const auto state = static_cast<JobState>(i);
    metrics_.set_jobs_in_state(schedulers::to_string(state), static_cast<double>(count_in(state)));
  }
}

Result<std::string> JobService::owner_of(const std::string& id) const {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) {
    auto archived = read_back(id, false);
    if (!archived) return archived.error();
    return (*archived)->row.owner;
  }
  return it->second->row.owner;
}

namespace {

// run.builtin's dataset read and checked against the job's model, as joule-worker will load it.
Status inspect_builtin_dataset(const schedulers::JobSpec& spec) {
  auto dataset = worker::parse_dataset_spec(spec.run.builtin->dataset, "/run/builtin/dataset", spec.run.workdir);
  if (!dataset) return dataset.error();
  auto info = worker::check_dataset_for_model(*dataset, *spec.model);
  if (!info) return info.error();
  // The estimate counts samples_per_epoch; the trainer trains on the dataset's training split.
  const auto split = worker::split_dataset(*dataset, info->samples, spec.training->samples_per_epoch);
  if (split.train != spec.training->samples_per_epoch)
    return invalid(fmt::format("the dataset holds {} samples and the trainer trains on {} of them each epoch ({} held "
                               "out): set samples_per_epoch to {}, which the estimate counts",
                               info->samples, split.train, split.holdout, split.train),
                   "/training/samples_per_epoch");
  return {};
}

}  // namespace

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
  if (!spec.knobs.empty()) {
    // Runnable where some device it may use has every knob it asks for, in range; otherwise the
    // first such device's reason (the one a user with one CPU and one GPU is asking about).
    std::optional<Error> first;
    bool fits = false;
    for (const auto& d : devices_) {
      if (!d.runs_jobs || !schedulers::device_allowed(spec.constraints, d.name)) continue;
      // A CPU knob's reason is the cpu device's, a GPU knob's a GPU's.
      if (d.node.empty() &&
          ((spec.knobs.wants_cpu() && d.name != "cpu") || (spec.knobs.wants_gpu() && d.name == "cpu")))
        continue;
      auto problem = knob_problem(d, spec.knobs);
      if (!problem) fits = true;
      if (problem && !first) first = std::move(problem);
    }
    if (!fits) {
      if (first) return *first;
      return invalid(spec.knobs.wants_cpu()   ? "CPU knobs need the cpu device, which constraints.devices leaves out"
                     : spec.knobs.wants_gpu() ? "a GPU knob needs a cuda:N device, which constraints.devices leaves out"
                                              : "constraints.devices leaves no device that could take the knobs",
                     "/knobs");
    }
  }
  if (spec.constraints.deadline && *spec.constraints.deadline <= now_ms())
    return invalid("the deadline has already passed", "/constraints/deadline");
  // Where it can only run on agents, the agent checks its program and workdir, and a job
  // that cannot start there fails with the agent's reason.
  if (!runs_here(spec)) return {};

  return local_->check(spec, identity);
}

void JobService::submit(const json& body, Submitter submitter, Done done) {
  if (!options_.refuse_submissions.empty()) return done(make_error(ErrorCode::conflict, options_.refuse_submissions));
  auto spec = schedulers::parse_job_spec(body);
  if (!spec) return done(spec.error());
  if (auto runnable = check_runnable(*spec, local_->job_identity(next_sequence_, submitter.uid)); !runnable)
    return done(runnable.error());
  if (!spec->run.builtin || !runs_here(*spec))
    return accept(std::move(spec).value(), std::move(submitter), std::move(done));
  // The built-in trainer's dataset is read (headers and labels: up to CIFAR-10's whole batches)
  // on a thread of its own, not on the loop every request waits on.
  if (dataset_checks_in_flight_ >= kMaxDatasetChecks)
    return done(make_error(ErrorCode::too_many, fmt::format("{} built-in jobs' datasets are being checked; retry later",
                                                            kMaxDatasetChecks)));
  ++dataset_checks_in_flight_;
  auto checked = std::make_shared<schedulers::JobSpec>(std::move(spec).value());
  boost::asio::post(*dataset_checks_, [this, alive = alive_, checked, submitter = std::move(submitter),
                                       done = std::move(done)]() mutable {
    Status fits = inspect_builtin_dataset(*checked);
    boost::asio::post(io_, [this, alive, checked, fits = std::move(fits), submitter = std::move(submitter),
                            done = std::move(done)]() mutable {
      if (!*alive) return;
      --dataset_checks_in_flight_;
      if (!fits) return done(fits.error());
      accept(std::move(*checked), std::move(submitter), std::move(done));
    });
  });
}

bool JobService::runs_here(const schedulers::JobSpec& spec) const {
  return std::any_of(devices_.begin(), devices_.end(), [&](const Device& d) {
    return d.runs_jobs && d.node.empty() && schedulers::device_allowed(spec.constraints, d.name);
  });
}

void JobService::accept(schedulers::JobSpec spec, Submitter submitter, Done done) {
  const std::size_t queued = core().queue().size();
  if (queued + submissions_in_flight_ >= options_.max_queued_jobs) {
    return done(
        make_error(ErrorCode::too_many, fmt::format("{} jobs are already waiting (the limit is {}); retry later",
                                                    queued + submissions_in_flight_, options_.max_queued_jobs)));
  }
  auto job = std::make_unique<Job>();
  static thread_local boost::uuids::random_generator make_uuid;
  job->row.id = boost::uuids::to_string(make_uuid());
  job->row.sequence = next_sequence_++;
  job->row.name = spec.name.empty() ? fmt::format("job-{}", job->row.sequence) : spec.name;
  job->row.spec_json = schedulers::to_json(spec).dump();
  job->row.state = "queued";
  job->row.priority = spec.priority;
  job->row.submitted_ms = now_ms();
  job->row.owner = std::move(submitter.name);
  job->row.owner_uid = submitter.uid;
  job->spec = std::move(spec);
  if (estimator_ && job->spec.model && job->spec.training) set_estimates(*job, estimator_->estimate_job(job->spec));
  if (auto never = core().never_fits(now_ms(), device_statuses(), pending_job(*job))) {
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
    enqueue(*owned);
    index(*owned);
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
  if (placing_paused_until_ && now < *placing_paused_until_) {
    schedule_retry(*placing_paused_until_);  // placing resumes then, if nothing else calls before
    return;
  }
  placing_paused_until_.reset();
  const auto pass = core().place(now, device_statuses());
  // Explained before anything is placed, which is all that could call back into the core.
  const std::vector<const schedulers::PendingJob*>& scanned = core().scanned();
  for (const auto& [id, reason] : pass.waiting) note_waiting(*jobs_.at(id), reason);
  // The pass stopped before the rest: say whether they wait for a device or for their turn.
  for (std::size_t i = pass.considered; i < scanned.size(); ++i) {
    const schedulers::PendingJob* pending = scanned[i];
    if (!pending) continue;  // placed by this pass
    Job& job = *jobs_.at(pending->id);
    const bool all_busy = std::all_of(pending->candidates.begin(), pending->candidates.end(),
                                      [&](const auto& c) { return devices_[c.device].job.has_value(); });
    if (all_busy && !pending->candidates.empty())
      note_waiting(job, schedulers::WaitReason(schedulers::WaitReason::Kind::no_free_device,
                                               "every device it may run on is busy"));
    else
      job.waiting.reset();
  }
  // Why the queue waits, for joule_jobs_waiting: a queued job without a reason waits its turn.
  std::map<std::string_view, double> waiting;
  std::size_t counted = 0;
  for (const schedulers::PendingJob* pending : scanned) {
    if (!pending) continue;  // placed by this pass
    const Job& job = *jobs_.at(pending->id);
    waiting[job.waiting ? schedulers::to_string(job.waiting->kind) : "behind"] += 1.0;
    ++counted;
  }
  if (core().queue().size() > counted) waiting["behind"] += static_cast<double>(core().queue().size() - counted);
  metrics_.set_jobs_waiting({waiting.begin(), waiting.end()});
  for (const auto& placement : pass.placements) {
    Job& job = *jobs_.at(placement.job);
    job.waiting.reset();
    place(job, devices_[placement.device], placement.note);
  }
  if (const auto wake = core().wake_at(now)) schedule_retry(*wake);
}

void JobService::schedule_retry(schedulers::UnixMillis at) {
  // One timer: the earliest moment a waiting job may fit (a budget window moving on).
  if (retry_at_ && *retry_at_ <= at && *retry_at_ > now_ms()) return;
  retry_at_ = at;
  // On the service's clock: the core's moments are its wall time, the wait its monotonic time.
  retry_timer_->wait_for(std::chrono::milliseconds(std::max<std::int64_t>(at - now_ms(), 0)), [this] {
    retry_at_.reset();
    schedule();
  });
}

void JobService::note_waiting(Job& job, schedulers::WaitReason reason) {
  // An event when the reason changes in kind or rule, not on every pass.
  const bool changed = !job.waiting || job.waiting->kind != reason.kind || job.waiting->rule != reason.rule ||
                       job.waiting->device != reason.device;
  using Kind = schedulers::WaitReason::Kind;
  const bool worth_an_event =
      reason.kind != Kind::behind && reason.kind != Kind::no_free_device && reason.kind != Kind::device_busy;
  if (changed && worth_an_event) {
    job.events.push_back(StoredEvent{job.row.id, now_ms(), job.row.state, "waiting: " + reason.message});
    persist_job(job, false, [event = job.events.back()](adapters::Database& db) { return db.insert_event(event); });
  }
  job.waiting = std::move(reason);
}

std::vector<schedulers::DeviceStatus> JobService::device_statuses() const {
  double longest_cap = 60.0;
  for (const auto& cap : budgets_.policy().power_caps) longest_cap = std::max(longest_cap, cap.average_seconds);
  // Only power caps read a device's average power: without any, its power now will do.
  const bool capped = !budgets_.policy().power_caps.empty();
  std::vector<schedulers::DeviceStatus> out;
  out.reserve(devices_.size());
  const schedulers::GridSignal* carbon = carbon_ ? carbon_->in_force(now_ms()).signal : nullptr;
  for (const auto& device : devices_) {
    schedulers::DeviceStatus status;
    status.carbon = carbon;
    status.ref = device.ref;
    status.accepts_work = device.runs_jobs && scheduling_ && device.node_ready;
    status.busy = device.job.has_value() || device.reported_busy;
    status.average_power_watts = capped ? device.average_power(longest_cap) : device.power_watts;
    status.work_seconds = device.work_seconds;
    status.battery_percent = device.battery_percent;
    // When its job is expected to end is the core's to say (its estimate, then its projection).
    out.push_back(std::move(status));
  }
  return out;
}

void JobService::set_estimates(Job& job, const json& rows) {
  const json kept = compact_estimates(rows);
  job.row.estimate_json = kept.dump();
  job.estimates = read_estimates(kept);
}

schedulers::PendingJob JobService::pending_job(const Job& job) const {
  const auto& spec = job.spec;
  schedulers::PendingJob pending;
  pending.id = job.row.id;
  pending.priority = spec.priority;
  pending.deadline = spec.constraints.deadline;
  pending.not_before = spec.constraints.not_before;
  pending.max_energy_joules = spec.constraints.max_energy_joules;
  // Indexed once: with a thousand agents' devices a search per device made this quadratic.
  std::unordered_map<std::string, const DeviceEstimate*> usable;
  for (const auto& estimate : job.estimates)
    if (estimate.ok) usable[estimate.device] = &estimate;
  for (std::size_t d = 0; d < devices_.size(); ++d) {
    const Device& device = devices_[d];
    if (!device.runs_jobs || !schedulers::device_allowed(spec.constraints, device.name)) continue;
    if (!spec.knobs.empty() && knob_problem(device, spec.knobs)) continue;
    schedulers::Candidate candidate{d, std::nullopt, std::nullopt, {}};
    if (const auto it = usable.find(device.name); it != usable.end()) {
      candidate.estimate = it->second->placement();
      candidate.flops_joules = it->second->baseline_joules;
    }
    pending.candidates.push_back(std::move(candidate));
  }
  return pending;
}

std::optional<schedulers::Estimate> JobService::estimate_for(const Job& job, const std::string& device) const {
  const Device* where = devices_.find(device);
  if (!where || !where->runs_jobs || !schedulers::device_allowed(job.spec.constraints, device)) return std::nullopt;
  const DeviceEstimate* estimate = find_estimate(job.estimates, device);
  if (!estimate || !estimate->ok) return std::nullopt;
  return estimate->placement();
}

void JobService::enqueue(const Job& job) { core().enqueue(pending_job(job), job.row.sequence); }

void JobService::track_run(const Job& job, const Device& device, schedulers::UnixMillis started) {
  schedulers::TrackedRun run;
  run.id = job.row.id;
  run.device = devices_.index_of(device.name).value();
  run.priority = job.row.priority;
  run.started = started;
  run.prior = estimate_on(job, device.name);
  if (const auto estimate = estimate_for(job, device.name)) run.expected_seconds = estimate->seconds_mean;
  core().track_run(std::move(run), budgets_.device_ref(device.name));
}

std::optional<schedulers::EnergyDistribution> JobService::estimate_on(const Job& job, const std::string& device) const {
  if (const auto estimate = estimate_for(job, device)) return estimate->energy();
  if (job.spec.constraints.max_energy_joules)
    return schedulers::EnergyDistribution{*job.spec.constraints.max_energy_joules, 0.0};
  return std::nullopt;
}

void JobService::refresh_estimates(std::size_t limit) {
  if (!estimator_ || !scheduling_) return;
  std::vector<adapters::StoredJob> changed;
  for (const auto& id : core().queue().first(limit)) {
    Job& job = *jobs_.at(id);
    if (!job.spec.model || !job.spec.training) continue;
    const json estimate = estimator_->estimate_job(job.spec);
    if (estimate.dump() == job.row.estimate_json) continue;
    set_estimates(job, estimate);
    core().update_pending(pending_job(job));
    changed.push_back(job.row);
  }
  if (changed.empty()) return;
  spdlog::info("estimated {} queued job{} again with the new energy model", changed.size(),
               changed.size() == 1 ? "" : "s");
  persist([rows = std::move(changed)](adapters::Database& db) -> Status {
    for (const auto& row : rows)
      if (auto s = db.update_job(row); !s) return s;
    return {};
  });
  schedule();
}

void JobService::set_policy(schedulers::Policy policy) {
  budgets_.set_policy(std::move(policy));
  for (auto& device : devices_) device.ref = budgets_.device_ref(device.name);
  budgets_.publish(now_ms());
  schedule();
}

json JobService::budgets_view() const { return budgets_.describe(now_ms(), device_statuses()); }

bool JobService::work_waiting_for(const std::string& device) const {
  if (!scheduling_) return false;
  // Jobs held back by a budget, cap, floor or a missing model do not claim the device: probing
  // it is what gives them a model.
  using Kind = schedulers::WaitReason::Kind;
  return core()
      .queue()
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
    out.push_back(
        estimator::WorkloadItem{*job.spec.model, job.spec.training->batch_size, job.spec.training->optimizer});
    if (out.size() >= 4 * recent + 256) break;  // bounded: the planner needs the mix, not every copy
  }
  return out;
}

void JobService::place(Job& job, Device& device, const std::string& note) {
  if (listener_) listener_->placing_on(device.name);
  device.job = job.row.id;
  job.row.device = device.name;
  Executor& executor = executor_for(device);
  const std::string run = executor.prepare(job, device);
  // The placement is committed before anything runs it: a crash in between leaves a "placed"
  // job that nothing ran (recovery queues it again), and another node only ever sees a stored epoch.
  transition(job, JobState::placed, fmt::format("placed on {}{}: {}", device.name, run, note),
             [this, id = job.row.id, epoch = job.row.epoch](Status status) {
               auto it = jobs_.find(id);
               if (it == jobs_.end() || it->second->row.epoch != epoch) return;
               Job& placed = *it->second;
               if (schedulers::is_terminal(placed.state)) return;  // cancelled before its node took it up
               if (placed.cancel_requested)
                 return finish(placed, JobState::cancelled, "cancelled before it started", std::nullopt);
               if (!status) return unplace(placed, "could not record the placement: " + status.error().message);
               if (!scheduling_) return;  // shutting down: the next daemon finds it placed and queues it again
               Device* where = devices_.find(placed.row.device);
               if (!where) return finish(placed, JobState::failed, "its device is gone", std::nullopt);
               executor_for(*where).start(placed, *where);
             });
}

void JobService::finish(Job& job, JobState state, const std::string& reason, std::optional<adapters::ExitStatus> exit) {
  if (exit) job.row.exit_code = exit->signaled ? 128 + exit->value : exit->value;
  job.row.reason = reason;
  job.row.finished_ms = now_ms();
  core().dequeue(job.row.id);
  Device* device = devices_.find(job.row.device);
  Executor& executor = executor_for(job.row.device);
  const bool metered_here = executor.settle_energy(job, device, exit ? &*exit : nullptr);
  if (job.started_steady)
    job.run_seconds = std::chrono::duration<double>(clock_.steady() - *job.started_steady).count();
  if (device && job.row.energy_joules && job.row.started_ms) {
    metrics_.add_job_energy(device->name, job.row.energy_source, *job.row.energy_joules);
    if (metered_here && listener_ && state == JobState::succeeded) {
      if (const auto* estimate = find_estimate(job.estimates, device->name))
        listener_->finished(Feedback{device->name, *estimate, *job.row.energy_joules, job.row.energy_source,
                                     job.row.energy_partial, job.row.id, job.row.finished_ms.value_or(0),
                                     job.run_seconds});
    }
  }
  // The budget ledger trades the job's reservation for what it was metered to use.
  std::optional<adapters::StoredEnergyUse> metered;
  if (job.row.energy_joules && job.row.started_ms)
    metered = adapters::StoredEnergyUse{budgets_.device_ref(job.row.device).node,
                                        budgets_.device_ref(job.row.device).name,
                                        job.row.id,
                                        *job.row.started_ms,
                                        job.row.finished_ms.value_or(now_ms()),
                                        *job.row.energy_joules,
                                        job.row.energy_source};
  budgets_.settle(job.row.id, metered);
  if (metered) account_carbon(job);
  if (device && job.row.started_ms) device->work_seconds += run_seconds(job).value_or(0.0);
  release_controls(job, /*ended=*/true);
  release_device(job);
  transition(job, state, reason);
  schedule();
}

void JobService::account_carbon(Job& job) {
  if (!carbon_) return;
  const auto from = *job.row.started_ms, to = job.row.finished_ms.value_or(now_ms());
  const auto force = carbon_->over(from, to);
  const auto intensity = carbon_->intensity_over(from, to);
  if (!intensity) return;
  const double grams = *job.row.energy_joules / 3.6e6 * *intensity;
  job.row.carbon_grams = grams;
  job.row.carbon_intensity = *intensity;
  job.row.carbon_signal = force.label();
  metrics_.add_job_carbon(job.row.device, job.row.energy_source, grams);
}

void JobService::release_device(Job& job) {
  for (auto& device : devices_)
    if (device.job == job.row.id) device.job.reset();
}

void JobService::unplace(Job& job, const std::string& why) {
  // Nothing ran it and the database still holds it queued: memory goes back to that.
  constexpr std::int64_t kRetryAfterMs = 5000;
  spdlog::warn("job {}: {}; it waits in the queue, placing again in {} s", job.row.id, why, kRetryAfterMs / 1000);
  executor_for(job.row.device).release(job, /*ended=*/true);
  release_device(job);
  if (!job.events.empty() && job.events.back().state == "placed") job.events.pop_back();
  // Nor is its placement written again once the database takes writes.
  if (auto unsaved = unsaved_.find(job.row.id); unsaved != unsaved_.end()) {
    auto& events = unsaved->second.events;
    if (!events.empty() && events.back().state == "placed") events.pop_back();
  }
  job.row.device.clear();
  set_state(job, JobState::queued);
  enqueue(job);
  refresh_state_metrics();
  placing_paused_until_ = now_ms() + kRetryAfterMs;
  schedule_retry(*placing_paused_until_);
}

void JobService::requeue(Job& job, const std::string& why) {
  job.row.device.clear();
  job.row.pid = 0;
  job.forget_run_reports();
  transition(job, JobState::queued, why);
  enqueue(job);
}

void JobService::cancel(const std::string& id, Done done) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return done(not_in_memory(id, "has already {}"));
  Job& job = *it->second;
  if (schedulers::is_terminal(job.state)) {
    return done(make_error(ErrorCode::conflict, fmt::format("job {} has already {}", id, job.row.state)));
  }
  if (job.state == JobState::queued) {
    core().dequeue(id);
    job.row.finished_ms = now_ms();
    job.row.reason = "cancelled while queued";
    transition(job, JobState::cancelled, job.row.reason, [this, id, done = std::move(done)](Status status) {
      if (!status) return done(status.error());
      done(to_json(*jobs_.at(id), true));
    });
    return;
  }
  if (!job.cancel_requested) {
    // TERM then KILL after the grace period here; on another node, its runner stops it.
    job.cancel_requested = true;
    executor_for(job.row.device).stop(job);
  }
  done(to_json(job, true));
}

void JobService::sample_meters() {
  for (const auto& sample : devices_.sample(clock_.steady())) {
    const std::string source(sample.device->meter->source());
    metrics_.add_device_energy(sample.device->name, source, sample.joules);
    if (sample.power_known) metrics_.set_device_power(sample.device->name, source, sample.device->power_watts);
  }
  store_unsaved();
  evict_finished();  // an agent's runs leave once their end is no longer reported
  forget_old_finished();
  if (!scheduling_) return;
  const auto now_millis = now_ms();
  if (options_.current_utc_offset_minutes) core_.set_utc_offset_minutes(options_.current_utc_offset_minutes());
  track_running(now_millis);
  budgets_.publish(now_millis);
  schedule();
}

void JobService::track_running(schedulers::UnixMillis now) {
  // Each running job's energy so far and what it should still need feed the ledger; then the
  // throttle controller looks at caps, budgets and floors.
  std::vector<schedulers::RunningSample> samples;
  for (std::size_t d = 0; d < devices_.size(); ++d) {
    Device& device = devices_[d];
    if (!device.job) continue;
    auto it = jobs_.find(*device.job);
    if (it == jobs_.end()) continue;
    Job& job = *it->second;
    if (job.state != JobState::running && job.state != JobState::throttled) continue;
    Executor& executor = executor_for(device);
    const std::optional<double> metered = executor.energy_as_sampled(job, device);
    job.used_joules = metered;          // shown as energy_so_far
    if (!job.row.started_ms) continue;  // placed, not started: its reservation stands as it is
    schedulers::RunningSample sample;
    sample.id = job.row.id;
    sample.started = *job.row.started_ms;
    sample.used_joules = metered;
    sample.controls.power_watts = device.power_watts;
    sample.controls.paused = job.paused;
    sample.controls.cpu_quota = job.cpu_quota;
    sample.controls.gpu_limit_watts = job.gpu_limit_watts;
    sample.controls.can_limit_cpu = executor.can_limit_cpu(job);
    sample.controls.can_limit_gpu = device.can_limit_gpu;
    sample.controls.gpu_min_watts = device.gpu_min_watts;
    sample.controls.cpus = static_cast<double>(std::max(1u, std::thread::hardware_concurrency()));
    samples.push_back(std::move(sample));
  }
  if (samples.empty()) return;
  for (const auto& action : core().track(now, device_statuses(), std::move(samples))) apply(action);
}

void JobService::apply(const schedulers::ThrottleAction& action) {
  auto it = jobs_.find(action.job);
  if (it == jobs_.end()) return;
  Job& job = *it->second;
  Device* device = devices_.find(job.row.device);
  if (!device) return;
  using Kind = schedulers::ThrottleAction::Kind;
  const bool was_paused = job.paused;
  const Status done = executor_for(*device).throttle(job, *device, action);
  if (!done) {
    spdlog::warn("job {}: throttling ({}) failed: {}", job.row.id, schedulers::to_string(action.kind),
                 done.error().message);
    return;
  }
  // A paused job's reservation stops accruing until it runs again.
  if (action.kind == Kind::pause && job.paused && !was_paused)
    budgets_.pause_running(job.row.id, now_ms(), std::string(device->meter->source()));
  else if (action.kind == Kind::resume && !job.paused && was_paused)
    budgets_.resume_running(job.row.id, now_ms());
  metrics_.count_throttle_action(std::string(schedulers::to_string(action.kind)));
  const bool throttled = job.paused || job.cpu_quota || job.gpu_limit_watts;
  const std::string message = fmt::format("{}: {}", schedulers::to_string(action.kind), action.reason);
  if (throttled && job.state == JobState::running) {
    transition(job, JobState::throttled, message);
  } else if (!throttled && job.state == JobState::throttled) {
    transition(job, JobState::running, message);
  } else {
    note(job, message);
  }
}

void JobService::release_controls(Job& job, bool ended) {
  // Nothing stays throttled once jouled lets go of a job (it ends, its node is lost, or jouled stops).
  executor_for(job.row.device).release(job, ended);
  job.paused = false;
  job.cpu_quota.reset();
  job.gpu_limit_watts.reset();
}

void JobService::stop_scheduling() {
  scheduling_ = false;
  retry_timer_->cancel();
  // Running jobs go on; the next daemon adopts them.
  for (auto& [id, job] : jobs_)
    if (!schedulers::is_terminal(job->state) && job->state != JobState::queued) release_controls(*job, false);
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
  std::size_t skipped = 0;
  for (auto& row : rows) {
    next_sequence_ = std::max(next_sequence_, row.sequence + 1);
    // One bad row must not keep the daemon from starting: it is left in the database as it is,
    // for someone to inspect, and the rest is served.
    auto state = schedulers::job_state_from_string(row.state);
    if (!state) {
      spdlog::error("job {}: skipped at start: unknown state \"{}\" (the row stays in the database)", row.id,
                    printable(row.state));
      ++skipped;
      continue;
    }
    json spec_json = json::parse(row.spec_json, nullptr, false);
    auto spec = schedulers::parse_job_spec(spec_json);
    if (!spec) {
      spdlog::error(
          "job {}: skipped at start: its stored spec no longer parses: {} at {} (the row stays in the "
          "database)",
          row.id, spec.error().message, spec.error().where);
      ++skipped;
      continue;
    }
    auto job = std::make_unique<Job>();
    job->spec = std::move(spec).value();
    job->state = *state;
    job->events = std::move(history[row.id]);
    const std::string id = row.id;
    job->row = std::move(row);
    job->estimates = read_estimates(job->row.estimate_json);
    if (job->state == JobState::queued) enqueue(*job);
    if (!schedulers::is_terminal(job->state) && job->state != JobState::queued) to_reconcile.push_back(id);
    if (schedulers::is_terminal(job->state)) finished_order_.push_back(id);
    index(*job);
    jobs_.emplace(id, std::move(job));
  }
  if (archive_) {
    // Finished jobs not loaded are counted, not read: the database serves them when asked.
    auto counts = archive_->count_jobs_by_state();
    if (!counts) return counts.error();
    auto last = archive_->max_job_sequence();
    if (!last) return last.error();
    next_sequence_ = std::max(next_sequence_, *last + 1);
    for (const auto& [name, count] : *counts) {
      const auto state = schedulers::job_state_from_string(name);
      if (!state) {
        spdlog::error("{} stored job{} in unknown state \"{}\" skipped (the rows stay in the database)", count,
                      count == 1 ? "" : "s", printable(name));
        skipped += static_cast<std::size_t>(count);
      } else if (schedulers::is_terminal(*state)) {
        const auto index = static_cast<std::size_t>(*state);
        const auto loaded = static_cast<std::int64_t>(sequences_by_state_[index].size());
        evicted_by_state_[index] = static_cast<std::size_t>(std::max<std::int64_t>(0, count - loaded));
      }
    }
  }
  if (skipped > 0)
    spdlog::warn("{} stored job{} could not be read and {} skipped (see above)", skipped, skipped == 1 ? "" : "s",
                 skipped == 1 ? "was" : "were");

  // Each executor finds what became of its runs while no daemon watched: adopted, finished, or
  // queued again.
  for (const auto& id : to_reconcile) {
    Job& job = *jobs_.at(id);
    Device* device = devices_.find(job.row.device);
    (device ? executor_for(*device) : *local_).recover(job, device);
  }
  evict_finished();
  refresh_state_metrics();
  schedule();
  return {};
}

bool JobService::job_token_matches(const std::string& id, const std::string& token) const {
  const auto it = jobs_.find(id);
  std::unique_ptr<Job> archived;
  if (it == jobs_.end()) {
    auto read = read_back(id, false);
    if (!read) return false;
    archived = std::move(read).value();
  }
  const Job& job = archived ? *archived : *it->second;
  if (job.row.token_sha256.empty() || token.empty()) return false;
  const std::string presented = joule::sha256_hex(token);
  const std::string& stored = job.row.token_sha256;
  return stored.size() == presented.size() && CRYPTO_memcmp(stored.data(), presented.data(), stored.size()) == 0;
}

Result<json> JobService::report_progress(const std::string& id, const std::string& token, const json& body) {
  auto it = jobs_.find(id);
  std::optional<std::string> finished;  // the state of a job out of memory
  if (it == jobs_.end()) {
    auto archived = read_back(id, false);
    if (!archived) return archived.error();
    finished = (*archived)->row.state;
  }
  if (!job_token_matches(id, token))
    return make_error(ErrorCode::unauthorized,
                      "progress needs the job's own token (JOULE_JOB_TOKEN) as the bearer token");
  if (finished) return make_error(ErrorCode::conflict, fmt::format("job {} is {}, not running", id, *finished));
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
  if (job.last_report && epoch <= job.last_report->epoch)
    return invalid(fmt::format("epoch {} was already reported (last: {})", epoch, job.last_report->epoch), "/epoch");

  // What training says of itself (the built-in trainer sends these): shown with the progress.
  json figures = json::object();
  for (const char* key : {"loss", "accuracy"}) {
    if (const auto it = body.find(key); it != body.end() && !it->is_null()) {
      if (!it->is_number() || !std::isfinite(it->get<double>()))
        return invalid(fmt::format("{} must be a finite number", key), fmt::format("/{}", key));
      figures[key] = it->get<double>();
    }
  }
  if (const auto it = body.find("firing_rates"); it != body.end()) {
    if (!it->is_object() || it->size() > 1024)
      return invalid("firing_rates must be an object of at most 1024 layers, each a share in [0, 1]", "/firing_rates");
    for (const auto& [layer, rate] : it->items()) {
      if (!rate.is_number() || rate.get<double>() < 0.0 || rate.get<double>() > 1.0 || layer.size() > 256)
        return invalid("firing rates are shares in [0, 1], by layer names of at most 256 characters",
                       "/firing_rates/" + std::string(printable(layer, 100)));
    }
    figures["firing_rates"] = *it;
  }

  job.training_figures = std::move(figures);

  Device* device = devices_.find(job.row.device);
  std::optional<double> used;
  if (device) used = executor_for(*device).energy_so_far(job, *device, nullptr);
  json out = {{"id", id}, {"epoch", epoch}, {"epochs", epochs}};
  if (!used) {
    out["energy"] = nullptr;
    out["note"] = "the device's meter could not be read: no projection from this report";
    return out;
  }
  const bool first_projection = !(job.projection && job.projection->step);
  job.last_report = schedulers::EpochReport{static_cast<int>(epoch), static_cast<int>(epochs), *used, now_ms()};
  const schedulers::Projection* projection = core().report(id, *job.last_report);
  if (!projection) {
    out["energy"] = nullptr;
    out["note"] = "the job is not running here: no projection from this report";
    return out;
  }
  job.projection = *projection;
  const std::string source(device->meter->source());
  out["energy"] = {{"joules", *used}, {"source", source}, {"partial", job.row.energy_partial}};
  out["projection"] = projection_json(*job.projection, source);
  if (first_projection && job.projection->step) {
    job.events.push_back(
        StoredEvent{id, now_ms(), job.row.state,
                    fmt::format("STEP projection after epoch {} of {}: {:.0f} J ({} joules, {})", epoch, epochs,
                                job.projection->total.mean_joules, source, job.projection->method)});
    persist_job(job, false, [event = job.events.back()](adapters::Database& db) { return db.insert_event(event); });
  }
  return out;
}

Result<json> JobService::job(const std::string& id) const {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) {
    auto archived = read_back(id, true);
    if (!archived) return archived.error();
    return to_json(**archived, true);
  }
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
    if (it != jobs_.end()) {
      after_sequence = it->second->row.sequence;
    } else if (auto archived = read_back(*after, false)) {
      after_sequence = (*archived)->row.sequence;
    } else if (archived.error().code != ErrorCode::not_found) {
      return archived.error();
    } else {
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("no job {} to list after; start again without \"after\"", *after), "after");
    }
  }
  // Every job, or the finished ones of a state, may be out of memory: the database pages them.
  if (archive_ && (!state || schedulers::is_terminal(*schedulers::job_state_from_string(*state))))
    return archived_page(state, limit, after_sequence, newest_first);
  // A page costs its own jobs plus a logarithm: the submission numbers are kept sorted, in all
  // (by_sequence_) and per state, so listing never walks or sorts the jobs it does not show.
  const auto page = [&](const auto& sequences, std::size_t total) {
    const auto sequence_of = [](const auto& entry) -> std::int64_t {
      if constexpr (std::is_same_v<std::decay_t<decltype(entry)>, std::int64_t>)
        return entry;
      else
        return entry.first;
    };
    json out = json::array();
    const Job* last = nullptr;
    bool more = false;
    const auto take = [&](auto it, auto end) {
      for (; it != end; ++it) {
        if (out.size() == limit) {
          more = true;
          break;
        }
        last = by_sequence_.at(sequence_of(*it));
        out.push_back(to_json(*last, false));
      }
    };
    if (newest_first)
      take(after_sequence ? std::make_reverse_iterator(sequences.lower_bound(*after_sequence)) : sequences.rbegin(),
           sequences.rend());
    else
      take(after_sequence ? sequences.upper_bound(*after_sequence) : sequences.begin(), sequences.end());
    return json{{"jobs", out}, {"total", total}, {"next", more && last ? json(last->row.id) : json(nullptr)}};
  };
  if (!state) return page(by_sequence_, by_sequence_.size());
  const auto& sequences = sequences_by_state_[static_cast<std::size_t>(*schedulers::job_state_from_string(*state))];
  return page(sequences, sequences.size());
}

std::vector<JobService::Feedback> JobService::finished_feedback() const {
  if (archive_) return archived_feedback();
  std::vector<const Job*> done;
  for (const auto& [sequence, job] : by_sequence_)
    if (job->state == JobState::succeeded && job->row.energy_joules && !job->estimates.empty() && job->row.finished_ms)
      done.push_back(job);
  std::stable_sort(done.begin(), done.end(),
                   [](const Job* a, const Job* b) { return *a->row.finished_ms < *b->row.finished_ms; });
  std::vector<Feedback> out;
  for (const Job* job : done)
    if (const auto* estimate = find_estimate(job->estimates, job->row.device))
      out.push_back(Feedback{job->row.device, *estimate, *job->row.energy_joules, job->row.energy_source,
                             job->row.energy_partial, job->row.id, *job->row.finished_ms, run_seconds(*job)});
  return out;
}

Result<std::filesystem::path> JobService::log_path(const std::string& id, const std::string& stream) const {
  if (!jobs_.contains(id)) {
    if (auto archived = read_back(id, false); !archived) return archived.error();
  }
  if (stream != "stdout" && stream != "stderr") return invalid("stream must be stdout or stderr", "stream");
  return local_->job_directory(id) / (stream + ".log");
}

std::string JobService::summary() const {
  std::size_t running = 0;
  for (const auto& device : devices_) running += device.job ? 1 : 0;
  std::string text = fmt::format("{} queued, {} running", core().queue().size(), running);
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
  // What changes as it runs is shown as committed: a state only once it would survive a crash.
  const auto& row = job.row;
  const ShownRow& shown = job.shown;
  const auto shown_state = schedulers::job_state_from_string(shown.state).value_or(job.state);
  json energy = nullptr;
  if (shown.energy_joules) {
    const bool measured = is_measurement(shown.energy_source);
    energy = {{"joules", *shown.energy_joules},
              {"source", shown.energy_source},
              {"measured", measured},
              {"scope", energy_scope(shown.device, shown.energy_source)},
              {"partial", shown.energy_partial}};
  }
  const std::optional<double> seconds = shown.started_ms ? run_seconds(job) : std::nullopt;
  json out = {{"id", row.id},
              {"name", row.name},
              {"owner", row.owner},
              {"state", shown.state},
              {"priority", row.priority},
              {"device", shown.device.empty() ? json(nullptr) : json(shown.device)},
              {"submitted_at", schedulers::format_rfc3339(row.submitted_ms)},
              {"started_at", optional_json(shown.started_ms)},
              {"finished_at", optional_json(shown.finished_ms)},
              {"seconds", seconds ? json(*seconds) : json(nullptr)},
              {"exit_code", shown.exit_code ? json(*shown.exit_code) : json(nullptr)},
              {"reason", shown.reason},
              {"energy", energy},
              {"cancel_requested", job.cancel_requested},
              {"estimate", row.estimate_json.empty() ? json(nullptr) : json::parse(row.estimate_json, nullptr, false)}};
  // Before it runs: what it would emit on each device if it started now.
  if (carbon_ && (shown_state == JobState::queued || shown_state == JobState::placed))
    carbon_->add_estimates(out["estimate"], now_ms());
  // Feedback: the metered energy beside the estimate for the device the job ran on (only when
  // both come from the same source: modelled joules are not compared with measured ones).
  if (shown.carbon_grams) {
    // Grams are as sure as the joules under them: modelled joules make modelled grams.
    out["carbon"] = {{"grams", *shown.carbon_grams},
                     {"intensity", shown.carbon_intensity ? json(*shown.carbon_intensity) : json(nullptr)},
                     {"unit", "gCO2e"},
                     {"signal", shown.carbon_signal},
                     {"joules_source", shown.energy_source},
                     {"measured", is_measurement(shown.energy_source)}};
  }
  if (shown.energy_joules) {
    const auto* estimate = find_estimate(job.estimates, shown.device);
    if (estimate && estimate->ok && estimate->joules_mean > 0.0 && estimate->source == shown.energy_source)
      out["estimate_error"] = {{"estimated_joules", estimate->joules_mean},
                               {"estimated_std", estimate->joules_std},
                               {"metered_joules", *shown.energy_joules},
                               {"relative", (*shown.energy_joules - estimate->joules_mean) / estimate->joules_mean},
                               {"source", shown.energy_source}};
  }
  if (shown_state == JobState::queued) {
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
      const std::size_t ahead = core().queue().position(row.id).value_or(0);
      waiting = {
          {"reason", "behind"},
          {"message", ahead == 0 ? std::string("next in line; waiting for a placement pass")
                                 : fmt::format("{} job{} ahead of it in the queue", ahead, ahead == 1 ? "" : "s")}};
    }
    out["waiting"] = waiting;
  }
  if (job.last_report) {
    const auto& last = *job.last_report;
    out["progress"] = {
        {"epoch", last.epoch}, {"epochs", last.epochs}, {"reported_at", schedulers::format_rfc3339(last.at)}};
    for (const auto& [key, value] : job.training_figures.items()) out["progress"][key] = value;
  }
  // While it runs the job has no energy source of its own yet: its device's meter is it.
  const auto running_source = [&] {
    std::string source = row.energy_source;
    for (const auto& device : devices_)
      if (source.empty() && device.name == row.device) source = std::string(device.meter->source());
    return source;
  };
  if (job.projection && job.projection->step) out["projection"] = projection_json(*job.projection, running_source());
  if (shown_state == JobState::running || shown_state == JobState::throttled) {
    if (const std::string source = running_source(); job.used_joules && !source.empty())
      out["energy_so_far"] = {{"joules", *job.used_joules}, {"source", source}, {"measured", is_measurement(source)}};
  }
  if (const auto& builtin = job.spec.run.builtin) {
    // Where the trainer keeps its checkpoints, and so the trained weights (model.pt): in the work
    // directory of the node it ran on, unless the job named a directory.
    const Device* ran_on = nullptr;
    for (const auto& device : devices_)
      if (device.name == shown.device) ran_on = &device;
    json where = {{"checkpoints", builtin->checkpoints}};
    if (ran_on && !ran_on->node.empty()) where["node"] = ran_on->node;
    const std::filesystem::path dir = ran_on && !ran_on->node.empty()
                                          ? std::filesystem::path(builtin->checkpoint_directory)
                                          : local_->checkpoint_directory(job);
    if (builtin->checkpoints && !dir.empty()) {
      where["checkpoint_directory"] = dir.string();
      where["weights"] = (dir / "model.pt").string();
      if (with_events && (!ran_on || ran_on->node.empty())) {
        std::error_code ec;
        where["weights_saved"] = std::filesystem::exists(dir / "model.pt", ec);
      }
    }
    out["builtin"] = where;
  }
  if (job.paused || job.cpu_quota || job.gpu_limit_watts) {
    out["throttle"] = {{"paused", job.paused},
                       {"cpu_quota", job.cpu_quota ? json(*job.cpu_quota) : json(nullptr)},
                       {"gpu_power_limit_watts", job.gpu_limit_watts ? json(*job.gpu_limit_watts) : json(nullptr)}};
  }
  if (!job.spec.knobs.empty()) {
    // Asked for, and what is in force this run (null before it starts, after it ends, or when
    // refused: its events say which).
    out["knobs"] = {{"requested", schedulers::to_json(job.spec.knobs)},
                    {"in_force", job.knobs_in_force ? json(*job.knobs_in_force) : json(nullptr)}};
  }
  if (with_events) {
    out["spec"] = json::parse(row.spec_json, nullptr, false);
    json events = json::array();
    for (std::size_t i = 0; i < job.events_shown && i < job.events.size(); ++i) {
      const auto& event = job.events[i];
      events.push_back(
          {{"at", schedulers::format_rfc3339(event.at_ms)}, {"state", event.state}, {"message", event.message}});
    }
    out["events"] = events;
  }
  return out;
}

}  // namespace joule::daemon
