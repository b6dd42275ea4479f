// Many people on one jouled: projects and quotas end to end, with real clients holding their own
// tokens. One owner flooding the API is held at its quota and another still gets in; a project's
// running quota holds its jobs with the reason, and a reload (SIGHUP) lets them run.

#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "daemon_process.hpp"

using joule::testing::DaemonProcess;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// sha256("alice-token") and sha256("bob-token"), as [[auth.tokens]] keeps them.
constexpr const char* kTokens = R"([[auth.tokens]]
name = "alice"
sha256 = "9c220f200955d76c0a38d308225e0ef10c5f971acaf2f8d1d8f732affa5bd1dc"
scopes = ["submit"]
[[auth.tokens]]
name = "bob"
sha256 = "97dd3707015dcf069cf73022ed7173b1165db6eff24b441cb57fd069a8c4e525"
scopes = ["submit"]
)";

std::string tenancy(int slow_running) {
  return "[tenancy]\nmax_queued_jobs_per_owner = 3\n\n"
         "[[projects]]\nname = \"vision\"\nowners = [\"token:bob\"]\n\n"
         "[[projects]]\nname = \"slow\"\nmax_running_jobs = " +
         std::to_string(slow_running) +
         "\n\n"
         "[[owners]]\nname = \"token:alice\"\nmax_queued_jobs = 2\n";
}

class TenancyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "joule-tenancy-XXXXXX").string();
    policies_ = ::mkdtemp(pattern.data());
    std::ofstream(policies_ / "60-tenancy.toml") << tenancy(0);
    options_.config_toml = "[node]\nname = \"lab1\"\n[probing]\nenabled = false\n[policy]\ndirectory = \"" +
                           policies_.string() + "\"\n" + kTokens;
    daemon_ = std::make_unique<DaemonProcess>(options_);
    ASSERT_TRUE(daemon_->start()) << daemon_->log();
  }
  void TearDown() override {
    daemon_.reset();
    std::error_code ec;
    std::filesystem::remove_all(policies_, ec);
  }

  std::pair<unsigned, json> submit_as(const std::string& token, const json& job) const {
    return submit_to(*daemon_, token, job);
  }
  static std::pair<unsigned, json> submit_to(const DaemonProcess& daemon, const std::string& token, const json& job) {
    auto reply = daemon.client(token).request("POST", "/v1/jobs", job.dump());
    if (!reply) return {0, json(reply.error().message)};
    return {reply->status, json::parse(reply->body, nullptr, false)};
  }

  std::filesystem::path policies_;
  joule::testing::DaemonOptions options_;
  std::unique_ptr<DaemonProcess> daemon_;
};

json job(const std::string& name, std::vector<std::string> argv, const std::string& project = {}) {
  json out = {{"name", name}, {"run", {{"command", std::move(argv)}}}};
  if (!project.empty()) out["project"] = project;
  return out;
}

