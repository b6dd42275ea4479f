#include "joule/daemon/api.hpp"

#include "joule/adapters/log_file.hpp"
#include "joule/common/sha256.hpp"
#include "joule/common/text.hpp"

#include "joule/daemon/estimates.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <chrono>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <boost/beast/http/verb.hpp>

namespace joule::daemon {

namespace http = boost::beast::http;
using nlohmann::json;

namespace {

// The most one answer of GET /v1/jobs/{id}/log carries.
constexpr std::size_t kMaxLogChunkBytes = 1 << 20;
// The most jobs one answer of GET /v1/jobs lists (and its default).
constexpr std::size_t kMaxJobsPage = 1000;

struct ProblemKind {
  http::status status;
  const char* slug;
};

ProblemKind kind_of(ErrorCode code) {
  switch (code) {
    case ErrorCode::invalid_argument:
      return {http::status::bad_request, "invalid-argument"};
    case ErrorCode::not_found:
      return {http::status::not_found, "not-found"};
    case ErrorCode::conflict:
      return {http::status::conflict, "conflict"};
    case ErrorCode::too_many:
      return {http::status::too_many_requests, "too-many-jobs"};
    case ErrorCode::payload_too_large:
      return {http::status::payload_too_large, "payload-too-large"};
    case ErrorCode::unauthorized:
      return {http::status::unauthorized, "unauthorized"};
    case ErrorCode::unavailable:
      return {http::status::service_unavailable, "unavailable"};
    case ErrorCode::permission_denied:
      return {http::status::forbidden, "permission-denied"};
    case ErrorCode::io:
      return {http::status::internal_server_error, "io-error"};
    case ErrorCode::internal:
      return {http::status::internal_server_error, "internal"};
  }
  return {http::status::internal_server_error, "internal"};
}

// Every JSON answer goes out through here. Text from the request (a target, an id, a parser's
// message quoting the bad bytes) can hold bytes that are not UTF-8, on which a plain dump()
// throws; they are replaced with U+FFFD instead.
std::string json_text(const json& body) { return body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"; }

HttpResponse json_response(http::status status, const json& body) {
  HttpResponse response{status, 11};
  response.set(http::field::content_type,
               static_cast<unsigned>(status) >= 400 ? "application/problem+json" : "application/json");
  response.body() = json_text(body);
  return response;
}

// A request body as JSON. nlohmann throws parse_error for bad syntax and ill-formed UTF-8 and
// out_of_range for numbers beyond a double (1e400); both are the client's mistake. The
// message quotes the offending bytes only in escaped form.
Result<json> parse_json_body(const std::string& body) {
  // nlohmann stops at a NUL byte and would accept what precedes it, ignoring the rest.
  if (const auto nul = body.find('\0'); nul != std::string::npos)
    return make_error(ErrorCode::invalid_argument, fmt::format("the body holds a NUL byte at offset {}", nul));
  try {
    return json::parse(body);
  } catch (const json::parse_error& error) {
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("malformed JSON at byte {}: {}", error.byte, printable(error.what(), 300)));
  } catch (const json::exception& error) {
    return make_error(ErrorCode::invalid_argument, fmt::format("unusable JSON: {}", printable(error.what(), 300)));
  }
}

// The request target as the routes may use it: RFC 9112 allows only visible ASCII there, and
// a percent-encoded segment or query value must decode to UTF-8 without control characters.
// Nothing past this point sees bytes it could choke on or forge log lines with.
std::optional<Error> check_target(std::string_view target) {
  if (target.empty() || target.front() != '/')
    return make_error(ErrorCode::invalid_argument, "the request target must be an absolute path such as /v1/jobs");
  for (const char c : target) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte <= 0x20 || byte >= 0x7F) {
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("the request target holds the byte 0x{:02x}; percent-encode it", byte));
    }
  }
  return std::nullopt;
}

