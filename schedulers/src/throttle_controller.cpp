#include "joule/schedulers/throttle_controller.hpp"

#include <algorithm>
#include <array>
#include <set>

#include <fmt/format.h>

namespace joule::schedulers {

std::string_view to_string(ThrottleAction::Kind kind) {
  static constexpr std::array<std::string_view, 6> names{"pause",           "resume",
                                                         "cpu-quota",       "clear-cpu-quota",
                                                         "gpu-power-limit", "clear-gpu-power-limit"};
  return names[static_cast<std::size_t>(kind)];
}

ThrottleController::ThrottleController(Policy policy, ThrottleOptions options)
    : policy_(std::move(policy)), options_(options) {}

void ThrottleController::set_policy(Policy policy) { policy_ = std::move(policy); }

std::vector<ThrottleAction> ThrottleController::evaluate(UnixMillis now, std::span<const DeviceStatus> devices,
                                                         std::span<const RunningJob> jobs,
                                                         const BudgetLedger& ledger) {
  std::vector<ThrottleAction> actions;
  std::set<std::string> present;
  for (const auto& job : jobs) present.insert(job.id);
  std::erase_if(holds_, [&](const auto& entry) { return !present.contains(entry.first); });

  std::set<std::string> touched;  // one action per job per call
  auto act = [&](ThrottleAction::Kind kind, const RunningJob& job, double value, const std::string& rule,
                 std::string reason, std::optional<Held> hold) {
    touched.insert(job.id);
    if (hold) holds_[job.id] = *hold;
    actions.push_back({kind, job.id, value, rule, std::move(reason)});
  };
  auto held_by = [&](const RunningJob& job, Hold hold, const std::string& rule) {
    const auto it = holds_.find(job.id);
    return it != holds_.end() && it->second.hold == hold && it->second.rule == rule;
  };
  // Jobs on devices a scope covers (of the owner or project a budget is for), lowest priority
  // first (the first to be slowed).
  auto in_scope = [&](const ScopeTarget& scope, const EnergyBudget* budget = nullptr) {
    std::vector<const RunningJob*> out;
    for (const auto& job : jobs)
      if (scope.covers(devices[job.device].ref) && (!budget || budget->counts_work_of(job.owner, job.project)))
        out.push_back(&job);
    std::stable_sort(out.begin(), out.end(), [](const RunningJob* a, const RunningJob* b) { return a->priority < b->priority; });
    return out;
  };

  // A reload that drops a rule lets go of what it held, one control per call like a release.
  auto rule_exists = [&](const Held& held) {
    switch (held.hold) {
      case Hold::cap:
        return std::any_of(policy_.power_caps.begin(), policy_.power_caps.end(),
                           [&](const PowerCap& cap) { return cap.name == held.rule; });
      case Hold::budget:
        return std::any_of(policy_.budgets.begin(), policy_.budgets.end(),
                           [&](const EnergyBudget& budget) { return budget.name == held.rule; });
      case Hold::battery:
        return std::any_of(policy_.battery_floors.begin(), policy_.battery_floors.end(),
                           [&](const BatteryFloor& floor) { return floor.name == held.rule; });
    }
    return false;
  };
  for (const auto& job : jobs) {
    const auto it = holds_.find(job.id);
    if (it == holds_.end() || rule_exists(it->second)) continue;
    const std::string rule = it->second.rule;
    const std::string why = fmt::format("{} is no longer in the policy", rule);
    const int controls = (job.paused ? 1 : 0) + (job.gpu_limit_watts ? 1 : 0) + (job.cpu_quota ? 1 : 0);
    if (controls <= 1) holds_.erase(job.id);
    if (job.paused)
      act(ThrottleAction::Kind::resume, job, 0.0, rule, why, std::nullopt);
    else if (job.gpu_limit_watts)
      act(ThrottleAction::Kind::clear_gpu_power_limit, job, 0.0, rule, why, std::nullopt);
    else if (job.cpu_quota)
      act(ThrottleAction::Kind::clear_cpu_quota, job, 0.0, rule, why, std::nullopt);
  }

  for (const auto& floor : policy_.battery_floors) {
    for (const RunningJob* job : in_scope(floor.scope)) {
      const auto& percent = devices[job->device].battery_percent;
      if (!percent || touched.contains(job->id)) continue;
      if (*percent <= floor.percent + floor.margin_percent && !job->paused) {
        act(ThrottleAction::Kind::pause, *job, 0.0, floor.name,
            fmt::format("battery floor {}: {:.0f}% charge is within {:.0f} points of the {:.0f}% floor", floor.name,
                        *percent, floor.margin_percent, floor.percent),
            Held{Hold::battery, floor.name});
      } else if (job->paused && held_by(*job, Hold::battery, floor.name) &&
                 *percent >= floor.percent + floor.margin_percent + options_.resume_above_percent) {
        holds_.erase(job->id);
        act(ThrottleAction::Kind::resume, *job, 0.0, floor.name,
            fmt::format("battery floor {}: charge back to {:.0f}%", floor.name, *percent), std::nullopt);
      }
    }
  }

  for (const auto& cap : policy_.power_caps) {
    double watts = 0.0;
    for (const auto& device : devices)
      if (cap.scope.covers(device.ref)) watts += device.average_power_watts;
    const auto scoped = in_scope(cap.scope);
    if (watts > cap.watts) {
      for (const RunningJob* job : scoped) {
        if (job->paused || touched.contains(job->id)) continue;
        const double ratio = cap.watts / watts;
        const std::string why = fmt::format("power cap {} ({}): {:.1f} W over {:.1f} W", cap.name,
                                            cap.scope.describe(), watts, cap.watts);
        const Held hold{Hold::cap, cap.name};
        if (job->can_limit_gpu) {
          const double current = job->gpu_limit_watts.value_or(std::max(job->power_watts, job->gpu_min_watts));
          const double next = std::max(job->gpu_min_watts, current * ratio);
          if (next < current - 1.0) {
            act(ThrottleAction::Kind::gpu_power_limit, *job, next, cap.name,
                fmt::format("{}; GPU power limit {:.0f} W", why, next), hold);
            break;
          }
        } else if (job->can_limit_cpu) {
          const double next = job->cpu_quota.value_or(job->cpus) * ratio;
          if (next >= options_.min_cpu_quota) {
            act(ThrottleAction::Kind::cpu_quota, *job, next, cap.name, fmt::format("{}; CPU quota {:.2f} CPUs", why, next),
                hold);
            break;
          }
        }
        act(ThrottleAction::Kind::pause, *job, 0.0, cap.name, fmt::format("{}; paused", why), hold);
        break;
      }
    } else if (watts < options_.release_fraction * cap.watts) {
      // Release one step at a time, highest priority first, so the scope does not jump back over.
      for (auto it = scoped.rbegin(); it != scoped.rend(); ++it) {
        const RunningJob& job = **it;
        if (!held_by(job, Hold::cap, cap.name) || touched.contains(job.id)) continue;
        const std::string why = fmt::format("power cap {}: {:.1f} W, below {:.0f}% of {:.1f} W", cap.name, watts,
                                            options_.release_fraction * 100.0, cap.watts);
        // Undo one control; the hold ends with the last one.
        const int controls = (job.paused ? 1 : 0) + (job.gpu_limit_watts ? 1 : 0) + (job.cpu_quota ? 1 : 0);
        if (controls <= 1) holds_.erase(job.id);
        if (job.paused)
          act(ThrottleAction::Kind::resume, job, 0.0, cap.name, why, std::nullopt);
        else if (job.gpu_limit_watts)
          act(ThrottleAction::Kind::clear_gpu_power_limit, job, 0.0, cap.name, why, std::nullopt);
        else if (job.cpu_quota)
          act(ThrottleAction::Kind::clear_cpu_quota, job, 0.0, cap.name, why, std::nullopt);
        break;
      }
    }
  }

  const std::vector<BudgetState> states = ledger.states(now);
  for (const auto& state : states) {
    const EnergyBudget& budget = state.budget;
    const double room = budget.limit - state.spent;
    const auto scoped = in_scope(budget.scope, &budget);
    // What a job still expects, in the budget's unit (nothing where its signal is missing, as
    // the ledger reserves it).
    auto still = [&](const RunningJob& job) {
      return job.still_expected.scaled(job.rates.of(budget.unit).value_or(0.0));
    };
    EnergyDistribution active = state.reserved;
    for (const RunningJob* job : scoped)
      if (job->paused) {
        active.mean_joules -= still(*job).mean_joules;
        active.variance -= still(*job).variance;
      }
    active.mean_joules = std::max(0.0, active.mean_joules);
    active.variance = std::max(0.0, active.variance);
    if (overrun_probability(active, room) > options_.overrun_probability) {
      for (const RunningJob* job : scoped) {
        if (job->paused || touched.contains(job->id)) continue;
        act(ThrottleAction::Kind::pause, *job, 0.0, state.budget.name,
            fmt::format("budget {}: running work is projected to need {} with {} left; paused until it fits",
                        budget.name, budget.amount_text(active.mean_joules), budget.amount_text(std::max(0.0, room))),
            Held{Hold::budget, state.budget.name});
        break;
      }
      continue;
    }
    for (auto it = scoped.rbegin(); it != scoped.rend(); ++it) {
      const RunningJob& job = **it;
      if (!job.paused || !held_by(job, Hold::budget, state.budget.name) || touched.contains(job.id)) continue;
      const EnergyDistribution with_job = active + still(job);
      if (overrun_probability(with_job, room) >= policy_.risk) continue;
      holds_.erase(job.id);
      act(ThrottleAction::Kind::resume, job, 0.0, state.budget.name,
          fmt::format("budget {}: {} left, enough for it again", budget.name, budget.amount_text(room)), std::nullopt);
      active = with_job;
    }
  }
  return actions;
}

}  // namespace joule::schedulers
