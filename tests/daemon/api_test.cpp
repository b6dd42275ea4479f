#include "joule/daemon/api.hpp"
#include "joule/daemon/status_page.hpp"

#include <fstream>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "counting_meter.hpp"
#include "joule/adapters/database.hpp"
#include "joule/adapters/storage_writer.hpp"
#include "joule/common/sha256.hpp"
#include "joule/common/text.hpp"
#include "joule/estimator/probe_campaign.hpp"
#include "joule/estimator/simulated_device.hpp"
#include "temp_dir.hpp"

namespace http = boost::beast::http;
using joule::daemon::Api;
using joule::daemon::HttpRequest;
using joule::daemon::HttpResponse;
using nlohmann::json;

namespace {

class ApiTest : public ::testing::Test {
 protected:
  ApiTest()
      : writer_(std::move(joule::adapters::Database::open(dir_ / "jouled.db")).value()),
        device_table_(devices()),
        jobs_(io_, writer_, metrics_, device_table_, options()),
        api_(std::make_unique<Api>(joule::daemon::ApiServices{jobs_, metrics_, device_table_})) {
    EXPECT_TRUE(jobs_.recover({}, {}));
  }

  static std::vector<joule::daemon::Device> devices() {
    std::vector<joule::daemon::Device> out(1);
    out[0].name = "cpu";
    out[0].meter = std::make_unique<joule::testing::CountingMeter>();
    return out;
  }
  joule::daemon::JobServiceOptions options() const {
    joule::daemon::JobServiceOptions o;
    o.state_directory = dir_.path();
    o.runner = JOULED_BINARY;
    o.max_queued_jobs = 2;
    return o;
  }

  // `uid`: the local user the kernel names for a loopback client (root, an admin, by default);
  // nothing for a remote client.
  HttpResponse call(http::verb method, const std::string& target, const std::string& body = {},
                    const std::string& token = {}, std::optional<uid_t> uid = 0u) {
    HttpRequest request{method, target, 11};
    request.body() = body;
    if (!token.empty()) request.set(http::field::authorization, "Bearer " + token);
    std::optional<HttpResponse> response;
    // Keeps run_for() waiting while a commit is on the storage thread.
    auto busy = boost::asio::make_work_guard(io_);
    joule::daemon::HttpPeer peer;
    peer.uid = uid;
    api_->handle(std::move(request), peer, [&](HttpResponse r) { response = std::move(r); });
    // Commits come back through the io_context; run it until the reply arrives.
    for (int i = 0; i < 2000 && !response; ++i) {
      io_.run_for(std::chrono::milliseconds(5));
      io_.restart();
    }
    EXPECT_TRUE(response) << "no reply to " << target;
    return response.value_or(HttpResponse{});
  }

  static json body_of(const HttpResponse& response) { return json::parse(response.body(), nullptr, false); }

  // Runs the loop until job `id` runs (it is placed, then started, after its commits).
  void wait_running(const std::string& id) {
    for (int i = 0; i < 1000; ++i) {
      if (body_of(call(http::verb::get, "/v1/jobs/" + id))["state"] == "running") return;
      // The placement's commit is on the storage thread: keep the loop waiting for it.
      auto busy = boost::asio::make_work_guard(io_);
      io_.run_for(std::chrono::milliseconds(10));
      io_.restart();
    }
    ADD_FAILURE() << "job " << id << " never ran";
  }

  joule::testing::TempDir dir_;
  boost::asio::io_context io_;
  joule::adapters::StorageWriter writer_;
  joule::daemon::Metrics metrics_;
  joule::daemon::DeviceTable device_table_;
  joule::daemon::JobService jobs_;
  std::unique_ptr<Api> api_;
};

}  // namespace

TEST_F(ApiTest, health_and_readiness) {
  EXPECT_EQ(call(http::verb::get, "/healthz").result_int(), 200u);
  EXPECT_EQ(call(http::verb::get, "/readyz").result_int(), 503u);
  api_->set_ready(true);
  EXPECT_EQ(call(http::verb::get, "/readyz").result_int(), 200u);
}