std::optional<Error> check_decoded(const std::string& text, std::string_view what) {
  if (!is_valid_utf8(text) || has_control_character(text)) {
    return make_error(
        ErrorCode::invalid_argument,
        fmt::format("the {} \"{}\" is not UTF-8 text without control characters", what, printable(text, 200)));
  }
  return std::nullopt;
}

// Splits "/v1/jobs/abc/log?x=1" into path segments and query parameters.
struct Target {
  std::vector<std::string> segments;
  std::map<std::string, std::string> query;
};

std::string percent_decode(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
      out.push_back(static_cast<char>(std::stoi(std::string(text.substr(i + 1, 2)), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(text[i] == '+' ? ' ' : text[i]);
    }
  }
  return out;
}

Target parse_target(std::string_view target) {
  Target out;
  const auto question = target.find('?');
  const std::string_view path = target.substr(0, question);
  std::size_t start = 0;
  while (start < path.size()) {
    const auto slash = path.find('/', start);
    const auto piece = path.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (!piece.empty()) out.segments.push_back(percent_decode(piece));
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  if (question != std::string_view::npos) {
    std::string_view query = target.substr(question + 1);
    while (!query.empty()) {
      const auto amp = query.find('&');
      const auto pair = query.substr(0, amp);
      const auto eq = pair.find('=');
      out.query[percent_decode(pair.substr(0, eq))] =
          eq == std::string_view::npos ? "" : percent_decode(pair.substr(eq + 1));
      if (amp == std::string_view::npos) break;
      query = query.substr(amp + 1);
    }
  }
  return out;
}

// RFC 3986 percent-encoding of everything but the unreserved characters, for query values.
std::string percent_encode(std::string_view text) {
  std::string out;
  for (const unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~')
      out += static_cast<char>(c);
    else
      out += fmt::format("%{:02X}", c);
  }
  return out;
}

std::optional<std::size_t> parse_count(const std::string& text) {
  if (text.empty() || text.size() > 12 || text.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return static_cast<std::size_t>(std::stoull(text));
}

}  // namespace

HttpResponse problem_response(const Error& error, const std::string& instance) {
  const auto kind = kind_of(error.code);
  json body = {{"type", fmt::format("urn:joule:problem:{}", kind.slug)},
               {"title", std::string(http::obsolete_reason(kind.status))},
               {"status", static_cast<unsigned>(kind.status)},
               {"detail", error.message},
               {"instance", instance}};
  if (!error.where.empty()) {
    // RFC 9457 §3.2 style extension: which member of the request is wrong, as a JSON pointer.
    const bool pointer = error.where.front() == '/';
    body["errors"] = json::array({{{"detail", error.message}, {pointer ? "pointer" : "parameter", error.where}}});
  }
  HttpResponse response{kind.status, 11};
  response.set(http::field::content_type, "application/problem+json");
  if (error.code == ErrorCode::too_many) response.set(http::field::retry_after, "10");
  if (error.code == ErrorCode::unauthorized) response.set(http::field::www_authenticate, "Bearer realm=\"jouled\"");
  response.body() = json_text(body);
  return response;
}

namespace {
// The token of "Authorization: Bearer TOKEN", or "" when there is none.
std::string bearer_token(const HttpRequest& request) {
  const auto header = request[http::field::authorization];
  constexpr std::string_view kBearer = "Bearer ";
  if (header.size() <= kBearer.size() || header.substr(0, kBearer.size()) != kBearer) return {};
  return std::string(header.substr(kBearer.size()));
}
}  // namespace

Api::Api(JobService& jobs, Metrics& metrics) : jobs_(jobs), metrics_(metrics) {}

namespace {

// What someone who may not act on a job sees of its run.env: the names, not the values
// (tokens and passwords are passed that way).
void hide_env_values(json& job) {
  if (!job.is_object() || !job.contains("spec")) return;
  auto& run = job["spec"]["run"];
  if (!run.is_object() || !run.contains("env") || !run["env"].is_object()) return;
  for (auto& [name, value] : run["env"].items()) value = "(hidden: not your job)";
}

}  // namespace

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
    route(std::move(request), peer, once);
  } catch (const std::exception& error) {
    spdlog::error("request {}: internal error: {}", target, printable(error.what()));
    metrics_.observe_request("internal-error", 500, 0.0);
    once(problem_response(make_error(ErrorCode::internal, "jouled failed to answer this request; the error is logged"),
                          target));
  }
}

