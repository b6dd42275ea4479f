// A job the API accepted is never lost, across kill -9 too; running jobs are reconciled.

#include <sched.h>
#include <signal.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "daemon_process.hpp"

using joule::testing::DaemonProcess;
using joule::testing::has_event;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

std::string state_of(const json& job) { return job.is_object() ? job["state"].get<std::string>() : "<none>"; }

// A shell loop that ends once `file` exists: a job that runs exactly as long as the test wants.
std::string wait_for(const std::filesystem::path& file) {
  return "while [ ! -e '" + file.string() + "' ]; do sleep 0.02; done";
}

}  // namespace

TEST(DurabilityTest, every_acknowledged_submission_survives_kill_9_exactly_once) {
  auto state = std::filesystem::temp_directory_path() / ("joule-durability-" + std::to_string(::getpid()));
  std::filesystem::remove_all(state);
  std::filesystem::remove_all(state.string() + "-jobs");  // the jobs' directories, beside it
  std::set<std::string> acknowledged;
  {
    DaemonProcess daemon({}, state);
    ASSERT_TRUE(daemon.start()) << daemon.log();
    std::mutex mutex;
    std::atomic<bool> stop{false};
    std::vector<std::thread> clients;
    for (int c = 0; c < 8; ++c) {
      clients.emplace_back([&, c] {
        auto client = daemon.client();
        for (int i = 0; !stop; ++i) {
          const json body = {{"name", "c" + std::to_string(c) + "-" + std::to_string(i)},
                             {"run", {{"command", {"true"}}}}};
          auto reply = client.request("POST", "/v1/jobs", body.dump());
          if (!reply) continue;  // no answer: not acknowledged, may or may not be stored
          if (reply->status == 201) {
            std::lock_guard lock(mutex);
            acknowledged.insert(json::parse(reply->body)["id"].get<std::string>());
          }
        }
      });
    }
    std::this_thread::sleep_for(700ms);
    daemon.signal(SIGKILL);
    stop = true;
    for (auto& client : clients) client.join();
    EXPECT_EQ(daemon.wait_exit(), 128 + SIGKILL);
  }
  ASSERT_GT(acknowledged.size(), 20u);
  DaemonProcess restarted({}, state);
  ASSERT_TRUE(restarted.start()) << restarted.log();
  // Listed page by page (at most 1,000 jobs each), following "next".
  std::multiset<std::string> stored;
  json listed;
  std::string target = "/v1/jobs?limit=1000";
  for (;;) {
    auto [status, page] = restarted.call("GET", target);
    ASSERT_EQ(status, 200u) << page.dump();
    for (const auto& job : page["jobs"]) stored.insert(job["id"].get<std::string>());
    listed = page;
    if (page["next"].is_null()) break;
    target = "/v1/jobs?limit=1000&after=" + page["next"].get<std::string>();
  }
  EXPECT_EQ(stored.size(), listed["total"].get<std::size_t>());
  for (const auto& id : acknowledged)
    EXPECT_EQ(stored.count(id), 1u) << "acknowledged job " << id << " is missing or doubled";
  // Nothing stays placed or running without a process behind it: all of them finish.
  const auto deadline = std::chrono::steady_clock::now() + 90s;
  json succeeded;
  while (std::chrono::steady_clock::now() < deadline) {
    auto [code, body] = restarted.call("GET", "/v1/jobs?state=succeeded&limit=1");
    if (code != 200u) {
      ADD_FAILURE() << "GET failed while jobs drain: " << body.dump();
      continue;
    }
    succeeded = body;
    if (succeeded["total"] == listed["total"]) break;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(succeeded["total"], listed["total"]);
  if (succeeded["total"] != listed["total"]) {
    for (const char* other : {"queued", "placed", "running", "failed", "cancelled"}) {
      auto stuck = restarted.call("GET", std::string("/v1/jobs?limit=3&state=") + other).second;
      for (const auto& job : stuck["jobs"])
        ADD_FAILURE() << "not succeeded: " << restarted.call("GET", "/v1/jobs/" + job["id"].get<std::string>()).second.dump(2);
    }
  }
  std::filesystem::remove_all(state);
  std::filesystem::remove_all(state.string() + "-jobs");  // the jobs' directories, beside it
}

// Beside the state directory, not in it: the state is jouled's alone and jobs, under accounts
// of their own, cannot look inside.
std::filesystem::path go_file(const std::filesystem::path& state) { return state.string() + "-go"; }

TEST(DurabilityTest, a_running_job_is_adopted_after_kill_9_and_its_end_recorded) {
  auto state = std::filesystem::temp_directory_path() / ("joule-adopt-" + std::to_string(::getpid()));
  std::filesystem::remove_all(state);
  std::filesystem::remove_all(state.string() + "-jobs");  // the jobs' directories, beside it
  std::string id;
  {
    DaemonProcess daemon({}, state);
    ASSERT_TRUE(daemon.start()) << daemon.log();
    // Runs until the test creates the go file, then fails with a status only the runner knows.
    id = daemon.submit(json{{"run", {{"command", {"sh", "-c", wait_for(go_file(state)) + "; exit 3"}}}}});
    ASSERT_EQ(state_of(daemon.wait_state(id, {"running"})), "running");
    daemon.signal(SIGKILL);
    daemon.wait_exit();
  }
  DaemonProcess restarted({}, state);
  ASSERT_TRUE(restarted.start()) << restarted.log();
  // The adoption's event is shown once its commit lands, which may be just after /readyz.
  auto during = joule::testing::wait_until([&] { return restarted.call("GET", "/v1/jobs/" + id).second; },
                                           [](const json& job) { return has_event(job, "adopted process group"); });
  EXPECT_EQ(state_of(during), "running") << during.dump(2);
  EXPECT_TRUE(has_event(during, "adopted process group")) << during.dump(2);
  std::ofstream(go_file(state)) << "go\n";
  auto done = restarted.wait_state(id, {"succeeded", "failed"});
  EXPECT_EQ(state_of(done), "failed");
  EXPECT_EQ(done["exit_code"], 3);  // the real exit status, read from the runner's status file
  EXPECT_TRUE(done["energy"]["partial"].get<bool>());
  std::filesystem::remove_all(state);
  std::filesystem::remove_all(state.string() + "-jobs");  // the jobs' directories, beside it
  std::filesystem::remove(go_file(state));
}

TEST(DurabilityTest, a_job_that_ended_while_the_daemon_was_down_gets_its_exit_status) {
  auto state = std::filesystem::temp_directory_path() / ("joule-down-" + std::to_string(::getpid()));
  std::filesystem::remove_all(state);
  std::filesystem::remove_all(state.string() + "-jobs");  // the jobs' directories, beside it
  std::string id;
  {
    DaemonProcess daemon({}, state);
    ASSERT_TRUE(daemon.start()) << daemon.log();
    id = daemon.submit(json{{"run", {{"command", {"sh", "-c", wait_for(go_file(state))}}}}});
    ASSERT_EQ(state_of(daemon.wait_state(id, {"running"})), "running");
    daemon.signal(SIGKILL);
    daemon.wait_exit();
  }
  // The job ends while no daemon runs; its runner records the exit status.
  std::ofstream(go_file(state)) << "go\n";
  const auto status_file = state / "jobs" / id / "status";
  for (int i = 0; i < 400 && !std::filesystem::exists(status_file); ++i) std::this_thread::sleep_for(25ms);
  ASSERT_TRUE(std::filesystem::exists(status_file));
  DaemonProcess restarted({}, state);
  ASSERT_TRUE(restarted.start()) << restarted.log();
  auto done = restarted.wait_state(id, {"succeeded", "failed"});
  EXPECT_EQ(state_of(done), "succeeded") << done.dump(2);
  EXPECT_NE(done["reason"].get<std::string>().find("while jouled was down"), std::string::npos);
  EXPECT_TRUE(done["energy"].is_null());  // not metered: no number is invented
  std::filesystem::remove_all(state);
  std::filesystem::remove_all(state.string() + "-jobs");  // the jobs' directories, beside it
  std::filesystem::remove(go_file(state));
}

// A job on cores of its own keeps them across a kill -9 of jouled: the next jouled reads them
// from the adopted process and gives the next job others.
TEST(DurabilityTest, an_adopted_job_keeps_its_cores_and_the_next_job_gets_others) {
  cpu_set_t usable;
  CPU_ZERO(&usable);
  if (::sched_getaffinity(0, sizeof(usable), &usable) != 0 || CPU_COUNT(&usable) < 2) GTEST_SKIP() << "needs two CPUs";
  auto state = std::filesystem::temp_directory_path() / ("joule-cores-" + std::to_string(::getpid()));
  std::filesystem::remove_all(state);
  std::filesystem::remove_all(state.string() + "-jobs");
  const std::string config =
      "[probing]\nenabled = false\n[[devices]]\nname = \"cpu\"\n[[devices]]\nname = \"sim:laptop-cpu\"\n"
      "runs_jobs = true\n";
  const std::string show_then_wait = "grep Cpus_allowed_list /proc/self/status; " + wait_for(go_file(state));
  auto on_one_core = [&](const std::string& device) {
    return json{{"resources", {{"cores", 1}}},
                {"constraints", {{"devices", {device}}}},
                {"run", {{"command", {"sh", "-c", show_then_wait}}}}};
  };
  auto cpus_of = [](const DaemonProcess& daemon, const std::string& id) {
    std::string log;
    for (int i = 0; i < 200 && log.find('\n') == std::string::npos; ++i) {
      log = daemon.client().request("GET", "/v1/jobs/" + id + "/log")->body;
      std::this_thread::sleep_for(25ms);
    }
    return log.substr(0, log.find('\n'));
  };
  std::string first, first_cpus;
  {
    DaemonProcess daemon({.config_toml = config}, state);
    ASSERT_TRUE(daemon.start()) << daemon.log();
    first = daemon.submit(on_one_core("cpu"));
    ASSERT_EQ(state_of(daemon.wait_state(first, {"running"})), "running");
    first_cpus = cpus_of(daemon, first);
    daemon.signal(SIGKILL);
    daemon.wait_exit();
  }
  DaemonProcess restarted({.config_toml = config}, state);
  ASSERT_TRUE(restarted.start()) << restarted.log();
  const std::string second = restarted.submit(on_one_core("sim:*"));
  ASSERT_EQ(state_of(restarted.wait_state(second, {"running"})), "running");
  const std::string second_cpus = cpus_of(restarted, second);
  EXPECT_NE(first_cpus.find("Cpus_allowed_list:"), std::string::npos) << first_cpus;
  EXPECT_NE(second_cpus.find("Cpus_allowed_list:"), std::string::npos) << second_cpus;
  EXPECT_NE(first_cpus, second_cpus);
  std::ofstream(go_file(state)) << "go\n";
  for (const auto& id : {first, second})
    EXPECT_EQ(state_of(restarted.wait_state(id, {"succeeded", "failed"})), "succeeded") << id;
  std::filesystem::remove_all(state);
  std::filesystem::remove_all(state.string() + "-jobs");
  std::filesystem::remove(go_file(state));
}

TEST(DurabilityTest, sigterm_drains_and_exits_zero_leaving_jobs_to_the_next_daemon) {
  auto state = std::filesystem::temp_directory_path() / ("joule-drain-" + std::to_string(::getpid()));
  std::filesystem::remove_all(state);
  std::filesystem::remove_all(state.string() + "-jobs");  // the jobs' directories, beside it
  std::string id;
  {
    DaemonProcess daemon({}, state);
    ASSERT_TRUE(daemon.start()) << daemon.log();
    id = daemon.submit(json{{"run", {{"command", {"sleep", "1"}}}}});
    ASSERT_EQ(state_of(daemon.wait_state(id, {"running"})), "running");
    daemon.signal(SIGTERM);
    EXPECT_EQ(daemon.wait_exit(), 0) << daemon.log();
  }
  DaemonProcess restarted({}, state);
  ASSERT_TRUE(restarted.start()) << restarted.log();
  EXPECT_EQ(state_of(restarted.wait_state(id, {"succeeded", "failed"})), "succeeded");
  std::filesystem::remove_all(state);
  std::filesystem::remove_all(state.string() + "-jobs");  // the jobs' directories, beside it
}
