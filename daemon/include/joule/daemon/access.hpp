#pragma once
// Who sent a request and what they may do: bearer tokens with an owner and scopes, or, on
// loopback without a token, the local user the kernel names (see adapters/peer_credentials).
// Pure: the caller hands in the token and the peer's uid; routes ask the Principal.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "joule/common/result.hpp"

namespace joule::daemon {

/// What a principal may do. Each scope includes the ones above it except `agent`.
///   read    GET devices, nodes, budgets, probes, jobs (others' run.env redacted), POST /v1/estimate
///   submit  read, POST /v1/jobs (owned by the submitter); cancel, pause, resume and read the
///           logs of its own jobs
///   admin   everything, on every job (probes, others' jobs, their logs and env)
///   agent   POST /v1/cluster/sync only
enum class Scope : std::uint8_t { read = 1, submit = 2, admin = 4, agent = 8 };

/// Scopes as a bit set; `scopes_from_names` expands submit to read+submit and admin to all three.
using Scopes = std::uint8_t;
constexpr Scopes scope_bit(Scope scope) { return static_cast<Scopes>(scope); }
constexpr Scopes kReadScopes = scope_bit(Scope::read);
constexpr Scopes kSubmitScopes = kReadScopes | scope_bit(Scope::submit);
constexpr Scopes kAdminScopes = kSubmitScopes | scope_bit(Scope::admin);
constexpr Scopes kAgentScopes = scope_bit(Scope::agent);

/// "read", "submit", "admin", "agent" as a scope set; an unknown name is an error naming it.
Result<Scopes> scopes_from_names(const std::vector<std::string>& names);
std::vector<std::string> scope_names(Scopes scopes);

/// A token jouled accepts: only the SHA-256 of the token is known.
struct TokenGrant {
  std::string sha256;  ///< lower-case hex
  std::string name;    ///< the owner: jobs submitted with it are "token:<name>"'s
  Scopes scopes = kAdminScopes;
};

struct AccessConfig {
  std::vector<TokenGrant> tokens;        ///< API tokens
  std::vector<TokenGrant> agent_tokens;  ///< tokens agents sync with (scope agent)
  /// What a loopback client without a token may do, identified by its uid: by default it
  /// reads and submits jobs of its own. 0: a token is needed on loopback too.
  Scopes local_user_scopes = kSubmitScopes;
  /// Local users who administer jouled without a token: root and jouled's own account.
  std::vector<uid_t> admin_uids = {0};
};

/// Who a request is from.
struct Principal {
  std::string name;  ///< "token:alice", "uid:1000"; jobs are owned by this name
  Scopes scopes = 0;
  std::optional<uid_t> uid;  ///< the local user, for a loopback client identified by its uid

  bool has(Scope scope) const { return (scopes & scope_bit(scope)) != 0; }
  /// Whether it may act on (cancel, pause, read the log and env of) a job owned by `owner`.
  bool may_act_on(std::string_view owner) const { return has(Scope::admin) || (!owner.empty() && owner == name); }
};

/// Who sent a request: the grant whose hash matches `bearer_token` (compared in constant
/// time), else, without a token, the loopback client's uid. A token that matches nothing is
/// `unauthorized` even on loopback: a wrong token is a mistake to report, not to work around.
Result<Principal> identify(const AccessConfig& config, std::string_view bearer_token, std::optional<uid_t> peer_uid);

/// The agent's principal for POST /v1/cluster/sync: a matching agent token, else (where no
/// agent tokens are configured) an API token with admin scope; without any token configured,
/// a loopback client of an admin uid.
Result<Principal> identify_agent(const AccessConfig& config, std::string_view bearer_token,
                                 std::optional<uid_t> peer_uid);

}  // namespace joule::daemon
