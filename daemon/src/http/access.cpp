#include "joule/daemon/access.hpp"

#include <openssl/crypto.h>

#include <algorithm>

#include <fmt/format.h>

#include "joule/common/sha256.hpp"

namespace joule::daemon {
namespace {

const TokenGrant* find_grant(const std::vector<TokenGrant>& grants, std::string_view token) {
  const std::string presented = joule::sha256_hex(std::string(token));
  const TokenGrant* found = nullptr;
  for (const auto& grant : grants) {
    // Constant time, and every grant compared: how much of a hash matched must not leak.
    if (grant.sha256.size() == presented.size() &&
        CRYPTO_memcmp(grant.sha256.data(), presented.data(), presented.size()) == 0)
      found = &grant;
  }
  return found;
}

}  // namespace

Result<Scopes> scopes_from_names(const std::vector<std::string>& names) {
  Scopes scopes = 0;
  for (const auto& name : names) {
    if (name == "read")
      scopes |= kReadScopes;
    else if (name == "submit")
      scopes |= kSubmitScopes;
    else if (name == "admin")
      scopes |= kAdminScopes;
    else if (name == "agent")
      scopes |= kAgentScopes;
    else
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("unknown scope \"{}\" (read, submit, admin or agent)", name));
  }
  return scopes;
}

std::vector<std::string> scope_names(Scopes scopes) {
  std::vector<std::string> out;
  for (const auto& [scope, name] : {std::pair{Scope::read, "read"}, std::pair{Scope::submit, "submit"},
                                    std::pair{Scope::admin, "admin"}, std::pair{Scope::agent, "agent"}}) {
    if (scopes & scope_bit(scope)) out.emplace_back(name);
  }
  return out;
}

Result<Principal> identify(const AccessConfig& config, std::string_view bearer_token, std::optional<uid_t> peer_uid) {
  if (!bearer_token.empty()) {
    if (const TokenGrant* grant = find_grant(config.tokens, bearer_token))
      return Principal{"token:" + grant->name, grant->scopes, std::nullopt};
    return make_error(ErrorCode::unauthorized, "the bearer token is not one jouled accepts");
  }
  if (peer_uid) {
    const bool admin =
        std::find(config.admin_uids.begin(), config.admin_uids.end(), *peer_uid) != config.admin_uids.end();
    const Scopes scopes = admin ? kAdminScopes : config.local_user_scopes;
    if (scopes != 0) return Principal{fmt::format("uid:{}", *peer_uid), scopes, peer_uid};
  }
  return make_error(ErrorCode::unauthorized, "a valid bearer token is required (Authorization: Bearer TOKEN)");
}

Result<Principal> identify_agent(const AccessConfig& config, std::string_view bearer_token,
                                 std::optional<uid_t> peer_uid) {
  if (!bearer_token.empty()) {
    if (const TokenGrant* grant = find_grant(config.agent_tokens, bearer_token))
      return Principal{"agent:" + grant->name, kAgentScopes, std::nullopt};
    if (config.agent_tokens.empty()) {
      if (const TokenGrant* grant = find_grant(config.tokens, bearer_token);
          grant && (grant->scopes & scope_bit(Scope::admin)))
        return Principal{"agent:" + grant->name, kAgentScopes, std::nullopt};
    }
  } else if (config.tokens.empty() && config.agent_tokens.empty() && peer_uid &&
             std::find(config.admin_uids.begin(), config.admin_uids.end(), *peer_uid) != config.admin_uids.end()) {
    // A coordinator without any token listens on loopback only (jouled refuses anything else):
    // agents of the same machine's administrators may sync there as they could before tokens.
    return Principal{fmt::format("agent:uid:{}", *peer_uid), kAgentScopes, peer_uid};
  }
  return make_error(ErrorCode::unauthorized, "an agent token is required (Authorization: Bearer TOKEN)");
}

}  // namespace joule::daemon
