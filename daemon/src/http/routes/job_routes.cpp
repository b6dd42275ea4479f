#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <openssl/crypto.h>

#include "http/routes/call.hpp"
#include "http/routes/job_json.hpp"
#include "jobs/job_record.hpp"
#include "joule/adapters/log_file.hpp"
#include "joule/common/energy_source.hpp"
#include "joule/common/sha256.hpp"
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

// The carbon and price signals a job that has not started is shown under (none without
// [carbon] and [price]).
SignalFeeds signals_of(const ApiContext& context) {
  return {context.signals ? &context.signals->feed() : nullptr,
          context.price_signals ? &context.price_signals->feed() : nullptr};
}

// A usage report's rows (one per group and energy source, in group order) as one object per
// group: its jobs and device-hours, joules by source with the measured ones summed apart (a
// model's joules are never counted as measured), the estimates of the jobs that had one beside
// what those jobs used, and grams of CO2e where a carbon signal gave them.
json usage_rows_json(const std::vector<adapters::UsageRow>& rows, const std::string& group_by) {
  json out = json::array();
  for (std::size_t i = 0; i < rows.size();) {
    const std::string& group = rows[i].group;
    std::int64_t jobs = 0, compared = 0, carbon_jobs = 0;
    double seconds = 0.0, measured = 0.0, estimated = 0.0, used = 0.0, error_sum = 0.0, grams = 0.0;
    json by_source = json::object();
    for (; i < rows.size() && rows[i].group == group; ++i) {
      const auto& row = rows[i];
      jobs += row.jobs;
      seconds += row.device_seconds;
      if (!row.source.empty()) by_source[row.source] = row.joules;
      if (is_measurement(std::string_view(row.source))) measured += row.joules;
      compared += row.compared_jobs;
      estimated += row.compared_estimated_joules;
      used += row.compared_joules;
      error_sum += row.compared_relative_error_sum;
      carbon_jobs += row.carbon_jobs;
      grams += row.carbon_grams;
    }
    json entry = {{group_by, group.empty() ? json(nullptr) : json(group)},
                  {"jobs", jobs},
                  {"device_hours", seconds / 3600.0},
                  {"joules", {{"measured", measured}, {"by_source", std::move(by_source)}}},
                  {"estimate", compared == 0 ? json(nullptr)
                                             : json{{"jobs", compared},
                                                    {"estimated_joules", estimated},
                                                    {"used_joules", used},
                                                    {"mean_abs_error", error_sum / static_cast<double>(compared)}}},
                  {"carbon", carbon_jobs == 0 ? json(nullptr) : json{{"jobs", carbon_jobs}, {"grams", grams}}}};
    out.push_back(std::move(entry));
  }
  return out;
}

// Whether `token` is the job's progress token (constant time).
bool job_token_matches(const JobRecord& job, const std::string& token) {
  if (job.row.token_sha256.empty() || token.empty()) return false;
  const std::string presented = joule::sha256_hex(token);
  const std::string& stored = job.row.token_sha256;
  return stored.size() == presented.size() && CRYPTO_memcmp(stored.data(), presented.data(), stored.size()) == 0;
}

void submit(Call& call, ApiContext& context) {
  auto body = parse_json_body(call.request.body());
  if (!body) return call.fail(body.error());
  JobService::Submitter submitter{call.principal->name, call.principal->uid};
  context.jobs.submit(
      *body, std::move(submitter),
      [answer = call.answer, target = call.target, signals = signals_of(context)](Result<JobView> result) {
        if (!result) return answer(problem_response(result.error(), target));
        HttpResponse response = json_response(http::status::created, job_text(*result, true, signals));
        response.set(http::field::location, "/v1/jobs/" + result->job().row.id);
        answer(std::move(response));
      });
}

void list(Call& call, const ApiContext& context) {
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
  auto page = context.jobs.jobs(state, limit, call.query("after"), order == "newest");
  if (!page) return call.fail(page.error());
  // A listed job shows no spec, so no environment values to hide from others.
  HttpResponse response = json_response(http::status::ok, job_page_text(*page, signals_of(context)));
  if (page->next) {
    std::string link = fmt::format("/v1/jobs?limit={}&after={}", limit, percent_encode(*page->next));
    if (state) link += "&state=" + percent_encode(*state);
    if (order == "newest") link += "&order=newest";
    response.set(http::field::link, fmt::format("<{}>; rel=\"next\"", link));
  }
  call.answer(std::move(response));
}

void show(Call& call, const ApiContext& context) {
  auto view = context.jobs.job(call.param("id"));
  if (!view) return call.fail(view.error());
  if (call.principal->may_act_on(view->job().row.owner))
    return call.answer(json_response(http::status::ok, job_text(*view, true, signals_of(context))));
  json job = job_json(*view, true, signals_of(context));
  hide_env_values(job);
  call.answer(json_response(http::status::ok, job));
}

void cancel(Call& call, ApiContext& context) {
  context.jobs.cancel(call.param("id"), [answer = call.answer, target = call.target,
                                         signals = signals_of(context)](Result<JobView> result) {
    if (!result) return answer(problem_response(result.error(), target));
    const json job = job_json(*result, true, signals);
    const bool done = job["state"] == "cancelled";
    answer(json_response(done ? http::status::ok : http::status::accepted, job));
  });
}

void pause(Call& call, ApiContext& context, bool pause) {
  auto view = context.jobs.pause(call.param("id"), pause);
  if (!view) return call.fail(view.error());
  call.answer(json_response(http::status::ok, job_text(*view, true, signals_of(context))));
}