TEST_F(TenancyTest, one_owner_flooding_the_api_is_held_at_its_quota_and_another_still_submits) {
  // Bob's job holds the only device, so everything after it queues.
  auto [status, blocker] = submit_as("bob-token", job("blocker", {"sleep", "60"}));
  ASSERT_EQ(status, 201u) << blocker.dump(2);
  EXPECT_EQ(blocker["owner"], "token:bob");
  EXPECT_TRUE(blocker["project"].is_null());
  daemon_->wait_state(blocker["id"], {"running"});

  // Alice sends 8 submissions at once: exactly her 2 are accepted, each refusal names the quota.
  std::vector<std::future<std::pair<unsigned, json>>> flood;
  for (int i = 0; i < 8; ++i)
    flood.push_back(std::async(std::launch::async,
                               [&, i] { return submit_as("alice-token", job(fmt::format("a{}", i), {"true"})); }));
  int accepted = 0, refused = 0;
  for (auto& answer : flood) {
    auto [code, body] = answer.get();
    if (code == 201) {
      ++accepted;
      continue;
    }
    ASSERT_EQ(code, 429u) << body.dump(2);
    ++refused;
    EXPECT_EQ(body["quota"]["kind"], "owner") << body.dump(2);
    EXPECT_EQ(body["quota"]["name"], "token:alice");
    EXPECT_EQ(body["quota"]["limit"], "max_queued_jobs");
    EXPECT_EQ(body["quota"]["max"], 2);
    EXPECT_EQ(body["quota"]["in_use"], 2);
    EXPECT_NE(body["detail"].get<std::string>().find("owner token:alice has 2 jobs queued"), std::string::npos)
        << body.dump(2);
  }
  EXPECT_EQ(accepted, 2);
  EXPECT_EQ(refused, 6);
  auto [listed_status, listed] = daemon_->call("GET", "/v1/jobs?state=queued");
  ASSERT_EQ(listed_status, 200u);
  EXPECT_EQ(listed["jobs"].size(), 2u) << "a refused submission stores nothing";

  // Bob is not starved by Alice: his own quota (the default, 3) holds, not hers.
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(submit_as("bob-token", job(fmt::format("b{}", i), {"true"}, "vision")).first, 201u);
  auto [bob_status, bob_refused] = submit_as("bob-token", job("b3", {"true"}));
  EXPECT_EQ(bob_status, 429u);
  EXPECT_EQ(bob_refused["quota"]["name"], "token:bob") << bob_refused.dump(2);
  EXPECT_EQ(bob_refused["quota"]["max"], 3);

  // A project Alice may not use, or none that exists: 400 at /project, nothing stored.
  auto [not_hers, why] = submit_as("alice-token", job("x", {"true"}, "vision"));
  EXPECT_EQ(not_hers, 400u);
  EXPECT_EQ(why["errors"][0]["pointer"], "/project") << why.dump(2);
  EXPECT_NE(why["detail"].get<std::string>().find("token:alice is not one of project \"vision\"'s owners"),
            std::string::npos);
  EXPECT_EQ(submit_as("bob-token", job("x", {"true"}, "visoin")).first, 400u);
  EXPECT_EQ(daemon_->call("GET", "/v1/jobs?state=queued").second["jobs"].size(), 5u);
  EXPECT_EQ(daemon_->call("DELETE", "/v1/jobs/" + blocker["id"].get<std::string>()).first, 202u);
}

TEST_F(TenancyTest, a_projects_running_quota_holds_its_jobs_with_the_reason_until_a_reload_raises_it) {
  auto [status, held] = submit_as("bob-token", job("held", {"true"}, "slow"));
  ASSERT_EQ(status, 201u) << held.dump(2);
  EXPECT_EQ(held["project"], "slow");
  const std::string id = held["id"];
  // The device is free; the project may run none.
  json shown;
  for (const auto until = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < until;
       std::this_thread::sleep_for(50ms)) {
    shown = daemon_->call("GET", "/v1/jobs/" + id).second;
    if (shown.contains("waiting") && shown["waiting"]["reason"] == "quota") break;
  }
  EXPECT_EQ(shown["state"], "queued");
  EXPECT_EQ(shown["waiting"]["reason"], "quota") << shown.dump(2);
  EXPECT_NE(shown["waiting"]["message"].get<std::string>().find("project slow runs 0 jobs"), std::string::npos)
      << shown.dump(2);
  // Another owner's job in no project runs past it.
  const std::string other = daemon_->submit(job("other", {"true"}));
  EXPECT_EQ(daemon_->wait_state(other, {"succeeded"})["state"], "succeeded");

  std::ofstream(policies_ / "60-tenancy.toml") << tenancy(1);
  daemon_->signal(SIGHUP);
  EXPECT_EQ(daemon_->wait_state(id, {"succeeded"})["state"], "succeeded") << daemon_->log();
}

// An RFC 3339 time `offset` from now, for a usage report's range.
std::string utc_from_now(std::chrono::seconds offset) {
  const std::time_t at = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now() + offset);
  std::tm utc{};
  ::gmtime_r(&at, &utc);
  return fmt::format("{:%Y-%m-%dT%H:%M:%S}Z", utc);
}

