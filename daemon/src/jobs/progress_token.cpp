#include "jobs/progress_token.hpp"

#include <array>

#include <fmt/format.h>
#include <openssl/rand.h>

#include "joule/common/sha256.hpp"

namespace joule::daemon {

std::optional<ProgressToken> new_progress_token() {
  std::array<unsigned char, 24> secret{};
  if (RAND_bytes(secret.data(), static_cast<int>(secret.size())) != 1) return std::nullopt;
  std::string token;
  for (const unsigned char byte : secret) token += fmt::format("{:02x}", byte);
  return ProgressToken{token, joule::sha256_hex(token)};
}

}  // namespace joule::daemon
