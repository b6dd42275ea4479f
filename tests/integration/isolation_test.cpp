// Jobs cannot touch jouled's state: with jouled as root they run under accounts of their own,
// in directories outside the state directory, with a clean start (issue: jobs rewrote the
// database, read other jobs' files and redirected another job's log through a link).

#include <unistd.h>

#include <gtest/gtest.h>

#include "daemon_process.hpp"

using joule::testing::DaemonProcess;
using nlohmann::json;

namespace {

json shell_job(const std::string& script, json env = json::object()) {
  return json{{"run", {{"command", {"sh", "-c", script}}, {"env", std::move(env)}}}};
}

std::string log_of(const DaemonProcess& daemon, const std::string& id) {
  auto reply = daemon.client().request("GET", "/v1/jobs/" + id + "/log");
  return reply ? reply->body : "";
}

class IsolationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "jouled switches users only as root (or with CAP_SETUID); not root here";
  }
};

TEST_F(IsolationTest, a_job_cannot_open_the_database_another_jobs_files_or_its_own_log) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start()) << daemon.log();
  const std::string state = daemon.state_dir().string();

  const auto first = daemon.submit(shell_job("id -u; echo private > mine"));
  ASSERT_EQ(daemon.wait_state(first, {"succeeded", "failed"})["state"], "succeeded") << log_of(daemon, first);
  const auto first_file = joule::testing::work_directory_of(daemon, first) / "mine";
  ASSERT_TRUE(std::filesystem::exists(first_file));

  // Each attempt prints "denied" or what it managed.
  const std::string probe =
      "id -u\n"
      "try() { if \"$@\" >/dev/null 2>&1; then echo \"did: $*\"; else echo denied; fi; }\n"
      "try cat " +
      state +
      "/jouled.db\n"
      "try sh -c 'echo x >> " +
      state +
      "/jouled.db'\n"
      "try cat " +
      first_file.string() +
      "\n"
      "try cat " +
      state + "/jobs/" + first +
      "/stdout.log\n"
      "try cat " +
      state +
      "/jobs/$JOULE_JOB_ID/stdout.log\n"
      "try ln -s /etc/shadow " +
      state +
      "/jobs/$JOULE_JOB_ID/stderr.log\n"
      "try ls " +
      (joule::testing::work_directory_of(daemon, first).parent_path()).string() +
      "\n"
      "echo x > in-my-own-directory && echo own-ok\n";
  const auto second = daemon.submit(shell_job(probe));
  ASSERT_EQ(daemon.wait_state(second, {"succeeded", "failed"})["state"], "succeeded") << log_of(daemon, second);

  const std::string first_log = log_of(daemon, first);
  const std::string second_log = log_of(daemon, second);
  const auto first_uid = std::stoul(first_log);
  const auto second_uid = std::stoul(second_log);
  EXPECT_NE(first_uid, 0u);
  EXPECT_NE(second_uid, 0u);
  EXPECT_NE(first_uid, second_uid) << "each job has an account of its own";
  EXPECT_EQ(second_log.find("did:"), std::string::npos) << second_log;
  std::size_t denied = 0;
  for (std::size_t at = 0; (at = second_log.find("denied", at)) != std::string::npos; ++at) ++denied;
  EXPECT_EQ(denied, 7u) << second_log;
  EXPECT_NE(second_log.find("own-ok"), std::string::npos) << second_log;

  // The daemon and its database are as they were.
  auto [status, jobs] = daemon.call("GET", "/v1/jobs");
  EXPECT_EQ(status, 200u);
  EXPECT_EQ(jobs["total"], 2);
}

TEST_F(IsolationTest, the_runner_starts_clean_and_the_job_gets_its_own_home) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start()) << daemon.log();
  // $PPID is the runner (jouled --job-runner): its environment is empty, so nothing of the
  // job's (LD_LIBRARY_PATH here) reached it; the job's own environment has it.
  const auto id = daemon.submit(shell_job(
      "echo runner-env=$(tr '\\0' '\\n' < /proc/$PPID/environ | wc -l); echo lib=$LD_LIBRARY_PATH; echo home=$HOME",
      {{"LD_LIBRARY_PATH", "/opt/lib"}}));
  ASSERT_EQ(daemon.wait_state(id, {"succeeded", "failed"})["state"], "succeeded") << log_of(daemon, id);
  const std::string out = log_of(daemon, id);
  EXPECT_NE(out.find("runner-env=0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("lib=/opt/lib\n"), std::string::npos) << out;
  EXPECT_NE(out.find("home=" + joule::testing::work_directory_of(daemon, id).string() + "\n"), std::string::npos)
      << out;
}

TEST_F(IsolationTest, a_workdir_the_jobs_account_cannot_enter_is_refused_at_submission) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start()) << daemon.log();
  char pattern[] = "/tmp/joule-private-XXXXXX";  // mkdtemp: mode 0700, root's
  const std::filesystem::path private_dir = ::mkdtemp(pattern);
  std::filesystem::create_directories(private_dir / "inner");
  auto [status, problem] = daemon.call(
      "POST", "/v1/jobs", json{{"run", {{"command", {"true"}}, {"workdir", (private_dir / "inner").string()}}}}.dump());
  EXPECT_EQ(status, 400u) << problem.dump();
  EXPECT_EQ(problem["errors"][0]["pointer"], "/run/workdir");
  EXPECT_NE(problem["detail"].get<std::string>().find(private_dir.string() + " is mode 0700"), std::string::npos)
      << problem["detail"];
  std::filesystem::remove_all(private_dir);
}

TEST_F(IsolationTest, a_local_users_job_runs_as_that_user_and_it_acts_on_its_own_jobs_only) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start()) << daemon.log();
  // `nobody` once submitted a job that ran as root.
  auto [code, submitted] =
      joule::testing::curl_as_nobody(daemon, "POST", "/v1/jobs", R"({"run": {"command": ["id", "-u"]}})");
  ASSERT_EQ(code, 0) << submitted;
  const auto job = json::parse(submitted, nullptr, false);
  ASSERT_TRUE(job.is_object() && job.contains("id")) << submitted;
  EXPECT_EQ(job["owner"], "uid:65534");
  const std::string id = job["id"];
  ASSERT_EQ(daemon.wait_state(id, {"succeeded", "failed"})["state"], "succeeded");
  EXPECT_EQ(log_of(daemon, id), "65534\n");

  // Root's job is not nobody's to stop, pause or read.
  const auto roots = daemon.submit(shell_job("sleep 30"));
  ASSERT_EQ(daemon.wait_state(roots, {"running"})["state"], "running");
  for (const auto& [method, suffix] :
       std::vector<std::pair<std::string, std::string>>{{"DELETE", ""}, {"POST", "/pause"}, {"GET", "/log"}}) {
    auto [refused_code, refused] = joule::testing::curl_as_nobody(daemon, method, "/v1/jobs/" + roots + suffix);
    EXPECT_NE(refused.find("\"status\":403"), std::string::npos) << method << suffix << ": " << refused;
  }
  EXPECT_EQ(daemon.call("GET", "/v1/jobs/" + roots).second["state"], "running");
  EXPECT_EQ(daemon.call("DELETE", "/v1/jobs/" + roots).first, 202u);
}

}  // namespace