TEST_F(ApiTest, metrics_are_the_text_exposition) {
  auto response = call(http::verb::get, "/metrics");
  EXPECT_EQ(response.result_int(), 200u);
  EXPECT_EQ(response[http::field::content_type], "text/plain; version=0.0.4; charset=utf-8");
  // Device metrics carry the node (the default node name here is "localhost").
  EXPECT_NE(
      response.body().find("joule_device_energy_joules_total{device=\"cpu\",node=\"localhost\",source=\"simulated\"}"),
      std::string::npos)
      << response.body();
  EXPECT_NE(response.body().find("joule_jobs{state=\"queued\"} 0"), std::string::npos);
  // The loop's time on each request is counted by method and route template, never by raw path.
  call(http::verb::get, "/v1/jobs/no-such-job");
  const std::string text = metrics_.serialize();
  EXPECT_NE(text.find("joule_loop_work_seconds_count{work=\"GET /metrics\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("joule_loop_work_seconds_count{work=\"GET /v1/jobs/{id}\"} 1"), std::string::npos) << text;
  EXPECT_EQ(text.find("no-such-job"), std::string::npos);
}

TEST_F(ApiTest, unknown_routes_and_wrong_methods) {
  auto missing = call(http::verb::get, "/v1/nothing");
  EXPECT_EQ(missing.result_int(), 404u);
  EXPECT_EQ(missing[http::field::content_type], "application/problem+json");
  auto wrong = call(http::verb::put, "/v1/jobs");
  EXPECT_EQ(wrong.result_int(), 405u);
  EXPECT_EQ(wrong[http::field::allow], "GET, HEAD, POST");  // from the route table: HEAD wherever GET
  EXPECT_EQ(call(http::verb::post, "/v1/probes", "{}").result_int(), 501u);
}

TEST_F(ApiTest, malformed_json_says_where) {
  auto response = call(http::verb::post, "/v1/jobs", R"({"run": {"command": ["true"]},)");
  EXPECT_EQ(response.result_int(), 400u);
  auto problem = body_of(response);
  EXPECT_EQ(problem["status"], 400);
  EXPECT_EQ(problem["type"], "urn:joule:problem:invalid-argument");
  EXPECT_NE(problem["detail"].get<std::string>().find("malformed JSON at byte"), std::string::npos);
}

TEST_F(ApiTest, invalid_jobs_name_the_field_and_are_not_stored) {
  auto response = call(http::verb::post, "/v1/jobs", R"({"run": {"command": ["true"], "workdir": "/no/such/dir"}})");
  EXPECT_EQ(response.result_int(), 400u);
  EXPECT_EQ(body_of(response)["errors"][0]["pointer"], "/run/workdir");
  response = call(http::verb::post, "/v1/jobs", R"({"run": {"command": ["no-such-program-xyz"]}})");
  EXPECT_EQ(body_of(response)["errors"][0]["pointer"], "/run/command/0");
  response =
      call(http::verb::post, "/v1/jobs", R"({"run": {"command": ["true"]}, "constraints": {"devices": ["cuda:*"]}})");
  EXPECT_EQ(body_of(response)["errors"][0]["pointer"], "/constraints/devices");
  response = call(http::verb::post, "/v1/jobs",
                  R"({"run": {"command": ["true"]}, "constraints": {"deadline": "2001-01-01T00:00:00Z"}})");
  EXPECT_EQ(body_of(response)["errors"][0]["pointer"], "/constraints/deadline");
  EXPECT_EQ(body_of(call(http::verb::get, "/v1/jobs"))["total"], 0);
}

TEST_F(ApiTest, accepted_job_has_location_and_is_listed) {
  auto response = call(http::verb::post, "/v1/jobs", R"({"name": "x", "run": {"command": ["sleep", "5"]}})");
  ASSERT_EQ(response.result_int(), 201u) << response.body();
  const auto id = body_of(response)["id"].get<std::string>();
  EXPECT_EQ(response[http::field::location], "/v1/jobs/" + id);
  auto listed = body_of(call(http::verb::get, "/v1/jobs"));
  EXPECT_EQ(listed["total"], 1);
  EXPECT_EQ(listed["jobs"][0]["id"], id);
  auto one = body_of(call(http::verb::get, "/v1/jobs/" + id));
  EXPECT_EQ(one["events"][0]["message"], "submitted");
  EXPECT_EQ(call(http::verb::get, "/v1/jobs?state=bogus").result_int(), 400u);
  EXPECT_EQ(call(http::verb::get, "/v1/jobs?limit=0").result_int(), 400u);
  EXPECT_EQ(call(http::verb::get, "/v1/jobs/does-not-exist").result_int(), 404u);
  EXPECT_EQ(call(http::verb::delete_, "/v1/jobs/" + id).result_int(), 202u);  // running: TERM sent
}

TEST_F(ApiTest, the_job_list_is_paged_with_a_next_cursor_and_a_link_header) {
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    auto response = call(http::verb::post, "/v1/jobs", R"({"run": {"command": ["sleep", "5"]}})");
    ASSERT_EQ(response.result_int(), 201u) << response.body();
    ids.push_back(body_of(response)["id"]);
  }
  auto first = call(http::verb::get, "/v1/jobs?limit=2");
  ASSERT_EQ(first.result_int(), 200u);
  auto page = body_of(first);
  ASSERT_EQ(page["jobs"].size(), 2u);
  EXPECT_EQ(page["jobs"][0]["id"], ids[0]);
  EXPECT_EQ(page["total"], 3);
  EXPECT_EQ(page["next"], ids[1]);
  EXPECT_EQ(first[http::field::link], "</v1/jobs?limit=2&after=" + ids[1] + ">; rel=\"next\"");
  auto second = call(http::verb::get, "/v1/jobs?limit=2&after=" + ids[1]);
  page = body_of(second);
  ASSERT_EQ(page["jobs"].size(), 1u);
  EXPECT_EQ(page["jobs"][0]["id"], ids[2]);
  EXPECT_TRUE(page["next"].is_null());
  EXPECT_EQ(second.count(http::field::link), 0u);
  // The state filter travels in the link; a cursor that names no job and a page over the cap are 400s.
  auto queued = call(http::verb::get, "/v1/jobs?state=queued&limit=1");
  if (body_of(queued)["next"].is_string()) {
    EXPECT_NE(std::string(queued[http::field::link]).find("&state=queued>"), std::string::npos);
  }
  auto unknown = call(http::verb::get, "/v1/jobs?after=nope");
  EXPECT_EQ(unknown.result_int(), 400u);
  EXPECT_EQ(body_of(unknown)["errors"][0]["parameter"], "after");
  EXPECT_EQ(call(http::verb::get, "/v1/jobs?limit=1001").result_int(), 400u);
  EXPECT_EQ(call(http::verb::get, "/v1/jobs?limit=1000").result_int(), 200u);
}

