#pragma once
// What a route of the REST API works with: one request (its decoded parameters, the principal,
// a reply that counts itself in the metrics) and the JSON and problem+json helpers. Internal to
// daemon/: each resource's routes are added to the table by the function declared at the end.

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/beast/http/status.hpp>
#include <nlohmann/json.hpp>

#include "joule/common/result.hpp"
#include "joule/daemon/access.hpp"
#include "joule/daemon/api.hpp"
#include "joule/daemon/http_server.hpp"
#include "joule/daemon/router.hpp"

namespace joule::daemon::routes {

/// Every JSON answer's text: invalid UTF-8 from the request (an id, a parser's message) is
/// replaced with U+FFFD, where a plain dump() would throw.
std::string json_text(const nlohmann::json& body);
HttpResponse json_response(boost::beast::http::status status, const nlohmann::json& body);
/// The same for an answer already written as JSON text (job_text).
HttpResponse json_response(boost::beast::http::status status, std::string text);
/// A request body as JSON; malformed syntax, bad UTF-8, NUL bytes and numbers beyond a double
/// are invalid_argument errors quoting the bytes only escaped.
Result<nlohmann::json> parse_json_body(const std::string& body);
/// RFC 3986 percent-encoding of all but the unreserved characters.
std::string percent_encode(std::string_view text);
/// The token of "Authorization: Bearer TOKEN", or "" when there is none.
std::string bearer_token(const HttpRequest& request);
/// A decimal count of at most 12 digits, or nothing.
std::optional<std::size_t> parse_count(const std::string& text);
/// A list's `limit` query value: `most` when there is none, else an integer from 1 to `most`, or
/// an error naming the parameter (further pages come with `after`).
Result<std::size_t> page_limit(const std::optional<std::string>& text, std::size_t most);

/// The request target split and decoded: refused (as a 400) unless it is visible ASCII whose
/// percent-decoded segments and query values are UTF-8 without control characters.
struct Target {
  std::vector<std::string> segments;
  std::map<std::string, std::string> query;
};
Result<Target> parse_target(std::string_view target);

/// One request on its way through a route.
struct Call {
  const HttpRequest& request;
  std::string target;  ///< printable, for a problem's "instance"
  const Target& parsed;
  std::map<std::string, std::string> params;  ///< the route template's {name} segments
  std::optional<Principal> principal;         ///< set for routes that need a scope
  /// Sends the answer, counted under the route's template; copyable and callable later (after
  /// a commit), once.
  Reply answer;

  const std::string& param(const std::string& name) const { return params.at(name); }
  std::optional<std::string> query(const std::string& name) const {
    auto it = parsed.query.find(name);
    return it == parsed.query.end() ? std::nullopt : std::optional<std::string>(it->second);
  }
  void fail(const Error& error) const { answer(problem_response(error, target)); }
  /// A result as the answer: `ok` with its JSON, or its error as a problem.
  void send(Result<nlohmann::json> result, boost::beast::http::status ok = boost::beast::http::status::ok) const {
    if (!result) return fail(result.error());
    answer(json_response(ok, *result));
  }
  /// The same, for a result that arrives later: a callback that holds what it needs by value.
  std::function<void(Result<nlohmann::json>)> send_later(
      boost::beast::http::status ok = boost::beast::http::status::ok) const {
    return [answer = answer, target = target, ok](Result<nlohmann::json> result) {
      if (!result) return answer(problem_response(result.error(), target));
      answer(json_response(ok, *result));
    };
  }
};

/// Who may reach a route: anyone, a job with its own token (checked by the route), an agent
/// with a cluster token, or an API principal with a scope (and, for `owner_only`, the job named
/// by the {id} segment must be the principal's own, unless it is an admin).
enum class Guard { open, job_token, agent, read, submit, admin };

struct Route {
  Guard guard = Guard::read;
  bool owner_only = false;
  std::function<void(Call&)> handle;
};
using RouteTable = Router<Route>;

/// The collaborators routes answer from (Api's services), and what Api sets as it runs.
struct ApiContext {
  explicit ApiContext(const ApiServices& services)
      : jobs(services.jobs),
        metrics(services.metrics),
        devices(services.devices),
        estimates(services.estimates),
        probes(services.probes),
        coordinator(services.coordinator),
        agent(services.agent),
        slurm(services.slurm),
        signals(services.signals),
        price_signals(services.price_signals),
        usage(services.usage) {
    if (!estimates) {
      no_models = std::make_unique<EstimateService>(devices);
      estimates = no_models.get();
    }
  }

  JobService& jobs;
  Metrics& metrics;
  const DeviceTable& devices;
  AccessConfig access;
  bool ready = false;
  /// What estimates are made with: the daemon's, else one with no models (no_models).
  const EstimateService* estimates;
  std::unique_ptr<EstimateService> no_models;
  ProbeService* probes;
  ClusterCoordinator* coordinator;
  ClusterAgent* agent;
  const SlurmExecutor* slurm;
  const SignalService* signals;
  const SignalService* price_signals;
  UsageReports* usage;
};

/// /healthz, /readyz, /metrics.
void add_health_routes(RouteTable& table, ApiContext& context);
/// /v1/jobs and everything under it.
void add_job_routes(RouteTable& table, ApiContext& context);
/// /v1/devices, /v1/nodes, /v1/budgets, /v1/estimate, /v1/probes, /v1/cluster/sync.
void add_node_routes(RouteTable& table, ApiContext& context);
/// GET /: the status page (daemon/assets/status.html).
void add_page_routes(RouteTable& table, ApiContext& context);

}  // namespace joule::daemon::routes
