#pragma once
// The status page jouled serves at GET /: one self-contained HTML file (daemon/assets/status.html,
// inline CSS and JavaScript, no external assets) embedded at build time. The page holds no data:
// its script reads the REST API (/v1/nodes, /v1/devices, /v1/budgets, /v1/jobs) from the same
// origin under the API's own guards, with the bearer token the user gives it where one is needed.

#include <string>
#include <string_view>

namespace joule::daemon {

/// The page's HTML, as daemon/assets/status.html held it when jouled was built.
std::string_view status_page_html();

/// The Content-Security-Policy header for `html`: nothing loads or runs but the document's own
/// inline `<script>` and `<style>` elements (each allowed by the SHA-256 of its exact text, so
/// an injected script or style does not run) and fetches to the same origin; no frames, forms,
/// base URL or plug-ins. Elements must be written `<script>` and `<style>` without attributes.
std::string status_page_policy(std::string_view html);

}  // namespace joule::daemon
