// The job book's placement passes and runs: placing, finishing and releasing jobs, metering
// them, throttling them as the core says, and their progress reports.
#include "joule/daemon/job_service.hpp"

#include "chosen_setting.hpp"
#include "executors/agent_runner.hpp"
#include "executors/local_executor.hpp"
#include "executors/node_executor.hpp"
#include "job_record.hpp"
#include "joule/estimator/thread_count.hpp"
#include "knob_check.hpp"

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <set>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "joule/common/energy_source.hpp"
#include "joule/common/text.hpp"
#include "joule/schedulers/step_projection.hpp"

namespace joule::daemon {

namespace asio = boost::asio;
using adapters::StoredEvent;
using adapters::StoredJob;
using nlohmann::json;
using schedulers::JobState;

void JobService::schedule() {
  if (!scheduling_) return;
  const TimedWork timed(metrics_, "placement", clock_);
  const auto now = now_ms();
  if (placing_paused_until_ && now < *placing_paused_until_) {
    schedule_retry(*placing_paused_until_);  // placing resumes then, if nothing else calls before
    return;
  }
  placing_paused_until_.reset();
  const auto pass = core().place(now, device_statuses());
  metrics_.count_placement_pass(pass.continued);
  // Explained before anything is placed, which is all that could call back into the core.
  const std::vector<const schedulers::PendingJob*>& scanned = core().scanned();
  for (const auto& [id, reason] : pass.waiting) note_waiting(*jobs_.at(id), reason);
  // The pass stopped before the rest: say whether they wait for a device or for their turn.
  for (std::size_t i = pass.considered; i < scanned.size(); ++i) {
    const schedulers::PendingJob* pending = scanned[i];
    if (!pending) continue;  // placed by this pass
    Job& job = *jobs_.at(pending->id);
    const bool all_busy = std::all_of(pending->candidates.begin(), pending->candidates.end(), [&](const auto& c) {
      return !devices_[c.device].can_hold(devices_[c.device].cores_for(job.spec.shared_cores()));
    });
    if (all_busy && !pending->candidates.empty())
      note_waiting(job, schedulers::WaitReason(schedulers::WaitReason::Kind::no_free_device,
                                               "every device it may run on is busy"));
    else
      job.waiting.reset();
  }
  // Why the queue waits, for joule_jobs_waiting: a queued job without a reason waits its turn.
  // A continued pass decided only the jobs queued since the full one: they add to its count.
  if (!pass.continued) {
    waiting_by_reason_.clear();
    waiting_counted_ = 0;
  }
  for (const schedulers::PendingJob* pending : scanned) {
    if (!pending) continue;  // placed by this pass
    const Job& job = *jobs_.at(pending->id);
    waiting_by_reason_[job.waiting ? schedulers::to_string(job.waiting->kind) : "behind"] += 1.0;
    ++waiting_counted_;
  }
  std::map<std::string, double> waiting(waiting_by_reason_.begin(), waiting_by_reason_.end());
  if (core().queue().size() > waiting_counted_)
    waiting["behind"] += static_cast<double>(core().queue().size() - waiting_counted_);
  metrics_.set_jobs_waiting(waiting);
  for (const auto& placement : pass.placements) {
    Job& job = *jobs_.at(placement.job);
    job.waiting.reset();
    place(job, devices_[placement.device], placement);
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
  const schedulers::GridSignal* price = price_ ? price_->in_force(now_ms()).signal : nullptr;
  for (const auto& device : devices_) {
    schedulers::DeviceStatus status;
    // An agent's own signals where it has them (its grid), else this node's.
    status.carbon = device.reported_carbon ? &device.reported_carbon->signal : carbon;
    status.price = device.reported_price ? &device.reported_price->signal : price;
    status.ref = device.ref;
    status.accepts_work = device.runs_jobs && scheduling_ && device.node_ready;
    status.busy = device.held_whole() || device.reported_busy;
    status.cores = device.shared_cores;
    status.cores_held = device.cores_held();
    status.group = device.gpu_group;
    status.average_power_watts = capped ? device.average_power(longest_cap) : device.power_watts;
    status.work_seconds = device.work_seconds;
    status.battery_percent = device.battery_percent;
    // When its job is expected to end is the core's to say (its estimate, then its projection).
    out.push_back(std::move(status));
  }
  return out;
}

void JobService::set_estimates(Job& job, const std::vector<EstimateRow>& rows) {
  job.row.estimate_json = stored_estimates(rows);
  job.estimates = figures_of(rows);
}

schedulers::PendingJob JobService::pending_job(const Job& job) const {
  const auto& spec = job.spec;
  schedulers::PendingJob pending;
  pending.id = job.row.id;
  pending.priority = spec.priority;
  pending.owner = job.row.owner;
  pending.project = spec.project;
  pending.deadline = spec.constraints.deadline;
  pending.not_before = spec.constraints.not_before;
  pending.max_energy_joules = spec.constraints.max_energy_joules;
  pending.max_slowdown = spec.constraints.max_slowdown;
  pending.cores = spec.shared_cores();
  pending.gpus = spec.resources.gpus.value_or(0);
  // Settings are chosen for jobs that ask for none: for those that hold their devices whole (a
  // job on several GPUs runs at it on each), and for a job on a number of cores of its own where
  // each CPU has a clock of its own (clocks_per_cpu: the cap reaches its cores alone; elsewhere
  // it would reach the jobs beside it). Not for a range of cores: placement chooses the count.
  const bool choose_settings = core().policy().knobs.goal != schedulers::KnobGoal::off && spec.knobs.empty() &&
                               !(pending.cores > 0 && spec.chooses_cores());
  const auto own_setting = setting_of(spec.knobs);
  std::string signature;  // of its network, once a remembered check needs it
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
      // A job that asks for a setting the device measured networks at is weighed at it.
      if (own_setting)
        if (const auto at = it->second->at(*own_setting)) candidate.estimate = at->placement();
      candidate.flops_joules = it->second->baseline_joules;
      const bool on_own_cores = pending.cores > 0 && device.shared_cores > 0;
      if (choose_settings && !it->second->settings.empty() &&
          (!on_own_cores || (device.cpu_frequency && clocks_per_cpu(*device.cpu_frequency)))) {
        // Only what the device offers now (its knobs can change with a restart).
        const auto offered = knob_choices(device);
        for (auto& option : it->second->setting_options()) {
          const estimator::KnobSetting setting{option.knob, option.value, option.label};
          if (std::find(offered.begin(), offered.end(), setting) == offered.end()) continue;
          // What an earlier job of this network measured at the setting in its first epochs
          // replaces the prediction: a setting it gave up is not offered again.
          if (!checked_settings_.empty()) {
            // The network's signature once per job, not per device and setting.
            if (signature.empty() && spec.model) signature = estimator::network_signature(*spec.model);
            if (const auto checked = checked_settings_.find(checked_key(job, device.name, setting, signature));
                checked != checked_settings_.end() && checked->second.setting_epoch > 0) {
              if (!checked->second.kept) continue;
              const auto base = it->second->placement();
              option.estimate.joules_mean = base.joules_mean * checked->second.energy_ratio;
              option.estimate.joules_std = base.joules_std * checked->second.energy_ratio;
              option.estimate.seconds_mean = base.seconds_mean * checked->second.time_ratio;
            }
          }
          candidate.settings.push_back(std::move(option));
        }
      }
    }
    if (spec.chooses_cores() && device.shared_cores > 0) {
      for (auto& option : core_options(spec, device, candidate, usable))
        pending.candidates.push_back(std::move(option));
      continue;
    }
    pending.candidates.push_back(std::move(candidate));
  }
  return pending;
}