TEST_F(ApiTest, the_job_list_newest_first_pages_backwards) {
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    auto response = call(http::verb::post, "/v1/jobs", R"({"run": {"command": ["sleep", "5"]}})");
    ASSERT_EQ(response.result_int(), 201u) << response.body();
    ids.push_back(body_of(response)["id"]);
  }
  auto first = call(http::verb::get, "/v1/jobs?order=newest&limit=2");
  ASSERT_EQ(first.result_int(), 200u) << first.body();
  auto page = body_of(first);
  ASSERT_EQ(page["jobs"].size(), 2u);
  EXPECT_EQ(page["jobs"][0]["id"], ids[2]);
  EXPECT_EQ(page["jobs"][1]["id"], ids[1]);
  EXPECT_EQ(page["total"], 3);
  EXPECT_EQ(page["next"], ids[1]);
  EXPECT_EQ(first[http::field::link], "</v1/jobs?limit=2&after=" + ids[1] + "&order=newest>; rel=\"next\"");
  page = body_of(call(http::verb::get, "/v1/jobs?order=newest&limit=2&after=" + ids[1]));
  ASSERT_EQ(page["jobs"].size(), 1u);
  EXPECT_EQ(page["jobs"][0]["id"], ids[0]);
  EXPECT_TRUE(page["next"].is_null());
  EXPECT_EQ(body_of(call(http::verb::get, "/v1/jobs?order=oldest&limit=1"))["jobs"][0]["id"], ids[0]);
  auto sideways = call(http::verb::get, "/v1/jobs?order=sideways");
  EXPECT_EQ(sideways.result_int(), 400u);
  EXPECT_EQ(body_of(sideways)["errors"][0]["parameter"], "order");
}

TEST_F(ApiTest, a_full_queue_answers_429_with_retry_after) {
  // Device busy with the first job; the limit of 2 waiting jobs is then reached.
  ASSERT_EQ(call(http::verb::post, "/v1/jobs", R"({"run": {"command": ["sleep", "5"]}})").result_int(), 201u);
  ASSERT_EQ(call(http::verb::post, "/v1/jobs", R"({"run": {"command": ["true"]}})").result_int(), 201u);
  ASSERT_EQ(call(http::verb::post, "/v1/jobs", R"({"run": {"command": ["true"]}})").result_int(), 201u);
  auto refused = call(http::verb::post, "/v1/jobs", R"({"run": {"command": ["true"]}})");
  EXPECT_EQ(refused.result_int(), 429u);
  EXPECT_EQ(refused[http::field::retry_after], "10");
  EXPECT_EQ(body_of(call(http::verb::get, "/v1/jobs"))["total"], 3);
}

