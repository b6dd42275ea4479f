// A coordinator and its agents as real jouled processes on loopback, with simulated devices of
// different profiles so placement across them shows: jobs go where they cost least, a lost
// agent's jobs run again elsewhere exactly once, a returning agent is fenced, a coordinator
// killed with -9 loses nothing, and a partition never leaves a job running twice.

#include <signal.h>
#include <unistd.h>

#include <sys/stat.h>
#include <chrono>
#include <filesystem>

#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "daemon_process.hpp"
#include "tcp_proxy.hpp"
#include "test_pki.hpp"

using joule::testing::DaemonOptions;
using joule::testing::DaemonProcess;
using joule::testing::has_event;
using joule::testing::TcpProxy;
using joule::testing::wait_until;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

constexpr double kLease = 2.0;  // seconds; heartbeats every 0.2 s

std::string coordinator_config(std::uint16_t port, const std::string& extra = "") {
  return fmt::format(
      "[node]\nname = \"coord\"\n[server]\nlisten = \"127.0.0.1:{}\"\n[cluster]\nrole = \"coordinator\"\n"
      "heartbeat_seconds = 0.2\nlost_after_seconds = {}\n{}[[devices]]\nname = \"sim:laptop-cpu\"\nprobes = 40\n"
      "[probing]\nenabled = false\n",
      port, kLease, extra);
}

std::string agent_config(const std::string& node, const std::string& profile, std::uint16_t coordinator_port,
                         const std::string& extra = "") {
  return fmt::format(
      "[node]\nname = \"{}\"\n[cluster]\nrole = \"agent\"\ncoordinator = \"http://127.0.0.1:{}\"\n{}"
      "[[devices]]\nname = \"sim:{}\"\nprobes = 40\nruns_jobs = true\n[probing]\nenabled = false\n",
      node, coordinator_port, extra, profile);
}

json training_job(const std::string& name, const std::vector<std::string>& command) {
  return joule::testing::mlp_training_job(name, command);
}

// A job that appends "<JOULE_JOB_ID>" to `marks` when it starts, then sleeps.
std::vector<std::string> marking_command(const std::filesystem::path& marks, double seconds) {
  return {"sh", "-c", fmt::format("echo \"$JOULE_JOB_ID\" >> {}; sleep {}", marks.string(), seconds)};
}

json nodes_of(const DaemonProcess& coordinator) { return coordinator.call("GET", "/v1/nodes").second; }

bool all_ready(const json& nodes, std::size_t count) {
  if (!nodes.is_object() || !nodes.contains("nodes") || nodes["nodes"].size() != count) return false;
  for (const auto& node : nodes["nodes"]) {
    if (node["state"] != "ready") return false;
    // Ready to estimate: its model reached the coordinator.
    for (const auto& device : node["devices"])
      if (device["model"].value("state", "") != "ready") return false;
  }
  return true;
}

std::vector<std::string> lines_of(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::size_t count_events(const json& job, const std::string& text) {
  std::size_t n = 0;
  for (const auto& event : job["events"]) n += event["message"].get<std::string>().find(text) != std::string::npos;
  return n;
}

// The state (R, S, T...) of the first process whose JOULE_JOB_ID starts with `prefix`, or '?'.
char process_state_of_job(const std::string& prefix) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::ifstream environ(entry.path() / "environ");
    std::string text((std::istreambuf_iterator<char>(environ)), std::istreambuf_iterator<char>());
    if (text.find("JOULE_JOB_ID=" + prefix) == std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const auto close = line.rfind(')');
    if (close != std::string::npos && close + 2 < line.size()) return line[close + 2];
  }
  return '?';
}

class ClusterNodesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/joule-cluster-XXXXXX";
    dir_ = ::mkdtemp(pattern);
    marks_ = dir_ / "marks";
    // Jobs run under accounts of their own (as root): they must reach the nodes' job
    // directories here and append to one marks file.
    ::chmod(dir_.c_str(), 0755);
    std::ofstream{marks_};
    ::chmod(marks_.c_str(), 0666);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::unique_ptr<DaemonProcess> start_coordinator(std::uint16_t port, const std::string& extra = "") {
    auto daemon = std::make_unique<DaemonProcess>(
        DaemonOptions{.config_toml = coordinator_config(port, extra), .listen_loopback_any_port = false},
        dir_ / "coordinator");
    std::filesystem::create_directories(dir_ / "coordinator");
    EXPECT_TRUE(daemon->start()) << daemon->log();
    return daemon;
  }
  std::unique_ptr<DaemonProcess> start_agent(const std::string& node, const std::string& profile, std::uint16_t port,
                                             const std::string& extra = "") {
    std::filesystem::create_directories(dir_ / node);
    auto daemon = std::make_unique<DaemonProcess>(
        DaemonOptions{.config_toml = agent_config(node, profile, port, extra)}, dir_ / node);
    EXPECT_TRUE(daemon->start()) << daemon->log();
    return daemon;
  }

  // A coordinator reading `policy` from its policies directory, with two agents (a Jetson Orin
  // and a Raspberry Pi) ready with their models; `port` gets the coordinator's.
  std::unique_ptr<DaemonProcess> start_cluster_with_policy(const std::string& policy, std::uint16_t& port) {
    std::filesystem::create_directories(dir_ / "policies");
    std::ofstream(dir_ / "policies" / "60-tenancy.toml") << policy;
    port = joule::testing::free_loopback_port();
    auto coordinator =
        start_coordinator(port, fmt::format("[policy]\ndirectory = \"{}\"\n", (dir_ / "policies").string()));
    agents_.push_back(start_agent("orin", "jetson-orin", port));
    agents_.push_back(start_agent("pi", "raspberry-pi-4", port));
    EXPECT_TRUE(all_ready(
        wait_until([&] { return nodes_of(*coordinator); }, [](const json& n) { return all_ready(n, 2); }), 2));
    return coordinator;
  }

  std::filesystem::path dir_;
  std::filesystem::path marks_;
  std::vector<std::unique_ptr<DaemonProcess>> agents_;
};

}  // namespace