std::vector<schedulers::Candidate> JobService::core_options(
    const schedulers::JobSpec& spec, const Device& device, const schedulers::Candidate& candidate,
    const std::unordered_map<std::string, const DeviceEstimate*>& usable) {
  // Each count of the range the device has figures for: its own thread count (the estimate's
  // own), the others measured there (the estimate's threads lines); with none, the range's least.
  const int low = *spec.resources.cores, high = std::min(*spec.resources.cores_max, device.shared_cores);
  std::vector<schedulers::Candidate> out;
  if (const auto it = usable.find(device.name); it != usable.end()) {
    const DeviceEstimate& estimate = *it->second;
    if (device.threads >= low && device.threads <= high) {
      schedulers::Candidate at = candidate;
      at.cores = device.threads;
      out.push_back(std::move(at));
    }
    for (const auto& line : estimate.settings) {
      const int count = static_cast<int>(line.setting.value);
      if (line.setting.knob != estimator::kThreadsKnob || count < low || count > high || count == device.threads)
        continue;
      if (const auto there = estimate.at(line.setting)) {
        schedulers::Candidate at = candidate;
        at.cores = count;
        at.estimate = there->placement();
        at.flops_joules.reset();
        out.push_back(std::move(at));
      }
    }
  }
  if (out.empty()) {
    schedulers::Candidate at = candidate;
    at.cores = low;
    out.push_back(std::move(at));
  }
  return out;
}

