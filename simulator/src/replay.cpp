#include "joule/simulator/replay.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "joule/schedulers/budget_ledger.hpp"
#include "joule/schedulers/scheduling_core.hpp"

namespace joule::simulator {
namespace {

using schedulers::BudgetLedger;
using schedulers::EnergyDistribution;
using schedulers::UnixMillis;

constexpr UnixMillis kDay = 86'400'000;
// A node whose battery ran empty boots again at this charge.
constexpr double kBootPercent = 5.0;

std::string_view to_string(Knowledge knowledge) {
  switch (knowledge) {
    case Knowledge::estimates:
      return "estimates";
    case Knowledge::none:
      return "none";
    case Knowledge::truth:
      return "truth";
  }
  return "estimates";
}

// A stretch of a job's run on one device without a pause: what a meter would have counted.
struct Segment {
  std::size_t device = 0;
  UnixMillis start = 0;
  UnixMillis end = 0;
  double joules = 0.0;
  const schedulers::PendingJob* job = nullptr;  // whose: owners' and projects' budgets count theirs
};

struct JobState {
  enum class Phase { future, queued, running, done, rejected } phase = Phase::future;
  schedulers::PendingJob pending;
  const JobCost* cost = nullptr;  // where it runs
  TrueCost truth;                 // what it really costs there, at the setting it runs at
  UnixMillis started = 0;
  UnixMillis finished = 0;
  double seconds_done = 0.0;  // of truth.seconds
  double joules_done = 0.0;
  std::optional<double> grams_done;  // at the cluster's signals, over its stretches so far
  std::optional<double> cost_done;
  bool paused = false;
  int held_cores = 0;            // of a device that shares its cores; 0: the whole device
  std::vector<std::size_t> companions;  // a job on several GPUs: the others it holds
  double reserved_joules = 0.0;  // what the scheduler reserved for it, for the event log
  int epochs_reported = 0;
  UnixMillis segment_start = 0;
  double segment_joules = 0.0;
  std::optional<schedulers::WaitReason::Kind> last_wait;
};

struct NodeState {
  double capacity_joules = 0.0;
  double charge_joules = 0.0;
  bool down = false;  // battery ran empty: the node is off until it has charged to kBootPercent
  double percent() const { return capacity_joules > 0.0 ? 100.0 * charge_joules / capacity_joules : 0.0; }
};

double share_in(const Segment& use, UnixMillis from, UnixMillis to) {
  if (use.end <= use.start) return use.end >= from && use.end <= to ? use.joules : 0.0;
  const UnixMillis overlap = std::min(use.end, to) - std::max(use.start, from);
  if (overlap <= 0) return 0.0;
  return use.joules * static_cast<double>(overlap) / static_cast<double>(use.end - use.start);
}

UnixMillis window_millis(const schedulers::BudgetWindow& window) {
  switch (window.kind) {
    case schedulers::BudgetWindow::Kind::rolling:
      return window.rolling_seconds * 1000;
    case schedulers::BudgetWindow::Kind::day:
      return kDay;
    case schedulers::BudgetWindow::Kind::week:
      return 7 * kDay;
    case schedulers::BudgetWindow::Kind::month:
      return 31 * kDay;
  }
  return kDay;
}

const schedulers::GridSignal* signal_of(const std::optional<schedulers::GridSignal>& signal) {
  return signal ? &*signal : nullptr;
}

bool over(double spent, double limit) { return spent > limit + 1e-6 * std::max(1.0, limit); }

// Budget windows whose true spent energy exceeded the limit, from every metered segment.
std::vector<Violation> find_violations(const World& world, const std::vector<schedulers::EnergyBudget>& budgets,
                                       const std::vector<Segment>& segments, const BudgetLedger& calendar) {
  std::vector<Violation> out;
  for (const auto& budget : budgets) {
    std::vector<const Segment*> covered;
    for (const auto& segment : segments)
      if (budget.scope.covers(world.devices[segment.device].ref) &&
          budget.counts_work_of(segment.job->owner, segment.job->project))
        covered.push_back(&segment);
    if (covered.empty()) continue;
    UnixMillis first = covered.front()->start, last = covered.front()->end;
    for (const Segment* s : covered) {
      first = std::min(first, s->start);
      last = std::max(last, s->end);
    }
    // Grams and money: each stretch's joules at the cluster's signal over it (none: nothing).
    const schedulers::GridSignal* signal = budget.unit == schedulers::BudgetUnit::grams   ? signal_of(world.carbon)
                                           : budget.unit == schedulers::BudgetUnit::money ? signal_of(world.price)
                                                                                          : nullptr;
    std::vector<double> rate(covered.size(), 1.0);
    for (std::size_t i = 0; i < covered.size() && budget.unit != schedulers::BudgetUnit::joules; ++i)
      rate[i] = signal
                    ? signal->mean_extended(covered[i]->start, std::max(covered[i]->end, covered[i]->start + 1)) / 3.6e6
                    : 0.0;
    auto spent_in = [&](UnixMillis from, UnixMillis to) {
      double spent = 0.0;
      for (std::size_t i = 0; i < covered.size(); ++i) spent += share_in(*covered[i], from, to) * rate[i];
      return spent;
    };
    auto violation = [&](UnixMillis from, UnixMillis to, double spent) {
      return Violation{budget.name, from, to, spent, budget.limit, budget.unit};
    };
    if (budget.window.kind != schedulers::BudgetWindow::Kind::rolling) {
      for (auto [from, to] = calendar.calendar_window(budget.window.kind, first); from <= last;
           std::tie(from, to) = calendar.calendar_window(budget.window.kind, to)) {
        const double spent = spent_in(from, to);
        if (over(spent, budget.limit)) out.push_back(violation(from, to, spent));
      }
      continue;
    }
    // Rolling: the spent energy of the window ending at t is piecewise linear in t, so its
    // maxima are at the breakpoints. Consecutive breakpoints over the limit are one violation.
    const UnixMillis length = window_millis(budget.window);
    std::vector<UnixMillis> moments;
    for (const Segment* s : covered)
      for (UnixMillis t : {s->start, s->end, s->start + length, s->end + length}) moments.push_back(t);
    std::sort(moments.begin(), moments.end());
    moments.erase(std::unique(moments.begin(), moments.end()), moments.end());
    std::optional<Violation> open;
    for (const UnixMillis t : moments) {
      const double spent = spent_in(t - length, t);
      if (over(spent, budget.limit)) {
        if (!open || spent > open->spent) open = violation(t - length, t, spent);  // the worst moment
      } else if (open) {
        out.push_back(*open);
        open.reset();
      }
    }
    if (open) out.push_back(*open);
  }
  return out;
}

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double rank = p * static_cast<double>(values.size() - 1);
  const auto low = static_cast<std::size_t>(std::floor(rank));
  const auto high = static_cast<std::size_t>(std::ceil(rank));
  return values[low] + (values[high] - values[low]) * (rank - static_cast<double>(low));
}

class Replay {
 public:
  Replay(const World& world, const PolicyRun& run, const ReplayOptions& options)
      : world_(world),
        run_(run),
        options_(options),
        core_(run.policy, world.utc_offset_minutes, schedulers::CoreOptions{.throttle = run.throttle}),
        jobs_(world.jobs.size()),
        device_jobs_(world.devices.size()),
        companion_of_(world.devices.size()),
        work_seconds_(world.devices.size(), 0.0),
        usage_(world.devices.size()),
        nodes_(world.nodes.size()) {
    for (std::size_t j = 0; j < world.jobs.size(); ++j) {
      jobs_[j].pending = pending_job(world.jobs[j]);
      index_.emplace(world.jobs[j].id, j);
    }
    for (std::size_t n = 0; n < world.nodes.size(); ++n) {
      if (!world.nodes[n].battery) continue;
      nodes_[n].capacity_joules = world.nodes[n].battery->capacity_wh * 3600.0;
      nodes_[n].charge_joules = nodes_[n].capacity_joules * world.nodes[n].battery->start_percent / 100.0;
      batteries_ = true;
      if (world.nodes[n].solar) solar_ = true;
    }
    UnixMillis longest = 2 * kDay;
    for (const auto& budget : run.policy.budgets) longest = std::max(longest, window_millis(budget.window) + kDay);
    stall_limit_ = longest;
  }

