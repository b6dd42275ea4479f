#pragma once
// The REST API v1 as one request handler: a route table, bearer-token and peer checks, JSON
// decoding, and every error as RFC 9457 problem+json. No sockets in here: tests call handle()
// directly with a request and read the response.

#include <functional>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include <boost/beast/http/verb.hpp>
#include <nlohmann/json.hpp>

#include "joule/common/result.hpp"
#include "joule/daemon/access.hpp"
#include "joule/daemon/cluster_service.hpp"
#include "joule/daemon/estimate_service.hpp"
#include "joule/daemon/http_server.hpp"
#include "joule/daemon/job_service.hpp"
#include "joule/daemon/metrics.hpp"
#include "joule/daemon/probe_service.hpp"
#include "joule/daemon/signal_service.hpp"
#include "joule/daemon/slurm_executor.hpp"
#include "joule/daemon/usage_reports.hpp"

namespace joule::daemon {

/// The HTTP status and problem+json body for an error; the one place errors meet HTTP.
HttpResponse problem_response(const Error& error, const std::string& instance);

namespace routes {
struct ApiContext;
struct Routes;
}  // namespace routes

/// What the API answers from. The optional services may be null, and their routes then say so.
struct ApiServices {
  JobService& jobs;
  Metrics& metrics;
  /// The book's devices (GET /v1/devices, /v1/nodes).
  const DeviceTable& devices;
  /// POST /v1/estimate and /v1/advise answer from its models, corrected by what finished jobs
  /// taught; null: from no model, so they give counts and say why no joules.
  const EstimateService* estimates = nullptr;
  /// /v1/probes (501 without it).
  ProbeService* probes = nullptr;
  /// A coordinator serves POST /v1/cluster/sync and its nodes in GET /v1/nodes; an agent its link.
  ClusterCoordinator* coordinator = nullptr;
  ClusterAgent* agent = nullptr;
  /// GET /v1/nodes then shows the Slurm node types and the executor's last word from Slurm.
  const SlurmExecutor* slurm = nullptr;
  /// GET /v1/signals: the carbon signal in force and where it comes from (none without one).
  const SignalService* signals = nullptr;
  /// The same for the price signal ([price]).
  const SignalService* price_signals = nullptr;
  /// GET /v1/usage (503 without it).
  UsageReports* usage = nullptr;
};

/// The REST API: a route table (daemon/src/http/routes/, one file per resource) and the dispatch in
/// front of it: target checks, authentication by each route's guard, metrics per route
/// template, 404/405 with the Allow header the table derives, and the catch-all for exceptions.
class Api {
 public:
  explicit Api(ApiServices services);
  ~Api();
  Api(const Api&) = delete;
  Api& operator=(const Api&) = delete;

  /// Who may do what (on start and reload): tokens with owners and scopes, agent tokens, and
  /// what loopback clients identified by their uid may do without a token.
  void set_access(AccessConfig access);
  /// /readyz answers 200 only after this is set (recovery done and listening).
  void set_ready(bool ready);

  /// Answers one request through `reply`, now or later (after a commit). Never throws: an
  /// exception from a route becomes a 500 problem+json, and nothing else is answered after it.
  void handle(HttpRequest&& request, const HttpPeer& peer, Reply reply);

  /// Every (verb, path template) the API serves, for listings and docs.
  std::vector<std::pair<boost::beast::http::verb, std::string>> routes() const;

 private:
  void dispatch(HttpRequest&& request, const HttpPeer& peer, const Reply& reply);

  std::unique_ptr<routes::ApiContext> context_;
  std::unique_ptr<routes::Routes> routes_;
};

}  // namespace joule::daemon
