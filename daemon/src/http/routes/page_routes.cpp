#include "http/routes/call.hpp"
#include "joule/daemon/status_page.hpp"

// GET /: the status page. Open, like /healthz: the page is the same static document for
// everyone and holds no data; what it shows comes from /v1 routes under their own guards.

namespace joule::daemon::routes {

namespace http = boost::beast::http;
using Verb = http::verb;

void add_page_routes(RouteTable& table, ApiContext&) {
  table.add(Verb::get, "/", {Guard::open, false, [](Call& call) {
                               static const std::string policy = status_page_policy(status_page_html());
                               HttpResponse response{http::status::ok, 11};
                               response.set(http::field::content_type, "text/html; charset=utf-8");
                               response.set("Content-Security-Policy", policy);
                               response.set("X-Content-Type-Options", "nosniff");
                               response.set("Referrer-Policy", "no-referrer");
                               response.set(http::field::cache_control, "no-cache");
                               response.body() = std::string(status_page_html());
                               call.answer(std::move(response));
                             }});
}

}  // namespace joule::daemon::routes