TEST_F(ClusterNodesTest, jobs_go_to_the_agent_where_they_cost_least_and_their_energy_comes_back_labelled) {
  const auto port = joule::testing::free_loopback_port();
  auto coordinator = start_coordinator(port);
  auto orin = start_agent("orin", "jetson-orin", port);
  auto server = start_agent("server", "server-gpu", port);
  const json nodes = wait_until([&] { return nodes_of(*coordinator); }, [](const json& n) { return all_ready(n, 2); });
  ASSERT_TRUE(all_ready(nodes, 2)) << nodes.dump(2) << coordinator->log();

  const std::string id = coordinator->submit(training_job("mlp", marking_command(marks_, 0.5)));
  ASSERT_FALSE(id.empty());
  const json done = coordinator->wait_state(id, {"succeeded", "failed", "cancelled"});
  ASSERT_EQ(done["state"], "succeeded") << done.dump(2) << orin->log();
  EXPECT_EQ(done["device"], "orin/sim:jetson-orin") << done.dump(2);
  EXPECT_EQ(done["energy"]["source"], "simulated");
  EXPECT_EQ(done["energy"]["measured"], false);
  EXPECT_GT(done["energy"]["joules"].get<double>(), 0.0);
  // Both agents' estimates were in the choice.
  double orin_joules = 0, server_joules = 0;
  for (const auto& estimate : done["estimate"]) {
    if (estimate["device"] == "orin/sim:jetson-orin") orin_joules = estimate["joules"]["mean"];
    if (estimate["device"] == "server/sim:server-gpu") server_joules = estimate["joules"]["mean"];
  }
  EXPECT_GT(orin_joules, 0.0);
  EXPECT_GT(server_joules, orin_joules);
  // The agent ran it once, under its own id for the placement.
  EXPECT_EQ(lines_of(marks_), std::vector<std::string>{id + ".1"});
  const json on_agent = orin->call("GET", "/v1/jobs/" + id + ".1").second;
  EXPECT_EQ(on_agent["state"], "succeeded") << on_agent.dump(2);

  // Nodes, devices and the node label in the metrics.
  const json after = nodes_of(*coordinator);
  EXPECT_EQ(after["role"], "coordinator");
  for (const auto& node : after["nodes"]) {
    EXPECT_LT(node["seconds_since_heartbeat"].get<double>(), kLease);
    EXPECT_EQ(node["devices"].size(), 1u);
  }
  auto metrics = coordinator->client().request("GET", "/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find(
                "joule_device_energy_joules_total{device=\"sim:jetson-orin\",node=\"orin\",source=\"simulated\"}"),
            std::string::npos)
      << metrics->body;
  EXPECT_NE(metrics->body.find("joule_nodes{state=\"ready\"} 2"), std::string::npos);
  const auto [code, text] =
      joule::testing::run_program({JOULECTL_BINARY, "--server", fmt::format("http://127.0.0.1:{}", port), "nodes"});
  EXPECT_EQ(code, 0) << text;
  EXPECT_NE(text.find("orin"), std::string::npos) << text;
  EXPECT_NE(text.find("server"), std::string::npos) << text;
  EXPECT_NE(text.find("ready"), std::string::npos) << text;

  // An agent takes jobs only from its coordinator.
  const auto [refused, problem] = orin->call("POST", "/v1/jobs", training_job("x", {"true"}).dump());
  EXPECT_EQ(refused, 409u) << problem.dump();
}