  PolicyMetrics run() {
    const auto wall_start = std::chrono::steady_clock::now();
    UnixMillis now = world_.start;
    const UnixMillis last_submit = world_.jobs.empty() ? now : world_.jobs.back().submit;
    UnixMillis horizon = last_submit + static_cast<UnixMillis>(options_.max_days * kDay);
    std::string reason = "all jobs done";
    if (options_.horizon_hours)
      horizon =
          std::min(horizon, world_.start + static_cast<UnixMillis>(std::llround(*options_.horizon_hours * 3.6e6)));
    last_progress_ = now;
    for (auto& node : nodes_) min_percent_.push_back(node.capacity_joules > 0 ? node.percent() : 100.0);
    step(now);
    while (true) {
      const std::optional<UnixMillis> next = next_event(now);
      if (!next) {
        reason = queued_ == 0 && running_ == 0 ? "all jobs done" : "nothing can progress";
        break;
      }
      if (*next > horizon) {
        advance(now, horizon);
        now = horizon;
        reason = options_.horizon_hours && horizon < last_submit + static_cast<UnixMillis>(options_.max_days * kDay)
                     ? "horizon"
                     : "max_days reached";
        break;
      }
      advance(now, *next);
      now = *next;
      step(now);
      if (next_submit_ == world_.jobs.size() && held_.empty() && progressing() == 0 &&
          now - last_progress_ > stall_limit_) {
        reason = "nothing can progress";
        break;
      }
    }
    PolicyMetrics metrics = finish(now, reason);
    metrics.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
    return metrics;
  }