std::optional<DeviceEstimate> JobService::estimate_as_run(const std::vector<DeviceEstimate>& estimates,
                                                          const adapters::StoredJob& row) const {
  const DeviceEstimate* found = find_estimate(estimates, row.device);
  if (!found) return std::nullopt;
  const Device* device = devices_.find(row.device);
  return at_chosen_cores(*found, row.cores, device ? device->threads : 0);
}

JobFeedback JobService::feedback_of(const adapters::StoredJob& row, const DeviceEstimate& estimate,
                                    std::optional<double> seconds) const {
  const Device* device = devices_.find(row.device);
  return JobFeedback{row.device,
                     estimate,
                     row.energy_joules.value_or(0.0),
                     energy_source_from_string(row.energy_source),
                     row.energy_partial,
                     row.id,
                     row.finished_ms.value_or(0),
                     seconds,
                     static_cast<int>(row.companions.size()) + 1,
                     device ? device->gpu_group : ""};
}

std::optional<schedulers::Estimate> JobService::estimate_for(const Job& job, const std::string& device) const {
  const Device* where = devices_.find(device);
  if (!where || !where->runs_jobs || !schedulers::device_allowed(job.spec.constraints, device)) return std::nullopt;
  const DeviceEstimate* found = find_estimate(job.estimates, device);
  if (!found || !found->ok) return std::nullopt;
  // At the count of cores placement chose, where it chose one.
  const auto estimate = at_chosen_cores(*found, job.row.cores, where->threads);
  if (!estimate) return std::nullopt;
  if (const auto own = setting_of(job.spec.knobs))
    if (const auto at = estimate->at(*own)) return at->placement();
  return estimate->placement();
}

void JobService::enqueue(const Job& job) { core().enqueue(pending_job(job), job.row.sequence); }

void JobService::track_run(const Job& job, const Device& device, schedulers::UnixMillis started) {
  schedulers::TrackedRun run;
  run.id = job.row.id;
  run.device = devices_.index_of(device.name).value();
  for (const auto& name : job.row.companions)
    if (const auto index = devices_.index_of(name)) run.companions.push_back(*index);
  run.priority = job.row.priority;
  run.owner = job.row.owner;
  run.project = job.spec.project;
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
  // The queue's head as it is now; a refresh already working goes on from there.
  refresh_left_.clear();
  for (const auto& id : core().queue().first(limit)) refresh_left_.push_back(id);
  if (refreshing_) return;
  refreshing_ = true;
  refresh_next();
}

