#pragma once
// SHA-256 as lower-case hex: how API tokens are stored (only hashes reach jouled.toml).

#include <openssl/evp.h>

#include <string>

#include <fmt/format.h>

namespace joule {

inline std::string sha256_hex(const std::string& text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(text.data(), text.size(), digest, &length, EVP_sha256(), nullptr);
  std::string hex;
  hex.reserve(2 * length);
  for (unsigned int i = 0; i < length; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

}  // namespace joule
