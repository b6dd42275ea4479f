#include "joule/daemon/status_page.hpp"

#include <openssl/evp.h>

#include <vector>

#include <fmt/format.h>

namespace joule::daemon {

namespace {

// CSP source expressions are base64 of the digest (CSP3 §2.3.1), not hex.
std::string sha256_base64(std::string_view text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(text.data(), text.size(), digest, &length, EVP_sha256(), nullptr);
  std::vector<unsigned char> encoded(4 * ((length + 2) / 3) + 1);
  const int written = EVP_EncodeBlock(encoded.data(), digest, static_cast<int>(length));
  return std::string(reinterpret_cast<const char*>(encoded.data()), static_cast<std::size_t>(written));
}

// "'sha256-...' 'sha256-...'" for the text of every <tag>...</tag> element: a browser hashes an
// inline element's text exactly as written (script and style content is raw text, no entities).
std::string hashes_of(std::string_view html, std::string_view tag) {
  const std::string open = fmt::format("<{}>", tag);
  const std::string close = fmt::format("</{}>", tag);
  std::string out;
  for (auto start = html.find(open); start != std::string_view::npos; start = html.find(open, start)) {
    start += open.size();
    const auto end = html.find(close, start);
    if (end == std::string_view::npos) break;
    out += fmt::format("{}'sha256-{}'", out.empty() ? "" : " ", sha256_base64(html.substr(start, end - start)));
    start = end + close.size();
  }
  return out.empty() ? "'none'" : out;
}

}  // namespace

std::string status_page_policy(std::string_view html) {
  return fmt::format(
      "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; img-src data:; base-uri 'none'; "
      "form-action 'none'; frame-ancestors 'none'",
      hashes_of(html, "script"), hashes_of(html, "style"));
}

}  // namespace joule::daemon