 private:
  schedulers::PendingJob pending_job(const SimJob& job) const {
    schedulers::PendingJob pending;
    pending.id = job.id;
    pending.priority = job.priority;
    pending.owner = job.owner;
    pending.project = job.project;
    pending.deadline = job.deadline;
    pending.not_before = job.not_before;
    pending.max_energy_joules = job.max_energy_joules;
    pending.max_slowdown = job.max_slowdown;
    pending.cores = job.cores;
    // One job per device: a job asking for several GPUs runs on one of them.
    pending.gpus = run_.one_job_per_device ? std::min(job.gpus, 1) : job.gpus;
    for (const auto& cost : job.costs) {
      schedulers::Candidate candidate;
      candidate.device = cost.device;
      const TrueCost& truth = truth_of(cost);
      if (run_.knowledge == Knowledge::estimates) {
        candidate.estimate = run_.one_job_per_device && cost.alone_truth ? cost.alone_estimate : cost.estimate;
        candidate.flops_joules = cost.flops_joules;
      } else if (run_.knowledge == Knowledge::truth) {
        candidate.estimate = schedulers::Estimate{truth.joules, 0.0, truth.seconds};
        candidate.flops_joules = truth.joules;
      }
      if (!cost.cores_options.empty() && !run_.one_job_per_device) {
        // A range: a candidate at each count (placement chooses; its truth follows the choice).
        for (const auto& option : cost.cores_options) {
          schedulers::Candidate at = candidate;
          at.cores = option.cores;
          if (run_.knowledge == Knowledge::estimates) at.estimate = option.estimate;
          if (run_.knowledge == Knowledge::truth)
            at.estimate = schedulers::Estimate{option.truth.joules, 0.0, option.truth.seconds};
          pending.candidates.push_back(at);
        }
        continue;
      }
      if (run_.policy.knobs.goal != schedulers::KnobGoal::off && run_.knowledge != Knowledge::none) {
        // A job on several GPUs given one: its settings' figures on that GPU alone.
        const bool alone = run_.one_job_per_device && cost.alone_truth;
        for (const auto& setting : cost.settings) {
          std::optional<schedulers::Estimate> estimate = setting.estimate;
          if (estimate && alone && cost.alone_estimate && cost.estimate && cost.estimate->joules_mean > 0 &&
              cost.estimate->seconds_mean > 0) {
            const double joules = cost.alone_estimate->joules_mean / cost.estimate->joules_mean;
            estimate->joules_mean *= joules;
            estimate->joules_std *= joules;
            estimate->seconds_mean *= cost.alone_estimate->seconds_mean / cost.estimate->seconds_mean;
          }
          if (run_.knowledge == Knowledge::truth)
            estimate = schedulers::Estimate{truth_of(setting).joules, 0.0, truth_of(setting).seconds};
          if (estimate)
            candidate.settings.push_back(
                schedulers::SettingOption{setting.knob, setting.value, setting.label, *estimate,
                                          run_.knowledge == Knowledge::truth ? 0.0 : setting.slowdown_log_std,
                                          run_.knowledge == Knowledge::truth ? 0.0 : setting.saving_log_std});
        }
      }
      pending.candidates.push_back(candidate);
    }
    return pending;
  }

  // What a job really costs on the device it is placed on under this run: on one GPU alone
  // where the run gives each job one device, else as it asked.
  const TrueCost& truth_of(const JobCost& cost) const {
    return run_.one_job_per_device && cost.alone_truth ? *cost.alone_truth : cost.truth;
  }
  // The same at one of its device's settings.
  const TrueCost& truth_of(const SettingCost& setting) const {
    return run_.one_job_per_device && setting.alone_truth ? *setting.alone_truth : setting.truth;
  }
  // The slowdown a job allows (its own, else the policy's), and whether `ran` exceeds it.
  const std::optional<double>& allowed_slowdown(const JobState& job) const {
    return job.pending.max_slowdown ? job.pending.max_slowdown : run_.policy.knobs.max_slowdown;
  }
  bool slower_than_allowed(const JobState& job, const TrueCost& ran) const {
    const auto& allowed = allowed_slowdown(job);
    const double default_seconds = truth_of(*job.cost).seconds;
    return allowed && default_seconds > 0 && ran.seconds / default_seconds - 1.0 > *allowed + 1e-9;
  }

  // Whether a job on several GPUs that holds `device` beside its own is progressing (its
  // energy, the device's static power included, is in that job's truth).
  bool held_by_progressing(std::size_t device) const {
    return companion_of_[device] && is_progressing(jobs_[*companion_of_[device]]);
  }

  void log(UnixMillis now, const std::string& text) const {
    if (options_.on_event) options_.on_event(now, text);
  }

  bool node_up(std::size_t device) const { return !nodes_[world_.devices[device].node].down; }
  bool is_progressing(const JobState& job) const {
    return job.phase == JobState::Phase::running && !job.paused && node_up(job.cost->device);
  }
  std::size_t progressing() const {
    std::size_t count = 0;
    for (const auto& on_device : device_jobs_)
      for (const std::size_t j : on_device)
        if (is_progressing(jobs_[j])) ++count;
    return count;
  }
  // The cores of its device a job's share of the static power goes by (the whole device's
  // where it holds it whole).
  int cores_weight(std::size_t device, const JobState& job) const {
    return job.held_cores > 0 ? job.held_cores : std::max(1, world_.devices[device].cores);
  }
  // What a device draws while these of its jobs progress: its static power once, each job's
  // dynamic power (all of its truth's on a device that does not share its cores).
  double device_watts(std::size_t device) const {
    double watts = 0.0;
    bool any = false;
    for (const std::size_t j : device_jobs_[device]) {
      const JobState& job = jobs_[j];
      if (!is_progressing(job)) continue;
      watts += job.truth.watts() - job.cost->static_watts;
      if (!any) watts += job.cost->static_watts;
      any = true;
    }
    return watts;
  }

  std::vector<schedulers::DeviceStatus> device_statuses() const {
    std::vector<schedulers::DeviceStatus> out(world_.devices.size());
    for (std::size_t d = 0; d < world_.devices.size(); ++d) {
      auto& status = out[d];
      status.ref = world_.devices[d].ref;
      status.accepts_work = node_up(d);
      status.work_seconds = work_seconds_[d];
      status.carbon = world_.carbon ? &*world_.carbon : nullptr;
      status.price = world_.price ? &*world_.price : nullptr;
      // One job at a time unless it shares its cores (and this run lets it: see PolicyRun).
      status.cores = run_.one_job_per_device ? 0 : world_.devices[d].cores;
      status.group = world_.devices[d].group;
      status.busy = companion_of_[d].has_value();
      for (const std::size_t j : device_jobs_[d]) {
        // When it is expected to be free is the core's to say, from what it was told.
        if (jobs_[j].held_cores > 0)
          status.cores_held += jobs_[j].held_cores;
        else
          status.busy = true;
      }
      status.average_power_watts = device_watts(d);
      const NodeState& node = nodes_[world_.devices[d].node];
      if (node.capacity_joules > 0.0) {
        status.battery_percent = node.percent();
        status.battery_capacity_joules = node.capacity_joules;
      }
    }
    return out;
  }