TEST_F(ClusterNodesTest, a_lost_agents_job_runs_again_elsewhere_once_and_the_returning_agent_stops_its_copy) {
  const auto port = joule::testing::free_loopback_port();
  auto coordinator = start_coordinator(port);
  auto orin = start_agent("orin", "jetson-orin", port);
  auto server = start_agent("server", "server-gpu", port);
  ASSERT_TRUE(
      all_ready(wait_until([&] { return nodes_of(*coordinator); }, [](const json& n) { return all_ready(n, 2); }), 2));

  const std::string id = coordinator->submit(training_job("long", marking_command(marks_, 6)));
  json job = coordinator->wait_state(id, {"running"});
  ASSERT_EQ(job["device"], "orin/sim:jetson-orin") << job.dump(2);

  orin->signal(SIGKILL);  // its job's process lives on, unwatched
  orin->wait_exit();
  job = wait_until([&] { return coordinator->call("GET", "/v1/jobs/" + id).second; },
                   [](const json& j) { return j["state"] == "running" && j["device"] == "server/sim:server-gpu"; });
  ASSERT_EQ(job["device"], "server/sim:server-gpu") << job.dump(2);
  EXPECT_TRUE(has_event(job, "node orin lost")) << job.dump(2);
  EXPECT_TRUE(has_event(job, "epoch 2")) << job.dump(2);
  const json lost = nodes_of(*coordinator);
  bool orin_lost = false;
  for (const auto& node : lost["nodes"]) orin_lost |= node["name"] == "orin" && node["state"] == "lost";
  EXPECT_TRUE(orin_lost) << lost.dump(2);

  // The agent comes back (same state): it adopts its old process, then is told to stop it.
  ASSERT_TRUE(orin->start()) << orin->log();
  const json copy = orin->wait_state(id + ".1", {"cancelled", "succeeded", "failed"});
  EXPECT_EQ(copy["state"], "cancelled") << copy.dump(2);
  EXPECT_TRUE(has_event(copy, "fenced")) << copy.dump(2);

  job = coordinator->wait_state(id, {"succeeded", "failed", "cancelled"});
  EXPECT_EQ(job["state"], "succeeded") << job.dump(2);
  EXPECT_EQ(job["device"], "server/sim:server-gpu");
  EXPECT_EQ(count_events(job, "queued again"), 1u) << job.dump(2);
  EXPECT_EQ(lines_of(marks_), (std::vector<std::string>{id + ".1", id + ".2"}));
}

TEST_F(ClusterNodesTest, a_killed_agents_job_is_paused_by_its_runner_before_it_runs_elsewhere) {
  const auto port = joule::testing::free_loopback_port();
  auto coordinator = start_coordinator(port);
  auto orin = start_agent("orin", "jetson-orin", port);
  auto server = start_agent("server", "server-gpu", port);
  ASSERT_TRUE(
      all_ready(wait_until([&] { return nodes_of(*coordinator); }, [](const json& n) { return all_ready(n, 2); }), 2));

  // The job marks every 50 ms that it runs, with the time: its own record of when it ran.
  const std::string beat = fmt::format(
      "end=$(( $(date +%s) + 5 )); while [ $(date +%s) -lt $end ]; do echo \"$JOULE_JOB_ID $(date +%s%N)\" >> {}; "
      "sleep 0.05; done",
      marks_.string());
  const std::string id = coordinator->submit(training_job("beat", {"sh", "-c", beat}));
  ASSERT_EQ(coordinator->wait_state(id, {"running"})["device"], "orin/sim:jetson-orin");
  std::this_thread::sleep_for(500ms);

  orin->signal(SIGKILL);  // nothing watches its job now but the job's own runner
  orin->wait_exit();
  const json job = coordinator->wait_state(id, {"succeeded", "failed", "cancelled"}, 30s);
  EXPECT_EQ(job["state"], "succeeded") << job.dump(2);
  EXPECT_EQ(job["device"], "server/sim:server-gpu") << job.dump(2);

  // By the jobs' own marks: the orphan's last beat came before the new placement's first.
  std::int64_t orphan_last = 0, next_first = std::numeric_limits<std::int64_t>::max();
  for (const auto& line : lines_of(marks_)) {
    const auto space = line.find(' ');
    const std::int64_t at = std::stoll(line.substr(space + 1));
    if (line.substr(0, space) == id + ".1") orphan_last = std::max(orphan_last, at);
    if (line.substr(0, space) == id + ".2") next_first = std::min(next_first, at);
  }
  ASSERT_GT(orphan_last, 0);
  ASSERT_LT(next_first, std::numeric_limits<std::int64_t>::max());
  EXPECT_LT(orphan_last, next_first) << "the orphan ran " << (orphan_last - next_first) / 1e6
                                     << " ms beside its next placement";
  // Its runner ended it: nothing of it runs on.
  EXPECT_EQ(wait_until([&] { return json(std::string(1, process_state_of_job(id + ".1"))); },
                       [](const json& state) { return state == "?"; }, 10s),
            "?");

  // The agent comes back: the run it finds ended by its runner is recorded as fenced.
  ASSERT_TRUE(orin->start()) << orin->log();
  const json copy = orin->wait_state(id + ".1", {"cancelled", "succeeded", "failed"});
  EXPECT_EQ(copy["state"], "cancelled") << copy.dump(2);
  EXPECT_TRUE(has_event(copy, "fenced")) << copy.dump(2);
}

TEST_F(ClusterNodesTest, a_job_with_restart_fail_fails_when_its_node_is_lost) {
  const auto port = joule::testing::free_loopback_port();
  auto coordinator = start_coordinator(port);
  auto orin = start_agent("orin", "jetson-orin", port);
  ASSERT_TRUE(
      all_ready(wait_until([&] { return nodes_of(*coordinator); }, [](const json& n) { return all_ready(n, 1); }), 1));
  json spec = training_job("once", marking_command(marks_, 30));
  spec["restart"] = "fail";
  const std::string id = coordinator->submit(spec);
  ASSERT_EQ(coordinator->wait_state(id, {"running"})["state"], "running");
  orin->signal(SIGSTOP);  // silent but alive: a hung node
  const json job = coordinator->wait_state(id, {"failed", "succeeded", "cancelled"});
  orin->signal(SIGCONT);
  EXPECT_EQ(job["state"], "failed") << job.dump(2);
  EXPECT_NE(job["reason"].get<std::string>().find("restart = fail"), std::string::npos) << job.dump(2);
  // Back, the agent is told to stop the copy it still runs.
  EXPECT_EQ(orin->wait_state(id + ".1", {"cancelled", "succeeded", "failed"})["state"], "cancelled");
}

