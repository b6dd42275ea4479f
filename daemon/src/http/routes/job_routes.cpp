#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "http/routes/call.hpp"
#include "joule/adapters/log_file.hpp"
#include "joule/common/text.hpp"

// /v1/jobs: submit, list (paged), show, cancel, pause/resume, log windows, and the progress a
// job reports with its own token.

namespace joule::daemon::routes {

namespace http = boost::beast::http;
using nlohmann::json;
using Verb = http::verb;

namespace {

// The most one answer of GET /v1/jobs/{id}/log carries.
constexpr std::size_t kMaxLogChunkBytes = 1 << 20;
// The most jobs one answer of GET /v1/jobs lists (and its default).
constexpr std::size_t kMaxJobsPage = 1000;

// What someone who may not act on a job sees of its run.env: the names, not the values
// (tokens and passwords are passed that way).
void hide_env_values(json& job) {
  if (!job.is_object() || !job.contains("spec")) return;
  auto& run = job["spec"]["run"];
  if (!run.is_object() || !run.contains("env") || !run["env"].is_object()) return;
  for (auto& [name, value] : run["env"].items()) value = "(hidden: not your job)";
}

void submit(Call& call, JobService& jobs) {
  auto body = parse_json_body(call.request.body());
  if (!body) return call.fail(body.error());
  JobService::Submitter submitter{call.principal->name, call.principal->uid};
  jobs.submit(*body, std::move(submitter), [answer = call.answer, target = call.target](Result<json> result) {
    if (!result) return answer(problem_response(result.error(), target));
    HttpResponse response = json_response(http::status::created, *result);
    response.set(http::field::location, "/v1/jobs/" + (*result)["id"].get<std::string>());
    answer(std::move(response));
  });
}

void list(Call& call, const JobService& jobs) {
  const auto state = call.query("state");
  // A page is at most kMaxJobsPage jobs: building thousands at once held the event loop for
  // half a second and a slow reader kept megabytes of answer in memory. Clients page on with
  // `after`, from "next" or the Link header.
  const auto limit_or = page_limit(call.query("limit"), kMaxJobsPage);
  if (!limit_or) return call.fail(limit_or.error());
  const std::size_t limit = *limit_or;
  // Submission order by default; the newest first for a look at what happened last (the
  // status page's recent jobs), without paging through every older job to get there.
  const std::string order = call.query("order").value_or("oldest");
  if (order != "oldest" && order != "newest")
    return call.fail(make_error(ErrorCode::invalid_argument,
                                fmt::format("order must be oldest (submission order, the default) or newest, not "
                                            "\"{}\"",
                                            order),
                                "order"));
  auto listed = jobs.jobs(state, limit, call.query("after"), order == "newest");
  if (!listed) return call.fail(listed.error());
  for (auto& job : (*listed)["jobs"]) {
    if (!call.principal->may_act_on(job.value("owner", ""))) hide_env_values(job);
  }
  HttpResponse response = json_response(http::status::ok, *listed);
  if (const auto& next = (*listed)["next"]; next.is_string()) {
    std::string link = fmt::format("/v1/jobs?limit={}&after={}", limit, percent_encode(next.get<std::string>()));
    if (state) link += "&state=" + percent_encode(*state);
    if (order == "newest") link += "&order=newest";
    response.set(http::field::link, fmt::format("<{}>; rel=\"next\"", link));
  }
  call.answer(std::move(response));
}

void show(Call& call, const JobService& jobs) {
  auto job = jobs.job(call.param("id"));
  if (job && !call.principal->may_act_on(job->value("owner", ""))) hide_env_values(*job);
  call.send(std::move(job));
}

void cancel(Call& call, JobService& jobs) {
  jobs.cancel(call.param("id"), [answer = call.answer, target = call.target](Result<json> result) {
    if (!result) return answer(problem_response(result.error(), target));
    const bool done = (*result)["state"] == "cancelled";
    answer(json_response(done ? http::status::ok : http::status::accepted, *result));
  });
}

void log(Call& call, const JobService& jobs) {
  const std::string& id = call.param("id");
  const std::string stream = call.query("stream").value_or("stdout");
  auto path = jobs.log_path(id, stream);
  if (!path) return call.fail(path.error());
  // One answer carries at most kMaxLogChunkBytes; a client pages on from Joule-Log-Next-Offset
  // (joulectl logs does), so a reader of a huge log never makes jouled hold it whole.
  adapters::LogWindow window{std::nullopt, kMaxLogChunkBytes, kMaxLogChunkBytes};
  const auto count_parameter = [&call](const char* name, auto& into) {
    const auto text = call.query(name);
    if (!text) return true;
    auto count = parse_count(*text);
    if (!count) {
      call.fail(make_error(ErrorCode::invalid_argument, fmt::format("{} must be a non-negative integer", name), name));
      return false;
    }
    into = *count;
    return true;
  };
  if (!count_parameter("tail_bytes", window.tail_bytes) || !count_parameter("offset", window.offset)) return;
  auto chunk = adapters::read_log_window(*path, window);
  if (!chunk) {
    spdlog::warn("job {}: log refused: {}", printable(id), chunk.error().message);
    return call.fail(make_error(ErrorCode::permission_denied, fmt::format("the {} log of job {} cannot be served: {}",
                                                                          stream, id, chunk.error().message)));
  }
  HttpResponse response{http::status::ok, 11};
  response.set(http::field::content_type, "text/plain; charset=utf-8");
  response.set("Joule-Log-Offset", std::to_string(chunk->offset));
  response.set("Joule-Log-Next-Offset", std::to_string(chunk->next_offset()));
  response.set("Joule-Log-Size", std::to_string(chunk->size));
  response.body() = std::move(chunk->bytes);
  call.answer(std::move(response));
}

// A job reports its progress with its own token (JOULE_JOB_TOKEN), not an API token.
void progress(Call& call, JobService& jobs) {
  auto body = parse_json_body(call.request.body());
  if (!body) return call.fail(body.error());
  call.send(jobs.report_progress(call.param("id"), bearer_token(call.request), *body));
}

}  // namespace

void add_job_routes(RouteTable& table, ApiContext& context) {
  JobService& jobs = context.jobs;
  table.add(Verb::get, "/v1/jobs", {Guard::read, false, [&jobs](Call& call) { list(call, jobs); }});
  table.add(Verb::post, "/v1/jobs", {Guard::submit, false, [&jobs](Call& call) { submit(call, jobs); }});
  table.add(Verb::get, "/v1/jobs/{id}", {Guard::read, false, [&jobs](Call& call) { show(call, jobs); }});
  table.add(Verb::delete_, "/v1/jobs/{id}", {Guard::submit, true, [&jobs](Call& call) { cancel(call, jobs); }});
  for (const bool pause : {true, false}) {
    table.add(Verb::post, pause ? "/v1/jobs/{id}/pause" : "/v1/jobs/{id}/resume",
              {Guard::submit, true, [&jobs, pause](Call& call) { call.send(jobs.pause(call.param("id"), pause)); }});
  }
  table.add(Verb::get, "/v1/jobs/{id}/log", {Guard::read, true, [&jobs](Call& call) { log(call, jobs); }});
  table.add(Verb::post, "/v1/jobs/{id}/progress",
            {Guard::job_token, false, [&jobs](Call& call) { progress(call, jobs); }});
}

}  // namespace joule::daemon::routes
