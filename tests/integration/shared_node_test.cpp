// Several jobs on one node side by side (issue 36): jobs that ask for cores share the CPU device,
// each on cores of its own, and each is given its own share of the meter.

#include <sched.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "daemon_process.hpp"

using joule::testing::DaemonProcess;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

std::string state_of(const json& job) { return job.is_object() ? job["state"].get<std::string>() : "<none>"; }

int usable_cpus() {
  cpu_set_t usable;
  CPU_ZERO(&usable);
  return ::sched_getaffinity(0, sizeof(usable), &usable) == 0 ? CPU_COUNT(&usable) : 1;
}

// A job on `cores` cores (0: none asked, the whole device) that prints its CPUs and runs until
// `go` exists: spinning (busy) or sleeping.
json job_until(const std::filesystem::path& go, int cores, bool busy) {
  const std::string loop = busy ? "while [ ! -e '" + go.string() + "' ]; do :; done"
                                : "while [ ! -e '" + go.string() + "' ]; do sleep 0.05; done";
  json spec{{"constraints", {{"devices", {"cpu"}}}},
            {"run", {{"command", {"sh", "-c", "grep Cpus_allowed_list /proc/self/status; " + loop}}}}};
  if (cores > 0) spec["resources"] = {{"cores", cores}};
  return spec;
}

}  // namespace

TEST(SharedNodeTest, two_one_core_jobs_run_side_by_side_on_cores_of_their_own_each_with_its_share_of_the_meter) {
  if (usable_cpus() != 2) GTEST_SKIP() << "written for a node with two usable CPUs";
  const std::filesystem::path go =
      std::filesystem::temp_directory_path() / ("joule-shared-go-" + std::to_string(::getpid()));
  std::filesystem::remove(go);
  DaemonProcess daemon({.config_toml = "[probing]\nenabled = false\n"});
  ASSERT_TRUE(daemon.start()) << daemon.log();

  const std::string busy = daemon.submit(job_until(go, 1, true));
  const std::string idle = daemon.submit(job_until(go, 1, false));
  ASSERT_EQ(state_of(daemon.wait_state(busy, {"running"})), "running") << daemon.log();
  ASSERT_EQ(state_of(daemon.wait_state(idle, {"running"})), "running") << daemon.log();

  // The device holds both, a core each, and says so.
  const json devices = daemon.call("GET", "/v1/devices").second;
  json cpu;
  for (const auto& device : devices["devices"])
    if (device["name"] == "cpu") cpu = device;
  ASSERT_TRUE(cpu.is_object()) << devices.dump(2);
  EXPECT_EQ(cpu["cores"]["shared"], 2) << cpu.dump(2);
  EXPECT_EQ(cpu["cores"]["held"], 2) << cpu.dump(2);
  EXPECT_EQ(cpu["jobs"].size(), 2u) << cpu.dump(2);
  const auto [code, table] = joule::testing::run_program(
      {JOULECTL_BINARY, "--server", fmt::format("http://127.0.0.1:{}", daemon.port()), "devices"});
  EXPECT_EQ(code, 0) << table;
  EXPECT_NE(table.find(" +1 [2/2 cores]"), std::string::npos) << table;

  // A third one-core job waits for a core; one that asks for none waits for the whole device.
  const std::string third = daemon.submit(job_until(go, 1, false));
  const std::string whole = daemon.submit(job_until(go, 0, false));
  json waiting;
  for (int i = 0; i < 100; ++i) {
    waiting = daemon.call("GET", "/v1/jobs/" + third).second;
    if (waiting.contains("waiting") && waiting["waiting"].is_object()) break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(waiting["state"], "queued") << waiting.dump(2);
  EXPECT_NE(waiting["waiting"]["message"].get<std::string>().find("cores (2 of 2 held)"), std::string::npos)
      << waiting.dump(2);
  EXPECT_EQ(daemon.call("GET", "/v1/jobs/" + whole).second["state"], "queued");

  std::this_thread::sleep_for(2500ms);  // a few meter samples with both running
  std::ofstream(go) << "go\n";
  json ended[2];
  int k = 0;
  for (const auto& id : {busy, idle}) {
    ended[k] = daemon.wait_state(id, {"succeeded", "failed"});
    ASSERT_EQ(state_of(ended[k]), "succeeded") << ended[k].dump(2);
    ++k;
  }
  for (const auto& id : {third, whole})
    EXPECT_EQ(state_of(daemon.wait_state(id, {"succeeded", "failed"})), "succeeded") << id;

  // Each on its own CPU, each with its own energy: the spinning one's share is the larger.
  std::string cpus[2];
  for (int i = 0; i < 2; ++i) {
    const std::string log = daemon.client().request("GET", "/v1/jobs/" + (i == 0 ? busy : idle) + "/log")->body;
    cpus[i] = log.substr(0, log.find('\n'));
    EXPECT_NE(cpus[i].find("Cpus_allowed_list:"), std::string::npos) << log;
  }
  EXPECT_NE(cpus[0], cpus[1]);
  for (const json& job : ended) {
    EXPECT_EQ(job["energy"]["source"], "modelled") << job.dump(2);
    EXPECT_NE(job["energy"]["scope"].get<std::string>().find("its share by CPU time"), std::string::npos)
        << job.dump(2);
  }
  EXPECT_GT(ended[0]["energy"]["joules"].get<double>(), 2.0 * ended[1]["energy"]["joules"].get<double>())
      << ended[0].dump(2) << ended[1].dump(2);
  bool noted = false;
  for (const auto& event : ended[1]["events"])
    noted = noted || event["message"].get<std::string>().find("shares cpu with 1 other job") != std::string::npos;
  EXPECT_TRUE(noted) << ended[1].dump(2);
  std::filesystem::remove(go);

  // The scope stays what it was across a restart (the row keeps that the energy was a share).
  daemon.signal(SIGKILL);
  ASSERT_TRUE(daemon.wait_exit());
  ASSERT_TRUE(daemon.start()) << daemon.log();
  const json again = daemon.call("GET", "/v1/jobs/" + idle).second;
  EXPECT_NE(again["energy"]["scope"].get<std::string>().find("its share by CPU time"), std::string::npos)
      << again.dump(2);
}