  // The next moment something happens, or nothing if nothing ever will.
  // Carbon-only: when a job with a deadline is let into the queue: the start of the signal's
  // lowest step before its deadline (its run's length unknown, so taken as nothing).
  UnixMillis carbon_only_release(const schedulers::PendingJob& job, UnixMillis now) const {
    if (!run_.carbon_only || !world_.carbon || !job.deadline || *job.deadline <= now + 1) return now;
    const auto window = world_.carbon->lowest_start(now, *job.deadline - 1, 1);
    return window ? window->start : now;
  }

  std::optional<UnixMillis> next_event(UnixMillis now) const {
    std::optional<UnixMillis> next;
    auto consider = [&](UnixMillis t) {
      if (t > now) next = next ? std::min(*next, t) : t;
    };
    if (next_submit_ < world_.jobs.size()) consider(world_.jobs[next_submit_].submit);
    if (!held_.empty()) consider(held_.begin()->first);
    for (const auto& on_device : device_jobs_)
      for (const std::size_t j : on_device) {
        const JobState& job = jobs_[j];
        if (!is_progressing(job)) continue;
        const double left = std::max(0.0, job.truth.seconds - job.seconds_done);
        // Less a hair: seconds summed over events carry rounding that would make it a millisecond late.
        consider(now + std::max<UnixMillis>(1, static_cast<UnixMillis>(std::ceil(left * 1000.0 - 1e-6))));
      }
    const bool waiting = queued_ > 0 || running_ > progressing();
    if (waiting)
      if (const auto wake = core_.wake_at(now)) consider(*wake);
    const bool tick =
        (batteries_ && (queued_ > 0 || running_ > 0)) || (run_.throttle && running_ > 0) || (solar_ && waiting);
    if (tick) consider(now + static_cast<UnixMillis>(std::llround(options_.tick_seconds * 1000.0)));
    return next;
  }

  // Moves the world from `from` to `to`: progress, energy, batteries.
  void advance(UnixMillis from, UnixMillis to) {
    if (to <= from) return;
    const double dt = static_cast<double>(to - from) / 1000.0;
    std::vector<double> draw(world_.nodes.size(), 0.0);
    std::vector<bool> ran(world_.devices.size(), false);
    std::vector<double> job_watts(world_.devices.size(), 0.0);
    for (std::size_t d = 0; d < world_.devices.size(); ++d) {
      const std::size_t n = world_.devices[d].node;
      // Its progressing jobs: each its own dynamic energy, and the device's static power split
      // by the cores each holds (all of it for a job alone), as jouled splits a shared meter.
      int weights = 0;
      for (const std::size_t j : device_jobs_[d])
        if (is_progressing(jobs_[j])) weights += cores_weight(d, jobs_[j]);
      if (weights > 0) {
        double longest = 0.0, joules = 0.0;
        for (const std::size_t j : device_jobs_[d]) {
          JobState& job = jobs_[j];
          if (!is_progressing(job)) continue;
          const double step = std::max(0.0, std::min(dt, job.truth.seconds - job.seconds_done));
          const double share = static_cast<double>(cores_weight(d, job)) / weights;
          const double used =
              (job.truth.watts() - job.cost->static_watts) * step + job.cost->static_watts * step * share;
          job.seconds_done += step;
          job.joules_done += used;
          job.segment_joules += used;
          joules += used;
          longest = std::max(longest, step);
        }
        work_seconds_[d] += longest;
        usage_[d].busy_seconds += longest;
        usage_[d].joules += joules;
        const double idle_seconds = dt - longest;
        draw[n] += joules / dt + world_.devices[d].idle_watts * idle_seconds / dt;
        idle_joules_ += world_.devices[d].idle_watts * idle_seconds;
        if (longest > 0.0) last_progress_ = to;
        ran[d] = longest > 0.0;
        job_watts[d] = joules / dt;
      } else if (held_by_progressing(d)) {
        ran[d] = true;  // its draw is in the job's truth, counted on the job's first GPU
      } else if (node_up(d)) {
        draw[n] += world_.devices[d].idle_watts;
        idle_joules_ += world_.devices[d].idle_watts * dt;
      }
    }
    // The floors and caps judged on the state over the interval: the charge at its start (the
    // scheduler saw it), the jobs' power during it.
    for (const auto& floor : run_.policy.battery_floors)
      for (std::size_t d = 0; d < world_.devices.size(); ++d) {
        const NodeState& node = nodes_[world_.devices[d].node];
        if (ran[d] && node.capacity_joules > 0.0 && node.percent() < floor.percent &&
            floor.scope.covers(world_.devices[d].ref)) {
          floor_seconds_[floor.name] += dt;
          break;
        }
      }
    for (const auto& cap : run_.policy.power_caps) {
      double watts = 0.0;
      for (std::size_t d = 0; d < world_.devices.size(); ++d)
        if (cap.scope.covers(world_.devices[d].ref)) watts += job_watts[d];
      if (watts > cap.watts + 1e-9) cap_seconds_[cap.name] += dt;
    }
    for (std::size_t n = 0; n < world_.nodes.size(); ++n) {
      NodeState& node = nodes_[n];
      if (node.capacity_joules <= 0.0) continue;
      if (node.down) empty_seconds_[world_.nodes[n].name] += dt;
      double charge = node.charge_joules - draw[n] * dt;
      if (world_.nodes[n].solar) charge += solar_joules(*world_.nodes[n].solar, from, to, world_.utc_offset_minutes);
      node.charge_joules = std::clamp(charge, 0.0, node.capacity_joules);
      if (node.charge_joules <= 0.0)
        node.down = true;
      else if (node.down && node.percent() >= kBootPercent)
        node.down = false;
      min_percent_[n] = std::min(min_percent_[n], node.percent());
    }
  }