TEST_F(TenancyTest, usage_reports_each_owners_and_projects_jobs_and_an_owner_sees_only_their_own) {
  std::vector<std::string> ids;
  for (const auto& [token, project] :
       {std::pair{"alice-token", ""}, std::pair{"bob-token", "vision"}, std::pair{"bob-token", "vision"}}) {
    auto [status, accepted] = submit_as(token, job("u", {"true"}, project));
    ASSERT_EQ(status, 201u) << accepted.dump(2);
    ids.push_back(accepted["id"]);
  }
  for (const auto& id : ids) ASSERT_EQ(daemon_->wait_state(id, {"succeeded"})["state"], "succeeded");
  const std::string range = "from=" + utc_from_now(-3600s) + "&to=" + utc_from_now(3600s);

  // An admin (jouled's own user, over loopback) sees everyone's.
  auto [status, report] = daemon_->call("GET", "/v1/usage?" + range);
  ASSERT_EQ(status, 200u) << report.dump(2);
  EXPECT_EQ(report["group_by"], "owner");
  EXPECT_TRUE(report["owner"].is_null());
  ASSERT_EQ(report["rows"].size(), 2u) << report.dump(2);
  EXPECT_EQ(report["rows"][0]["owner"], "token:alice");
  EXPECT_EQ(report["rows"][0]["jobs"], 1);
  EXPECT_EQ(report["rows"][1]["owner"], "token:bob");
  EXPECT_EQ(report["rows"][1]["jobs"], 2);
  // This VM has no meter: the joules are the model's, by source, and none is counted as measured.
  EXPECT_EQ(report["rows"][1]["joules"]["measured"], 0.0);
  EXPECT_TRUE(report["rows"][1]["joules"]["by_source"].contains("modelled")) << report.dump(2);
  EXPECT_GT(report["rows"][1]["device_hours"].get<double>(), 0.0);

  auto [by_project_status, by_project] = daemon_->call("GET", "/v1/usage?" + range + "&group_by=project");
  ASSERT_EQ(by_project_status, 200u);
  ASSERT_EQ(by_project["rows"].size(), 2u) << by_project.dump(2);
  EXPECT_TRUE(by_project["rows"][0]["project"].is_null());  // Alice's job, in none
  EXPECT_EQ(by_project["rows"][1]["project"], "vision");

  // Alice sees her own row alone, and may not ask for Bob's.
  auto own = daemon_->client("alice-token").request("GET", "/v1/usage?" + range);
  ASSERT_TRUE(own);
  ASSERT_EQ(own->status, 200u) << own->body;
  const json mine = json::parse(own->body);
  EXPECT_EQ(mine["owner"], "token:alice");
  ASSERT_EQ(mine["rows"].size(), 1u);
  EXPECT_EQ(mine["rows"][0]["owner"], "token:alice");
  auto other = daemon_->client("alice-token").request("GET", "/v1/usage?" + range + "&owner=token:bob");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 400u) << other->body;

  // Bad input names the parameter.
  for (const auto& [query, parameter] :
       {std::pair{"from=" + utc_from_now(0s), std::string("to")},
        std::pair{"from=" + utc_from_now(0s) + "&to=" + utc_from_now(-60s), std::string("to")},
        std::pair{"from=yesterday&to=" + utc_from_now(0s), std::string("from")},
        std::pair{range + "&group_by=week", std::string("group_by")}}) {
    auto [bad_status, bad] = daemon_->call("GET", "/v1/usage?" + query);
    EXPECT_EQ(bad_status, 400u) << query;
    EXPECT_EQ(bad["errors"][0]["parameter"], parameter) << bad.dump(2);
  }
}