void JobService::refresh_next() {
  while (!refresh_left_.empty()) {
    const std::string id = std::move(refresh_left_.front());
    refresh_left_.pop_front();
    const auto it = jobs_.find(id);
    if (it == jobs_.end() || it->second->state != schedulers::JobState::queued) continue;
    const Job& job = *it->second;
    if (!job.spec.model || !job.spec.training) continue;
    estimate_off_loop(job.spec, "estimates: corrected", [this, id](KeptEstimates kept) {
      const TimedWork timed(metrics_, "estimates", clock_);
      const auto found = jobs_.find(id);
      // Compared as the job keeps its figures (6 significant digits): only a job whose estimate
      // moved is stored again, not every queued job at every model change.
      if (found != jobs_.end() && found->second->state == schedulers::JobState::queued &&
          !std::equal(kept.figures.begin(), kept.figures.end(), found->second->estimates.begin(),
                      found->second->estimates.end(),
                      [](const DeviceEstimate& a, const DeviceEstimate& b) { return a.same_figures(b); })) {
        Job& job = *found->second;
        job.row.estimate_json = std::move(kept.stored);
        job.estimates = std::move(kept.figures);
        core().update_pending(pending_job(job));
        ++refresh_changed_;
        persist([row = job.row](adapters::Database& db) { return db.update_job(row); });
        schedule();
      }
      refresh_next();
    });
    return;
  }
  refreshing_ = false;
  if (refresh_changed_ > 0)
    spdlog::info("estimated {} queued job{} again with the new energy model", refresh_changed_,
                 refresh_changed_ == 1 ? "" : "s");
  refresh_changed_ = 0;
}

void JobService::set_policy(schedulers::Policy policy) {
  budgets_.set_policy(std::move(policy));
  for (auto& device : devices_) device.ref = budgets_.device_ref(device.name);
  budgets_.publish(now_ms());
  schedule();
}

BudgetsView JobService::budgets_view() const { return budgets_.view(now_ms(), device_statuses()); }

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

std::string JobService::checked_key(const Job& job, const std::string& device, const estimator::KnobSetting& setting,
                                    const std::string& signature) {
  if (!job.spec.model || !job.spec.training) return {};
  return device + "|" +
         estimator::whole_network_key(signature.empty() ? estimator::network_signature(*job.spec.model) : signature,
                                      job.spec.training->batch_size, job.spec.training->optimizer, &setting);
}

bool JobService::chooses_settings() const {
  return scheduling_ && core().policy().knobs.goal != schedulers::KnobGoal::off;
}

std::vector<int> JobService::core_counts(const std::string& device) const {
  // The queue's head, a bounded number: the jobs about to run, not every queued copy (the book
  // also holds finished jobs, which a walk of all of it would pass over each time).
  constexpr std::size_t kLooked = 4096;
  std::set<int> counts;
  for (const auto& id : core().queue().first(kLooked)) {
    const auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    const Job& job = *it->second;
    const int cores = job.spec.shared_cores();
    if (cores <= 0 || !schedulers::device_allowed(job.spec.constraints, device)) continue;
    counts.insert(cores);
    // A range: its ends too, so that its curve is known as far as it may go.
    if (job.spec.chooses_cores()) counts.insert(*job.spec.resources.cores_max);
  }
  return {counts.begin(), counts.end()};
}