// A hung agent (SIGSTOP: a partition as the coordinator sees it) is declared lost and its job
// queued again; its job ends meanwhile (the runner does not need the agent). When the agent
// comes back with that success, the job is taken back and ends: it once stayed queued for good,
// out of the queue, after a refused "queued -> succeeded".
TEST_F(ClusterNodesTest, a_job_that_succeeded_while_its_agent_was_lost_ends_when_the_agent_is_back) {
  const auto port = joule::testing::free_loopback_port();
  auto coordinator = start_coordinator(port);
  auto orin = start_agent("orin", "jetson-orin", port);
  ASSERT_TRUE(
      all_ready(wait_until([&] { return nodes_of(*coordinator); }, [](const json& n) { return all_ready(n, 1); }), 1));
  const std::string id = coordinator->submit(training_job("short", marking_command(marks_, 0.2)));
  ASSERT_EQ(coordinator->wait_state(id, {"running"})["state"], "running");
  orin->signal(SIGSTOP);
  const json lost = coordinator->wait_state(id, {"queued"});
  ASSERT_EQ(lost["state"], "queued") << lost.dump(2);
  orin->signal(SIGCONT);
  const json job = coordinator->wait_state(id, {"succeeded", "failed", "cancelled"});
  EXPECT_EQ(job["state"], "succeeded") << job.dump(2);
  // The agent's first report after it resumes may come before it has reaped the runner that
  // ended while it was stopped: then it is adopted running and ends with the next report.
  // Either way it ends, and it ran once.
  EXPECT_TRUE(has_event(job, "came back having run it to the end") || has_event(job, "came back still running it"))
      << job.dump(2);
  EXPECT_EQ(lines_of(marks_).size(), 1u);  // it ran once
}

// A hung agent back after its job's runner fenced the run, but before (or just after) the
// coordinator declared it lost: the job is not over, whichever came first; it runs again and
// ends succeeded, never "cancelled" by the fence (bench/chaos.py saw that for 2 jobs of 400).
TEST_F(ClusterNodesTest, a_run_fenced_while_its_agent_hung_runs_again_instead_of_ending_cancelled) {
  const auto port = joule::testing::free_loopback_port();
  auto coordinator = start_coordinator(port);
  auto orin = start_agent("orin", "jetson-orin", port);
  ASSERT_TRUE(
      all_ready(wait_until([&] { return nodes_of(*coordinator); }, [](const json& n) { return all_ready(n, 1); }), 1));
  const std::string id = coordinator->submit(training_job("fenced", marking_command(marks_, 3)));
  ASSERT_EQ(coordinator->wait_state(id, {"running"})["state"], "running");
  orin->signal(SIGSTOP);
  // The runner ends the run after twice the job's lease (half the coordinator's), 2 s here, when
  // the coordinator also declares the node lost: which comes first is a race, and both are fine.
  std::this_thread::sleep_for(2500ms);
  orin->signal(SIGCONT);
  const json job = coordinator->wait_state(id, {"succeeded", "failed", "cancelled"}, 30s);
  EXPECT_EQ(job["state"], "succeeded") << job.dump(2);
  EXPECT_TRUE(has_event(job, "was fenced") || has_event(job, "lost")) << job.dump(2);
  EXPECT_GE(lines_of(marks_).size(), 2u) << job.dump(2);  // the fenced run, then the one that ended
}

TEST_F(ClusterNodesTest, a_coordinator_killed_with_9_loses_nothing_and_resumes_with_its_agents) {
  const auto port = joule::testing::free_loopback_port();
  auto coordinator = start_coordinator(port);
  auto orin = start_agent("orin", "jetson-orin", port);
  auto pi = start_agent("pi", "raspberry-pi-4", port);
  ASSERT_TRUE(
      all_ready(wait_until([&] { return nodes_of(*coordinator); }, [](const json& n) { return all_ready(n, 2); }), 2));

  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i)
    ids.push_back(coordinator->submit(training_job(fmt::format("j{}", i), marking_command(marks_, 1.5))));
  for (const auto& id : ids) ASSERT_FALSE(id.empty());
  ASSERT_EQ(coordinator->wait_state(ids[0], {"running"})["state"], "running");
  coordinator->signal(SIGKILL);
  coordinator->wait_exit();
  std::this_thread::sleep_for(500ms);  // agents carry on alone, within their lease
  ASSERT_TRUE(coordinator->start()) << coordinator->log();

  for (const auto& id : ids) {
    const json job = coordinator->wait_state(id, {"succeeded", "failed", "cancelled"}, 40s);
    EXPECT_EQ(job["state"], "succeeded") << job.dump(2) << coordinator->log();
  }
  // Each ran exactly once (one placement each: no "queued again").
  auto marks = lines_of(marks_);
  EXPECT_EQ(marks.size(), ids.size());
  for (const auto& id : ids) EXPECT_EQ(std::count(marks.begin(), marks.end(), id + ".1"), 1) << id;
  // The agents' models were kept: the restarted coordinator loaded them from its own state (an
  // agent whose last answer predates its upload may still offer its model once more).
  const std::string log = coordinator->log();
  EXPECT_NE(log.find("device orin/sim:jetson-orin: energy model version 1 loaded"), std::string::npos) << log;
  EXPECT_NE(log.find("device pi/sim:raspberry-pi-4: energy model version 1 loaded"), std::string::npos) << log;
}

