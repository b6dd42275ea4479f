#pragma once
// Handing jobs to a Slurm cluster through its command-line tools (sbatch, scontrol, scancel, sacct).
//
// Identity: every job Joule submits carries `--comment=joule:<joule_id>`, and that comment, not
// the Slurm job id, says which Joule job a Slurm job is. slurmctld acknowledges a submission
// before it is saved and hands the same job ids out again after a crash (docs/design.md,
// Slurm, "Exactly once"), so a Slurm id alone proves nothing; slurm_reconcile.hpp decides what
// to do with what list() returns.
//
// Every call runs one or two short commands (no shell) and blocks its thread until they end or
// time out; call it off the event loop. SlurmCli has no mutable state besides a flag remembering
// that accounting is disabled: it is safe to share between threads (and neither copied nor moved).

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "joule/common/result.hpp"

namespace joule::adapters {

/// How to reach Slurm's tools.
struct SlurmOptions {
  std::filesystem::path bin_dir;  ///< where sbatch etc. live; empty: looked up in PATH
  double timeout_seconds = 15.0;  ///< per command; sbatch needs ~9 s to give up on a dead controller
  /// Extra NAME=VALUE for the commands, e.g. SLURM_CONF=/path/slurm.conf. sbatch runs with these
  /// and the job's environment only, plus SLURM_CONF from this process's environment if set.
  std::vector<std::string> env;
  int accounting_days = 2;  ///< how far back list() asks sacct, where accounting is enabled
};

/// One job to hand to Slurm. Its command runs as the batch script `exec 'argv0' 'argv1'...`
/// (each word in single quotes: never split or expanded), in exactly the environment `env`
/// plus Slurm's SLURM_* variables: sbatch runs with that environment and --export=ALL, so
/// nothing of jouled's own environment reaches the job. Not --export=NONE: Slurm 22.05 then
/// builds the submitting user's login environment on the node (`su - user`), which measured
/// 1.3 s more from submission to the command starting here, and depends on the user's profile.
struct SlurmSubmission {
  std::string joule_id;    ///< [A-Za-z0-9._:-], 1..128 characters; goes into the comment
  std::string name;        ///< --job-name; empty: the joule id
  std::string partition;   ///< empty: the cluster's default partition
  std::string nodelist;    ///< --nodelist; empty: any node
  std::string constraint;  ///< --constraint (node features); empty: none
  std::vector<std::string> argv;
  std::string workdir;  ///< --chdir; empty: the caller's working directory
  /// The job's environment; PATH=/usr/local/bin:/usr/bin:/bin unless given. Names are shell
  /// identifiers, not SLURM_* or SBATCH_* (sbatch would read those as its own options).
  std::map<std::string, std::string> env;
  std::string stdout_path, stderr_path;  ///< empty: Slurm's default slurm-<id>.out in workdir; '%' is literal
  bool hold = false;                     ///< submit held (PENDING, JobHeldUser) until release()
  /// Where the batch script claims the joule id before it runs argv (see batch_script); a
  /// directory every node of the partition sees, as the job's output files are. Empty: no claim.
  std::string run_claim_dir;
  /// How long a second copy waits for the first copy's exit status before giving up (kSecondCopyExit).
  int run_claim_wait_seconds = 60;
};

/// The exit status of a second Slurm job of one joule id whose first copy had started and left
/// no exit status within run_claim_wait_seconds: the command was not run again.
inline constexpr int kSecondCopyExit = 86;

/// One job as Slurm reports it.
struct SlurmJob {
  std::string slurm_id;
  std::string joule_id;            ///< parsed from a "joule:<id>" comment; empty when the job is not Joule's
  std::string user;                ///< the Slurm user who submitted it (anyone may write any comment)
  std::string state;               ///< Slurm's base state: PENDING, RUNNING, SUSPENDED, COMPLETED, FAILED, CANCELLED...
  std::string reason;              ///< Slurm's reason (JobHeldUser, NonZeroExitCode, None...)
  std::string nodes;               ///< node list; empty until it has an allocation
  std::optional<int> exit_code;    ///< set once the job has ended (0 for a job cancelled before it started)
  std::optional<int> exit_signal;  ///< set when a signal ended it (scancel of a running job: 9 or 15)
  std::optional<std::int64_t> start_ms, end_ms;  ///< Unix ms; start only once it really started, end once ended
};

/// The Slurm commands Joule needs. Errors carry Slurm's own stderr verbatim and the command:
/// "`sbatch ... --partition=nope ...` failed (exit 1): sbatch: error: invalid partition specified: nope; ...".
/// Codes: unavailable when slurmctld cannot be reached or a command times out (retry later);
/// invalid_argument for a submission Slurm or Joule rejects; not_found for an unknown job id;
/// conflict for a job in the wrong state (resume of a running job, release of a finished one);
/// internal for anything else, including output that cannot be parsed.
class SlurmCli {
 public:
  explicit SlurmCli(SlurmOptions options = {});