TEST_F(TenancyTest, a_budget_for_each_owner_holds_one_owners_second_job_and_counts_another_apart) {
  std::ofstream(policies_ / "70-each.toml")
      << "[[budgets]]\nname = \"each-day\"\nowner = \"*\"\njoules = 150\nwindow = \"24h\"\n";
  daemon_->signal(SIGHUP);
  joule::testing::wait_until([&] { return daemon_->call("GET", "/v1/budgets").second; },
                             [](const json& view) {
                               return view["policy"]["source"].get<std::string>().find("70-each.toml") !=
                                      std::string::npos;
                             });
  // Each job reserves its own max_energy_joules (no model): alice's budget has room for one.
  auto capped = [](const std::string& name, const std::string& seconds) {
    json out = job(name, {"sleep", seconds});
    out["constraints"] = {{"max_energy_joules", 100}};
    return out;
  };
  auto [first_status, first] = submit_as("alice-token", capped("a1", "1"));
  ASSERT_EQ(first_status, 201u) << first.dump(2);
  ASSERT_EQ(daemon_->wait_state(first["id"], {"running"})["state"], "running");
  auto [second_status, second] = submit_as("alice-token", capped("a2", "0.1"));
  ASSERT_EQ(second_status, 201u) << second.dump(2);
  const json held = joule::testing::wait_until(
      [&] { return daemon_->call("GET", "/v1/jobs/" + second["id"].get<std::string>()).second; },
      [](const json& j) { return j.contains("waiting") && j["waiting"]["reason"] == "budget"; });
  EXPECT_EQ(held["waiting"]["rule"], "each-day (token:alice)") << held.dump(2);
  // Bob's job is his own budget's: it waits for the device, not for alice's budget.
  auto [bob_status, bob] = submit_as("bob-token", capped("b1", "0.1"));
  ASSERT_EQ(bob_status, 201u) << bob.dump(2);
  const json bobs = joule::testing::wait_until(
      [&] { return daemon_->call("GET", "/v1/jobs/" + bob["id"].get<std::string>()).second; },
      [](const json& j) { return j.contains("waiting") || j["state"] != "queued"; });
  if (bobs.contains("waiting")) {
    EXPECT_NE(bobs["waiting"]["reason"], "budget") << bobs.dump(2);
  }
  std::vector<std::string> names;
  const json budgets = daemon_->call("GET", "/v1/budgets").second;
  for (const auto& budget : budgets["budgets"]) names.push_back(budget["name"].get<std::string>());
  EXPECT_NE(std::find(names.begin(), names.end(), "each-day (token:alice)"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "each-day (token:bob)"), names.end());
  EXPECT_EQ(daemon_->wait_state(bob["id"], {"succeeded"}, std::chrono::seconds(20))["state"], "succeeded");
}

TEST_F(TenancyTest, fair_share_runs_the_job_of_the_owner_who_used_less_lately_first_across_a_restart) {
  // Alice has used energy lately (a half-second job: ~5 J of the modelled meter); Bob none.
  auto [status, used] = submit_as("alice-token", job("earlier", {"sleep", "0.5"}));
  ASSERT_EQ(status, 201u) << used.dump(2);
  ASSERT_EQ(daemon_->wait_state(used["id"], {"succeeded"})["state"], "succeeded");
  // jouled restarts: what Alice used is read back from the jobs that ended.
  daemon_->signal(SIGTERM);
  ASSERT_EQ(daemon_->wait_exit(), 0);
  DaemonProcess restarted(options_, daemon_->state_dir());
  ASSERT_TRUE(restarted.start()) << restarted.log();
  // The device busy with someone else's job, Alice queues first, then Bob.
  const std::string blocker = restarted.submit(job("blocker", {"sleep", "30"}));
  ASSERT_FALSE(blocker.empty());
  restarted.wait_state(blocker, {"running"});
  const json alices = submit_to(restarted, "alice-token", job("a1", {"true"})).second;
  const json bobs = submit_to(restarted, "bob-token", job("b1", {"true"})).second;
  ASSERT_EQ(restarted.call("DELETE", "/v1/jobs/" + blocker).first, 202u);
  const json a = restarted.wait_state(alices["id"], {"succeeded"});
  const json b = restarted.wait_state(bobs["id"], {"succeeded"});
  ASSERT_EQ(a["state"], "succeeded");
  ASSERT_EQ(b["state"], "succeeded");
  EXPECT_LT(b["started_at"].get<std::string>(), a["started_at"].get<std::string>())
      << "Bob's job, submitted after Alice's, ran first: " << a.dump(2) << b.dump(2);
}

}  // namespace