TEST_F(ClusterNodesTest, a_partitioned_agent_pauses_its_job_after_the_lease_and_stops_it_when_the_network_heals) {
  const auto port = joule::testing::free_loopback_port();
  auto coordinator = start_coordinator(port);
  TcpProxy link(port);
  auto orin = start_agent("orin", "jetson-orin", link.port());
  auto server = start_agent("server", "server-gpu", port);
  ASSERT_TRUE(
      all_ready(wait_until([&] { return nodes_of(*coordinator); }, [](const json& n) { return all_ready(n, 2); }), 2));

  const std::string id = coordinator->submit(training_job("cut", marking_command(marks_, 8)));
  ASSERT_EQ(coordinator->wait_state(id, {"running"})["device"], "orin/sim:jetson-orin");
  link.cut();
  // The coordinator places it again elsewhere; the cut-off agent pauses its copy by itself.
  json job =
      wait_until([&] { return coordinator->call("GET", "/v1/jobs/" + id).second; },
                 [](const json& j) { return j["device"] == "server/sim:server-gpu" && j["state"] == "running"; });
  ASSERT_EQ(job["device"], "server/sim:server-gpu") << job.dump(2);
  const json fenced = wait_until([&] { return orin->call("GET", "/v1/jobs/" + id + ".1").second; },
                                 [](const json& j) { return j["state"] == "throttled"; }, 5s);
  EXPECT_EQ(fenced["state"], "throttled") << fenced.dump(2);
  EXPECT_TRUE(has_event(fenced, "fenced")) << fenced.dump(2);
  const char state = process_state_of_job(id + ".1");
  EXPECT_TRUE(state == 'T' || state == 't') << "the partitioned copy should be stopped, is " << state;

  link.heal();
  const json copy = orin->wait_state(id + ".1", {"cancelled", "succeeded", "failed"});
  EXPECT_EQ(copy["state"], "cancelled") << copy.dump(2);
  job = coordinator->wait_state(id, {"succeeded", "failed", "cancelled"});
  EXPECT_EQ(job["state"], "succeeded") << job.dump(2);
  EXPECT_EQ(count_events(job, "queued again"), 1u) << job.dump(2);
}

TEST_F(ClusterNodesTest, agents_need_the_cluster_token) {
  const auto port = joule::testing::free_loopback_port();
  const std::string token = "agent-secret";
  std::ofstream(dir_ / "token") << token << "\n";
  const auto [code, printed] = joule::testing::run_program({"/bin/sh", "-c", "printf %s " + token + " | sha256sum"});
  ASSERT_EQ(code, 0) << printed;
  std::string token_hash = printed.substr(0, 64);
  auto coordinator = start_coordinator(port, fmt::format("agent_token_sha256 = [\"{}\"]\n", token_hash));
  auto good = start_agent("good", "jetson-orin", port, fmt::format("token_file = \"{}\"\n", (dir_ / "token").string()));
  auto bad = start_agent("bad", "server-gpu", port);
  const json nodes = wait_until([&] { return nodes_of(*coordinator); }, [](const json& n) { return all_ready(n, 1); });
  ASSERT_TRUE(all_ready(nodes, 1)) << nodes.dump(2);
  EXPECT_EQ(nodes["nodes"][0]["name"], "good");
  const json status = bad->call("GET", "/v1/nodes").second;
  EXPECT_NE(status.value("error", "").find("401"), std::string::npos) << status.dump(2);
}