  void close_segment(JobState& job, UnixMillis now) {
    segments_.push_back(Segment{job.cost->device, job.segment_start, now, job.segment_joules, &job.pending});
    // What the stretch emitted and cost at the cluster's signals, for budgets in grams and money
    // (as jouled prices a metered job at the signals over its run).
    auto at = [&](const std::optional<schedulers::GridSignal>& signal, std::optional<double>& total) {
      if (!signal) return;
      total = total.value_or(0.0) + job.segment_joules / 3.6e6 *
                                        signal->mean_extended(job.segment_start, std::max(now, job.segment_start + 1));
    };
    at(world_.carbon, job.grams_done);
    at(world_.price, job.cost_done);
    job.segment_start = now;
    job.segment_joules = 0.0;
  }

  // Everything that happens at `now`: finishes, submissions, progress reports, throttling, a
  // placement pass.
  void step(UnixMillis now) {
    for (std::size_t d = 0; d < world_.devices.size(); ++d) {
      const std::vector<std::size_t> on_device = device_jobs_[d];  // finished ones leave it
      for (const std::size_t j : on_device) {
        JobState& job = jobs_[j];
        report_progress(j, now);
        if (job.seconds_done < job.truth.seconds - 1e-6) continue;
        job.phase = JobState::Phase::done;
        job.finished = now;
        log(now, fmt::format("finish {} on {}: {:.0f} J (reserved {:.0f} J)", job.pending.id,
                             world_.devices[d].ref.qualified(), job.joules_done, job.reserved_joules));
        close_segment(job, now);
        core_.end(job.pending.id, schedulers::EnergyUse{world_.devices[d].ref, job.pending.id, job.started, now,
                                                        job.joules_done, "simulated", job.pending.owner,
                                                        job.pending.project, job.grams_done, job.cost_done});
        std::erase(device_jobs_[d], j);
        for (const std::size_t m : job.companions) companion_of_[m].reset();
        --running_;
        last_progress_ = now;
        idle_at_last_finish_ = idle_joules_;
      }
    }
    while (next_submit_ < world_.jobs.size() && world_.jobs[next_submit_].submit <= now) {
      JobState& job = jobs_[next_submit_];
      if (auto never = core_.never_fits(now, device_statuses(), job.pending)) {
        job.phase = JobState::Phase::rejected;
        log(now, fmt::format("reject {}: {}", job.pending.id, never->message));
      } else {
        job.phase = JobState::Phase::queued;
        ++queued_;
        const UnixMillis release = carbon_only_release(job.pending, now);
        if (release > now)
          held_.emplace(release, next_submit_);
        else
          core_.enqueue(job.pending, static_cast<std::int64_t>(next_submit_));
      }
      ++next_submit_;
    }
    while (!held_.empty() && held_.begin()->first <= now) {
      const std::size_t j = held_.begin()->second;
      held_.erase(held_.begin());
      core_.enqueue(jobs_[j].pending, static_cast<std::int64_t>(j));
    }
    if (run_.policy.admission || run_.throttle) track_running(now);
    place(now);
  }

  // Epoch reports, as a job's progress callbacks would send them: the true energy at each
  // epoch boundary passed since the last event.
  void report_progress(std::size_t j, UnixMillis now) {
    JobState& job = jobs_[j];
    const SimJob& spec = world_.jobs[j];
    const double fraction = job.truth.seconds > 0 ? job.seconds_done / job.truth.seconds : 1.0;
    const int done = std::min(spec.epochs, static_cast<int>(std::floor(fraction * spec.epochs + 1e-9)));
    // The energy at each epoch's end, on the pace it has used so far (side by side with other
    // jobs that is less than its truth, which assumes it alone).
    const double per_fraction = fraction > 0.0 ? job.joules_done / fraction : job.truth.joules;
    for (int e = job.epochs_reported + 1; e <= done; ++e)
      core_.report(job.pending.id, {e, spec.epochs, per_fraction * e / spec.epochs, now});
    job.epochs_reported = std::max(job.epochs_reported, done);
  }

  // As jouled does: each running job's energy so far feeds the core, which keeps its
  // projection in the ledger; then the throttle actions it asks for are applied.
  void track_running(UnixMillis now) {
    const auto statuses = device_statuses();
    std::vector<schedulers::RunningSample> samples;
    for (std::size_t d = 0; d < world_.devices.size(); ++d)
      for (const std::size_t j : device_jobs_[d]) {
        const JobState& job = jobs_[j];
        schedulers::RunningSample sample;
        sample.id = job.pending.id;
        sample.used_joules = job.joules_done;
        sample.controls.power_watts = statuses[d].average_power_watts;
        sample.controls.paused = job.paused;
        samples.push_back(std::move(sample));
      }
    for (const auto& action : core_.track(now, statuses, std::move(samples))) {
      const auto it = index_.find(action.job);
      if (it == index_.end()) continue;
      JobState& job = jobs_[it->second];
      if (job.phase != JobState::Phase::running) continue;
      ++throttle_actions_[std::string(schedulers::to_string(action.kind))];
      log(now, fmt::format("{} {}: {}", schedulers::to_string(action.kind), action.job, action.reason));
      if (action.kind == schedulers::ThrottleAction::Kind::pause && !job.paused) {
        close_segment(job, now);
        core_.paused(job.pending.id, now);
        job.paused = true;
      } else if (action.kind == schedulers::ThrottleAction::Kind::resume && job.paused) {
        job.segment_start = now;
        core_.resumed(job.pending.id, now);
        job.paused = false;
      }
    }
  }