namespace {

const char* kEstimateBody = R"({
  "model": {"input": {"shape": [1, 28, 28]}, "layers": [
    {"type": "conv2d", "out_channels": 8, "kernel_size": 3}, {"type": "relu"}, {"type": "flatten"},
    {"type": "linear", "out_features": 10}]},
  "training": {"batch_size": 32, "epochs": 2, "samples_per_epoch": 3200}})";

}  // namespace

namespace {

joule::daemon::AccessConfig tokens_for_test() {
  joule::daemon::AccessConfig access;
  access.tokens = {{joule::sha256_hex("s3cret"), "admin", joule::daemon::kAdminScopes},
                   {joule::sha256_hex("alice"), "alice", joule::daemon::kSubmitScopes},
                   {joule::sha256_hex("bob"), "bob", joule::daemon::kSubmitScopes},
                   {joule::sha256_hex("viewer"), "viewer", joule::daemon::kReadScopes}};
  access.agent_tokens = {{joule::sha256_hex("agent"), "agent", joule::daemon::kAgentScopes}};
  return access;
}

}  // namespace

TEST_F(ApiTest, tokens_guard_the_v1_routes_but_not_health) {
  api_->set_access(tokens_for_test());
  EXPECT_EQ(call(http::verb::get, "/v1/jobs", "", "", std::nullopt).result_int(), 401u);
  EXPECT_EQ(call(http::verb::get, "/v1/jobs", "", "wrong", std::nullopt).result_int(), 401u);
  EXPECT_EQ(call(http::verb::get, "/v1/jobs", "", "wrong", 0u).result_int(), 401u) << "a wrong token is never ignored";
  EXPECT_EQ(call(http::verb::get, "/v1/jobs", "", "s3cret", std::nullopt).result_int(), 200u);
  EXPECT_EQ(call(http::verb::get, "/healthz", "", "", std::nullopt).result_int(), 200u);
}

// The page at / is open (it holds no data) and may run nothing but its own inline script.
TEST_F(ApiTest, the_status_page_is_open_and_served_under_its_content_security_policy) {
  api_->set_access(tokens_for_test());
  auto page = call(http::verb::get, "/", "", "", std::nullopt);
  ASSERT_EQ(page.result_int(), 200u);
  EXPECT_EQ(page[http::field::content_type], "text/html; charset=utf-8");
  EXPECT_EQ(page["Content-Security-Policy"], joule::daemon::status_page_policy(joule::daemon::status_page_html()));
  EXPECT_EQ(page["X-Content-Type-Options"], "nosniff");
  EXPECT_EQ(page.body(), joule::daemon::status_page_html());
  EXPECT_EQ(call(http::verb::get, "/v1/jobs", "", "", std::nullopt).result_int(), 401u) << "its data is not";
  EXPECT_EQ(call(http::verb::post, "/", "", "", std::nullopt).result_int(), 405u);
}

