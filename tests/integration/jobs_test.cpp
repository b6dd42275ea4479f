// Jobs end to end: the real daemon runs real processes and meters them.

#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "daemon_process.hpp"

using joule::testing::DaemonProcess;
using nlohmann::json;

namespace {

json job(const std::string& name, std::vector<std::string> argv, int priority = 0) {
  return json{{"name", name}, {"run", {{"command", argv}}}, {"priority", priority}};
}

}  // namespace

TEST(JobsTest, a_job_runs_to_success_with_its_output_and_modelled_energy) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start()) << daemon.log();
  const auto id = daemon.submit(job("hello", {"sh", "-c", "echo out; echo err >&2; echo $JOULE_JOB_ID; sleep 0.3"}));
  ASSERT_FALSE(id.empty());
  auto done = daemon.wait_state(id, {"succeeded", "failed"});
  ASSERT_EQ(done["state"], "succeeded") << done.dump(2);
  EXPECT_EQ(done["exit_code"], 0);
  EXPECT_EQ(done["device"], "cpu");
  EXPECT_GE(done["seconds"].get<double>(), 0.3);
  ASSERT_TRUE(done["energy"].is_object()) << done.dump(2);
  EXPECT_EQ(done["energy"]["source"], "modelled");
  EXPECT_EQ(done["energy"]["measured"], false);
  EXPECT_GT(done["energy"]["joules"].get<double>(), 0.0);
  std::vector<std::string> states;
  for (const auto& event : done["events"]) states.push_back(event["state"]);
  EXPECT_EQ(states, (std::vector<std::string>{"queued", "placed", "running", "succeeded"}));

  auto out = daemon.client().request("GET", "/v1/jobs/" + id + "/log");
  ASSERT_TRUE(out);
  EXPECT_EQ(out->body, "out\n" + id + "\n");
  auto err = daemon.client().request("GET", "/v1/jobs/" + id + "/log?stream=stderr");
  EXPECT_EQ(err->body, "err\n");
  auto tail = daemon.client().request("GET", "/v1/jobs/" + id + "/log?tail_bytes=4");
  EXPECT_EQ(tail->body.size(), 4u);

  auto metrics = daemon.client().request("GET", "/metrics");
  EXPECT_NE(metrics->body.find("joule_jobs{state=\"succeeded\"} 1"), std::string::npos);
  EXPECT_NE(metrics->body.find("joule_jobs_submitted_total 1"), std::string::npos);
  EXPECT_NE(metrics->body.find("joule_job_energy_joules_total{device=\"cpu\",node="), std::string::npos);
}

// On a modelled CPU a job's energy is its own, metered as probes are: idle power over its run
// plus busy power over its processes' CPU time (the defaults: 10 W and 12 W per busy core), not
// whatever else the node ran meanwhile.
TEST(JobsTest, a_modelled_jobs_energy_is_its_own_cpu_time_not_the_nodes) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start()) << daemon.log();
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    volatile std::uint64_t spin = 0;
    while (!stop.load()) spin = spin + 1;
  });
  const auto sleeper = daemon.submit(job("sleeper", {"sh", "-c", "sleep 1"}));
  auto slept = daemon.wait_state(sleeper, {"succeeded", "failed"});
  stop = true;
  busy.join();
  ASSERT_EQ(slept["state"], "succeeded") << slept.dump(2);
  const double wall = slept["seconds"].get<double>();
  const double joules = slept["energy"]["joules"].get<double>();
  EXPECT_GE(joules, 10.0 * wall - 1e-6) << slept.dump(2);
  EXPECT_LE(joules, 10.0 * wall + 12.0 * 0.2) << slept.dump(2);  // the busy core outside is not its
  EXPECT_NE(slept["energy"]["scope"].get<std::string>().find("the job's own, modelled"), std::string::npos)
      << slept.dump(2);

  const auto spinner = daemon.submit(job("spinner", {"sh", "-c", "i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done"}));
  auto spun = daemon.wait_state(spinner, {"succeeded", "failed"}, std::chrono::seconds(120));
  ASSERT_EQ(spun["state"], "succeeded") << spun.dump(2);
  const double spun_wall = spun["seconds"].get<double>();
  // Its own busy core counts (at least a fifth of one on this shared machine).
  EXPECT_GT(spun["energy"]["joules"].get<double>() - 10.0 * spun_wall, 12.0 * 0.2 * spun_wall) << spun.dump(2);
}