  /// sbatch --parsable --comment=joule:<id> ... --export=ALL --wrap=<script>; returns the job
  /// id (a ";cluster" suffix is stripped). Not idempotent: a timeout may still have submitted
  /// the job, which a later list() finds by its joule id.
  Result<std::string> submit(const SlurmSubmission& submission) const;

  /// Every job slurmctld knows, Joule's and others', finished ones included for MinJobAge
  /// (`scontrol show job --oneliner`; not squeue --json, which answers a dead controller with
  /// exit 0, no jobs and "Unspecified error"). With accounting (slurmdbd), sacct adds jobs of
  /// the last `accounting_days` days that slurmctld has forgotten; their joule ids need
  /// AccountingStoreFlags=job_comment. Without accounting ("Slurm accounting storage is
  /// disabled") sacct is not asked again; other sacct failures leave slurmctld's listing as is.
  Result<std::vector<SlurmJob>> list() const;

  Status suspend(std::string_view slurm_id) const;  ///< scontrol suspend: SIGSTOP to the job, RUNNING → SUSPENDED
  Status resume(std::string_view slurm_id) const;   ///< scontrol resume
  /// scancel. Slurm 22.05 says nothing about an unknown or finished job, so neither is an error.
  Status cancel(std::string_view slurm_id) const;
  Status release(std::string_view slurm_id) const;  ///< scontrol release of a --hold job

  /// The cluster's energy accounting plugin (`scontrol show config`, AcctGatherEnergyType):
  /// "rapl", "ipmi", "gpu", "pm_counters"...; empty where none is configured.
  Result<std::string> energy_plugin() const;
  /// A finished job's energy as Slurm's accounting has it (sacct ConsumedEnergyRaw, joules; see
  /// parse_sacct_energy); nullopt while sacct has no figure for it yet, or has none at all.
  Result<std::optional<double>> consumed_energy(std::string_view slurm_id) const;
  /// Running jobs' energy so far, as the energy plugin has it for their steps (one sstat for
  /// them all; see parse_sstat_energy), by Slurm job id; a job without a figure yet is absent.
  Result<std::map<std::string, double>> running_energy(const std::vector<std::string>& slurm_ids) const;

 private:
  /// `environment`: the command's whole environment; none: ours with options_.env on top.
  Result<std::string> run(const std::string& tool, const std::vector<std::string>& args,
                          std::optional<std::vector<std::string>> environment = std::nullopt) const;
  Status control(const std::string& tool, std::vector<std::string> args, std::string_view slurm_id) const;
  std::vector<SlurmJob> accounting_jobs() const;