TEST_F(ClusterNodesTest, agents_sync_over_tls_and_verify_the_coordinators_certificate) {
  const auto pki = joule::testing::make_test_pki(dir_);
  const auto port = joule::testing::free_loopback_port();
  const std::string tls = fmt::format("[server]\ntls_certificate = \"{}\"\ntls_private_key = \"{}\"\n",
                                      pki.server_chain.string(), pki.server_key.string());
  // The coordinator's own [server] table comes first in its config: add the TLS keys there.
  std::string config = coordinator_config(port);
  config.replace(config.find("[server]\n"), 9, tls);
  std::filesystem::create_directories(dir_ / "coordinator");
  DaemonProcess coordinator(DaemonOptions{.config_toml = config, .listen_loopback_any_port = false},
                            dir_ / "coordinator");
  ASSERT_TRUE(coordinator.start()) << coordinator.log();
  const std::string https = fmt::format("https://127.0.0.1:{}", port);

  auto agent_with = [&](const std::string& node, const std::string& ca) {
    std::string text = agent_config(node, "jetson-orin", port, ca.empty() ? "" : fmt::format("ca_file = \"{}\"\n", ca));
    text.replace(text.find("http://"), 7, "https://");
    std::filesystem::create_directories(dir_ / node);
    auto agent = std::make_unique<DaemonProcess>(DaemonOptions{.config_toml = text}, dir_ / node);
    EXPECT_TRUE(agent->start()) << agent->log();
    return agent;
  };
  auto trusted = agent_with("trusted", pki.ca_certificate.string());
  auto untrusting = agent_with("untrusting", "");

  const auto [code, listed] = joule::testing::run_program(
      {JOULECTL_BINARY, "--server", https, "--ca-file", pki.ca_certificate.string(), "--json", "nodes"});
  ASSERT_EQ(code, 0) << listed;
  const json nodes = wait_until(
      [&] {
        const auto [rc, text] = joule::testing::run_program(
            {JOULECTL_BINARY, "--server", https, "--ca-file", pki.ca_certificate.string(), "--json", "nodes"});
        return rc == 0 ? json::parse(text, nullptr, false) : json(nullptr);
      },
      [](const json& n) { return all_ready(n, 1); });
  ASSERT_TRUE(all_ready(nodes, 1)) << nodes.dump(2);
  EXPECT_EQ(nodes["nodes"][0]["name"], "trusted");
  // Its first sync may not have been tried yet on a loaded machine ("error": null until then).
  const json refused = wait_until([&] { return untrusting->call("GET", "/v1/nodes").second; },
                                  [](const json& n) { return n.contains("error") && n["error"].is_string(); });
  ASSERT_TRUE(refused.contains("error") && refused["error"].is_string()) << refused.dump(2);
  EXPECT_NE(refused["error"].get<std::string>().find("certificate verify failed"), std::string::npos)
      << refused.dump(2);
  // joulectl without the CA is refused too, and says why.
  const auto [bad, said] = joule::testing::run_program({JOULECTL_BINARY, "--server", https, "nodes"});
  EXPECT_NE(bad, 0);
  EXPECT_NE(said.find("certificate verify failed"), std::string::npos) << said;
}

TEST_F(ClusterNodesTest, a_projects_running_quota_holds_across_agents_and_a_coordinator_killed_with_9) {
  // fifo: without the quota, the project's jobs would run on both agents at once.
  std::uint16_t port = 0;
  auto coordinator = start_cluster_with_policy(
      "[placement]\nobjective = \"fifo\"\n[[projects]]\nname = \"vision\"\nmax_running_jobs = 1\n", port);
  ASSERT_FALSE(HasFailure());

  // Three jobs of the project: two devices, but the project may run one job at once.
  std::vector<std::string> vision;
  for (int i = 0; i < 3; ++i) {
    json job = training_job(fmt::format("v{}", i), marking_command(marks_, 1.5));
    job["project"] = "vision";
    vision.push_back(coordinator->submit(job));
    ASSERT_FALSE(vision.back().empty());
  }
  ASSERT_EQ(coordinator->wait_state(vision[0], {"running"})["state"], "running");
  const json held = coordinator->call("GET", "/v1/jobs/" + vision[1]).second;
  EXPECT_EQ(held["state"], "queued");
  EXPECT_EQ(held["waiting"]["reason"], "quota") << held.dump(2);
  EXPECT_EQ(held["waiting"]["rule"], "project vision");

  // The coordinator killed with -9 while the project's job runs: back, it counts that job again.
  coordinator->signal(SIGKILL);
  coordinator->wait_exit();
  std::this_thread::sleep_for(300ms);
  ASSERT_TRUE(coordinator->start()) << coordinator->log();
  std::vector<json> done;
  for (const auto& id : vision) {
    done.push_back(coordinator->wait_state(id, {"succeeded", "failed", "cancelled"}, 40s));
    EXPECT_EQ(done.back()["state"], "succeeded") << done.back().dump(2) << coordinator->log();
  }
  // One at a time, each once.
  std::sort(done.begin(), done.end(), [](const json& a, const json& b) {
    return a["started_at"].get<std::string>() < b["started_at"].get<std::string>();
  });
  for (std::size_t i = 1; i < done.size(); ++i)
    EXPECT_GE(done[i]["started_at"].get<std::string>(), done[i - 1]["finished_at"].get<std::string>())
        << done[i - 1].dump(2) << done[i].dump(2);
  const auto marks = lines_of(marks_);
  for (const auto& id : vision) EXPECT_EQ(std::count(marks.begin(), marks.end(), id + ".1"), 1) << id;
}