  void place(UnixMillis now) {
    const auto started = std::chrono::steady_clock::now();
    const schedulers::PassResult result = core_.place(now, device_statuses());
    placer_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (result.considered > 0) ++passes_;
    for (const auto& [id, why] : result.waiting) {
      JobState& job = jobs_[index_.at(id)];
      if (job.last_wait != why.kind && why.kind != schedulers::WaitReason::Kind::behind)
        log(now, fmt::format("wait {}: {}", id, why.message));
      job.last_wait = why.kind;
    }
    for (const auto& placement : result.placements) {
      const std::size_t j = index_.at(placement.job);
      --queued_;
      JobState& job = jobs_[j];
      for (const auto& cost : world_.jobs[j].costs)
        if (cost.device == placement.device) job.cost = &cost;
      job.truth = truth_of(*job.cost);
      for (const auto& option : job.cost->cores_options)
        if (option.cores == placement.cores && !run_.one_job_per_device) job.truth = option.truth;
      if (placement.setting) {
        for (const auto& setting : job.cost->settings)
          if (setting.label == placement.setting->label) job.truth = truth_of(setting);
        ++jobs_at_settings_;
        // The slowdown it was allowed, against the one it really had (estimates can be wrong).
        if (slower_than_allowed(job, job.truth)) ++slowdown_exceeded_;
      } else if (run_.jit_power_limit) {
        if (auto tuned = jit_power_limit(*job.cost)) {
          job.truth = *tuned;
          ++jobs_at_settings_;
        }
      }
      // (A job given a range of cores is weighed at each count, never at a setting.)
      // (Only where placement minimises energy too: min-carbon and min-cost weigh a slower
      // setting's hours by their signal, so an energy sweep is not their yardstick.)
      if (run_.policy.knobs.goal == schedulers::KnobGoal::min_energy &&
          run_.policy.objective == schedulers::Objective::min_energy && !job.cost->settings.empty() &&
          job.cost->cores_options.empty())
        sweep(job);
      job.phase = JobState::Phase::running;
      job.started = now;
      job.segment_start = now;
      job.reserved_joules = placement.reserve.mean_joules;
      job.held_cores = placement.cores;
      job.companions = placement.companions;
      for (const std::size_t m : placement.companions) companion_of_[m] = j;
      device_jobs_[placement.device].push_back(j);
      log(now, fmt::format("start {}: {}", job.pending.id, placement.note));
      if (options_.on_placement) options_.on_placement(now, placement);
      ++usage_[placement.device].jobs;
      ++running_;
      ++placements_;
      last_progress_ = now;
    }
  }

  // The job as run against the least energy any setting of its device (or the defaults) truly
  // costs within its allowed slowdown: the exhaustive sweep the chosen setting is judged by.
  void sweep(const JobState& job) {
    double best = truth_of(*job.cost).joules;
    for (const auto& setting : job.cost->settings)
      if (!slower_than_allowed(job, truth_of(setting))) best = std::min(best, truth_of(setting).joules);
    if (!(best > 0.0)) return;
    // A job run slower than it allowed may have used less than the best allowed: that is a broken
    // promise, not a find (jobs_slowed_beyond_max_slowdown counts it), so it counts as no regret
    // and not as within.
    const double regret = std::max(0.0, job.truth.joules / best - 1.0);
    ++jobs_swept_;
    if (regret <= 0.05 && !slower_than_allowed(job, job.truth)) ++jobs_within_5pct_;
    setting_regret_ += regret;
  }

  // Zeus's just-in-time profiling (NSDI'23, 4.2): the job's first steps run a window at each
  // power limit (training goes on meanwhile), the limit with the least η·E + (1 − η)·P_max·T
  // (η = 0.5, P_max the highest limit) is kept for the rest. No estimates: measured as it runs.
  std::optional<TrueCost> jit_power_limit(const JobCost& cost) const {
    std::vector<const SettingCost*> limits;
    double max_watts = 0.0;
    for (const auto& setting : cost.settings)
      if (setting.knob == "gpu_power_limit_watts") {
        limits.push_back(&setting);
        max_watts = std::max(max_watts, setting.value);
      }
    if (limits.empty()) return std::nullopt;
    max_watts = std::max(max_watts, cost.truth.watts());
    constexpr double kWindowSeconds = 10.0;
    constexpr double eta = 0.5;
    auto zeus_cost = [&](const TrueCost& at) { return eta * at.joules + (1.0 - eta) * max_watts * at.seconds; };
    TrueCost best = cost.truth;
    for (const SettingCost* limit : limits)
      if (zeus_cost(limit->truth) < zeus_cost(best)) best = limit->truth;
    // The profiling windows: the default's and each limit's, a fraction of the job each.
    TrueCost total;
    double fraction_done = 0.0;
    auto window = [&](const TrueCost& at) {
      if (at.seconds <= 0.0 || fraction_done >= 0.5) return;
      const double fraction = std::min(kWindowSeconds / at.seconds, 0.5 - fraction_done);
      total.seconds += fraction * at.seconds;
      total.joules += fraction * at.joules;
      fraction_done += fraction;
    };
    window(cost.truth);
    for (const SettingCost* limit : limits) window(limit->truth);
    total.seconds += (1.0 - fraction_done) * best.seconds;
    total.joules += (1.0 - fraction_done) * best.joules;
    return total;
  }