void JobService::place(Job& job, Device& device, const schedulers::Placement& placement) {
  if (listener_) listener_->placing_on(device.name);
  device.hold(job.row.id, placement.cores);
  job.row.device = device.name;
  // The count placement chose, where the job let it (its spec's otherwise); on a device that
  // does not share its cores, the device's own count within the range (what it was weighed at).
  job.row.cores = 0;
  if (job.spec.chooses_cores())
    job.row.cores = placement.cores > 0 ? placement.cores
                                        : std::clamp(device.threads > 0 ? device.threads : *job.spec.resources.cores,
                                                     *job.spec.resources.cores, *job.spec.resources.cores_max);
  // A job on several GPUs holds the others whole too, for its whole run.
  job.row.companions.clear();
  for (const std::size_t m : placement.companions) {
    Device& other = devices_[m];
    if (listener_) listener_->placing_on(other.name);
    other.hold(job.row.id, 0);
    job.row.companions.push_back(other.name);
  }
  // Its estimate there, for usage reports' estimate error: the one placement weighed (at the
  // knob setting chosen), else (a baseline objective reads none) the stored one.
  const auto estimate = placement.estimate ? placement.estimate : estimate_for(job, device.name);
  job.row.estimated_joules = estimate ? std::optional(estimate->joules_mean) : std::nullopt;
  const std::string& note = placement.note;
  job.forget_setting();
  if (placement.setting && placement.at_default && job.spec.knobs.empty())
    job.chosen_setting = Job::ChosenSetting{
        estimator::KnobSetting{placement.setting->knob, placement.setting->value, placement.setting->label},
        std::string(schedulers::to_string(core().policy().knobs.goal)), placement.setting->estimate,
        *placement.at_default};
  store_setting(job);
  if (job.chosen_setting) {
    metrics_.count_knobs(device.name, "chosen");
    const auto& knobs = core().policy().knobs;
    job.setting_check.emplace(
        knobs, job.spec.constraints.max_slowdown ? job.spec.constraints.max_slowdown : knobs.max_slowdown,
        core().policy().warmup_epochs);
  }
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
  if (job.row.started_ms) {
    // Labels bounded by the policy: configured projects, "none", and "other" for the rest.
    const std::string& project = job.spec.project;
    metrics_.add_project_job(project.empty()                            ? "none"
                             : core().policy().tenancy.project(project) ? project
                                                                        : "other",
                             job.row.energy_source, job.row.energy_joules);
  }
  if (device && job.row.energy_joules && job.row.started_ms) {
    metrics_.add_job_energy(device->name, job.row.energy_source, *job.row.energy_joules);
    if (metered_here && listener_ && state == JobState::succeeded) {
      // Compared with its estimate at the cores it ran on, and at the setting chosen for it.
      const std::optional<DeviceEstimate> as_run = estimate_as_run(job.estimates, job.row);
      const DeviceEstimate* estimate = as_run ? &*as_run : nullptr;
      std::optional<DeviceEstimate> at_setting;
      if (const auto ran_at = job.setting_ran_at(); estimate && ran_at && job.knobs_in_force)
        at_setting = estimate->at(*ran_at);
      store_setting(job);  // whether it ran at it, before its controls are released
      if (at_setting) estimate = &*at_setting;
      if (estimate) listener_->finished(feedback_of(job.row, *estimate, job.run_seconds));
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
  if (metered) account_signals(job, *metered);
  budgets_.settle(job.row.id, metered);
  if (device && job.row.started_ms) device->work_seconds += run_seconds(job).value_or(0.0);
  release_controls(job, /*ended=*/true);
  release_device(job);
  transition(job, state, reason);
  schedule();
}

void JobService::account_signals(Job& job, adapters::StoredEnergyUse& metered) {
  const auto from = *job.row.started_ms, to = job.row.finished_ms.value_or(now_ms());
  // A value and its label: an agent's own signal where its node reported one, else this node's.
  struct Figure {
    double value = 0.0;
    std::string label;
    std::string currency;
  };
  const Device* device = devices_.find(job.row.device);
  auto figure = [&](const GridSignalFeed* feed,
                    const std::shared_ptr<const cluster::ReportedSignal>& reported) -> std::optional<Figure> {
    if (reported)
      return Figure{reported->signal.mean_extended(from, std::max(to, from + 1)),
                    fmt::format("node {}: {}", device->node, reported->label), reported->currency};
    if (const auto mean = feed ? feed->mean_over(from, to) : std::nullopt)
      return Figure{*mean, feed->over(from, to).label(), feed->currency()};
    return std::nullopt;
  };
  if (const auto intensity = figure(carbon_, device ? device->reported_carbon : nullptr)) {
    const double grams = *job.row.energy_joules / 3.6e6 * intensity->value;
    job.row.carbon_grams = grams;
    job.row.carbon_intensity = intensity->value;
    job.row.carbon_signal = intensity->label;
    metered.grams = grams;
    metrics_.add_job_carbon(job.row.device, job.row.energy_source, grams);
  }
  if (const auto price = figure(price_, device ? device->reported_price : nullptr)) {
    const double cost = *job.row.energy_joules / 3.6e6 * price->value;
    job.row.cost = cost;
    job.row.cost_price = price->value;
    job.row.cost_currency = price->currency;
    job.row.cost_signal = price->label;
    metered.cost = cost;
    metrics_.add_job_cost(job.row.device, job.row.energy_source, price->currency, cost);
  }
}

void JobService::release_device(Job& job) {
  for (const auto& name : job.row.companions)
    if (Device* other = devices_.find(name)) other->release(job.row.id);
  if (Device* device = devices_.find(job.row.device); device && device->holds_job(job.row.id)) {
    device->release(job.row.id);
    return;
  }
  for (auto& device : devices_) device.release(job.row.id);  // placed somewhere it no longer names
}

void JobService::unplace(Job& job, const std::string& why) {
  // Nothing ran it and the database still holds it queued: memory goes back to that.
  constexpr std::int64_t kRetryAfterMs = 5000;
  spdlog::warn("job {}: {}; it waits in the queue, placing again in {} s", job.row.id, why, kRetryAfterMs / 1000);
  executor_for(job.row.device).release(job, /*ended=*/true);
  release_device(job);
  if (!job.events.empty() && job.events.back().state == "placed") job.events.pop_back();
  job.forget_setting();
  // Nor is its placement written again once the database takes writes.
  if (auto unsaved = unsaved_.find(job.row.id); unsaved != unsaved_.end()) {
    auto& events = unsaved->second.events;
    if (!events.empty() && events.back().state == "placed") events.pop_back();
  }
  job.row.device.clear();
  job.row.companions.clear();
  job.row.cores = 0;
  set_state(job, JobState::queued);
  enqueue(job);
  refresh_state_metrics();
  placing_paused_until_ = now_ms() + kRetryAfterMs;
  schedule_retry(*placing_paused_until_);
}

void JobService::requeue(Job& job, const std::string& why) {
  job.row.device.clear();
  job.row.companions.clear();
  job.row.cores = 0;
  job.row.pid = 0;
  job.forget_run_reports();  // and the setting chosen for that run
  transition(job, JobState::queued, why);
  enqueue(job);
}

void JobService::sample_meters() {
  {
    const TimedWork timed(metrics_, "sample", clock_);  // its placement pass is counted as placement
    // Every running job's CPU time that this sample reads, in one walk of /proc.
    local_->begin_sample([this](const std::string& name) {
      const Device* device = devices_.find(name);
      return device && (device->meter->cpu_time_model() || device->shared_cores > 0);
    });
    struct EndSample {
      LocalExecutor& local;
      ~EndSample() { local.end_sample(); }
    } end_sample{*local_};
    // A meter that shares its counter (a MIG device's) splits each interval among the devices
    // with work: a job held there, or a probe.
    for (auto& device : devices_)
      if (auto* shared = device.meter->shared_gpu_counter())
        shared->set_busy(!device.idle() || (listener_ && listener_->probing(device.name)));
    for (const auto& sample : devices_.sample(clock_.steady())) {
      // Several jobs on one device's cores: each is given its share of what the meter read.
      if (sample.device->shared_cores > 0 && !sample.device->on_agent() && !sample.device->idle())
        local_->share_sample(*sample.device, sample.joules, sample.seconds);
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
  }
  schedule();
}

void JobService::track_running(schedulers::UnixMillis now) {
  // Each running job's energy so far and what it should still need feed the ledger; then the
  // throttle controller looks at caps, budgets and floors.
  std::vector<schedulers::RunningSample> samples;
  for (std::size_t d = 0; d < devices_.size(); ++d) {
    Device& device = devices_[d];
    for (const DeviceHold& hold : device.holds) {
      auto it = jobs_.find(hold.job);
      if (it == jobs_.end()) continue;
      Job& job = *it->second;
      if (job.state != JobState::running && job.state != JobState::throttled) continue;
      // A job on several GPUs is sampled once, on its own device (it sums the others').
      if (job.row.device != device.name) continue;
      Executor& executor = executor_for(device);
      const std::optional<double> metered = executor.energy_as_sampled(job, device);
      job.used_joules = metered;          // shown as energy_so_far
      job.used_source = executor.source_so_far(job, device);
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
      // What a CPU quota is a fraction of: its own cores where it asked for some.
      sample.controls.cpus = job.run_cores() > 0
                                 ? static_cast<double>(job.run_cores())
                                 : static_cast<double>(std::max(1u, std::thread::hardware_concurrency()));
      samples.push_back(std::move(sample));
    }
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

void JobService::check_setting(Job& job, Device& device) {
  if (!job.setting_check || !job.chosen_setting || job.setting_check_noted || !job.last_report) return;
  const auto step = job.setting_check->on_report(*job.last_report);
  const auto& setting = job.chosen_setting->setting;
  if (step == schedulers::SettingCheck::Step::to_defaults) {
    executor_for(device).switch_setting(job, device, true);
    note(job, fmt::format("checking {} {}: epoch {} runs at the device's defaults", setting.knob, setting.label,
                          job.last_report->epoch + 1));
  } else if (step == schedulers::SettingCheck::Step::to_setting) {
    executor_for(device).switch_setting(job, device, false);
  }
  const auto& result = job.setting_check->result();
  if (!result) return;
  job.setting_check_noted = true;
  if (result->setting_epoch > 0) metrics_.count_knobs(device.name, result->kept ? "check-kept" : "check-defaults");
  if (result->setting_epoch > 0)
    note(job, fmt::format("{} {} checked in epochs {} and {}: {}", setting.knob, setting.label, result->setting_epoch,
                          result->default_epoch, result->why));
  if (const auto key = checked_key(job, device.name, setting); !key.empty() && result->setting_epoch > 0)
    checked_settings_[key] = *result;
  // The verdict joins the row: a restart shows it, and remembers it for the next job.
  store_setting(job);
  persist([row = job.row](adapters::Database& db) { return db.update_job(row); });
}

void JobService::store_setting(Job& job) const {
  if (!job.chosen_setting) {
    job.row.chosen_setting.clear();
    return;
  }
  // In force now: a job adopted after a restart is not (jouled put its device's settings back as
  // it started), and its energy, partial, teaches nothing anyway.
  StoredSetting stored{*job.chosen_setting, std::nullopt, job.knobs_in_force.has_value(), {}};
  if (const auto* check = job.check_result()) {
    stored.check = *check;
    if (check->setting_epoch > 0) stored.checked_key = checked_key(job, job.row.device, job.chosen_setting->setting);
  }
  job.row.chosen_setting = write_stored_setting(stored);
}

void JobService::recall_checked_setting(const Job& job) {
  const auto stored = read_stored_setting(job.row.chosen_setting);
  if (stored && stored->check && stored->check->setting_epoch > 0 && !stored->checked_key.empty())
    checked_settings_[stored->checked_key] = *stored->check;
}

Result<ProgressAnswer> JobService::report_progress(const std::string& id, const ProgressReport& report) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return not_in_memory(id, "is {}, not running");
  Job& job = *it->second;
  if (job.state != JobState::running && job.state != JobState::throttled)
    return make_error(ErrorCode::conflict, fmt::format("job {} is {}, not running", id, job.row.state));
  const auto epoch = report.epoch;
  const auto epochs = report.epochs;
  if (job.last_report && epoch <= job.last_report->epoch)
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("epoch {} was already reported (last: {})", epoch, job.last_report->epoch), "/epoch");
  job.training_figures = report.figures;

  Device* device = devices_.find(job.row.device);
  std::optional<double> used;
  if (device) used = executor_for(*device).energy_so_far(job, *device, nullptr);
  ProgressAnswer out;
  if (!used) {
    out.note = "the device's meter could not be read: no projection from this report";
    return out;
  }
  const bool first_projection = !(job.projection && job.projection->step);
  job.last_report = schedulers::EpochReport{static_cast<int>(epoch), static_cast<int>(epochs), *used, now_ms()};
  const schedulers::Projection* projection = core().report(id, *job.last_report);
  if (!projection) {
    out.note = "the job is not running here: no projection from this report";
    return out;
  }
  job.projection = *projection;
  check_setting(job, *device);
  const std::string source = executor_for(*device).source_so_far(job, *device);
  out.joules = *used;
  out.source = source;
  out.partial = job.row.energy_partial;
  out.projection = job.projection;
  if (first_projection && job.projection->step) {
    job.events.push_back(
        StoredEvent{id, now_ms(), job.row.state,
                    fmt::format("STEP projection after epoch {} of {}: {:.0f} J ({} joules, {})", epoch, epochs,
                                job.projection->total.mean_joules, source, job.projection->method)});
    persist_job(job, false, [event = job.events.back()](adapters::Database& db) { return db.insert_event(event); });
  }
  return out;
}

}  // namespace joule::daemon
