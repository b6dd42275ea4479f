#pragma once
// A job's own token for POST /v1/jobs/{id}/progress (JOULE_JOB_TOKEN): random, handed to the
// job alone; only its SHA-256 is kept, with the job's row.

#include <optional>
#include <string>

namespace joule::daemon {

struct ProgressToken {
  std::string token;   ///< 48 hex digits, for the job's environment
  std::string sha256;  ///< what the row keeps
};

/// A new token; nullopt where the system gives no randomness (the job then runs without one).
std::optional<ProgressToken> new_progress_token();

}  // namespace joule::daemon
