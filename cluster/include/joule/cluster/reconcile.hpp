#pragma once
// The rules that keep a job running at most once across a coordinator and its agents: what
// the coordinator makes of an agent's report, and what an agent does with the desired state.
// Identity is always (job id, epoch): a placement's epoch grows each time the job is placed
// again, so an agent still running an older epoch is fenced off.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "joule/cluster/sync.hpp"
#include "joule/schedulers/job.hpp"

namespace joule::cluster {

/// The coordinator's record of a job, as far as a report concerns it.
struct CoordinatorJob {
  schedulers::JobState state = schedulers::JobState::queued;
  std::int64_t epoch = 0;   ///< of its latest placement (0: never placed)
  std::string node;         ///< the node of that placement
};

enum class Verdict {
  stale,     ///< another placement, or unknown: not in the node's desired state, so it is stopped
  progress,  ///< the placement it has: nothing changes but the energy so far
  started,   ///< placed here and now running: the job is running
  finished,  ///< its placement ended: record the end (once; the job is then terminal)
  recorded,  ///< an end already recorded: acknowledge it so the agent stops reporting it
  adopt,     ///< the node was declared lost and the job queued again, but it still runs there
             ///< and was not placed elsewhere: take it back as it is
  /// The node was declared lost and the job queued again, and the node comes back having run
  /// it to success: take it back and record that end (it need not run again). Any other end of
  /// such a run (its runner fenced it, its agent died with it) is `stale`: the job, queued
  /// again, runs again as its restart policy says.
  ended_while_lost,
  /// Its runner ended the current placement's run because no jouled renewed its lease (the
  /// agent was down or hung, yet back before the coordinator declared it lost): the run is gone
  /// but the job is not over: queue it again, as for a lost node.
  fenced,
};
std::string_view to_string(Verdict verdict);

Verdict judge_report(const std::optional<CoordinatorJob>& job, const std::string& node, const ReportedJob& report);

/// A job the agent runs for its coordinator, as the agent has it.
struct LocalAssignment {
  std::string local_id;
  std::string origin;  ///< the coordinator's id
  std::int64_t epoch = 0;
  bool terminal = false;
  bool paused = false;
  bool stopping = false;  ///< a stop was already asked for
};

struct AgentPlan {
  std::vector<Assignment> start;
  std::vector<std::pair<std::string, std::string>> stop;  ///< local id, why
  std::vector<std::string> pause;
  std::vector<std::string> resume;
};

/// What the agent must do so that what it runs matches `desired`.
AgentPlan plan_agent(const std::vector<Assignment>& desired, const std::vector<LocalAssignment>& local);

}  // namespace joule::cluster
