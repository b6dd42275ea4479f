#include "joule/adapters/slurm_reconcile.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <string_view>

#include <fmt/format.h>

namespace joule::adapters {
namespace {

// Slurm ids are numbers (or 12_3 for array tasks): shorter is lower.
bool lower_id(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return a.size() < b.size();
  return a < b;
}

const SlurmJob* pick_kept(const std::vector<const SlurmJob*>& candidates, const std::string& recorded_id) {
  if (!recorded_id.empty()) {
    for (const auto* job : candidates) {
      if (job->slurm_id == recorded_id) return job;
    }
  }
  const SlurmJob* best = nullptr;
  for (const auto* job : candidates) {
    if (best == nullptr) {
      best = job;
    } else if (has_started(*job) != has_started(*best)) {
      if (has_started(*job)) best = job;
    } else if (lower_id(job->slurm_id, best->slurm_id)) {
      best = job;
    }
  }
  return best;
}

ReconcileDecision stray(const SlurmJob& job, std::string reason) {
  return ReconcileDecision{ReconcileAction::stray, job.joule_id, job.slurm_id, false, job, std::move(reason)};
}

}  // namespace

std::string_view to_string(ReconcileAction action) {
  switch (action) {
    case ReconcileAction::keep:
      return "keep";
    case ReconcileAction::resubmit:
      return "resubmit";
    case ReconcileAction::lost:
      return "lost";
    case ReconcileAction::stray:
      return "stray";
  }
  return "?";
}

bool has_started(const SlurmJob& job) {
  if (job.start_ms) return true;
  const auto phase = slurm_phase(job.state);
  return phase == SlurmPhase::running || phase == SlurmPhase::suspended;
}

std::vector<ReconcileDecision> reconcile(std::span<const HandedJob> handed, std::span<const SlurmJob> listing,
                                         const ReconcileOptions& options) {
  std::map<std::string, std::vector<const SlurmJob*>> by_joule_id;
  std::map<std::string, const SlurmJob*> by_slurm_id;  // only to explain a reused id
  for (const auto& job : listing) {
    const bool ours = !job.joule_id.empty() && (options.user.empty() || job.user == options.user);
    if (ours) by_joule_id[job.joule_id].push_back(&job);
    by_slurm_id.emplace(job.slurm_id, &job);
  }

  std::vector<ReconcileDecision> decisions;
  std::vector<ReconcileDecision> strays;
  std::set<std::string> followed;
  for (const auto& record : handed) {
    if (record.joule_id.empty() || !followed.insert(record.joule_id).second) continue;
    ReconcileDecision decision;
    decision.joule_id = record.joule_id;

    if (auto found = by_joule_id.find(record.joule_id); found != by_joule_id.end()) {
      const SlurmJob* kept = pick_kept(found->second, record.slurm_id);
      decision.action = ReconcileAction::keep;
      decision.slurm_id = kept->slurm_id;
      decision.slurm_id_changed = kept->slurm_id != record.slurm_id;
      decision.job = *kept;
      decision.reason = decision.slurm_id_changed
                            ? fmt::format("Slurm lists it as job {} (recorded: '{}')", kept->slurm_id, record.slurm_id)
                            : fmt::format("Slurm lists it as job {}, {}", kept->slurm_id, kept->state);
      for (const auto* other : found->second) {
        if (other == kept || is_final_slurm_state(other->state)) continue;
        strays.push_back(stray(*other, fmt::format("a second Slurm job for joule id {} (job {} is kept)",
                                                   record.joule_id, kept->slurm_id)));
      }
      decisions.push_back(std::move(decision));
      continue;
    }

    decision.slurm_id = record.slurm_id;
    std::string reused;
    if (auto same_id = by_slurm_id.find(record.slurm_id); !record.slurm_id.empty() && same_id != by_slurm_id.end()) {
      reused = fmt::format(
          "; Slurm job {} is now {}", record.slurm_id,
          same_id->second->joule_id.empty() ? std::string("another job") : "joule id " + same_id->second->joule_id);
    }
    const std::int64_t age_ms = options.now_ms - record.submitted_ms;
    if (options.guarded) {
      if (record.resubmissions >= options.max_resubmissions) {
        decision.action = ReconcileAction::lost;
        decision.reason = fmt::format("vanished after {} resubmission(s){}", record.resubmissions, reused);
      } else {
        decision.action = ReconcileAction::resubmit;
        decision.reason = std::string(record.seen_running ? "Slurm lost it after it started"
                                                          : "Slurm lost it (controller restart?)") +
                          "; its run claim keeps a second copy from running the command again" + reused;
      }
    } else if (record.seen_running) {
      decision.action = ReconcileAction::lost;
      decision.reason = "it had started and Slurm no longer lists it" + reused;
    } else if (age_ms > options.min_job_age_ms) {
      decision.action = ReconcileAction::lost;
      decision.reason =
          fmt::format("not listed, submitted {} s ago (more than MinJobAge {} s): it may have run and been forgotten{}",
                      age_ms / 1000, options.min_job_age_ms / 1000, reused);
    } else if (record.resubmissions >= options.max_resubmissions) {
      decision.action = ReconcileAction::lost;
      decision.reason =
          fmt::format("vanished before starting after {} resubmission(s){}", record.resubmissions, reused);
    } else {
      decision.action = ReconcileAction::resubmit;
      decision.reason = "Slurm lost it before it started (controller restart?)" + reused;
    }
    decisions.push_back(std::move(decision));
  }

  // Live jobs carrying a joule id Joule does not follow (any more).
  for (const auto& [joule_id, jobs] : by_joule_id) {
    if (followed.count(joule_id) != 0 || joule_id.rfind(options.id_prefix, 0) != 0) continue;
    for (const auto* job : jobs) {
      if (is_final_slurm_state(job->state)) continue;
      strays.push_back(stray(*job, fmt::format("joule id {} is not a job Joule follows", joule_id)));
    }
  }
  std::sort(strays.begin(), strays.end(),
            [](const auto& a, const auto& b) { return lower_id(a.slurm_id, b.slurm_id); });
  decisions.insert(decisions.end(), std::make_move_iterator(strays.begin()), std::make_move_iterator(strays.end()));
  return decisions;
}

}  // namespace joule::adapters