TEST_F(ClusterNodesTest, a_projects_energy_budget_holds_across_agents_and_a_coordinator_killed_with_9) {
  // Each job reserves its own max_energy_joules (they have no model): the project's budget has
  // room for one at a time; everyone's budget is only there to show the other project's energy.
  std::uint16_t port = 0;
  auto coordinator = start_cluster_with_policy(
      "[[projects]]\nname = \"vision\"\n[[projects]]\nname = \"lab\"\n"
      "[[budgets]]\nname = \"vision-day\"\nproject = \"vision\"\njoules = 150\nwindow = \"24h\"\n"
      "[[budgets]]\nname = \"everyone\"\nscope = \"cluster\"\njoules = 1000000\nwindow = \"24h\"\n",
      port);
  ASSERT_FALSE(HasFailure());
  auto job = [&](const std::string& name, const std::string& project, double seconds) {
    return json{{"name", name},
                {"project", project},
                {"run", {{"command", marking_command(marks_, seconds)}}},
                {"constraints", {{"max_energy_joules", 100}}}};
  };
  const std::string v0 = coordinator->submit(job("v0", "vision", 3));
  ASSERT_EQ(coordinator->wait_state(v0, {"running"})["state"], "running") << coordinator->log();
  const std::string v1 = coordinator->submit(job("v1", "vision", 0.5));
  // A device is free, but the project's budget is not.
  json held = wait_until([&] { return coordinator->call("GET", "/v1/jobs/" + v1).second; },
                         [](const json& j) { return j.contains("waiting") && j["waiting"]["reason"] == "budget"; });
  EXPECT_EQ(held["state"], "queued");
  EXPECT_EQ(held["waiting"]["reason"], "budget") << held.dump(2);
  EXPECT_EQ(held["waiting"]["rule"], "vision-day");
  EXPECT_NE(held["waiting"]["message"].get<std::string>().find("project vision on the cluster"), std::string::npos)
      << held.dump(2);
  // Another project's job runs on the free device meanwhile.
  const std::string l0 = coordinator->submit(job("l0", "lab", 0.5));
  EXPECT_EQ(coordinator->wait_state(l0, {"succeeded"})["state"], "succeeded") << coordinator->log();

  // The coordinator killed with -9 while the project's job runs: back, it holds the budget again.
  coordinator->signal(SIGKILL);
  coordinator->wait_exit();
  std::this_thread::sleep_for(300ms);
  ASSERT_TRUE(coordinator->start()) << coordinator->log();
  const json first = coordinator->wait_state(v0, {"succeeded", "failed", "cancelled"}, 40s);
  const json second = coordinator->wait_state(v1, {"succeeded", "failed", "cancelled"}, 40s);
  ASSERT_EQ(first["state"], "succeeded") << first.dump(2) << coordinator->log();
  ASSERT_EQ(second["state"], "succeeded") << second.dump(2) << coordinator->log();
  EXPECT_GE(second["started_at"].get<std::string>(), first["finished_at"].get<std::string>())
      << first.dump(2) << second.dump(2);
  const auto marks = lines_of(marks_);
  for (const auto& id : {v0, v1}) EXPECT_EQ(std::count(marks.begin(), marks.end(), id + ".1"), 1) << id;

  // The project's budget counts its two jobs' energy, not the other project's; so again after
  // another kill -9 (from the stored ledger).
  const json lab = coordinator->call("GET", "/v1/jobs/" + l0).second;
  const double vision_joules = first["energy"]["joules"].get<double>() + second["energy"]["joules"].get<double>();
  auto spent = [&](const std::string& name) {
    const json view = coordinator->call("GET", "/v1/budgets").second;
    for (const auto& budget : view["budgets"])
      if (budget["name"] == name) return budget["spent_joules"].get<double>();
    return -1.0;
  };
  EXPECT_GT(lab["energy"]["joules"].get<double>(), 0.0) << lab.dump(2);
  EXPECT_NEAR(spent("vision-day"), vision_joules, 1e-6 * vision_joules + 1e-3);
  EXPECT_GE(spent("everyone"), vision_joules + lab["energy"]["joules"].get<double>() - 1e-3);
  coordinator->signal(SIGKILL);
  coordinator->wait_exit();
  ASSERT_TRUE(coordinator->start()) << coordinator->log();
  EXPECT_NEAR(spent("vision-day"), vision_joules, 1e-6 * vision_joules + 1e-3);
  const json budget = coordinator->call("GET", "/v1/budgets").second["budgets"][0];
  EXPECT_EQ(budget["project"], "vision");
  EXPECT_TRUE(budget["owner"].is_null());
}

