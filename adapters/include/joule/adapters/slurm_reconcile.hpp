#pragma once
// Deciding, from Slurm's current listing, what became of the jobs Joule handed to Slurm (pure, no I/O).
//
// Why this exists: slurmctld acknowledges sbatch before the job is saved; after a controller
// crash, submissions of the last ~5 s can be gone and their job ids handed to new jobs
// (docs/design.md, Slurm, "Exactly once"). So a job is identified by the joule id in its
// comment ("joule:<id>"), never by its Slurm id alone, and Joule resubmits a job that vanished
// before it started, once, and never while any Slurm job carries its joule id. "Before it
// started" is only what Joule saw: slurmctld can launch a job and crash before Joule's next
// listing, so the executor also guards each job's command with a run claim (batch_script) and
// then resubmits any vanished job, whose copy reports the first one's end.
//
// The other way round, a job that ended in the seconds before the crash can come back RUNNING
// from the saved state (measured: a COMPLETED job recovered as RUNNING with its batch step):
// Joule keeps a terminal state once it has seen one and stops reconciling that job.
//
// Use: record a job (slurm_id empty) before calling sbatch, store the id sbatch returns, and
// run reconcile() on every listing after a controller restart (or periodically) with no
// sbatch of Joule's in flight; a submission in flight would look lost.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "joule/adapters/slurm.hpp"

namespace joule::adapters {

/// What Joule remembers of a job it handed to Slurm and still considers live.
struct HandedJob {
  std::string joule_id;
  std::string slurm_id;           ///< what sbatch returned; empty while (or if) it never answered
  std::int64_t submitted_ms = 0;  ///< Unix ms when Joule called sbatch for its current Slurm job
  bool seen_running = false;      ///< a listing ever showed it started (RUNNING, SUSPENDED, ended...)
  int resubmissions = 0;          ///< how many times reconcile() already had it submitted again
};

struct ReconcileOptions {
  std::int64_t now_ms = 0;  ///< the time of the listing
  /// slurmctld's MinJobAge: a finished job stays listed at least this long. A job missing from
  /// the listing that was submitted earlier than this may have run and been forgotten (without
  /// accounting), so it is `lost`, not resubmitted: running it twice is worse than asking.
  std::int64_t min_job_age_ms = 300'000;
  /// A job whose resubmissions vanished this often is `lost` instead (a controller that keeps
  /// crashing must not make Joule submit forever).
  int max_resubmissions = 1;
  /// The submissions carry a run claim (SlurmSubmission::run_claim_dir): a second copy cannot
  /// run the command again, it reports how the first ended. Then a job gone after it started
  /// (or older than MinJobAge) is submitted again too, to learn that end, instead of `lost`.
  bool guarded = false;
  /// Only Slurm jobs of this user are Joule's (anyone can write "joule:<id>" into a comment):
  /// the user jouled submits as. Empty: any user's.
  std::string user;
  /// Only joule ids that start with this are Joule's to cancel as strays (several jouled
  /// sharing one cluster give their ids distinct prefixes); empty: every "joule:" comment.
  std::string id_prefix;
};

enum class ReconcileAction {
  keep,      ///< found by its joule id: follow `job` (its state may say it ended)
  resubmit,  ///< Slurm lost it before it started (or, guarded, at all): submit it again, once, and store the new id
  lost,      ///< it had started (or may have) and is gone, unguarded: fail or requeue by its restart policy
  stray,     ///< a live Slurm job with a joule id but not one Joule is following: scancel it
};

std::string_view to_string(ReconcileAction action);

/// Whether a listing shows the job started: what sets HandedJob::seen_running.
bool has_started(const SlurmJob& job);

struct ReconcileDecision {
  ReconcileAction action = ReconcileAction::keep;
  std::string joule_id;
  /// keep: Slurm's id for the job now; stray: the job to cancel; resubmit, lost: the id Joule had.
  std::string slurm_id;
  bool slurm_id_changed = false;  ///< keep: Slurm knows it under another id than Joule recorded
  std::optional<SlurmJob> job;    ///< keep, stray: Slurm's record
  std::string reason;             ///< one line for the log
};

/// One decision per distinct joule id in `handed` (in its order; a repeated joule id is
/// decided once, by its first record), then one `stray` per live Slurm job to cancel.
/// When several Slurm jobs carry one handed joule id, the one kept is the recorded Slurm id if it
/// is among them, else one that started, else the lowest id; the other live ones are strays.
/// Slurm jobs without a joule id, of another user, and finished ones Joule does not follow,
/// are left alone.
std::vector<ReconcileDecision> reconcile(std::span<const HandedJob> handed, std::span<const SlurmJob> listing,
                                         const ReconcileOptions& options);

}  // namespace joule::adapters