TEST(JobsTest, failures_keep_exit_code_and_reason) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start()) << daemon.log();
  const auto id = daemon.submit(job("fails", {"sh", "-c", "exit 7"}));
  auto done = daemon.wait_state(id, {"succeeded", "failed"});
  EXPECT_EQ(done["state"], "failed");
  EXPECT_EQ(done["exit_code"], 7);
  EXPECT_EQ(done["reason"], "exit code 7");
}

TEST(JobsTest, one_job_per_device_in_priority_then_fifo_order) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start()) << daemon.log();
  // The blocker holds the device until the test creates its "go" file, however slow the machine.
  const auto go = daemon.state_dir().parent_path() / "go";
  json blocker_job = job("blocker", {"sh", "-c", "while [ ! -e '" + go.string() + "' ]; do sleep 0.02; done"});
  const auto blocker = daemon.submit(blocker_job);
  ASSERT_EQ(daemon.wait_state(blocker, {"running"})["state"], "running");
  const auto low_a = daemon.submit(job("low-a", {"true"}, 0));
  const auto high = daemon.submit(job("high", {"true"}, 5));
  const auto low_b = daemon.submit(job("low-b", {"true"}, 0));
  auto [status, listed] = daemon.call("GET", "/v1/jobs?state=queued");
  EXPECT_EQ(listed["total"], 3);
  std::ofstream(go) << "go\n";
  std::map<std::string, std::string> started;
  for (const auto& id : {blocker, low_a, high, low_b}) {
    auto done = daemon.wait_state(id, {"succeeded"});
    ASSERT_EQ(done["state"], "succeeded") << done.dump(2);
    started[id] = done["started_at"];
  }
  EXPECT_LT(started[blocker], started[high]);
  EXPECT_LT(started[high], started[low_a]);
  EXPECT_LT(started[low_a], started[low_b]);
}

TEST(JobsTest, cancel_queued_running_and_finished_jobs) {
  DaemonProcess daemon({.config_toml = "[jobs]\nkill_grace_seconds = 1\n"});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  // Ignores TERM, so the KILL after the grace period is what ends it.
  const auto stubborn =
      daemon.submit(job("stubborn", {"sh", "-c", "trap '' TERM; echo ready; sleep 30 & wait; sleep 30"}));
  ASSERT_EQ(daemon.wait_state(stubborn, {"running"})["state"], "running");
  // Cancel only once the job has set its trap, or TERM would end it before it can ignore it.
  for (int i = 0; i < 200; ++i) {
    auto out = daemon.client().request("GET", "/v1/jobs/" + stubborn + "/log");
    if (out && out->body == "ready\n") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  const auto waiting = daemon.submit(job("waiting", {"true"}));

  auto [queued_status, queued] = daemon.call("DELETE", "/v1/jobs/" + waiting);
  EXPECT_EQ(queued_status, 200u);
  EXPECT_EQ(queued["state"], "cancelled");
  EXPECT_EQ(queued["reason"], "cancelled while queued");

  auto [running_status, running] = daemon.call("DELETE", "/v1/jobs/" + stubborn);
  EXPECT_EQ(running_status, 202u);
  EXPECT_EQ(running["cancel_requested"], true);
  auto done = daemon.wait_state(stubborn, {"cancelled"}, std::chrono::seconds(15));
  EXPECT_EQ(done["state"], "cancelled") << done.dump(2);
  EXPECT_NE(done["reason"].get<std::string>().find("signal 9"), std::string::npos) << done["reason"];

  auto [again_status, again] = daemon.call("DELETE", "/v1/jobs/" + stubborn);
  EXPECT_EQ(again_status, 409u);
  EXPECT_EQ(daemon.call("DELETE", "/v1/jobs/nope").first, 404u);
}

TEST(JobsTest, a_polite_job_ends_on_term_and_the_workdir_and_env_are_honoured) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start()) << daemon.log();
  const auto workdir = daemon.state_dir().parent_path();
  const auto id = daemon.submit(json{{"run",
                                      {{"command", {"sh", "-c", "pwd; echo $SEED; echo $TMPDIR; exec sleep 30"}},
                                       {"workdir", workdir.string()},
                                       {"env", {{"SEED", "42"}}}}}});
  ASSERT_EQ(daemon.wait_state(id, {"running"})["state"], "running");
  const std::string expected = workdir.string() + "\n42\n" + (work_directory_of(daemon, id) / "tmp").string() + "\n";
  for (int i = 0; i < 200; ++i) {  // cancel once it has printed everything
    auto out = daemon.client().request("GET", "/v1/jobs/" + id + "/log");
    if (out && out->body == expected) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_EQ(daemon.call("DELETE", "/v1/jobs/" + id).first, 202u);
  auto done = daemon.wait_state(id, {"cancelled"});
  EXPECT_EQ(done["state"], "cancelled");
  EXPECT_NE(done["reason"].get<std::string>().find("signal 15"), std::string::npos) << done["reason"];
  auto out = daemon.client().request("GET", "/v1/jobs/" + id + "/log");
  EXPECT_EQ(out->body, expected);
}

