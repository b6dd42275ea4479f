#include <fmt/format.h>

#include "http/routes/budget_json.hpp"
#include "http/routes/call.hpp"
#include "http/routes/estimate_json.hpp"
#include "nodes/device_views.hpp"

// What a node is and has: health, metrics, devices, nodes, budgets, estimates, probes, and the
// coordinator's side of cluster sync.

namespace joule::daemon::routes {

namespace http = boost::beast::http;
using nlohmann::json;
using Verb = http::verb;

namespace {

// A coordinator's page of agents: 500 with their devices take ~17 ms of the loop.
// A page of nodes is built on the loop: 500 of them held it ~25 ms at 1,000 nodes with models,
// 100 about a fifth of that.
constexpr std::size_t kMaxNodesPage = 100;

// Without a probe service (jouled built or configured without probing) /v1/probes is part of
// the API that this jouled does not implement.
void no_probes(const Call& call) {
  call.answer(json_response(http::status::not_implemented,
                            {{"type", "urn:joule:problem:not-implemented"},
                             {"title", "Not Implemented"},
                             {"status", 501},
                             {"detail", "/v1/probes is part of the API but this jouled runs no probe service"},
                             {"instance", call.target}}));
}

// GET /v1/nodes: a coordinator pages its agents (`limit`, `after`, "next" and a Link header, as
// GET /v1/jobs); an agent or a node on its own describes itself.
void list_nodes(Call& call, ApiContext& context) {
  json out;
  std::optional<std::string> link;
  if (context.coordinator) {
    const auto limit_or = page_limit(call.query("limit"), kMaxNodesPage);
    if (!limit_or) return call.fail(limit_or.error());
    const std::size_t limit = *limit_or;
    out = context.coordinator->nodes(limit, call.query("after"));
    if (const auto& next = out["next"]; next.is_string())
      link = fmt::format("</v1/nodes?limit={}&after={}>; rel=\"next\"", limit, percent_encode(next.get<std::string>()));
  } else {
    out = context.agent ? context.agent->status() : json{{"role", "standalone"}};
    out["devices"] = devices_view(context.devices, context.estimates)["devices"];
  }
  if (context.slurm) out["slurm"] = context.slurm->describe();
  HttpResponse response = json_response(http::status::ok, out);
  if (link) response.set(http::field::link, *link);
  call.answer(std::move(response));
}
}  // namespace

void add_health_routes(RouteTable& table, ApiContext& context) {
  table.add(Verb::get, "/healthz", {Guard::open, false, [](Call& call) {
                                      call.answer(json_response(http::status::ok, {{"status", "ok"}}));
                                    }});
  table.add(Verb::get, "/readyz",
            {Guard::open, false, [&context](Call& call) {
               if (!context.ready) return call.fail(make_error(ErrorCode::unavailable, "jouled is starting"));
               // Accepting work means storing it: not ready while the database refuses writes.
               if (const auto& failure = context.jobs.storage_failure())
                 return call.fail(make_error(ErrorCode::unavailable, "the database takes no writes: " + *failure));
               call.answer(json_response(http::status::ok, {{"status", "ready"}}));
             }});
  table.add(Verb::get, "/metrics", {Guard::open, false, [&context](Call& call) {
                                      HttpResponse response{http::status::ok, 11};
                                      response.set(http::field::content_type,
                                                   "text/plain; version=0.0.4; charset=utf-8");
                                      response.body() = context.metrics.serialize();
                                      call.answer(std::move(response));
                                    }});
}

void add_node_routes(RouteTable& table, ApiContext& context) {
  table.add(Verb::get, "/v1/devices",
            {Guard::read, false, [&context](Call& call) {
               call.answer(json_response(http::status::ok, devices_view(context.devices, context.estimates)));
             }});
  table.add(Verb::get, "/v1/budgets",
            {Guard::read, false, [&context](Call& call) {
               call.answer(json_response(http::status::ok, budgets_json(context.jobs.budgets_view())));
             }});
  table.add(Verb::get, "/v1/signals",
            {Guard::read, false, [&context](Call& call) {
               json out = context.signals ? context.signals->describe()
                                          : SignalService::describe_none(config::SignalKind::carbon);
               out.update(context.price_signals ? context.price_signals->describe()
                                                : SignalService::describe_none(config::SignalKind::price));
               call.answer(json_response(http::status::ok, out));
             }});
  table.add(Verb::get, "/v1/nodes", {Guard::read, false, [&context](Call& call) { list_nodes(call, context); }});
  // An estimate is a computation that changes nothing: read scope.
  table.add(Verb::post, "/v1/estimate", {Guard::read, false, [&context](Call& call) {
                                           auto body = parse_json_body(call.request.body());
                                           if (!body) return call.fail(body.error());
                                           auto request = parse_estimate_request(*body);
                                           if (!request) return call.fail(request.error());
                                           auto answer = context.estimates->estimate(*request);
                                           if (!answer) return call.fail(answer.error());
                                           json out = estimate_answer_json(*answer);
                                           add_policy_choices(out, *answer, context.jobs.budgets().policy());
                                           for (const SignalService* signals : {context.signals, context.price_signals})
                                             if (signals)
                                               signals->feed().add_estimates(out["estimates"], signals->now_ms());
                                           call.answer(json_response(http::status::ok, out));
                                         }});

  // Advice is a computation on the models that changes nothing: read scope.
  table.add(Verb::post, "/v1/advise", {Guard::read, false, [&context](Call& call) {
                                         auto body = parse_json_body(call.request.body());
                                         if (!body) return call.fail(body.error());
                                         call.send(advise_request(*body, context.estimates->device_names(),
                                                                  context.estimates->models()));
                                       }});

  table.add(Verb::get, "/v1/probes", {Guard::read, false, [&context](Call& call) {
                                        if (!context.probes) return no_probes(call);
                                        call.answer(json_response(http::status::ok, context.probes->runs()));
                                      }});
  // A probe spends the node's energy and time: admin scope.
  table.add(Verb::post, "/v1/probes", {Guard::admin, false, [&context](Call& call) {
                                         if (!context.probes) return no_probes(call);
                                         auto body = parse_json_body(call.request.body());
                                         if (!body) return call.fail(body.error());
                                         call.send(context.probes->request(*body), http::status::accepted);
                                       }});
  table.add(Verb::get, "/v1/probes/{id}", {Guard::read, false, [&context](Call& call) {
                                             if (!context.probes) return no_probes(call);
                                             call.send(context.probes->run(call.param("id")));
                                           }});

  // Agents sync with the cluster's own tokens ([cluster] agent_token_sha256, else the API's).
  table.add(Verb::post, "/v1/cluster/sync",
            {Guard::agent, false, [&context](Call& call) {
               if (!context.coordinator)
                 return call.fail(make_error(ErrorCode::conflict, "this jouled is not a coordinator ([cluster] role)"));
               auto body = parse_json_body(call.request.body());
               if (!body) return call.fail(body.error());
               context.coordinator->sync(*body, call.send_later());
             }});
}

}  // namespace joule::daemon::routes