// Every route, with no token, a wrong one, and each scope: what each may do.
TEST_F(ApiTest, every_route_answers_by_the_scope_of_its_token) {
  api_->set_access(tokens_for_test());
  const auto submitted = call(http::verb::post, "/v1/jobs", R"({"run": {"command": ["sleep", "5"]}})", "alice");
  ASSERT_EQ(submitted.result_int(), 201u) << submitted.body();
  const std::string id = body_of(submitted)["id"];
  wait_running(id);  // pause and resume need a running job
  struct Route {
    http::verb method;
    std::string target;
    std::string body;
    unsigned viewer, alice, admin;  // the status each gets
  };
  const std::vector<Route> routes = {
      {http::verb::get, "/v1/jobs", "", 200, 200, 200},
      {http::verb::get, "/v1/jobs/" + id, "", 200, 200, 200},
      {http::verb::get, "/v1/jobs/" + id + "/log", "", 403, 200, 200},
      {http::verb::post, "/v1/jobs/" + id + "/pause", "", 403, 200, 200},
      {http::verb::post, "/v1/jobs/" + id + "/resume", "", 403, 200, 200},
      {http::verb::get, "/v1/devices", "", 200, 200, 200},
      {http::verb::get, "/v1/nodes", "", 200, 200, 200},
      {http::verb::get, "/v1/budgets", "", 200, 200, 200},
      {http::verb::post, "/v1/estimate", kEstimateBody, 200, 200, 200},
      {http::verb::post, "/v1/jobs", R"({"run": {"command": ["true"]}})", 403, 201, 201},
      {http::verb::post, "/v1/cluster/sync", "{}", 401, 401, 401},  // agents only (and no coordinator here)
  };
  for (const auto& route : routes) {
    const std::string what = std::string(http::to_string(route.method)) + " " + route.target;
    // Every route, cluster sync included, authenticates before it says anything else.
    EXPECT_EQ(call(route.method, route.target, route.body, "", std::nullopt).result_int(), 401u)
        << what << " without a token";
    EXPECT_EQ(call(route.method, route.target, route.body, "wrong", std::nullopt).result_int(), 401u)
        << what << " with a wrong token";
    if (route.target == "/v1/cluster/sync") {
      // The agent's token gets through, to hear that this node is no coordinator.
      EXPECT_EQ(call(route.method, route.target, route.body, "agent", std::nullopt).result_int(), 409u) << what;
      continue;
    }
    EXPECT_EQ(call(route.method, route.target, route.body, "viewer", std::nullopt).result_int(), route.viewer)
        << what << " as viewer (read)";
    EXPECT_EQ(call(route.method, route.target, route.body, "alice", std::nullopt).result_int(), route.alice)
        << what << " as alice (submit, the owner)";
    EXPECT_EQ(call(route.method, route.target, route.body, "s3cret", std::nullopt).result_int(), route.admin)
        << what << " as admin";
  }
  EXPECT_EQ(call(http::verb::delete_, "/v1/jobs/" + id, "", "viewer", std::nullopt).result_int(), 403u);
  EXPECT_EQ(call(http::verb::delete_, "/v1/jobs/" + id, "", "alice", std::nullopt).result_int(), 202u);
}

TEST_F(ApiTest, a_submit_token_acts_on_its_own_jobs_only_and_does_not_see_others_secrets) {
  api_->set_access(tokens_for_test());
  auto submitted = call(http::verb::post, "/v1/jobs",
                        R"({"run": {"command": ["sleep", "5"], "env": {"API_KEY": "alices-secret"}}})", "alice");
  ASSERT_EQ(submitted.result_int(), 201u) << submitted.body();
  const std::string id = body_of(submitted)["id"];
  EXPECT_EQ(body_of(submitted)["owner"], "token:alice");
  wait_running(id);

  auto seen_by_bob = call(http::verb::get, "/v1/jobs/" + id, "", "bob", std::nullopt);
  EXPECT_EQ(seen_by_bob.result_int(), 200u);
  EXPECT_EQ(seen_by_bob.body().find("alices-secret"), std::string::npos) << seen_by_bob.body();
  EXPECT_EQ(body_of(seen_by_bob)["spec"]["run"]["env"]["API_KEY"], "(hidden: not your job)");
  auto listed_for_bob = call(http::verb::get, "/v1/jobs", "", "bob", std::nullopt);
  EXPECT_EQ(listed_for_bob.body().find("alices-secret"), std::string::npos);
  EXPECT_NE(call(http::verb::get, "/v1/jobs/" + id, "", "alice", std::nullopt).body().find("alices-secret"),
            std::string::npos);

  for (const auto& [method, suffix] : std::vector<std::pair<http::verb, std::string>>{{http::verb::get, "/log"},
                                                                                      {http::verb::post, "/pause"},
                                                                                      {http::verb::post, "/resume"},
                                                                                      {http::verb::delete_, ""}}) {
    auto refused = call(method, "/v1/jobs/" + id + suffix, "", "bob", std::nullopt);
    EXPECT_EQ(refused.result_int(), 403u) << suffix;
    EXPECT_NE(body_of(refused)["detail"].get<std::string>().find("token:alice"), std::string::npos) << refused.body();
  }
  EXPECT_EQ(body_of(call(http::verb::get, "/v1/jobs/" + id, "", "s3cret", std::nullopt))["state"], "running");
  EXPECT_EQ(call(http::verb::delete_, "/v1/jobs/" + id, "", "s3cret", std::nullopt).result_int(), 202u)
      << "an admin acts on every job";
}