TEST(JobsTest, devices_report_their_meter_honestly) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start()) << daemon.log();
  auto [status, body] = daemon.call("GET", "/v1/devices");
  ASSERT_EQ(status, 200u);
  const auto& cpu = body["devices"][0];
  EXPECT_EQ(cpu["name"], "cpu");
  EXPECT_EQ(cpu["meter"]["source"], "modelled");
  EXPECT_EQ(cpu["meter"]["measured"], false);
  EXPECT_EQ(cpu["model"]["state"], "none");
}

TEST(JobsTest, a_boards_published_figures_drive_the_modelled_meter_unless_the_config_sets_its_own) {
  DaemonProcess pi5({.config_toml = "[probing]\nenabled = false\n[[devices]]\nname = \"cpu\"\nmeter = \"modelled\"\n"
                                    "board = \"Raspberry Pi 5 Model B Rev 1.0\"\n"});
  ASSERT_TRUE(pi5.start()) << pi5.log();
  auto [status, body] = pi5.call("GET", "/v1/devices");
  ASSERT_EQ(status, 200u);
  const auto& cpu = body["devices"][0];
  EXPECT_EQ(cpu["board"]["model"], "Raspberry Pi 5 Model B Rev 1.0");
  EXPECT_EQ(cpu["board"]["figures"], "published");
  EXPECT_NE(cpu["board"]["note"].get<std::string>().find("sbc-reviews"), std::string::npos) << cpu["board"];
  // The meter itself models the board's figures, and says it is a model.
  const auto note = cpu["meter"]["note"].get<std::string>();
  EXPECT_NE(note.find("modelled as 2.8 W idle + 1.725 W per busy core"), std::string::npos) << note;
  EXPECT_EQ(cpu["meter"]["measured"], false);

  // Figures in the config win, and no board is consulted.
  DaemonProcess own({.config_toml = "[probing]\nenabled = false\n[[devices]]\nname = \"cpu\"\nmeter = \"modelled\"\n"
                                    "board = \"Raspberry Pi 5 Model B Rev 1.0\"\nidle_watts = 4.0\n"});
  ASSERT_TRUE(own.start()) << own.log();
  auto [own_status, own_body] = own.call("GET", "/v1/devices");
  ASSERT_EQ(own_status, 200u);
  EXPECT_FALSE(own_body["devices"][0].contains("board")) << own_body["devices"][0];
  EXPECT_NE(own_body["devices"][0]["meter"]["note"].get<std::string>().find("modelled as 4 W idle + 12 W"),
            std::string::npos)
      << own_body["devices"][0]["meter"]["note"];
}
