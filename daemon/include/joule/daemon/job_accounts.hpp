#pragma once
// Who a job's command runs as. Jobs must not reach the daemon's state (its database, other
// jobs' logs), so where jouled may switch users each job runs as an account of its own: a
// uid and gid of a reserved range, one per job (DynamicUser-style, no passwd entry), or one
// named account for all jobs. Pure: the caller resolves names and capabilities.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "joule/adapters/job_process.hpp"

namespace joule::daemon {

/// How jobs are run, from [jobs] run_as.
struct JobAccounts {
  enum class Mode {
    per_job,  ///< each job its own uid = gid = uid_base + (sequence mod uid_count)
    account,  ///< every job as one named account (its uid, primary gid and groups)
    daemon,   ///< as jouled itself: jobs can reach its state (only where nothing else is possible)
  };
  Mode mode = Mode::daemon;  // what a unit test gets; jouled resolves [jobs] run_as
  /// Unused by systemd and common distributions: 0x70000000 is past the container ranges
  /// (up to 0x6FFFFFFF) and before the "foreign" range (0x7FFE0000).
  uid_t uid_base = 0x70000000;
  std::uint32_t uid_count = 1u << 27;
  adapters::JobIdentity account;    ///< Mode::account
  std::string account_name;         ///< Mode::account, for USER and LOGNAME
  std::vector<gid_t> extra_groups;  ///< per_job: supplementary groups (e.g. video, render)

  /// The identity of the job with this submission sequence; nothing in Mode::daemon.
  std::optional<adapters::JobIdentity> identity_for(std::int64_t sequence) const {
    switch (mode) {
      case Mode::per_job: {
        const auto slot = static_cast<std::uint64_t>(sequence < 0 ? -sequence : sequence) % uid_count;
        const auto id = static_cast<uid_t>(uid_base + slot);
        return adapters::JobIdentity{id, static_cast<gid_t>(id), extra_groups, {}};
      }
      case Mode::account:
        return account;
      case Mode::daemon:
        return std::nullopt;
    }
    return std::nullopt;
  }

  /// USER and LOGNAME for the job: the account's name, or "job-<uid>" for per-job uids.
  std::string user_name(const adapters::JobIdentity& identity) const {
    return mode == Mode::account ? account_name : "job-" + std::to_string(identity.uid);
  }
};

}  // namespace joule::daemon