void Api::route(HttpRequest&& request, const HttpPeer& peer, const Reply& reply) {
  const auto started = std::chrono::steady_clock::now();
  std::string route = "unmatched";
  if (auto error = check_target(request.target())) {
    metrics_.observe_request(route, 400, 0.0);
    return reply(problem_response(*error, printable(request.target(), 512)));
  }
  const std::string target(request.target());
  const Target parsed = parse_target(target);
  const auto& seg = parsed.segments;
  const http::verb method = request.method();
  for (const auto& segment : seg) {
    if (auto error = check_decoded(segment, "path segment")) {
      metrics_.observe_request(route, 400, 0.0);
      return reply(problem_response(*error, target));
    }
  }
  for (const auto& [name, value] : parsed.query) {
    if (auto error = check_decoded(name, "query parameter name");
        error || (error = check_decoded(value, "query value"))) {
      metrics_.observe_request(route, 400, 0.0);
      return reply(problem_response(*error, target));
    }
  }

  // Wraps the reply so every answer is counted with its route template and latency.
  auto answer = [this, reply, started, &route](HttpResponse response) {
    metrics_.observe_request(route, static_cast<unsigned>(response.result_int()),
                             std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    reply(std::move(response));
  };
  auto answer_later = [this, reply, started](std::string route_name) {
    return [this, reply, started, route_name](HttpResponse response) {
      metrics_.observe_request(route_name, static_cast<unsigned>(response.result_int()),
                               std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
      reply(std::move(response));
    };
  };
  auto fail = [&](const Error& error) { answer(problem_response(error, target)); };
  auto wrong_method = [&](const char* allow) {
    HttpResponse response = json_response(
        http::status::method_not_allowed,
        {{"type", "urn:joule:problem:method-not-allowed"},
         {"title", "Method Not Allowed"},
         {"status", 405},
         {"detail", fmt::format("{} is not allowed here; use {}", std::string(request.method_string()), allow)},
         {"instance", target}});
    response.set(http::field::allow, allow);
    answer(std::move(response));
  };

  if (seg.size() == 1 && (seg[0] == "healthz" || seg[0] == "readyz" || seg[0] == "metrics")) {
    route = "/" + seg[0];
    if (method != http::verb::get && method != http::verb::head) return wrong_method("GET");
    if (seg[0] == "healthz") return answer(json_response(http::status::ok, {{"status", "ok"}}));
    if (seg[0] == "readyz") {
      if (!ready_) return fail(make_error(ErrorCode::unavailable, "jouled is starting"));
      return answer(json_response(http::status::ok, {{"status", "ready"}}));
    }
    HttpResponse response{http::status::ok, 11};
    response.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
    response.body() = metrics_.serialize();
    return answer(std::move(response));
  }

  if (seg.empty() || seg[0] != "v1")
    return fail(make_error(ErrorCode::not_found, fmt::format("no route {}", printable(target, 200))));
  // A job reports its progress with its own token (JOULE_JOB_TOKEN), not an API token.
  if (seg.size() == 4 && seg[1] == "jobs" && seg[3] == "progress") {
    route = "/v1/jobs/{id}/progress";
    if (method != http::verb::post) return wrong_method("POST");
    const std::string token = bearer_token(request);
    auto body = parse_json_body(request.body());
    if (!body) return fail(body.error());
    auto result = jobs_.report_progress(seg[2], token, *body);
    if (!result) return fail(result.error());
    return answer(json_response(http::status::ok, *result));
  }
  // Agents sync with the cluster's own tokens ([cluster] agent_token_sha256, else the API's).
  if (seg.size() == 3 && seg[1] == "cluster" && seg[2] == "sync") {
    route = "/v1/cluster/sync";
    if (method != http::verb::post) return wrong_method("POST");
    if (!coordinator_)
      return fail(make_error(ErrorCode::conflict, "this jouled is not a coordinator ([cluster] role)"));
    if (auto agent = identify_agent(access_, bearer_token(request), peer.uid); !agent) return fail(agent.error());
    auto body = parse_json_body(request.body());
    if (!body) return fail(body.error());
    return coordinator_->sync(*body, [respond = answer_later(route), target](Result<json> result) {
      if (!result) return respond(problem_response(result.error(), target));
      respond(json_response(http::status::ok, *result));
    });
  }
  auto identified = identify(access_, bearer_token(request), peer.uid);
  if (!identified) {
    route = "/v1 (unauthorized)";
    return fail(identified.error());
  }
  const Principal principal = std::move(identified).value();
  // Whether the principal holds `scope`; else answers 403 naming what is missing.
  auto allowed = [&](Scope scope) {
    if (principal.has(scope)) return true;
    const char* names[] = {"", "read", "submit", "", "admin"};
    fail(make_error(ErrorCode::permission_denied,
                    fmt::format("{} needs the {} scope; {} has {}", route, names[static_cast<int>(scope)],
                                principal.name, fmt::join(scope_names(principal.scopes), ", "))));
    return false;
  };
  // Whether the principal may act on job `id` (its owner, or an admin); else answers 404/403.
  auto may_act_on = [&](const std::string& id) {
    auto owner = jobs_.owner_of(id);
    if (!owner) {
      fail(owner.error());
      return false;
    }
    if (principal.may_act_on(*owner)) return true;
    fail(make_error(ErrorCode::permission_denied,
                    fmt::format("job {} is {}'s; {} may act only on its own jobs", id,
                                owner->empty() ? "an administrator" : *owner, principal.name)));
    return false;
  };

  auto parse_body = [&](json& out) -> bool {
    // Any Content-Type is accepted (curl -d sends a form type): the body must parse as JSON.
    auto parsed_body = parse_json_body(request.body());
    if (!parsed_body) {
      fail(parsed_body.error());
      return false;
    }
    out = std::move(parsed_body).value();
    return true;
  };
  auto send_result = [&target](auto respond, http::status ok_status) {
    return [respond, ok_status, target](Result<json> result) {
      if (!result) return respond(problem_response(result.error(), target));
      respond(json_response(ok_status, *result));
    };
  };

  if (seg.size() == 2 && seg[1] == "jobs") {
    route = "/v1/jobs";
    if (method == http::verb::post) {
      if (!allowed(Scope::submit)) return;
      json body;
      if (!parse_body(body)) return;
      auto respond = answer_later(route);
      JobService::Submitter submitter{principal.name, std::nullopt};
      if (principal.uid) submitter.uid = *principal.uid;
      return jobs_.submit(body, std::move(submitter), [respond, target](Result<json> result) {
        if (!result) return respond(problem_response(result.error(), target));
        HttpResponse response = json_response(http::status::created, *result);
        response.set(http::field::location, "/v1/jobs/" + (*result)["id"].get<std::string>());
        respond(std::move(response));
      });
    }
    if (method != http::verb::get) return wrong_method("GET, POST");
    if (!allowed(Scope::read)) return;
    std::optional<std::string> state;
    if (auto it = parsed.query.find("state"); it != parsed.query.end()) state = it->second;
    // A page is at most kMaxJobsPage jobs: building thousands at once held the event loop for
    // half a second and a slow reader kept megabytes of answer in memory. Clients page on with
    // `after`, from "next" or the Link header.
    std::size_t limit = kMaxJobsPage;
    if (auto it = parsed.query.find("limit"); it != parsed.query.end()) {
      auto count = parse_count(it->second);
      if (!count || *count == 0 || *count > kMaxJobsPage)
        return fail(make_error(ErrorCode::invalid_argument,
                               fmt::format("limit must be an integer from 1 to {}; list further pages with "
                                           "after=<the previous page's \"next\">",
                                           kMaxJobsPage),
                               "limit"));
      limit = *count;
    }
    std::optional<std::string> after;
    if (auto it = parsed.query.find("after"); it != parsed.query.end()) after = it->second;
    auto listed = jobs_.jobs(state, limit, after);
    if (!listed) return fail(listed.error());
    for (auto& job : (*listed)["jobs"]) {
      if (!principal.may_act_on(job.value("owner", ""))) hide_env_values(job);
    }
    HttpResponse response = json_response(http::status::ok, *listed);
    if (const auto& next = (*listed)["next"]; next.is_string()) {
      std::string link = fmt::format("/v1/jobs?limit={}&after={}", limit, percent_encode(next.get<std::string>()));
      if (state) link += "&state=" + percent_encode(*state);
      response.set(http::field::link, fmt::format("<{}>; rel=\"next\"", link));
    }
    return answer(std::move(response));
  }
  if (seg.size() == 3 && seg[1] == "jobs") {
    route = "/v1/jobs/{id}";
    if (method == http::verb::get) {
      if (!allowed(Scope::read)) return;
      auto job = jobs_.job(seg[2]);
      if (job && !principal.may_act_on(job->value("owner", ""))) hide_env_values(*job);
      return send_result(answer, http::status::ok)(std::move(job));
    }
    if (method == http::verb::delete_) {
      if (!allowed(Scope::submit) || !may_act_on(seg[2])) return;
      return jobs_.cancel(seg[2], [respond = answer_later(route), target](Result<json> result) {
        if (!result) return respond(problem_response(result.error(), target));
        const bool done = (*result)["state"] == "cancelled";
        respond(json_response(done ? http::status::ok : http::status::accepted, *result));
      });
    }
    return wrong_method("GET, DELETE");
  }
  if (seg.size() == 4 && seg[1] == "jobs" && (seg[3] == "pause" || seg[3] == "resume")) {
    route = "/v1/jobs/{id}/" + seg[3];
    if (method != http::verb::post) return wrong_method("POST");
    if (!allowed(Scope::submit) || !may_act_on(seg[2])) return;
    return send_result(answer, http::status::ok)(jobs_.pause(seg[2], seg[3] == "pause"));
  }
  if (seg.size() == 4 && seg[1] == "jobs" && seg[3] == "log") {
    route = "/v1/jobs/{id}/log";
    if (method != http::verb::get) return wrong_method("GET");
    if (!allowed(Scope::read) || !may_act_on(seg[2])) return;
    std::string stream = "stdout";
    if (auto it = parsed.query.find("stream"); it != parsed.query.end()) stream = it->second;
    auto path = jobs_.log_path(seg[2], stream);
    if (!path) return fail(path.error());
    // One answer carries at most kMaxLogChunkBytes; a client pages on from Joule-Log-Next-Offset
    // (joulectl logs does), so a reader of a huge log never makes jouled hold it whole.
    adapters::LogWindow window{std::nullopt, kMaxLogChunkBytes, kMaxLogChunkBytes};
    if (auto it = parsed.query.find("tail_bytes"); it != parsed.query.end()) {
      auto count = parse_count(it->second);
      if (!count)
        return fail(make_error(ErrorCode::invalid_argument, "tail_bytes must be a non-negative integer", "tail_bytes"));
      window.tail_bytes = *count;
    }
    if (auto it = parsed.query.find("offset"); it != parsed.query.end()) {
      auto count = parse_count(it->second);
      if (!count)
        return fail(make_error(ErrorCode::invalid_argument, "offset must be a non-negative integer", "offset"));
      window.offset = *count;
    }
    auto chunk = adapters::read_log_window(*path, window);
    if (!chunk) {
      spdlog::warn("job {}: log refused: {}", printable(seg[2]), chunk.error().message);
      return fail(make_error(ErrorCode::permission_denied, fmt::format("the {} log of job {} cannot be served: {}",
                                                                       stream, seg[2], chunk.error().message)));
    }
    HttpResponse response{http::status::ok, 11};
    response.set(http::field::content_type, "text/plain; charset=utf-8");
    response.set("Joule-Log-Offset", std::to_string(chunk->offset));
    response.set("Joule-Log-Next-Offset", std::to_string(chunk->next_offset()));
    response.set("Joule-Log-Size", std::to_string(chunk->size));
    response.body() = std::move(chunk->bytes);
    return answer(std::move(response));
  }
  if (seg.size() == 2 && seg[1] == "devices") {
    route = "/v1/devices";
    if (method != http::verb::get) return wrong_method("GET");
    if (!allowed(Scope::read)) return;
    return answer(json_response(http::status::ok, jobs_.devices()));
  }
  if (seg.size() == 2 && seg[1] == "estimate") {
    route = "/v1/estimate";
    if (method != http::verb::post) return wrong_method("POST");
    if (!allowed(Scope::read)) return;  // a computation that changes nothing
    json body;
    if (!parse_body(body)) return;
    return send_result(answer, http::status::ok)(estimate_request(body, jobs_.device_names(), models_));
  }
  if (seg.size() == 2 && seg[1] == "probes" && probes_) {
    route = "/v1/probes";
    if (method == http::verb::post) {
      if (!allowed(Scope::admin)) return;  // spends the node's energy and time
      json body;
      if (!parse_body(body)) return;
      return send_result(answer, http::status::accepted)(probes_->request(body));
    }
    if (method != http::verb::get) return wrong_method("GET, POST");
    if (!allowed(Scope::read)) return;
    return answer(json_response(http::status::ok, probes_->runs()));
  }
  if (seg.size() == 3 && seg[1] == "probes" && probes_) {
    route = "/v1/probes/{id}";
    if (method != http::verb::get) return wrong_method("GET");
    if (!allowed(Scope::read)) return;
    return send_result(answer, http::status::ok)(probes_->run(seg[2]));
  }
  if (seg.size() == 2 && seg[1] == "nodes") {
    route = "/v1/nodes";
    if (method != http::verb::get) return wrong_method("GET");
    if (!allowed(Scope::read)) return;
    json out;
    if (coordinator_) {
      out = coordinator_->nodes();
    } else {
      out = agent_ ? agent_->status() : json{{"role", "standalone"}};
      out["devices"] = jobs_.devices()["devices"];
    }
    if (slurm_) out["slurm"] = slurm_->describe();
    return answer(json_response(http::status::ok, out));
  }
  if (seg.size() == 2 && seg[1] == "budgets") {
    route = "/v1/budgets";
    if (method != http::verb::get) return wrong_method("GET");
    if (!allowed(Scope::read)) return;
    return answer(json_response(http::status::ok, jobs_.budgets_view()));
  }
  if (seg.size() == 2 && seg[1] == "probes") {
    route = "/v1/" + seg[1];
    return answer(json_response(
        http::status::not_implemented,
        {{"type", "urn:joule:problem:not-implemented"},
         {"title", "Not Implemented"},
         {"status", 501},
         {"detail", fmt::format("/v1/{} is part of the API but not implemented in this version of jouled", seg[1])},
         {"instance", target}}));
  }
  fail(make_error(ErrorCode::not_found, fmt::format("no route {}", printable(target, 200))));
}

}  // namespace joule::daemon