  PolicyMetrics finish(UnixMillis now, const std::string& reason) {
    PolicyMetrics m;
    m.jobs_at_settings = jobs_at_settings_;
    m.slowdown_exceeded = slowdown_exceeded_;
    m.jobs_swept = jobs_swept_;
    m.jobs_within_5pct_of_best = jobs_within_5pct_;
    m.setting_regret = setting_regret_;
    m.name = run_.name;
    m.objective = std::string(schedulers::to_string(run_.policy.objective));
    m.admission = run_.policy.admission;
    m.throttle = run_.throttle;
    m.knowledge = std::string(to_string(run_.knowledge));
    m.jobs = world_.jobs.size();
    m.ended_at = now;
    m.end_reason = reason;
    std::vector<double> waits;
    double completed_joules = 0.0;
    UnixMillis last_finish = world_.jobs.empty() ? world_.start : world_.jobs.front().submit;
    for (std::size_t j = 0; j < jobs_.size(); ++j) {
      JobState& job = jobs_[j];
      const SimJob& spec = world_.jobs[j];
      if (job.phase == JobState::Phase::running) {
        close_segment(job, now);
        ++m.started_not_completed;
      }
      if (job.phase == JobState::Phase::queued || job.phase == JobState::Phase::future) {
        ++m.never_started;
        if (job.last_wait) ++m.waiting_reasons[std::string(schedulers::to_string(*job.last_wait))];
      }
      if (job.phase == JobState::Phase::rejected) ++m.rejected;
      if (job.phase == JobState::Phase::running || job.phase == JobState::Phase::done)
        waits.push_back(static_cast<double>(job.started - spec.submit) / 1000.0);
      m.energy_joules += job.joules_done;
      if (!spec.owner.empty()) {
        OwnerMetrics& owner = m.owners[spec.owner];
        ++owner.jobs;
        owner.energy_joules += job.joules_done;
        if (job.phase == JobState::Phase::done) ++owner.completed;
        if (job.phase == JobState::Phase::running || job.phase == JobState::Phase::done) {
          const double wait = static_cast<double>(job.started - spec.submit) / 1000.0;
          ++owner.started;
          owner.wait_mean_seconds += wait;  // a sum until divided below
          owner.wait_max_seconds = std::max(owner.wait_max_seconds, wait);
        }
      }
      if (job.phase == JobState::Phase::done) {
        ++m.completed;
        completed_joules += job.joules_done;
        m.turnaround_mean_seconds += static_cast<double>(job.finished - spec.submit) / 1000.0;  // a sum until divided
        last_finish = std::max(last_finish, job.finished);
        if (spec.deadline && job.finished > *spec.deadline) ++m.deadline_misses;
      } else if (spec.deadline && *spec.deadline < now) {
        ++m.deadline_misses;
      }
      if (spec.max_energy_joules && job.joules_done > *spec.max_energy_joules) ++m.max_energy_exceeded;
    }
    for (auto& [name, owner] : m.owners)
      if (owner.started) owner.wait_mean_seconds /= static_cast<double>(owner.started);
    m.energy_per_completed_job_joules = m.completed ? completed_joules / static_cast<double>(m.completed) : 0.0;
    if (m.completed) m.turnaround_mean_seconds /= static_cast<double>(m.completed);
    m.idle_joules_not_counted = idle_at_last_finish_;
    if (m.completed && !world_.jobs.empty())
      m.makespan_seconds = static_cast<double>(last_finish - world_.jobs.front().submit) / 1000.0;
    if (!waits.empty()) {
      double sum = 0.0;
      for (double w : waits) sum += w;
      m.wait_mean_seconds = sum / static_cast<double>(waits.size());
      m.wait_p95_seconds = percentile(waits, 0.95);
    }
    std::vector<std::string> owners;
    for (const auto& job : world_.jobs) owners.push_back(job.owner);
    std::sort(owners.begin(), owners.end());
    owners.erase(std::unique(owners.begin(), owners.end()), owners.end());
    m.violations =
        find_violations(world_, schedulers::budgets_for_owners(run_.policy.budgets, owners), segments_, core_.ledger());
    // Each stretch's energy drawn evenly over it, at the grid's intensity or price then.
    auto at_signal = [&](const std::optional<schedulers::GridSignal>& signal, std::optional<double>& total,
                         double& outside) {
      if (!signal) return;
      total = 0.0;
      for (const Segment& use : segments_) {
        const auto value = use.end > use.start ? signal->mean_over(use.start, use.end) : signal->at(use.start);
        if (value)
          *total += use.joules / 3.6e6 * *value;
        else
          outside += use.joules;
      }
    };
    at_signal(world_.carbon, m.carbon_grams, m.joules_outside_carbon_signal);
    at_signal(world_.price, m.cost, m.joules_outside_price_signal);
    for (const auto& v : m.violations)
      if (v.unit == schedulers::BudgetUnit::joules) m.max_overrun_joules = std::max(m.max_overrun_joules, v.overrun());
    m.throttle_actions = throttle_actions_;
    for (const auto& [kind, count] : throttle_actions_) m.throttle_action_count += count;
    for (std::size_t n = 0; n < world_.nodes.size(); ++n) {
      if (nodes_[n].capacity_joules <= 0.0) continue;
      m.battery_min_percent[world_.nodes[n].name] = min_percent_[n];
      m.battery_empty_seconds[world_.nodes[n].name] = empty_seconds_[world_.nodes[n].name];
    }
    for (const auto& floor : run_.policy.battery_floors)
      m.floor_violation_seconds[floor.name] = floor_seconds_[floor.name];
    for (const auto& cap : run_.policy.power_caps) m.cap_violation_seconds[cap.name] = cap_seconds_[cap.name];
    for (std::size_t d = 0; d < world_.devices.size(); ++d) m.devices[world_.devices[d].ref.qualified()] = usage_[d];
    m.placement_passes = passes_;
    m.placements = placements_;
    m.placer_wall_seconds = placer_seconds_;
    return m;
  }

