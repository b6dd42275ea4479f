#include "joule/schedulers/scheduling_core.hpp"

#include <algorithm>
#include <cmath>

namespace joule::schedulers {
namespace {

// Uses older than every window are forgotten this often: it frees memory and changes no decision.
constexpr UnixMillis kPruneEvery = 3'600'000;

// A job's candidates in the order the policy's objective walks them, unless they are already
// (ordered when queued or updated; again only after a policy with another objective).
void order_for(PendingJob& job, Objective objective) {
  if (job.order.objective == objective &&
      (!walks_cheapest_first(objective) || job.order.cheapest_first.size() == job.candidates.size()))
    return;
  order_candidates(job, objective);
}

UnixMillis after_seconds(UnixMillis from, double seconds) {
  return from + static_cast<UnixMillis>(std::llround(std::max(0.0, seconds) * 1000.0));
}

// A placement as its driver will report it from now on: its device, and a job on several GPUs'
// others, held.
void hold(std::vector<DeviceStatus>& devices, const Placement& placement) {
  devices[placement.device].hold(placement.cores);
  for (const std::size_t m : placement.companions) devices[m].hold(0);
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
  open_.reset();
  policy_ = std::move(policy);
  if (has_owner_templates()) return expand_owner_budgets(/*always=*/true);
  budget_owners_.clear();
  ledger_.set_policy(policy_);
  placer_.set_policy(policy_);
  throttle_.set_policy(policy_);
}

bool SchedulingCore::lacks_owner_budgets(const std::string& owner) const {
  return !owner.empty() && has_owner_templates() &&
         !std::binary_search(budget_owners_.begin(), budget_owners_.end(), owner);
}

bool SchedulingCore::has_owner_templates() const {
  return std::any_of(policy_.budgets.begin(), policy_.budgets.end(),
                     [](const EnergyBudget& budget) { return budget.each_owner; });
}

void SchedulingCore::expand_owner_budgets(bool always) {
  // New owners are rare (a first submission): the whole policy is set again then, and the
  // ledger counts each new budget's past uses as it does on a reload.
  std::vector<std::string> owners = ledger_.owners();
  for (const auto& [id, job] : pending_) owners.push_back(job.owner);
  for (const auto& [id, run] : running_) owners.push_back(run.owner);
  std::sort(owners.begin(), owners.end());
  owners.erase(std::unique(owners.begin(), owners.end()), owners.end());
  owners.erase(std::remove(owners.begin(), owners.end(), std::string()), owners.end());
  if (!always && owners == budget_owners_) return;
  open_.reset();
  budget_owners_ = owners;
  Policy expanded = policy_;
  expanded.budgets = budgets_for_owners(policy_.budgets, owners);
  ledger_.set_policy(expanded);
  placer_.set_policy(expanded);
  throttle_.set_policy(expanded);
}

std::optional<WaitReason> SchedulingCore::never_fits(UnixMillis now, std::span<const DeviceStatus> devices,
                                                     const PendingJob& job) const {
  return placer_.never_fits(now, devices, job, ledger_);
}

void SchedulingCore::enqueue(PendingJob job, std::int64_t sequence) {
  if (running_.contains(job.id)) end(job.id, std::nullopt);
  if (const auto old = pending_.find(job.id); old != pending_.end()) {
    open_.reset();  // queued again: the open pass weighed it as it was
    count(old->second.owner, old->second.project, -1, 0);
  }
  count(job.owner, job.project, 1, 0);
  const bool new_owner = lacks_owner_budgets(job.owner);
  queue_.push(job.id, job.priority, sequence);
  if (open_) {
    // Behind every job the open pass saw: it may continue with this one. Ahead of any: not.
    if (queue_.position(job.id) == queue_.size() - 1)
      open_->queued_since.push_back(job.id);
    else
      open_.reset();
  }
  order_candidates(job, policy_.objective);  // here, not in a pass: its cost is the submission's
  std::string id = job.id;
  pending_.insert_or_assign(std::move(id), std::move(job));
  if (new_owner) expand_owner_budgets(/*always=*/false);  // its own budgets before it is weighed
}

void SchedulingCore::update_pending(PendingJob job) {
  auto it = pending_.find(job.id);
  if (it == pending_.end()) return;
  open_.reset();  // its candidates changed: the pass that weighed the old ones is not continued
  count(it->second.owner, it->second.project, -1, 0);
  count(job.owner, job.project, 1, 0);
  it->second = std::move(job);
  order_candidates(it->second, policy_.objective);
}

void SchedulingCore::dequeue(const std::string& id) {
  open_.reset();
  queue_.erase(id);
  if (const auto it = pending_.find(id); it != pending_.end()) {
    count(it->second.owner, it->second.project, -1, 0);
    pending_.erase(it);
  }
}

const PendingJob* SchedulingCore::pending(const std::string& id) const {
  auto it = pending_.find(id);
  return it == pending_.end() ? nullptr : &it->second;
}

std::vector<DeviceStatus> SchedulingCore::with_expectations(UnixMillis now, std::vector<DeviceStatus> devices) const {
  for (const auto& [id, run] : running_) {
    if (run.device >= devices.size()) continue;
    DeviceStatus& status = devices[run.device];
    // Several jobs may share a device's cores: it is wholly free when the last one ends.
    std::optional<UnixMillis> until;
    if (run.projection && run.projection->seconds_remaining > 0)
      until = after_seconds(now, run.projection->seconds_remaining);
    else if (run.expected_seconds)
      until = after_seconds(run.started, *run.expected_seconds);
    if (!until) continue;
    status.busy_until = std::max(status.busy_until.value_or(*until), *until);
    for (const std::size_t m : run.companions)
      if (m < devices.size()) devices[m].busy_until = std::max(devices[m].busy_until.value_or(*until), *until);
  }
  return devices;
}

PassResult SchedulingCore::place(UnixMillis now, std::vector<DeviceStatus> devices) {
  if (continues(now, devices)) return continue_pass(now);
  open_.reset();
  retry_at_.reset();
  if (now - last_prune_ > kPruneEvery) {
    ledger_.prune(now);
    last_prune_ = now;
  }
  scanned_.clear();
  // With no device free the placer explains the first max_explain jobs and places nothing; the
  // rest of a full scan was gathered (and then re-labelled by jouled) on every submission, work
  // that grew with the queue up to max_scan (issue 32: 0.4x the submission rate at 1,000 queued).
  const bool any_free =
      std::any_of(devices.begin(), devices.end(), [](const DeviceStatus& device) { return device.takes_work(); });
  const std::size_t scan = any_free ? options_.max_scan : std::min(options_.max_scan, options_.max_explain);
  for (const auto& id : queue_.first(scan)) {
    PendingJob& job = pending_.at(id);
    order_for(job, policy_.objective);  // a new objective since it was queued
    scanned_.push_back(&job);
  }
  if (scanned_.empty()) return {};
  order_by_fair_share(now);
  const bool reaches_tail = scanned_.size() == queue_.size();
  std::vector<DeviceStatus> given;
  if (options_.continue_within_ms > 0) given = devices;
  devices = with_expectations(now, std::move(devices));
  PassState state = placer_.begin(now, devices, ledger_, running_by_tenant());
  PassResult result = placer_.extend(state, now, devices, scanned_, ledger_);
  retry_at_ = result.next_retry;
  start_runs(now, result, devices);
  if (options_.continue_within_ms > 0) {
    OpenPass open;
    open.began = now;
    open.until = std::min(now + options_.continue_within_ms, wake_at(now).value_or(now + options_.continue_within_ms));
    open.ledger_revision = ledger_.revision();
    open.given = std::move(given);
    for (const auto& placement : result.placements) hold(open.given, placement);  // as it will be told
    open.expected = std::move(devices);
    open.state = std::move(state);
    open.reaches_tail = reaches_tail && result.considered == scanned_.size();
    open.scan_left = scan - scanned_.size();
    open_ = std::move(open);
  }
  return result;
}

bool SchedulingCore::continues(UnixMillis now, const std::vector<DeviceStatus>& devices) const {
  if (!open_ || now < open_->began || now >= open_->until || ledger_.revision() != open_->ledger_revision) return false;
  if (devices.size() != open_->given.size()) return false;
  // Only what a pass reads of a device (power only under a cap, as only caps read it).
  const bool capped = !policy_.power_caps.empty();
  for (std::size_t d = 0; d < devices.size(); ++d) {
    const DeviceStatus& a = devices[d];
    const DeviceStatus& b = open_->given[d];
    if (a.accepts_work != b.accepts_work || a.busy != b.busy || a.cores != b.cores || a.cores_held != b.cores_held ||
        a.busy_until != b.busy_until || a.battery_percent != b.battery_percent ||
        a.battery_capacity_joules != b.battery_capacity_joules || a.work_seconds != b.work_seconds ||
        a.carbon != b.carbon || a.price != b.price || (capped && a.average_power_watts != b.average_power_watts) ||
        a.ref.name != b.ref.name || a.ref.node != b.ref.node || a.ref.groups != b.ref.groups || a.group != b.group)
      return false;
  }
  return true;
}

PassResult SchedulingCore::continue_pass(UnixMillis now) {
  OpenPass& open = *open_;
  scanned_.clear();
  for (const auto& id : open.queued_since) {
    auto it = pending_.find(id);
    if (it == pending_.end()) continue;
    if (!open.reaches_tail || open.scan_left == 0) {
      open.reaches_tail = false;  // this one and every later one wait behind the jobs not reached
      break;
    }
    scanned_.push_back(&it->second);  // ordered when queued, under this policy (a new one ends the pass)
    --open.scan_left;
  }
  open.queued_since.clear();
  PassResult result;
  if (!scanned_.empty()) result = placer_.extend(open.state, now, open.expected, scanned_, ledger_);
  result.continued = true;
  if (result.considered < scanned_.size()) open.reaches_tail = false;  // the placer stopped
  if (result.next_retry) {
    retry_at_ = std::min(retry_at_.value_or(*result.next_retry), *result.next_retry);
    open.until = std::min(open.until, *result.next_retry);
  }
  start_runs(now, result, open.expected);
  for (const auto& placement : result.placements) hold(open.given, placement);  // as it will be told
  open.ledger_revision = ledger_.revision();
  return result;
}

void SchedulingCore::start_runs(UnixMillis now, const PassResult& result, std::span<const DeviceStatus> devices) {
  for (const auto& placement : result.placements) {
    auto it = pending_.find(placement.job);
    if (it == pending_.end()) continue;
    TrackedRun run;
    run.id = placement.job;
    run.device = placement.device;
    run.companions = placement.companions;
    run.priority = it->second.priority;
    run.owner = it->second.owner;
    run.project = it->second.project;
    run.started = now;
    // What it is expected to use: its estimate there, else its own max_energy_joules.
    if (placement.reserve.mean_joules > 0) run.prior = placement.reserve;
    if (placement.estimate) run.expected_seconds = placement.estimate->seconds_mean;
    ledger_.reserve(run.id, devices[placement.device].ref, placement.reserve, run.owner, run.project, placement.rates);
    queue_.erase(placement.job);
    std::replace(scanned_.begin(), scanned_.end(), static_cast<const PendingJob*>(&it->second),
                 static_cast<const PendingJob*>(nullptr));
    count(run.owner, run.project, -1, 1);
    pending_.erase(it);
    running_.insert_or_assign(run.id, std::move(run));
  }
}

EnergyDistribution SchedulingCore::still_expected(const TrackedRun& run) const {
  const std::optional<EnergyDistribution> expected = run.projection ? std::optional(run.projection->total) : run.prior;
  if (!expected) return {};
  return {std::max(0.0, expected->mean_joules - run.used_joules), expected->variance};
}

std::vector<ThrottleAction> SchedulingCore::track(UnixMillis now, std::vector<DeviceStatus> devices,
                                                  std::vector<RunningSample> samples) {
  open_.reset();
  std::vector<RunningJob> views;
  views.reserve(samples.size());
  for (auto& sample : samples) {
    auto it = running_.find(sample.id);
    if (it == running_.end()) continue;
    TrackedRun& run = it->second;
    if (sample.started) run.started = *sample.started;
    run.used_joules = sample.used_joules.value_or(0.0);
    const EnergyDistribution still = still_expected(run);
    // Grams and money budgets: its joules so far at the signals since it started, what is still
    // to come at theirs over what is left of its run (its projection, else its estimate).
    UseRates spent_rates, ahead_rates;
    if (run.device < devices.size()) {
      const DeviceStatus& device = devices[run.device];
      spent_rates = rates_over(device, run.started, now);
      std::optional<UnixMillis> until;
      if (run.projection && run.projection->seconds_remaining > 0)
        until = after_seconds(now, run.projection->seconds_remaining);
      else if (run.expected_seconds)
        until = after_seconds(run.started, *run.expected_seconds);
      ahead_rates = rates_over(device, now, std::max(now, until.value_or(now)));
    }
    ledger_.update_running(run.id, run.started, now, run.used_joules, still, spent_rates, ahead_rates);
    RunningJob view = std::move(sample.controls);
    view.id = run.id;
    view.device = run.device;
    view.priority = run.priority;
    view.owner = run.owner;
    view.project = run.project;
    view.still_expected = still;
    view.rates = ahead_rates;
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
  open_.reset();
  queue_.erase(run.id);
  if (const auto queued = pending_.find(run.id); queued != pending_.end()) {
    count(queued->second.owner, queued->second.project, -1, 0);
    pending_.erase(queued);
  }
  if (const auto old = running_.find(run.id); old != running_.end())
    count(old->second.owner, old->second.project, 0, -1);
  count(run.owner, run.project, 0, 1);
  if (run.prior) ledger_.reserve(run.id, device, *run.prior, run.owner, run.project);
  if (!run.reports.empty() && !run.projection) {
    StepOptions step;
    step.warmup_epochs = policy_.warmup_epochs;
    run.projection = project_energy(run.reports, run.prior, step);
  }
  const bool new_owner = lacks_owner_budgets(run.owner);
  std::string id = run.id;
  running_.insert_or_assign(std::move(id), std::move(run));
  if (new_owner) expand_owner_budgets(/*always=*/false);
}

const Projection* SchedulingCore::report(const std::string& id, EpochReport report) {
  open_.reset();
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
  auto use = ledger_.pause_running(id, now);
  if (const auto it = running_.find(id); it != running_.end()) remember_use(it->second, use);
  return use;
}

void SchedulingCore::resumed(const std::string& id, UnixMillis now) { ledger_.resume_running(id, now); }

std::optional<EnergyUse> SchedulingCore::end(const std::string& id, std::optional<EnergyUse> metered) {
  open_.reset();
  throttle_.forget(id);
  const auto it = running_.find(id);
  if (metered && it != running_.end()) {
    // Its owners' and projects' budgets count it (a run with nothing reserved is not in the ledger).
    if (metered->owner.empty()) metered->owner = it->second.owner;
    if (metered->project.empty()) metered->project = it->second.project;
  }
  auto use = ledger_.settle(id, std::move(metered));
  if (it != running_.end()) {
    remember_use(it->second, use);
    count(it->second.owner, it->second.project, 0, -1);
    running_.erase(it);
  }
  return use;
}

const TrackedRun* SchedulingCore::running(const std::string& id) const {
  auto it = running_.find(id);
  return it == running_.end() ? nullptr : &it->second;
}

TenantUse SchedulingCore::owner_use(const std::string& owner) const {
  const auto it = owner_use_.find(owner);
  return it == owner_use_.end() ? TenantUse{} : it->second;
}

TenantUse SchedulingCore::project_use(const std::string& project) const {
  const auto it = project_use_.find(project);
  return it == project_use_.end() ? TenantUse{} : it->second;
}

void SchedulingCore::count(const std::string& owner, const std::string& project, int queued, int running) {
  auto add = [&](std::unordered_map<std::string, TenantUse>& uses, const std::string& name) {
    TenantUse& use = uses[name];
    use.queued = static_cast<std::size_t>(static_cast<std::ptrdiff_t>(use.queued) + queued);
    use.running = static_cast<std::size_t>(static_cast<std::ptrdiff_t>(use.running) + running);
    if (use.queued == 0 && use.running == 0) uses.erase(name);  // owners come and go: no entry per owner ever seen
  };
  add(owner_use_, owner);
  if (!project.empty()) add(project_use_, project);
}

RunningByTenant SchedulingCore::running_by_tenant() const {
  RunningByTenant running;
  if (!policy_.tenancy.limits_running()) return running;
  for (const auto& [owner, use] : owner_use_)
    if (use.running > 0) running.owners.emplace(owner, use.running);
  for (const auto& [project, use] : project_use_)
    if (use.running > 0) running.projects.emplace(project, use.running);
  return running;
}

namespace {
// Recent use decayed below a joule is no use: shares of a vanishing total would still rank
// whoever left the last crumb behind everyone else.
constexpr double kForgottenJoules = 1.0;
}  // namespace

double DecayedUse::at(UnixMillis now, std::int64_t half_life_seconds) const {
  if (joules <= 0.0 || now <= as_of) return joules;
  return joules * std::exp2(-static_cast<double>(now - as_of) / (1000.0 * static_cast<double>(half_life_seconds)));
}

void DecayedUse::add(double more, UnixMillis when, std::int64_t half_life_seconds) {
  joules = at(std::max(when, as_of), half_life_seconds) + std::max(0.0, more);
  as_of = std::max(when, as_of);
}

double SchedulingCore::recent_joules_of_owner(const std::string& owner, UnixMillis now) const {
  const auto it = owner_recent_.find(owner);
  return it == owner_recent_.end() ? 0.0 : it->second.at(now, policy_.tenancy.usage_half_life_seconds);
}

double SchedulingCore::recent_joules_of_project(const std::string& project, UnixMillis now) const {
  const auto it = project_recent_.find(project);
  return it == project_recent_.end() ? 0.0 : it->second.at(now, policy_.tenancy.usage_half_life_seconds);
}

void SchedulingCore::remember_use(const TrackedRun& run, const std::optional<EnergyUse>& use) {
  if (use) add_recent_use(run.owner, run.project, use->joules, use->end);
}

void SchedulingCore::add_recent_use(const std::string& owner, const std::string& project, double joules,
                                    UnixMillis at) {
  if (!(joules > 0.0)) return;
  const std::int64_t half_life = policy_.tenancy.usage_half_life_seconds;
  owner_recent_[owner].add(joules, at, half_life);
  if (!project.empty()) project_recent_[project].add(joules, at, half_life);
}

std::vector<double> SchedulingCore::fair_share_factors(std::span<const PendingJob* const> jobs, UnixMillis now) const {
  const std::int64_t half_life = policy_.tenancy.usage_half_life_seconds;
  // factor(name) = 2^(−(use / total use) / (shares / total shares)) over the active names: those
  // with recent use and those with a job here.
  auto factors = [&](const std::unordered_map<std::string, DecayedUse>& recent, auto name_of, auto shares_of) {
    std::unordered_map<std::string, double> use;
    for (const auto& [name, decayed] : recent)
      if (const double joules = decayed.at(now, half_life); joules >= kForgottenJoules) use[name] = joules;
    for (const PendingJob* job : jobs)
      if (job && !name_of(*job).empty()) use.try_emplace(name_of(*job), 0.0);
    double total_use = 0.0, total_shares = 0.0;
    for (const auto& [name, joules] : use) {
      total_use += joules;
      total_shares += shares_of(name);
    }
    std::unordered_map<std::string, double> out;
    for (const auto& [name, joules] : use)
      out[name] = total_use > 0.0 ? std::exp2(-(joules / total_use) / (shares_of(name) / total_shares)) : 1.0;
    return out;
  };
  const auto by_owner = factors(
      owner_recent_, [](const PendingJob& job) -> const std::string& { return job.owner; },
      [](const std::string&) { return 1.0; });
  const auto by_project = factors(
      project_recent_, [](const PendingJob& job) -> const std::string& { return job.project; },
      [&](const std::string& name) {
        const Project* project = policy_.tenancy.project(name);
        return project ? project->shares : 1.0;
      });
  std::vector<double> out;
  out.reserve(jobs.size());
  for (const PendingJob* job : jobs) {
    if (!job) {
      out.push_back(1.0);
      continue;
    }
    const auto owner = by_owner.find(job->owner);
    const auto project = job->project.empty() ? by_project.end() : by_project.find(job->project);
    out.push_back((owner == by_owner.end() ? 1.0 : owner->second) *
                  (project == by_project.end() ? 1.0 : project->second));
  }
  return out;
}

void SchedulingCore::order_by_fair_share(UnixMillis now) {
  if (!policy_.tenancy.fair_share || scanned_.size() < 2 || (owner_recent_.empty() && project_recent_.empty())) return;
  // Jobs of one owner in one project have one factor: nothing to reorder (a node with one user,
  // or joule-sim's traces without owners, pay nothing for fair share per pass).
  const PendingJob& first = *scanned_.front();
  if (std::all_of(scanned_.begin(), scanned_.end(),
                  [&](const PendingJob* job) { return job->owner == first.owner && job->project == first.project; }))
    return;
  // Forget those whose use has decayed to nothing: the maps hold recent users, not everyone seen.
  const std::int64_t half_life = policy_.tenancy.usage_half_life_seconds;
  std::erase_if(owner_recent_, [&](const auto& entry) { return entry.second.at(now, half_life) < kForgottenJoules; });
  std::erase_if(project_recent_, [&](const auto& entry) { return entry.second.at(now, half_life) < kForgottenJoules; });
  const std::vector<double> factor = fair_share_factors(scanned_, now);
  std::vector<std::size_t> order(scanned_.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  // The queue's own order is priority, then submission: within a priority, the factor first.
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (scanned_[a]->priority != scanned_[b]->priority) return scanned_[a]->priority > scanned_[b]->priority;
    return factor[a] > factor[b];
  });
  std::vector<const PendingJob*> ordered;
  ordered.reserve(order.size());
  for (const std::size_t i : order) ordered.push_back(scanned_[i]);
  scanned_ = std::move(ordered);
}

}  // namespace joule::schedulers