void log(Call& call, const JobService& jobs) {
  const std::string& id = call.param("id");
  const std::string stream = call.query("stream").value_or("stdout");
  auto view = jobs.job(id, false);
  if (!view) return call.fail(view.error());
  if (stream != "stdout" && stream != "stderr")
    return call.fail(make_error(ErrorCode::invalid_argument, "stream must be stdout or stderr", "stream"));
  const auto path = std::make_optional(view->directory / (stream + ".log"));
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
  const std::string& id = call.param("id");
  auto body = parse_json_body(call.request.body());
  if (!body) return call.fail(body.error());
  auto view = jobs.job(id, false);
  if (!view) return call.fail(view.error());
  const JobRecord& job = view->job();
  if (!job_token_matches(job, bearer_token(call.request)))
    return call.fail(make_error(ErrorCode::unauthorized,
                                "progress needs the job's own token (JOULE_JOB_TOKEN) as the bearer token"));
  if (job.state != schedulers::JobState::running && job.state != schedulers::JobState::throttled)
    return call.fail(make_error(ErrorCode::conflict, fmt::format("job {} is {}, not running", id, job.row.state)));
  auto report = parse_progress(*body);
  if (!report) return call.fail(report.error());
  auto answer = jobs.report_progress(id, *report);
  if (!answer) return call.fail(answer.error());
  call.answer(json_response(http::status::ok, progress_json(id, *report, *answer)));
}

// GET /v1/usage?from=&to=&group_by=: what jobs that ended in [from, to) used, per owner,
// project, device, node or day. An owner sees only their own jobs; an admin everyone's, or one
// owner's with owner=. The sums come from SQLite off the loop (UsageReports).
void usage(Call& call, ApiContext& context) {
  if (!context.usage) return call.fail(make_error(ErrorCode::unavailable, "usage reports are not kept here"));
  using GroupBy = adapters::UsageQuery::GroupBy;
  static const std::vector<std::pair<std::string, GroupBy>> kGroups = {{"owner", GroupBy::owner},
                                                                       {"project", GroupBy::project},
                                                                       {"device", GroupBy::device},
                                                                       {"node", GroupBy::node},
                                                                       {"day", GroupBy::day}};
  adapters::UsageQuery query;
  for (const auto& [name, slot] : {std::pair{"from", &query.from_ms}, std::pair{"to", &query.to_ms}}) {
    const auto text = call.query(name);
    if (!text)
      return call.fail(make_error(ErrorCode::invalid_argument,
                                  fmt::format("{} is required: the report covers jobs that ended from `from` up to "
                                              "`to`, RFC 3339 times such as 2026-11-01T00:00:00Z",
                                              name),
                                  name));
    const auto parsed = schedulers::parse_rfc3339(*text);
    if (!parsed)
      return call.fail(make_error(
          ErrorCode::invalid_argument,
          fmt::format("{} \"{}\" is not an RFC 3339 time such as 2026-11-01T00:00:00Z", name, printable(*text)), name));
    *slot = *parsed;
  }
  if (query.to_ms <= query.from_ms)
    return call.fail(make_error(ErrorCode::invalid_argument, "to must be after from", "to"));
  const std::string group_by = call.query("group_by").value_or("owner");
  const auto group = std::find_if(kGroups.begin(), kGroups.end(), [&](const auto& g) { return g.first == group_by; });
  if (group == kGroups.end())
    return call.fail(
        make_error(ErrorCode::invalid_argument,
                   fmt::format("group_by \"{}\" is not one of owner, project, device, node, day", printable(group_by)),
                   "group_by"));
  query.group_by = group->second;
  const Principal& principal = *call.principal;
  const auto owner = call.query("owner");
  if (principal.has(Scope::admin)) {
    if (owner) query.owner = *owner;
  } else {
    if (owner && *owner != principal.name)
      return call.fail(make_error(
          ErrorCode::invalid_argument,
          fmt::format("owner: {} may see only its own usage; another owner's needs an admin", principal.name),
          "owner"));
    query.owner = principal.name;
  }
  json head = {{"from", schedulers::format_rfc3339(query.from_ms)},
               {"to", schedulers::format_rfc3339(query.to_ms)},
               {"group_by", group_by},
               {"owner", query.owner ? json(*query.owner) : json(nullptr)}};
  context.usage->report(std::move(query), [send = call.send_later(), head = std::move(head),
                                           group_by](Result<std::vector<adapters::UsageRow>> rows) mutable {
    if (!rows) return send(rows.error());
    head["rows"] = usage_rows_json(*rows, group_by);
    send(std::move(head));
  });
}

}  // namespace

void add_job_routes(RouteTable& table, ApiContext& context) {
  JobService& jobs = context.jobs;
  table.add(Verb::get, "/v1/jobs", {Guard::read, false, [&context](Call& call) { list(call, context); }});
  table.add(Verb::post, "/v1/jobs", {Guard::submit, false, [&context](Call& call) { submit(call, context); }});
  table.add(Verb::get, "/v1/jobs/{id}", {Guard::read, false, [&context](Call& call) { show(call, context); }});
  table.add(Verb::delete_, "/v1/jobs/{id}", {Guard::submit, true, [&context](Call& call) { cancel(call, context); }});
  for (const bool paused : {true, false}) {
    table.add(Verb::post, paused ? "/v1/jobs/{id}/pause" : "/v1/jobs/{id}/resume",
              {Guard::submit, true, [&context, paused](Call& call) { pause(call, context, paused); }});
  }
  table.add(Verb::get, "/v1/usage", {Guard::read, false, [&context](Call& call) { usage(call, context); }});
  table.add(Verb::get, "/v1/jobs/{id}/log", {Guard::read, true, [&jobs](Call& call) { log(call, jobs); }});
  table.add(Verb::post, "/v1/jobs/{id}/progress",
            {Guard::job_token, false, [&jobs](Call& call) { progress(call, jobs); }});
}

}  // namespace joule::daemon::routes
