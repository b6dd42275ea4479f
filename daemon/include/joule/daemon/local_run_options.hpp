#pragma once
// How this node runs jobs as processes (the local executor's settings): where their
// directories go, whose accounts they run under, what starts them, and what limits them.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "joule/adapters/control_journal.hpp"
#include "joule/adapters/jetson_power_mode.hpp"
#include "joule/adapters/job_controls.hpp"
#include "joule/adapters/job_process.hpp"
#include "joule/daemon/job_accounts.hpp"

namespace joule::daemon {

struct LocalRunOptions {
  std::filesystem::path state_directory;
  /// Where each job gets a directory of its own (its default workdir, HOME and TMPDIR), owned
  /// by the job's account. Outside the state directory, which jobs must not reach. Empty: the
  /// job's directory in the state directory (only with JobAccounts::Mode::daemon).
  std::filesystem::path work_directory;
  JobAccounts accounts;
  /// The account of a local user who submitted a job (uid, primary gid, groups), for jobs to
  /// run as their submitter; nothing for root and jouled's own uid, whose jobs get accounts of
  /// their own. Unset: every job gets `accounts`' identity.
  std::function<std::optional<adapters::JobIdentity>(std::int64_t uid)> user_identity;
  std::filesystem::path runner;  ///< executable that understands --job-runner (jouled itself)
  double kill_grace_seconds = 10.0;
  std::string boot_id;
  std::filesystem::path proc_root = "/proc";
  /// Per-job cgroups (freezer, CPU quota) when the daemon's cgroup is delegated; nullptr or
  /// unusable: jobs are paused with SIGSTOP and get no CPU quota.
  std::shared_ptr<adapters::JobCgroups> cgroups;
  /// Where the originals of the knobs jobs set are noted before they change (owned by the
  /// daemon); nullptr: not noted, so a kill -9 would leave a job's setting in force.
  adapters::ControlJournal* control_journal = nullptr;
  /// How knobs run their tools (nvpmodel); adapters::run_command where unset.
  adapters::CommandRunner run_tool;
  /// The directory holding the Python package `joule` (python/ of the source tree, or
  /// share/joule/python of an install): put first on every job's PYTHONPATH, so training
  /// scripts `import joule` without installing it. Empty: PYTHONPATH is the job's own.
  std::filesystem::path python_path;
  /// joule-worker, which runs jobs with `run.builtin` (the built-in trainer). Empty: such jobs
  /// are refused.
  std::filesystem::path worker;
};

}  // namespace joule::daemon
