#include "joule/daemon/job_service.hpp"

#include "chosen_setting.hpp"
#include "executors/agent_runner.hpp"
#include "executors/local_executor.hpp"
#include "executors/node_executor.hpp"
#include "job_record.hpp"
#include "knob_check.hpp"

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
#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>
#include <boost/uuid/random_generator.hpp>
#include <boost/uuid/uuid_io.hpp>

#include "joule/adapters/job_controls.hpp"
#include "joule/common/energy_source.hpp"
#include "joule/common/text.hpp"
#include "joule/daemon/thread_settings.hpp"
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
  Device* find_device(const std::string& name) override { return book_.devices_.find(name); }
  std::vector<unsigned> gpus_not_of(const std::vector<std::string>& own) const override {
    return book_.devices_.gpus_not_of(own);
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
    book_.cancel(id, [](Result<JobView>) {});
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
      price_(links.price),
      core_(schedulers::Policy{}, options_.utc_offset_minutes),
      budgets_(storage, metrics, options_.node_name, core_, SignalFeeds{links.carbon, links.price}),
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
  estimating_->stop();
  estimating_->join();
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
  // A coordinator's job is reported as stored (AgentRunner::assignment_reports): its new state
  // goes out once stored (not at the transition, which would report the old one), rather than
  // at the next heartbeat.
  if (before != after && !job.row.origin.empty()) agent_->changed();
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
  // Its project, and the owner's and project's quotas on queued jobs (submissions not yet
  // committed count too: a flood of one owner's requests is held at its quota, not past it).
  const auto& tenancy = core().policy().tenancy;
  const auto chosen = schedulers::choose_project(tenancy, submitter.name, spec.project);
  if (!chosen.error.empty()) return done(invalid(chosen.error, "/project"));
  spec.project = chosen.project;
  if (auto refused = queued_quota_refusal(submitter.name, spec.project)) return done(std::move(*refused));
  if (!estimator_ || !spec.model || !spec.training)
    return admit(std::move(spec), std::move(submitter), std::nullopt, std::move(done));
  if (estimates_in_flight_ >= kMaxEstimatesInFlight)
    return done(make_error(ErrorCode::too_many,
                           fmt::format("{} submissions are being estimated; retry later", estimates_in_flight_)));
  // The models' predictions run on a thread of their own; meanwhile the submission counts as in
  // flight against the queue's limit and its quotas, as while it is stored.
  ++estimates_in_flight_;
  ++submissions_in_flight_;
  count_in_flight(submitter.name, spec.project, 1);
  // The submission, moved into what admits it, is estimated from a copy of its spec.
  const schedulers::JobSpec estimated = spec;
  estimate_off_loop(estimated, "POST /v1/jobs: corrected",
                    [this, spec = std::move(spec), submitter = std::move(submitter),
                     done = std::move(done)](KeptEstimates kept) mutable {
                      const TimedWork timed(metrics_, "POST /v1/jobs: estimated", clock_);
                      --estimates_in_flight_;
                      --submissions_in_flight_;
                      count_in_flight(submitter.name, spec.project, -1);
                      admit(std::move(spec), std::move(submitter), std::move(kept), std::move(done));
                    });
}

void JobService::estimate_off_loop(const schedulers::JobSpec& spec, std::string what,
                                   std::function<void(KeptEstimates)> then) {
  auto work = estimator_->start_estimate(spec);
  auto finishing = std::make_shared<const schedulers::JobSpec>(spec);  // what finish_estimate reads
  boost::asio::post(*estimating_, [this, alive = alive_, work = std::move(work), finishing, what = std::move(what),
                                   then = std::move(then)]() mutable {
    auto rows = work();
    boost::asio::post(io_, [this, alive, rows = std::move(rows), finishing, what = std::move(what),
                            then = std::move(then)]() mutable {
      if (!*alive) return;
      {
        const TimedWork timed(metrics_, what, clock_);
        estimator_->finish_estimate(*finishing, rows);
      }
      boost::asio::post(*estimating_, [this, alive, rows = std::move(rows), then = std::move(then)]() mutable {
        KeptEstimates kept{stored_estimates(rows), figures_of(rows)};
        boost::asio::post(io_, [alive, kept = std::move(kept), then = std::move(then)]() mutable {
          if (*alive) then(std::move(kept));
        });
      });
    });
  });
}

