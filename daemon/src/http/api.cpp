#include "joule/daemon/api.hpp"

#include <chrono>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "http/routes/call.hpp"
#include "jobs/job_record.hpp"
#include "joule/common/text.hpp"

namespace joule::daemon {

namespace http = boost::beast::http;
using nlohmann::json;

namespace routes {
struct Routes {
  RouteTable table;
};
}  // namespace routes

Api::Api(ApiServices services)
    : context_(std::make_unique<routes::ApiContext>(services)), routes_(std::make_unique<routes::Routes>()) {
  routes::add_health_routes(routes_->table, *context_);
  routes::add_job_routes(routes_->table, *context_);
  routes::add_node_routes(routes_->table, *context_);
  routes::add_page_routes(routes_->table, *context_);
}

Api::~Api() = default;

void Api::set_access(AccessConfig access) { context_->access = std::move(access); }
void Api::set_ready(bool ready) { context_->ready = ready; }

std::vector<std::pair<http::verb, std::string>> Api::routes() const { return routes_->table.routes(); }

void Api::handle(HttpRequest&& request, const HttpPeer& peer, Reply reply) {
  // The one place where a handler's exception stops: whatever a route throws (a bug, a library
  // surprise) becomes a 500 problem for this request, and the daemon goes on serving. A reply
  // already sent is not sent twice.
  auto replied = std::make_shared<bool>(false);
  Reply once = [reply = std::move(reply), replied](HttpResponse response) {
    if (*replied) return;
    *replied = true;
    reply(std::move(response));
  };
  const std::string target = printable(request.target(), 512);
  try {
    dispatch(std::move(request), peer, once);
  } catch (const std::exception& error) {
    spdlog::error("request {}: internal error: {}", target, printable(error.what()));
    context_->metrics.observe_request("internal-error", 500, 0.0);
    once(problem_response(make_error(ErrorCode::internal, "jouled failed to answer this request; the error is logged"),
                          target));
  }
}

namespace {

// Whether the principal holds what `guard` asks; the error names what is missing.
std::optional<Error> missing_scope(routes::Guard guard, const Principal& principal, const std::string& route) {
  const Scope scope = guard == routes::Guard::admin    ? Scope::admin
                      : guard == routes::Guard::submit ? Scope::submit
                                                       : Scope::read;
  if (principal.has(scope)) return std::nullopt;
  return make_error(ErrorCode::permission_denied,
                    fmt::format("{} needs the {} scope; {} has {}", route, scope_names(scope_bit(scope)).front(),
                                principal.name, fmt::join(scope_names(principal.scopes), ", ")));
}

// Whether the principal may act on job `id` (its owner, or an admin): not_found for no such
// job, permission_denied for someone else's.
std::optional<Error> not_owner(const JobService& jobs, const Principal& principal, const std::string& id) {
  auto job = jobs.job(id, false);
  if (!job) return job.error();
  const std::string& owner = job->job().row.owner;
  if (principal.may_act_on(owner)) return std::nullopt;
  return make_error(ErrorCode::permission_denied,
                    fmt::format("job {} is {}'s; {} may act only on its own jobs", id,
                                owner.empty() ? "an administrator" : owner, principal.name));
}

}  // namespace

namespace {

// Records, when the dispatch returns, how long the loop spent on it (joule_loop_work_seconds):
// what a slow handler holds every other request and pass back by. Requests that match no
// route are not counted (their label would be the raw path).
struct TimedDispatch {
  Metrics& metrics;
  std::chrono::steady_clock::time_point started;
  std::string work;
  ~TimedDispatch() {
    if (!work.empty())
      metrics.observe_loop_work(work,
                                std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  }
};

}  // namespace

void Api::dispatch(HttpRequest&& request, const HttpPeer& peer, const Reply& reply) {
  const auto started = std::chrono::steady_clock::now();
  Metrics& metrics = context_->metrics;
  TimedDispatch timed{metrics, started, {}};
  // Every answer is counted under its route's template and with its latency.
  const auto counted = [&metrics, reply, started](std::string route) -> Reply {
    return [&metrics, reply, started, route = std::move(route)](HttpResponse response) {
      metrics.observe_request(route, static_cast<unsigned>(response.result_int()),
                              std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
      reply(std::move(response));
    };
  };
  const std::string target(request.target());
  auto parsed = routes::parse_target(target);
  if (!parsed) {
    metrics.observe_request("unmatched", 400, 0.0);
    return reply(problem_response(parsed.error(), printable(target, 512)));
  }

  const auto lookup = routes_->table.find(request.method(), parsed->segments);
  if (std::holds_alternative<routes::RouteTable::NotFound>(lookup)) {
    return counted("unmatched")(
        problem_response(make_error(ErrorCode::not_found, fmt::format("no route {}", printable(target, 200))), target));
  }
  if (const auto* wrong = std::get_if<routes::RouteTable::WrongMethod>(&lookup)) {
    HttpResponse response = routes::json_response(
        http::status::method_not_allowed,
        {{"type", "urn:joule:problem:method-not-allowed"},
         {"title", "Method Not Allowed"},
         {"status", 405},
         {"detail", fmt::format("{} is not allowed here; use {}", std::string(request.method_string()), wrong->allow)},
         {"instance", target}});
    response.set(http::field::allow, wrong->allow);
    return counted(*wrong->pattern)(std::move(response));
  }

  const auto& found = std::get<routes::RouteTable::Found>(lookup);
  timed.work = fmt::format("{} {}", std::string_view(request.method_string()), *found.pattern);
  const routes::Route& route = *found.value;
  routes::Call call{request, target, *parsed, found.params, std::nullopt, counted(*found.pattern)};
  switch (route.guard) {
    case routes::Guard::open:
    case routes::Guard::job_token:  // the route compares the job's own token
      break;
    case routes::Guard::agent:
      if (auto agent = identify_agent(context_->access, routes::bearer_token(request), peer.uid); !agent)
        return call.fail(agent.error());
      break;
    case routes::Guard::read:
    case routes::Guard::submit:
    case routes::Guard::admin: {
      auto identified = identify(context_->access, routes::bearer_token(request), peer.uid);
      if (!identified) {
        call.answer = counted("/v1 (unauthorized)");
        return call.fail(identified.error());
      }
      if (auto missing = missing_scope(route.guard, *identified, *found.pattern)) return call.fail(*missing);
      if (route.owner_only) {
        if (auto refused = not_owner(context_->jobs, *identified, call.param("id"))) return call.fail(*refused);
      }
      call.principal = std::move(identified).value();
      break;
    }
  }
  route.handle(call);
}

}  // namespace joule::daemon