  SlurmOptions options_;
  mutable std::atomic<bool> accounting_disabled_{false};  // sacct said so once
};

/// Where a Slurm job is, in the few phases Joule tells apart (the daemon maps them onto its
/// own job states at the edge, slurm_executor.cpp).
enum class SlurmPhase {
  waiting,    ///< handed over, not started: PENDING, CONFIGURING (nodes booting), REQUEUED, REQUEUE_HOLD, REQUEUE_FED,
              ///< RESV_DEL_HOLD
  running,    ///< RUNNING, COMPLETING, RESIZING, SIGNALING, STAGE_OUT
  suspended,  ///< SUSPENDED, STOPPED (by Joule's suspend, or by scontrol)
  completed,  ///< COMPLETED
  failed,     ///< FAILED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL, DEADLINE, PREEMPTED, SPECIAL_EXIT
  cancelled,  ///< CANCELLED, REVOKED
};

/// A Slurm state's phase; nothing for a state Joule does not know. Accepts "CANCELLED by 0"
/// (sacct) and any case.
std::optional<SlurmPhase> slurm_phase(std::string_view slurm_state);

/// Whether a Slurm state is final (the job holds no resources and will not run again).
bool is_final_slurm_state(std::string_view slurm_state);

// ---- Pieces of the above, public so that they are tested against captured real output ----

/// The comment that names a Joule job, and back ("" when the comment is not one of ours).
std::string joule_comment(std::string_view joule_id);
std::string joule_id_from_comment(std::string_view comment);

/// Whether a joule id can go into a comment and come back unchanged through every listing.
bool valid_joule_id(std::string_view joule_id);

/// `word` in single quotes for /bin/sh ('' for the empty word, ' as '\'').
std::string shell_quote(std::string_view word);

/// The script run by --wrap: `exec` and the quoted words of argv (see SlurmSubmission).
///
/// With a run_claim_dir, the script first claims <run_claim_dir>/<joule_id> (mkdir: atomic, on
/// NFS too), runs argv, and stores its exit status there. A slurmctld that crashed before saving
/// a job can have launched it already and then forget it (docs/design.md, Slurm, "Exactly
/// once"), so Joule may submit a job whose command ran or runs: that second copy finds the
/// claim, waits for the first's exit status and exits with it without running anything, or
/// exits kSecondCopyExit when none comes. A claim that cannot be made (unwritable directory)
/// runs argv anyway, with a warning on the job's stderr.
std::string batch_script(const SlurmSubmission& submission);

/// sbatch's arguments after the program name; invalid_argument naming the field when a
/// submission cannot be expressed (bad joule id, empty argv, bad env name...).
Result<std::vector<std::string>> sbatch_arguments(const SlurmSubmission& submission);

/// sbatch's whole environment: the job's `env` (PATH defaulted) and then `slurm_env`
/// (SlurmOptions::env: how sbatch finds the cluster, e.g. SLURM_CONF), which the job sees too.
std::vector<std::string> sbatch_environment(const SlurmSubmission& submission,
                                            const std::vector<std::string>& slurm_env);

/// sbatch --parsable's answer: "123" or "123;cluster" → "123".
Result<std::string> parse_sbatch_id(std::string_view output);

/// `squeue --json` and slurmrestd's GET /slurm/v0.0.38/jobs (the same v0.0.38 job schema;
/// later formats' object-valued numbers and state lists are accepted too). A non-empty
/// "errors" array is a failure (unavailable): squeue reports a dead controller only there.
Result<std::vector<SlurmJob>> parse_squeue_json(std::string_view text);

/// `scontrol show job --oneliner`, one job per line; "No jobs in the system" gives none. Times
/// are epoch seconds (SLURM_TIME_FORMAT=%s, as SlurmCli runs it) or ISO local time. Values
/// with spaces (another user's comment) run up to the next word that looks like "Key=".
Result<std::vector<SlurmJob>> parse_scontrol_jobs(std::string_view text);

/// `sacct -X -n -P --format=JobIDRaw,User,State,Reason,NodeList,ExitCode,Start,End,Comment`
/// (the comment last, so a '|' in it stays in it).
Result<std::vector<SlurmJob>> parse_sacct(std::string_view text);

/// The energy plugin named in `scontrol show config` ("AcctGatherEnergyType = acct_gather_energy/rapl"
/// gives "rapl"); empty for none, "(null)" or a listing without it.
std::string parse_energy_plugin(std::string_view show_config);

/// `sacct -n -P -j ID --format=JobIDRaw,ConsumedEnergyRaw`: the job's own line where it carries
/// a figure above 0, else its batch step's (the command Joule hands Slurm runs there); nullopt
/// where neither has one (no energy plugin, or the figure not stored yet).
std::optional<double> parse_sacct_energy(std::string_view text, std::string_view slurm_id);

/// `sstat -n -P -a -j ID,ID... --format=JobID,ConsumedEnergyRaw`: each job's energy so far, by job
/// id, from its batch step's line (the command Joule hands Slurm runs there), else its largest
/// step's. Steps are not summed: a node-level plugin (rapl, ipmi) charges every step running at
/// once with the node's energy over its life, so overlapping steps would count it twice. A job
/// whose steps carry no figure above 0 is absent.
std::map<std::string, double> parse_sstat_energy(std::string_view text);

/// The error code for a failed Slurm command (`tool` is sbatch, scontrol...) from its stderr (see SlurmCli).
ErrorCode classify_slurm_error(std::string_view tool, std::string_view stderr_text);

}  // namespace joule::adapters