  const World& world_;
  const PolicyRun& run_;
  ReplayOptions options_;
  schedulers::SchedulingCore core_;
  std::vector<JobState> jobs_;
  std::unordered_map<std::string, std::size_t> index_;  // job id → jobs_
  std::vector<std::vector<std::size_t>> device_jobs_;   // the jobs on each device, in the order placed
  std::vector<std::optional<std::size_t>> companion_of_;  // the job on several GPUs holding it beside its own
  std::vector<double> work_seconds_;
  std::vector<DeviceUsage> usage_;
  std::vector<NodeState> nodes_;
  std::vector<double> min_percent_;
  std::map<std::string, double> empty_seconds_;
  std::map<std::string, double> floor_seconds_;
  std::map<std::string, double> cap_seconds_;
  std::vector<Segment> segments_;
  std::map<std::string, std::size_t> throttle_actions_;
  std::size_t next_submit_ = 0;
  std::multimap<UnixMillis, std::size_t> held_;  // carbon-only: jobs let into the queue at a time
  std::size_t queued_ = 0;
  std::size_t running_ = 0;
  std::size_t passes_ = 0;
  std::size_t placements_ = 0;
  double placer_seconds_ = 0.0;
  double idle_joules_ = 0.0;
  double idle_at_last_finish_ = 0.0;
  std::size_t jobs_at_settings_ = 0;
  std::size_t slowdown_exceeded_ = 0;
  std::size_t jobs_swept_ = 0;
  std::size_t jobs_within_5pct_ = 0;
  double setting_regret_ = 0.0;
  bool batteries_ = false;
  bool solar_ = false;
  UnixMillis last_progress_ = 0;
  UnixMillis stall_limit_ = 2 * kDay;
};

}  // namespace

std::vector<PolicyRun> standard_runs(const schedulers::Policy& policy, bool carbon, bool shared_cores, bool price) {
  using schedulers::Objective;
  std::vector<PolicyRun> runs;
  runs.push_back(
      PolicyRun{std::string(schedulers::to_string(policy.objective)), policy, Knowledge::estimates, policy.admission});
  if (shared_cores) {
    PolicyRun alone = runs.front();
    alone.name += ", one job per device";
    alone.one_job_per_device = true;
    runs.push_back(alone);
  }
  if (policy.knobs.goal == schedulers::KnobGoal::off) {
    // The same policy choosing devices' knob settings too (the default goal and slowdown).
    schedulers::Policy with_knobs = policy;
    with_knobs.knobs.goal = schedulers::KnobGoal::min_energy;
    runs.push_back(PolicyRun{runs.front().name + "+knobs", with_knobs, Knowledge::estimates, policy.admission});
  }
  auto baseline = [&](Objective objective, Knowledge knowledge, bool admission, const char* name) {
    schedulers::Policy p = policy;
    p.objective = objective;
    p.admission = admission;
    std::string label = name;
    if (label == runs.front().name) label += " (baseline)";
    runs.push_back(PolicyRun{label, p, knowledge, admission});
  };
  if (carbon && (policy.objective == Objective::min_carbon || policy.objective == Objective::min_energy))
    baseline(policy.objective == Objective::min_carbon ? Objective::min_energy : Objective::min_carbon,
             Knowledge::estimates, policy.admission,
             policy.objective == Objective::min_carbon ? "min-energy" : "min-carbon");
  if (price && (policy.objective == Objective::min_cost || policy.objective == Objective::min_energy))
    baseline(policy.objective == Objective::min_cost ? Objective::min_energy : Objective::min_cost,
             Knowledge::estimates, policy.admission,
             policy.objective == Objective::min_cost ? "min-energy" : "min-cost");
  baseline(Objective::fifo, Knowledge::none, false, "fifo");
  if (carbon) {
    schedulers::Policy p = policy;
    p.objective = Objective::least_loaded;
    p.admission = false;
    PolicyRun only{"carbon-only", p, Knowledge::none, false};
    only.carbon_only = true;
    runs.push_back(only);
  }
  baseline(Objective::round_robin, Knowledge::none, false, "round-robin");
  baseline(Objective::least_loaded, Knowledge::none, false, "least-loaded");
  baseline(Objective::flops_greedy, Knowledge::estimates, true, "flops-greedy");
  {
    schedulers::Policy p = policy;
    p.objective = Objective::least_loaded;
    p.admission = false;
    p.knobs.goal = schedulers::KnobGoal::off;
    PolicyRun zeus{"zeus-like", p, Knowledge::none, false};
    zeus.jit_power_limit = true;
    runs.push_back(zeus);
  }
  baseline(Objective::min_energy, Knowledge::truth, true, "oracle");
  {
    // What choosing settings is worth with perfect knowledge: the ceiling for +knobs.
    schedulers::Policy p = runs.back().policy;
    p.knobs.goal =
        policy.knobs.goal == schedulers::KnobGoal::off ? schedulers::KnobGoal::min_energy : policy.knobs.goal;
    runs.push_back(PolicyRun{"oracle+knobs", p, Knowledge::truth, true});
  }
  return runs;
}

PolicyMetrics replay(const World& world, const PolicyRun& run, const ReplayOptions& options) {
  return Replay(world, run, options).run();
}

}  // namespace joule::simulator