TEST_F(ApiTest, a_local_user_without_a_token_owns_what_it_submits) {
  api_->set_access(tokens_for_test());
  auto submitted = call(http::verb::post, "/v1/jobs", R"({"run": {"command": ["sleep", "5"]}})", "", 1000u);
  ASSERT_EQ(submitted.result_int(), 201u) << submitted.body();
  const std::string id = body_of(submitted)["id"];
  EXPECT_EQ(body_of(submitted)["owner"], "uid:1000");
  EXPECT_EQ(call(http::verb::post, "/v1/jobs/" + id + "/pause", "", "", 1001u).result_int(), 403u);
  EXPECT_EQ(call(http::verb::delete_, "/v1/jobs/" + id, "", "", 0u).result_int(), 202u) << "root administers";
}

TEST(Sha256Test, matches_the_known_vector) {
  EXPECT_EQ(joule::sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_F(ApiTest, estimate_without_a_model_gives_counts_and_says_why_no_joules) {
  auto response = call(http::verb::post, "/v1/estimate", kEstimateBody);
  ASSERT_EQ(response.result_int(), 200u) << response.body();
  auto body = body_of(response);
  EXPECT_EQ(body["steps"], 200);
  EXPECT_EQ(body["model"]["layers"].size(), 4u);
  EXPECT_EQ(body["model"]["layers"][0]["output_shape"], json::array({8, 26, 26}));
  EXPECT_EQ(body["model"]["parameters"], 8 * 9 + 8 + 8 * 26 * 26 * 10 + 10);
  ASSERT_EQ(body["estimates"].size(), 1u);
  EXPECT_EQ(body["estimates"][0]["device"], "cpu");
  EXPECT_EQ(body["estimates"][0]["status"], "no-model");
  EXPECT_FALSE(body["estimates"][0].contains("joules"));
}

TEST_F(ApiTest, estimate_errors_name_the_field) {
  auto misfit = body_of(call(
      http::verb::post, "/v1/estimate",
      R"({"model": {"input": {"shape": [1, 4, 4]}, "layers": [{"type": "conv2d", "out_channels": 2, "kernel_size": 5}]},
                                 "training": {"samples_per_epoch": 10}})"));
  EXPECT_EQ(misfit["status"], 400);
  EXPECT_EQ(misfit["errors"][0]["pointer"], "/model/layers/0");
  auto no_training =
      body_of(call(http::verb::post, "/v1/estimate",
                   R"({"model": {"input": {"shape": [4]}, "layers": [{"type": "linear", "out_features": 2}]}})"));
  EXPECT_EQ(no_training["errors"][0]["pointer"], "/training");
  json filtered = json::parse(kEstimateBody);
  filtered["devices"] = json::array({"cuda:*"});
  EXPECT_EQ(body_of(call(http::verb::post, "/v1/estimate", filtered.dump()))["errors"][0]["pointer"], "/devices");
}

TEST_F(ApiTest, estimate_with_a_simulated_model_carries_mean_std_breakdown_and_baseline) {
  using namespace joule::estimator;
  SimulatedDevice device(*find_simulated_profile("server-gpu"), 4);
  auto model = std::make_shared<DeviceEnergyModel>("cpu", "simulated");
  auto spec = *parse_model_spec(json::parse(kEstimateBody)["model"], "/model");
  const NetworkMeter meter = simulated_network_meter(device, 1);
  CampaignOptions options;
  options.probes = 60;
  options.gp.restarts = 1;
  ASSERT_TRUE(run_campaign(*model, {WorkloadItem{spec, 32}}, meter, options));
  joule::daemon::EstimateService estimates(device_table_);
  estimates.set_models({{"cpu", model}});
  api_ = std::make_unique<Api>(joule::daemon::ApiServices{jobs_, metrics_, device_table_, &estimates});
  auto body = body_of(call(http::verb::post, "/v1/estimate", kEstimateBody));
  const auto& estimate = body["estimates"][0];
  ASSERT_EQ(estimate["status"], "ok") << body.dump(2);
  EXPECT_EQ(estimate["source"], "simulated");
  EXPECT_EQ(estimate["method"], "thor-gp");
  EXPECT_GT(estimate["joules"]["mean"].get<double>(), 0.0);
  EXPECT_GT(estimate["joules"]["std"].get<double>(), 0.0);
  EXPECT_EQ(estimate["layers"].size(), 4u);
  EXPECT_EQ(estimate["baseline"]["method"], "flops");

  // A job's model work started before the models change (it runs off the loop) is made with the
  // models it began with.
  json job = json::parse(kEstimateBody);
  job["run"] = {{"command", {"true"}}};
  const auto job_spec = joule::schedulers::parse_job_spec(job);
  ASSERT_TRUE(job_spec) << job_spec.error().message;
  auto work = estimates.start_estimate(*job_spec);
  estimates.set_models({});
  auto rows = work();
  estimates.finish_estimate(*job_spec, rows);
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_TRUE(rows[0].estimate);
  EXPECT_NEAR(rows[0].estimate->joules.mean, estimate["joules"]["mean"].get<double>(),
              1e-6 * estimate["joules"]["mean"].get<double>());
  EXPECT_FALSE(estimates.estimate_job(*job_spec).at(0).estimate);  // made now: no model
}

// ---- Hostile input: each request below once stopped jouled (an exception escaped a handler).

TEST_F(ApiTest, a_number_beyond_a_double_is_a_400_not_a_crash) {
  for (const char* target : {"/v1/jobs/x/progress", "/v1/jobs", "/v1/estimate"}) {
    auto response = call(http::verb::post, target, R"({"epoch": 1e400})");
    EXPECT_EQ(response.result_int(), 400u) << target << ": " << response.body();
    EXPECT_EQ(response[http::field::content_type], "application/problem+json");
    EXPECT_FALSE(body_of(response).is_discarded()) << response.body();
  }
}

TEST_F(ApiTest, bytes_that_are_not_utf8_in_a_json_string_are_a_400_with_a_valid_body) {
  auto response = call(http::verb::post, "/v1/jobs/x/progress", "{\"epoch\":\"\xff\"}");
  EXPECT_EQ(response.result_int(), 400u);
  auto problem = body_of(response);
  ASSERT_FALSE(problem.is_discarded()) << response.body();
  // The parser's message quotes the bad byte only in escaped form.
  EXPECT_NE(problem["detail"].get<std::string>().find("\\xff"), std::string::npos) << problem["detail"];
  response = call(http::verb::post, "/v1/jobs", "{\"name\":\"\xc3\x28\",\"run\":{\"command\":[\"true\"]}}");
  EXPECT_EQ(response.result_int(), 400u);
  EXPECT_FALSE(body_of(response).is_discarded());
}

TEST_F(ApiTest, a_raw_byte_outside_ascii_in_the_target_is_a_400) {
  for (const std::string target : {"/\xff", "/v1/jobs/\xff", "/v1/jobs?state=\xc3\xa9"}) {
    auto response = call(http::verb::get, target);
    EXPECT_EQ(response.result_int(), 400u) << joule::printable(target);
    auto problem = body_of(response);
    ASSERT_FALSE(problem.is_discarded()) << response.body();
    EXPECT_NE(problem["detail"].get<std::string>().find("percent-encode"), std::string::npos);
  }
}

TEST_F(ApiTest, percent_encoded_ids_that_decode_to_bad_utf8_or_controls_are_a_400) {
  api_->set_access(tokens_for_test());
  for (const char* target : {"/v1/jobs/%ff", "/v1/jobs/%0a", "/v1/jobs/%ff/log", "/v1/jobs?state=%ff", "/%ff"}) {
    auto response = call(http::verb::get, target, "", "s3cret");
    EXPECT_EQ(response.result_int(), 400u) << target;
    EXPECT_FALSE(body_of(response).is_discarded()) << target << ": " << response.body();
  }
  // Before authentication as well.
  EXPECT_EQ(call(http::verb::get, "/v1/jobs/%ff", "", "", std::nullopt).result_int(), 400u);
}

TEST_F(ApiTest, priorities_beyond_the_range_are_refused_as_written) {
  for (const char* priority : {"18446744073709551615", "9223372036854775808", "-9223372036854775808", "1000001"}) {
    auto response = call(http::verb::post, "/v1/jobs",
                         fmt::format(R"({{"priority": {}, "run": {{"command": ["true"]}}}})", priority));
    EXPECT_EQ(response.result_int(), 400u) << priority;
    EXPECT_EQ(body_of(response)["errors"][0]["pointer"], "/priority") << priority;
  }
  EXPECT_EQ(body_of(call(http::verb::get, "/v1/jobs"))["total"], 0);
}

TEST_F(ApiTest, names_with_control_characters_and_unsafe_environment_names_are_refused) {
  for (const char* name : {R"(x\n2026-11-26 [info] forged)", R"(x\u00852026-01-01 critical: forged)", R"(\u009b2J)",
                           R"(a\u2028b)", R"(evil\u202etxt)"}) {
    auto refused =
        call(http::verb::post, "/v1/jobs", fmt::format(R"({{"name": "{}", "run": {{"command": ["true"]}}}})", name));
    EXPECT_EQ(refused.result_int(), 400u) << name;
    EXPECT_EQ(body_of(refused)["errors"][0]["pointer"], "/name") << name;
  }
  // A NUL byte ended the JSON body: what followed it was ignored and the job accepted.
  const std::string with_nul("{\"run\": {\"command\": [\"true\"]}}\0\xff{", 33);
  auto nul = call(http::verb::post, "/v1/jobs", with_nul);
  EXPECT_EQ(nul.result_int(), 400u) << nul.body();
  EXPECT_NE(body_of(nul)["detail"].get<std::string>().find("NUL byte at offset 30"), std::string::npos) << nul.body();
  auto response = call(http::verb::post, "/v1/jobs", R"({"run": {"command": ["true"], "workdir": "/tmp\u0000/x"}})");
  EXPECT_EQ(response.result_int(), 400u);
  EXPECT_EQ(body_of(response)["errors"][0]["pointer"], "/run/workdir");
  const std::vector<std::pair<std::string, std::string>> names = {{"A B", "/run/env/A B"},
                                                                  {"A\\nB", "/run/env/A\nB"},
                                                                  {"1X", "/run/env/1X"},
                                                                  {"BASH_ENV", "/run/env/BASH_ENV"},
                                                                  {"LD_PRELOAD", "/run/env/LD_PRELOAD"},
                                                                  {"LD_AUDIT", "/run/env/LD_AUDIT"},
                                                                  {"JOULE_JOB_TOKEN", "/run/env/JOULE_JOB_TOKEN"},
                                                                  {"a/b", "/run/env/a~1b"}};
  for (const auto& [name, pointer] : names) {
    response = call(http::verb::post, "/v1/jobs",
                    fmt::format(R"({{"run": {{"command": ["true"], "env": {{"{}": "x"}}}}}})", name));
    EXPECT_EQ(response.result_int(), 400u) << name;
    EXPECT_EQ(body_of(response)["errors"][0]["pointer"], pointer) << name << ": " << response.body();
  }
  EXPECT_EQ(body_of(call(http::verb::get, "/v1/jobs"))["total"], 0);
  // LD_LIBRARY_PATH stays usable: it only changes where the job's own program finds libraries.
  response =
      call(http::verb::post, "/v1/jobs", R"({"run": {"command": ["true"], "env": {"LD_LIBRARY_PATH": "/opt"}}})");
  EXPECT_EQ(response.result_int(), 201u) << response.body();
}

TEST_F(ApiTest, a_log_is_served_in_bounded_windows_and_a_planted_link_is_not_followed) {
  auto response = call(http::verb::post, "/v1/jobs", R"({"run": {"command": ["sleep", "5"]}})");
  ASSERT_EQ(response.result_int(), 201u) << response.body();
  const auto id = body_of(response)["id"].get<std::string>();
  const auto log = dir_ / "jobs" / id / "stdout.log";
  std::filesystem::create_directories(log.parent_path());
  std::filesystem::remove(log);
  std::ofstream(log) << std::string(3 << 20, 'a') << "end";
  auto first = call(http::verb::get, "/v1/jobs/" + id + "/log?offset=0");
  ASSERT_EQ(first.result_int(), 200u) << first.body();
  EXPECT_EQ(first.body().size(), 1u << 20);
  EXPECT_EQ(first["Joule-Log-Next-Offset"], std::to_string(1 << 20));
  EXPECT_EQ(first["Joule-Log-Size"], std::to_string((3 << 20) + 3));
  auto tail = call(http::verb::get, "/v1/jobs/" + id + "/log?tail_bytes=3");
  EXPECT_EQ(tail.body(), "end");

  std::filesystem::remove(log);
  std::ofstream(dir_ / "secret") << "the daemon's";
  std::filesystem::create_symlink(dir_ / "secret", log);
  auto refused = call(http::verb::get, "/v1/jobs/" + id + "/log");
  EXPECT_EQ(refused.result_int(), 403u) << refused.body();
  EXPECT_EQ(refused.body().find("the daemon's"), std::string::npos);
  call(http::verb::delete_, "/v1/jobs/" + id);
}