void JobService::admit(schedulers::JobSpec spec, Submitter submitter, std::optional<KeptEstimates> estimates,
                       Done done) {
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
  job->row.project = spec.project;
  job->spec = std::move(spec);
  if (estimates) {
    job->row.estimate_json = std::move(estimates->stored);
    job->estimates = std::move(estimates->figures);
  }
  if (auto never = core().never_fits(now_ms(), device_statuses(), pending_job(*job))) {
    using Kind = schedulers::WaitReason::Kind;
    const auto& resources = job->spec.resources;
    const char* where = never->kind == Kind::deadline                         ? "/constraints/deadline"
                        : never->kind == Kind::max_energy                     ? "/constraints/max_energy_joules"
                        : never->kind == Kind::unavailable && resources.gpus  ? "/resources/gpus"
                        : never->kind == Kind::unavailable && resources.cores ? "/resources/cores"
                                                                              : "/training";
    return done(invalid(fmt::format("the job can never run on this node: {}", never->message), where));
  }
  StoredEvent event{job->row.id, job->row.submitted_ms, "queued", "submitted"};
  job->events.push_back(event);

  ++submissions_in_flight_;
  count_in_flight(job->row.owner, job->spec.project, 1);
  std::shared_ptr<Job> pending = std::move(job);
  Write write = [row = pending->row, event](adapters::Database& db) -> Status {
    if (auto s = db.insert_job(row); !s) return s;
    return db.insert_event(event);
  };
  persist(std::move(write), [this, job = std::move(pending), done = std::move(done)](Status status) mutable {
    // Committed: queued, and answered (the 201's body is written here).
    const TimedWork timed(metrics_, "POST /v1/jobs: stored", clock_);
    --submissions_in_flight_;
    count_in_flight(job->row.owner, job->spec.project, -1);
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
    done(view_of(*jobs_.at(id)));
    schedule();
  });
}

std::optional<Error> JobService::queued_quota_refusal(const std::string& owner, const std::string& project) const {
  const auto& tenancy = core().policy().tenancy;
  auto in_flight = [](const std::unordered_map<std::string, std::size_t>& counts, const std::string& name) {
    const auto it = counts.find(name);
    return it == counts.end() ? std::size_t{0} : it->second;
  };
  auto refusal = [](const char* kind, const std::string& name, std::size_t queued, std::int64_t limit) {
    Error error = make_error(
        ErrorCode::too_many,
        fmt::format("{} {} has {} job{} queued, as many as its quota allows (max_queued_jobs = {}); another may "
                    "be submitted once one of them starts or is cancelled",
                    kind, name, queued, queued == 1 ? "" : "s", limit));
    error.extensions = json{{"quota",
                             {{"kind", kind},
                              {"name", name},
                              {"limit", "max_queued_jobs"},
                              {"max", limit},
                              {"in_use", queued},
                              {"frees", "when one of its queued jobs starts or is cancelled"}}}}
                           .dump();
    return error;
  };
  if (const auto limit = tenancy.quota_of_owner(owner).max_queued_jobs) {
    const std::size_t queued = core().owner_use(owner).queued + in_flight(in_flight_by_owner_, owner);
    if (static_cast<std::int64_t>(queued) >= *limit) return refusal("owner", owner, queued, *limit);
  }
  if (const schedulers::Project* rule = project.empty() ? nullptr : tenancy.project(project);
      rule && rule->quota.max_queued_jobs) {
    const std::size_t queued = core().project_use(project).queued + in_flight(in_flight_by_project_, project);
    if (static_cast<std::int64_t>(queued) >= *rule->quota.max_queued_jobs)
      return refusal("project", project, queued, *rule->quota.max_queued_jobs);
  }
  return std::nullopt;
}

void JobService::count_in_flight(const std::string& owner, const std::string& project, int change) {
  auto add = [change](std::unordered_map<std::string, std::size_t>& counts, const std::string& name) {
    auto& count = counts[name];
    count = static_cast<std::size_t>(static_cast<std::ptrdiff_t>(count) + change);
    if (count == 0) counts.erase(name);
  };
  add(in_flight_by_owner_, owner);
  if (!project.empty()) add(in_flight_by_project_, project);
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
      done(view_of(*jobs_.at(id)));
    });
    return;
  }
  if (!job.cancel_requested) {
    // TERM then KILL after the grace period here; on another node, its runner stops it.
    job.cancel_requested = true;
    executor_for(job.row.device).stop(job);
  }
  done(view_of(job));
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
    // A run that began to share its device and whose row was not written since (jouled killed).
    for (const auto& event : job->events)
      if (event.message.find(kSharedEnergyNote) != std::string::npos) job->row.energy_shared = true;
    job->estimates = read_estimates(job->row.estimate_json);
    restore_chosen_setting(*job);
    recall_checked_setting(*job);
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

}  // namespace joule::daemon
