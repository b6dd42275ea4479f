#include "joule/daemon/status_page.hpp"

#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

using joule::daemon::status_page_html;
using joule::daemon::status_page_policy;

namespace {

std::size_t count(std::string_view text, std::string_view what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string_view::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

}  // namespace

// Expected hashes: printf %s 'alert(1)' | openssl dgst -sha256 -binary | base64
TEST(StatusPageTest, policy_allows_each_inline_script_and_style_by_the_sha256_of_its_text) {
  const std::string policy =
      status_page_policy("<style>p{}</style><style>b{}</style><body><script>alert(1)</script></body>");
  EXPECT_EQ(policy,
            "default-src 'none'; script-src 'sha256-bhHHL3z2vDgxUt0W3dWQOrprscmda2Y5pLsLg4GF+pI='; "
            "style-src 'sha256-gG2yISYereRMiG2lMXrbiUgi0Ubw9p7QCeWcroOvy9Y=' "
            "'sha256-7yqHVAesot11p6HczDsgKRipvI5UPgs97z80zNXlans='; connect-src 'self'; img-src data:; "
            "base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
}

TEST(StatusPageTest, policy_of_a_page_without_scripts_runs_none) {
  const std::string policy = status_page_policy("<p>nothing to run</p><script>unterminated");
  EXPECT_NE(policy.find("script-src 'none';"), std::string::npos) << policy;
  EXPECT_NE(policy.find("style-src 'none';"), std::string::npos) << policy;
}

TEST(StatusPageTest, embedded_page_is_the_asset_byte_for_byte) {
  std::ifstream file(JOULE_SOURCE_DIR "/daemon/assets/status.html", std::ios::binary);
  ASSERT_TRUE(file);
  std::ostringstream text;
  text << file.rdbuf();
  EXPECT_EQ(status_page_html(), text.str());
}

// What keeps the page offline and its script the only one: one inline script and one inline
// style, written without attributes (the policy hashes exactly those), nothing loaded by URL,
// and data from the API put in as text only.
TEST(StatusPageTest, embedded_page_is_self_contained_and_builds_no_markup_from_data) {
  const std::string_view html = status_page_html();
  EXPECT_EQ(count(html, "<script"), 1u);
  EXPECT_EQ(count(html, "<script>"), 1u);
  EXPECT_EQ(count(html, "<style"), 1u);
  EXPECT_EQ(count(html, "<style>"), 1u);
  EXPECT_EQ(count(html, " src="), 0u);
  EXPECT_EQ(count(html, "href="), count(html, "href=\"data:"));
  EXPECT_EQ(count(html, "@import"), 0u);
  EXPECT_EQ(count(html, "url("), 0u);
  // The one absolute URL is SVG's namespace name, which nothing fetches.
  EXPECT_EQ(count(html, "://"), count(html, "'http://www.w3.org/2000/svg'"));
  for (const char* sink : {"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function("})
    EXPECT_EQ(count(html, sink), 0u) << sink;
  const std::string policy = status_page_policy(html);
  EXPECT_EQ(policy.find("unsafe"), std::string::npos) << policy;
}
