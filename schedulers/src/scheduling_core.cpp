#include "joule/schedulers/scheduling_core.hpp"

#include <algorithm>
#include <cmath>

namespace joule::schedulers {
namespace {

// Uses older than every window are forgotten this often: it frees memory and changes no decision.
constexpr UnixMillis kPruneEvery = 3'600'000;

UnixMillis after_seconds(UnixMillis from, double seconds) {
  return from + static_cast<UnixMillis>(std::llround(std::max(0.0, seconds) * 1000.0));
}

}  // namespace

SchedulingCore::SchedulingCore(Policy policy, int utc_offset_minutes, CoreOptions options)
    : policy_(std::move(policy)),
      options_(options),
      ledger_(utc_offset_minutes),
      placer_(policy_, PlacementOptions{.max_scan = options.max_scan, .max_explain = options.max_explain}),
      throttle_(policy_) {
  ledger_.set_policy(policy_);
}

void SchedulingCore::set_policy(Policy policy) {
  policy_ = std::move(policy);
  ledger_.set_policy(policy_);
  placer_.set_policy(policy_);
  throttle_.set_policy(policy_);
}

std::optional<WaitReason> SchedulingCore::never_fits(UnixMillis now, std::span<const DeviceStatus> devices,
                                                     const PendingJob& job) const {
  return placer_.never_fits(now, devices, job, ledger_);
}

void SchedulingCore::enqueue(PendingJob job, std::int64_t sequence) {
  if (running_.contains(job.id)) end(job.id, std::nullopt);
  queue_.push(job.id, job.priority, sequence);
  std::string id = job.id;
  pending_.insert_or_assign(std::move(id), std::move(job));
}

void SchedulingCore::update_pending(PendingJob job) {
  auto it = pending_.find(job.id);
  if (it != pending_.end()) it->second = std::move(job);
}

void SchedulingCore::dequeue(const std::string& id) {
  queue_.erase(id);
  pending_.erase(id);
}

const PendingJob* SchedulingCore::pending(const std::string& id) const {
  auto it = pending_.find(id);
  return it == pending_.end() ? nullptr : &it->second;
}

std::vector<DeviceStatus> SchedulingCore::with_expectations(UnixMillis now, std::vector<DeviceStatus> devices) const {
  for (const auto& [id, run] : running_) {
    if (run.device >= devices.size()) continue;
    DeviceStatus& status = devices[run.device];
    if (run.projection && run.projection->seconds_remaining > 0)
      status.busy_until = after_seconds(now, run.projection->seconds_remaining);
    else if (run.expected_seconds)
      status.busy_until = after_seconds(run.started, *run.expected_seconds);
  }
  return devices;
}

PassResult SchedulingCore::place(UnixMillis now, std::vector<DeviceStatus> devices) {
  retry_at_.reset();
  if (now - last_prune_ > kPruneEvery) {
    ledger_.prune(now);
    last_prune_ = now;
  }
  scanned_.clear();
  // With no device free the placer explains the first max_explain jobs and places nothing; the
  // rest of a full scan was gathered (and then re-labelled by jouled) on every submission, work
  // that grew with the queue up to max_scan (issue 32: 0.4x the submission rate at 1,000 queued).
  const bool any_free = std::any_of(devices.begin(), devices.end(),
                                    [](const DeviceStatus& device) { return device.accepts_work && !device.busy; });
  const std::size_t scan = any_free ? options_.max_scan : std::min(options_.max_scan, options_.max_explain);
  for (const auto& id : queue_.first(scan)) scanned_.push_back(&pending_.at(id));
  if (scanned_.empty()) return {};
  devices = with_expectations(now, std::move(devices));
  PassResult result = placer_.decide(now, devices, scanned_, ledger_);
  retry_at_ = result.next_retry;
  for (const auto& placement : result.placements) {
    auto it = pending_.find(placement.job);
    if (it == pending_.end()) continue;
    TrackedRun run;
    run.id = placement.job;
    run.device = placement.device;
    run.priority = it->second.priority;
    run.started = now;
    // What it is expected to use: its estimate there, else its own max_energy_joules.
    if (placement.reserve.mean_joules > 0) run.prior = placement.reserve;
    if (placement.estimate) run.expected_seconds = placement.estimate->seconds_mean;
    ledger_.reserve(run.id, devices[placement.device].ref, placement.reserve);
    queue_.erase(placement.job);
    std::replace(scanned_.begin(), scanned_.end(), static_cast<const PendingJob*>(&it->second),
                 static_cast<const PendingJob*>(nullptr));
    pending_.erase(it);
    running_.insert_or_assign(run.id, std::move(run));
  }
  return result;
}

EnergyDistribution SchedulingCore::still_expected(const TrackedRun& run) const {
  const std::optional<EnergyDistribution> expected = run.projection ? std::optional(run.projection->total) : run.prior;
  if (!expected) return {};
  return {std::max(0.0, expected->mean_joules - run.used_joules), expected->variance};
}

std::vector<ThrottleAction> SchedulingCore::track(UnixMillis now, std::vector<DeviceStatus> devices,
                                                  std::vector<RunningSample> samples) {
  std::vector<RunningJob> views;
  views.reserve(samples.size());
  for (auto& sample : samples) {
    auto it = running_.find(sample.id);
    if (it == running_.end()) continue;
    TrackedRun& run = it->second;
    if (sample.started) run.started = *sample.started;
    run.used_joules = sample.used_joules.value_or(0.0);
    const EnergyDistribution still = still_expected(run);
    ledger_.update_running(run.id, run.started, now, run.used_joules, still);
    RunningJob view = std::move(sample.controls);
    view.id = run.id;
    view.device = run.device;
    view.priority = run.priority;
    view.still_expected = still;
    views.push_back(std::move(view));
  }
  if (!options_.throttle || views.empty()) return {};
  return throttle_.evaluate(now, with_expectations(now, std::move(devices)), views, ledger_);
}

std::optional<UnixMillis> SchedulingCore::wake_at(UnixMillis now) const {
  std::optional<UnixMillis> next;
  auto consider = [&](UnixMillis t) {
    if (t > now) next = next ? std::min(*next, t) : t;
  };
  if (queue_.size() == 0) return next;
  if (retry_at_) consider(*retry_at_);
  for (const auto& state : ledger_.states(now))
    if (state.resets_at) consider(*state.resets_at);
  return next;
}

void SchedulingCore::track_run(TrackedRun run, const DeviceRef& device) {
  queue_.erase(run.id);
  pending_.erase(run.id);
  if (run.prior) ledger_.reserve(run.id, device, *run.prior);
  if (!run.reports.empty() && !run.projection) {
    StepOptions step;
    step.warmup_epochs = policy_.warmup_epochs;
    run.projection = project_energy(run.reports, run.prior, step);
  }
  std::string id = run.id;
  running_.insert_or_assign(std::move(id), std::move(run));
}

const Projection* SchedulingCore::report(const std::string& id, EpochReport report) {
  auto it = running_.find(id);
  if (it == running_.end()) return nullptr;
  TrackedRun& run = it->second;
  run.reports.push_back(report);
  StepOptions step;
  step.warmup_epochs = policy_.warmup_epochs;
  run.projection = project_energy(run.reports, run.prior, step);
  return &*run.projection;
}

std::optional<EnergyUse> SchedulingCore::paused(const std::string& id, UnixMillis now) {
  return ledger_.pause_running(id, now);
}

void SchedulingCore::resumed(const std::string& id, UnixMillis now) { ledger_.resume_running(id, now); }

std::optional<EnergyUse> SchedulingCore::end(const std::string& id, std::optional<EnergyUse> metered) {
  throttle_.forget(id);
  running_.erase(id);
  return ledger_.settle(id, std::move(metered));
}

const TrackedRun* SchedulingCore::running(const std::string& id) const {
  auto it = running_.find(id);
  return it == running_.end() ? nullptr : &it->second;
}

}  // namespace joule::schedulers