// Agents on grids of their own: each reports its [carbon] (and a price in the coordinator's
// currency), the coordinator places by them under min-carbon and accounts the job's grams and
// cost at the agent's signal; an agent's price in another currency is not taken.
TEST_F(ClusterNodesTest, agents_report_their_own_grids_and_jobs_are_placed_and_accounted_by_them) {
  std::filesystem::create_directories(dir_ / "policies");
  std::ofstream(dir_ / "policies" / "00-placement.toml") << "[placement]\nobjective = \"min-carbon\"\n";
  const auto port = joule::testing::free_loopback_port();
  auto coordinator = start_coordinator(
      port, fmt::format("[policy]\ndirectory = \"{}\"\n[carbon]\nintensity = 300\n[price]\ncurrency = \"EUR\"\n"
                        "per_kwh = 0.3\n",
                        (dir_ / "policies").string()));
  // The Orin uses the fewest joules but sits on a coal grid; the server on a hydro one.
  auto orin = start_agent("orin", "jetson-orin", port, "[carbon]\nintensity = 4000\n");
  auto server = start_agent("server", "server-gpu", port,
                            "[carbon]\nintensity = 2\n[price]\ncurrency = \"EUR\"\nper_kwh = 0.1\n");
  const json nodes = wait_until([&] { return nodes_of(*coordinator); },
                                [](const json& n) {
                                  if (!all_ready(n, 2)) return false;
                                  for (const auto& node : n["nodes"])
                                    if (node["signals"]["carbon"].is_null()) return false;
                                  return true;
                                });
  ASSERT_TRUE(all_ready(nodes, 2)) << nodes.dump(2) << coordinator->log();
  for (const auto& node : nodes["nodes"]) {
    ASSERT_FALSE(node["signals"]["carbon"].is_null()) << nodes.dump(2);
    if (node["name"] == "orin") {
      // Read between the reported points: a constant up to rounding.
      EXPECT_NEAR(node["signals"]["carbon"]["value_now"].get<double>(), 4000.0, 1e-6);
      EXPECT_EQ(node["signals"]["carbon"]["signal"], "constant 4000 g/kWh");
      EXPECT_TRUE(node["signals"]["price"].is_null());  // the coordinator's stands in
    } else {
      EXPECT_NEAR(node["signals"]["price"]["value_now"].get<double>(), 0.1, 1e-9);
      EXPECT_EQ(node["signals"]["price"]["currency"], "EUR");
    }
  }

  const std::string id = coordinator->submit(training_job("mlp", marking_command(marks_, 0.5)));
  ASSERT_FALSE(id.empty());
  const json done = coordinator->wait_state(id, {"succeeded", "failed", "cancelled"});
  ASSERT_EQ(done["state"], "succeeded") << done.dump(2);
  EXPECT_EQ(done["device"], "server/sim:server-gpu") << done.dump(2);
  EXPECT_DOUBLE_EQ(done["carbon"]["intensity"].get<double>(), 2.0) << done.dump(2);
  EXPECT_EQ(done["carbon"]["signal"], "node server: constant 2 g/kWh");
  EXPECT_DOUBLE_EQ(done["cost"]["price_per_kwh"].get<double>(), 0.1);
  EXPECT_EQ(done["cost"]["signal"], "node server: constant 0.1 EUR/kWh");

  // Prices in pounds cannot be added to a coordinator's euros: not taken, and said so.
  auto pounds = start_agent("pounds", "raspberry-pi-4", port, "[price]\ncurrency = \"GBP\"\nper_kwh = 0.2\n");
  const std::string warning = "node pounds: its prices are in GBP but this coordinator's are in EUR";
  const json warned = wait_until([&] { return json(coordinator->log().find(warning) != std::string::npos); },
                                 [](const json& found) { return found.get<bool>(); });
  EXPECT_TRUE(warned.get<bool>()) << coordinator->log();
  const json with_pounds =
      wait_until([&] { return nodes_of(*coordinator); }, [](const json& n) { return all_ready(n, 3); });
  for (const auto& node : with_pounds["nodes"])
    if (node["name"] == "pounds") EXPECT_TRUE(node["signals"]["price"].is_null()) << node.dump(2);
}

// An agent's CPU shares its cores among jobs that ask for cores: the coordinator learns how many
// from the agent's sync and packs two 1-core jobs there side by side, as the agent runs them.
TEST_F(ClusterNodesTest, jobs_asking_for_cores_run_side_by_side_on_an_agents_shared_cpu) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs two CPUs";
  const auto port = joule::testing::free_loopback_port();
  auto coordinator = start_coordinator(port);
  auto packer = start_agent("packer", "raspberry-pi-4", port, "[[devices]]\nname = \"cpu\"\nmeter = \"modelled\"\n");
  // Its CPU has no model (probing is off): the node being heard from is enough.
  auto heard = [](const json& n) {
    return n.is_object() && n.contains("nodes") && n["nodes"].size() == 1 && n["nodes"][0]["state"] == "ready" &&
           n["nodes"][0]["devices"].size() == 2;
  };
  const json nodes = wait_until([&] { return nodes_of(*coordinator); }, heard);
  ASSERT_TRUE(heard(nodes)) << nodes.dump(2);
  const auto go = dir_ / "go";
  std::vector<std::string> ids;
  for (int i = 0; i < 2; ++i) {
    json job = training_job(fmt::format("core-{}", i),
                            {"sh", "-c",
                             fmt::format("echo \"$JOULE_JOB_ID\" >> {}; while [ ! -e {} ]; do sleep 0.1; done",
                                         marks_.string(), go.string())});
    job["resources"] = {{"cores", 1}};
    job["constraints"] = {{"devices", {"packer/cpu"}}};
    ids.push_back(coordinator->submit(job));
    ASSERT_FALSE(ids.back().empty()) << coordinator->log();
  }
  // Both start before either may end: side by side on the agent's CPU.
  const auto started = wait_until([&] { return json(lines_of(marks_).size()); },
                                  [](const json& count) { return count.get<std::size_t>() >= 2; });
  EXPECT_EQ(started.get<std::size_t>(), 2u) << coordinator->log() << packer->log();
  const json devices = coordinator->call("GET", "/v1/devices").second;
  bool seen = false;
  for (const auto& device : devices["devices"]) {
    if (device["name"] != "packer/cpu") continue;
    seen = true;
    EXPECT_GE(device["cores"]["shared"].get<int>(), 2) << device.dump(2);
    EXPECT_EQ(device["cores"]["held"], 2) << device.dump(2);
  }
  EXPECT_TRUE(seen) << devices.dump(2);
  std::ofstream{go};
  for (const auto& id : ids)
    EXPECT_EQ(coordinator->wait_state(id, {"succeeded", "failed", "cancelled"})["state"], "succeeded")
        << coordinator->log();
}
