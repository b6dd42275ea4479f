#pragma once
// The reason of the oldest queued OpenSSL error ("no start line", "certificate verify failed");
// empties the queue. Header-only: its users link OpenSSL themselves.

#include <string>

#include <openssl/err.h>

namespace joule {

inline std::string openssl_reason() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  const char* reason = code ? ERR_reason_error_string(code) : nullptr;
  return reason ? reason : "unknown OpenSSL error";
}

}  // namespace joule
