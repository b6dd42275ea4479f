#pragma once
// Running a job's command as a real process that can outlive the daemon and be re-adopted.
//
// jouled starts every job through a small runner (the jouled binary itself, called with
// `--job-runner`): the runner leads a new process group, starts the command, waits for it and
// writes its exit status to a file. The file is what lets a restarted daemon (after kill -9 or
// an upgrade) learn how a job ended that it could not wait for itself.

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "joule/common/result.hpp"

namespace joule::adapters {

/// The account a job's command runs as, when it is not the daemon's own.
struct JobIdentity {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  ///< supplementary groups (e.g. video for a GPU); may be empty
  std::string user_name;      ///< for USER and LOGNAME; empty where the account has no name
};

/// What to start and where its output and status go.
struct LaunchSpec {
  std::vector<std::string> argv;
  std::filesystem::path workdir;
  /// The command's complete environment, "NAME=value". The runner itself starts with an empty
  /// one and gets this through a memfd, so nothing in it (LD_PRELOAD...) reaches the runner.
  std::vector<std::string> env;
  std::filesystem::path stdout_path;
  std::filesystem::path stderr_path;
  std::filesystem::path status_path;
  std::filesystem::path runner;  ///< the executable that understands --job-runner
  /// Run the command (not the runner, which stays the daemon's to write the status) as this
  /// account, with no capabilities. The workdir is then entered after the switch, so a
  /// directory the account may not enter fails the job (exit 127, the reason on stderr).
  std::optional<JobIdentity> identity;
  /// A lease the runner holds for the job (empty: none, the job outlives its daemon to be
  /// adopted). The daemon renews it by touching the file (renew_lease); when its modification
  /// time has not changed for `lease_seconds` of the runner's monotonic time the runner pauses
  /// the job (SIGSTOP), resumes it if the lease is renewed, and after twice that ends it (TERM,
  /// then KILL 10 s later). A job run for a coordinator holds one, so that it cannot go on
  /// running beside its next placement once its agent is gone.
  std::filesystem::path lease_path;
  double lease_seconds = 0.0;
  /// The CPUs the command (and all it starts) may run on (sched_setaffinity before exec); empty:
  /// any. One the kernel refuses fails the job (exit 127, the reason on stderr).
  std::vector<int> cpus;
};

/// The CPUs this process may run on (its affinity), ascending.
std::vector<int> usable_cpus();
/// CPUs as the kernel lists them: "0-3,6".
std::string cpu_list_text(const std::vector<int>& cpus);

/// Renews a job's lease (creates the file if needed): its modification time moves on.
Status renew_lease(const std::filesystem::path& lease_path);

/// A process named so that a recycled pid is never mistaken for it: pid plus its start time
/// in clock ticks since boot (field 22 of /proc/PID/stat).
struct ProcessIdentity {
  pid_t pid = 0;
  std::uint64_t start_ticks = 0;
};

/// How a job's command ended.
struct ExitStatus {
  bool signaled = false;
  int value = 0;  ///< exit code, or the signal number when `signaled`
  /// CPU seconds (user + system) of the command and the descendants it waited for, from the
  /// runner's wait4; absent where unknown (a child reaped directly, an older runner's file).
  std::optional<double> cpu_seconds;
  /// Its runner ended it because the daemon stopped renewing its lease (LaunchSpec::lease_path).
  bool fenced = false;
  bool success() const { return !signaled && value == 0; }
  /// "exit code 3", "killed by signal 9 (Killed)".
  std::string describe() const;
};

/// Why `identity` cannot reach `path` (search every directory on the way, and `last_access` on
/// the last: S_IXOTH to enter a directory or run a program, S_IROTH to read a file), e.g. "/root is mode 0700, owned by
/// uid 0"; nothing when it can. Judged by the mode bits as the kernel would for that account (POSIX ACLs are not read).
std::optional<std::string> unreachable_by(const std::filesystem::path& path, const JobIdentity& identity,
                                          mode_t last_access = S_IXOTH);

/// Starts the runner in a new process group (pgid = pid), stdin from /dev/null, stdout and
/// stderr appended to their files (never through a symbolic link), in `workdir`, with no
/// descriptor of the daemon inherited.
Result<ProcessIdentity> launch_job(const LaunchSpec& spec);

/// The start time of a live process, or nothing if there is no such process.
std::optional<std::uint64_t> process_start_ticks(pid_t pid, const std::filesystem::path& proc_root = "/proc");

/// Whether `identity` still names a live process (same pid and same start time).
bool is_alive(const ProcessIdentity& identity, const std::filesystem::path& proc_root = "/proc");

/// A pidfd (Linux >= 5.3) that becomes readable when the process ends; the caller owns it.
Result<int> open_pidfd(pid_t pid);

/// Sends `signal` to the process group led by `pgid`; a group already gone is not an error.
Status signal_process_group(pid_t pgid, int signal);

/// Collects a child of this process without blocking; nothing if it has not ended yet or is
/// not our child (an adopted job).
std::optional<ExitStatus> reap_child(pid_t pid);

/// The status the runner wrote, if it did: "exit N" or "signal N", then "cpu SECONDS".
std::optional<ExitStatus> read_status_file(const std::filesystem::path& path);

/// CPU seconds (user + system, with waited-for children's) of every live process in the group
/// `pgid`: a running job's CPU time so far (its runner leads the group). Nothing if the group
/// has no live process.
std::optional<double> process_group_cpu_seconds(pid_t pgid, const std::filesystem::path& proc_root = "/proc");
/// The same for several groups in one walk of `proc_root` (a meter sample reads every running
/// job's): each group with a live process, and its seconds.
std::map<pid_t, double> process_groups_cpu_seconds(const std::vector<pid_t>& groups,
                                                   const std::filesystem::path& proc_root = "/proc");

/// The CPUs a job's command may run on, read from the first process of the group `pgid` other
/// than its runner (`Cpus_allowed_list` in its status): what a job adopted after a restart was
/// confined to. Nothing where no such process lives.
std::optional<std::vector<int>> process_group_cpus(pid_t pgid, const std::filesystem::path& proc_root = "/proc");

/// The runner's own main: `STATUS_PATH [--env-fd N] [--uid U --gid G [--groups G,...]]
/// [--workdir DIR] -- ARGV...`. Returns the process exit code.
int job_runner_main(int argc, char** argv);

}  // namespace joule::adapters

namespace joule::adapters {

/// Finds a live runner started for `status_path` by scanning `<proc_root>/*/cmdline`: how a
/// restarted daemon re-finds a job whose pid it never got to store. A runner still inside its
/// exec (the first milliseconds after launch_job returns) shows an empty cmdline and is missed.
std::optional<ProcessIdentity> find_job_runner(const std::filesystem::path& status_path,
                                               const std::filesystem::path& proc_root = "/proc");

/// The kernel's boot id (`<proc_root>/sys/kernel/random/boot_id`); pids and start times are
/// only comparable within one boot.
std::string read_boot_id(const std::filesystem::path& proc_root = "/proc");

}  // namespace joule::adapters
