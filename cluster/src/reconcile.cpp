#include "joule/cluster/reconcile.hpp"

#include <map>

namespace joule::cluster {

using schedulers::JobState;

std::string_view to_string(Verdict verdict) {
  switch (verdict) {
    case Verdict::stale: return "stale";
    case Verdict::progress: return "progress";
    case Verdict::started: return "started";
    case Verdict::finished: return "finished";
    case Verdict::recorded: return "recorded";
    case Verdict::adopt: return "adopt";
    case Verdict::ended_while_lost: return "ended_while_lost";
    case Verdict::fenced:
      return "fenced";
  }
  return "?";
}

Verdict judge_report(const std::optional<CoordinatorJob>& job, const std::string& node, const ReportedJob& report) {
  if (!job || job->epoch != report.epoch || job->node != node) return Verdict::stale;
  const auto reported = schedulers::job_state_from_string(report.state);
  if (!reported) return Verdict::stale;
  const bool ended = schedulers::is_terminal(*reported);
  if (schedulers::is_terminal(job->state)) return ended ? Verdict::recorded : Verdict::stale;
  if (ended && job->state == JobState::queued)
    return *reported == JobState::succeeded ? Verdict::ended_while_lost : Verdict::stale;
  if (ended && report.fenced) return Verdict::fenced;
  if (ended) return Verdict::finished;
  if (job->state == JobState::queued) return Verdict::adopt;
  const bool runs = *reported == JobState::running || *reported == JobState::throttled;
  if (job->state == JobState::placed && runs) return Verdict::started;
  return Verdict::progress;
}

AgentPlan plan_agent(const std::vector<Assignment>& desired, const std::vector<LocalAssignment>& local) {
  AgentPlan plan;
  std::map<std::pair<std::string, std::int64_t>, const LocalAssignment*> have;
  for (const auto& job : local) have[{job.origin, job.epoch}] = &job;
  std::map<std::pair<std::string, std::int64_t>, const Assignment*> want;
  for (const auto& job : desired) {
    want[{job.id, job.epoch}] = &job;
    const auto it = have.find({job.id, job.epoch});
    if (it == have.end()) {
      if (!job.stop) plan.start.push_back(job);
      continue;
    }
    const LocalAssignment& mine = *it->second;
    if (mine.terminal) continue;
    if (job.stop) {
      if (!mine.stopping) plan.stop.emplace_back(mine.local_id, "cancelled on the coordinator");
    } else if (job.paused && !mine.paused) {
      plan.pause.push_back(mine.local_id);
    } else if (!job.paused && mine.paused) {
      plan.resume.push_back(mine.local_id);
    }
  }
  for (const auto& mine : local) {
    if (mine.terminal || mine.stopping || want.contains({mine.origin, mine.epoch})) continue;
    plan.stop.emplace_back(mine.local_id, "fenced: the coordinator no longer places it here (epoch " +
                                              std::to_string(mine.epoch) + ")");
  }
  return plan;
}

}  // namespace joule::cluster
