// Jobs on several GPUs (issue 36), through jouled against the fake libnvidia-ml with three GPUs:
// a job asking for two holds two, is started with the environment DDP and torchrun read (a real
// PyTorch program spawns two gloo processes from it and all-reduces across them), keeps both
// across a kill -9 of jouled, and its energy is both GPUs'; a request that can never fit is
// refused naming the field and what the node has.

#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "daemon_process.hpp"

using joule::testing::DaemonProcess;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// Debian's PyTorch (python3-torch): what its interpreter is, where it is installed.
constexpr const char* kPython = "/usr/bin/python3";

bool has_torch() {
  return joule::testing::run_program({kPython, "-c", "import torch.distributed as d; assert d.is_available()"}).first ==
         0;
}

// A data-parallel program as people write them without torchrun: one process per GPU, spawned
// from WORLD_SIZE, meeting at MASTER_ADDR:MASTER_PORT (env://). Each rank adds its rank + 1
// across all, waits for `go`, and prints what it got.
constexpr const char* kProgram = R"(import os, sys, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def train(rank, world, go):
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t)
    while not os.path.exists(go):
        time.sleep(0.05)
    sys.stdout.write(f"rank {rank} of {dist.get_world_size()} sum {t.item():g} gpus {os.environ['CUDA_VISIBLE_DEVICES']}"
                     f" torchrun {os.environ['PET_NPROC_PER_NODE']} at {os.environ['PET_MASTER_ADDR']}\n")
    sys.stdout.flush()
    dist.destroy_process_group()

if __name__ == "__main__":
    world = int(os.environ["WORLD_SIZE"])
    mp.spawn(train, args=(world, sys.argv[1]), nprocs=world)
)";

struct FakeGpus {
  std::filesystem::path dir;
  explicit FakeGpus(int count, int joules_per_reading = 100) {
    dir = std::filesystem::temp_directory_path() / ("joule-multi-gpu-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::filesystem::permissions(dir, std::filesystem::perms::all);  // the job's account reads and writes here
    std::filesystem::create_symlink(JOULE_FAKE_NVML, dir / "libnvidia-ml.so.1");
    // `joules_per_reading` more at every reading of each GPU (jouled reads about once a second).
    std::string energy = "energy_mj";
    for (int i = 0; i < 5000; ++i) energy += " " + std::to_string(i * 1000LL * joules_per_reading);
    std::ofstream(dir / "script") << "devices " << count << "\nname NVIDIA Fake A100\n" << energy << "\n";
    std::ofstream(dir / "ddp.py") << kProgram;
  }
  ~FakeGpus() { std::filesystem::remove_all(dir); }
  joule::testing::DaemonOptions options(int count) const {
    std::string config = "[probing]\nenabled = false\n[[devices]]\nname = \"cpu\"\n";
    for (int i = 0; i < count; ++i)
      config += "[[devices]]\nname = \"cuda:" + std::to_string(i) + "\"\nmeter = \"nvml\"\n";
    return {.config_toml = config,
            .env = {{"LD_LIBRARY_PATH", dir.string()}, {"JOULE_FAKE_NVML_SCRIPT", (dir / "script").string()}}};
  }
};

json ddp_job(const FakeGpus& gpus, int count) {
  return {{"name", "ddp"},
          {"resources", {{"gpus", count}}},
          {"run",
           {{"command", {kPython, (gpus.dir / "ddp.py").string(), (gpus.dir / "go").string()}},
            {"env", {{"GLOO_SOCKET_IFNAME", "lo"}}}}}};
}

// Each GPU's power limits in the order the fake libnvidia-ml was asked to set them ("0", "1" ->
// milliwatts), from its log.
std::map<std::string, std::vector<std::string>> limits_set(const std::filesystem::path& log_file) {
  std::map<std::string, std::vector<std::string>> limits;
  std::ifstream log(log_file);
  for (std::string line; std::getline(log, line);) {
    if (line.rfind("set_limit ", 0) != 0) continue;
    const auto gpu = line.find(" gpu ");
    limits[gpu == std::string::npos ? "0" : line.substr(gpu + 5)].push_back(line.substr(10, line.find(' ', 10) - 10));
  }
  return limits;
}

// A job on `count` GPUs that runs until the file `go` exists.
json waiting_job(const std::filesystem::path& go, int count) {
  return {{"name", "ddp"},
          {"resources", {{"gpus", count}}},
          {"run", {{"command", {"sh", "-c", "while [ ! -e " + go.string() + " ]; do sleep 0.05; done"}}}}};
}

// The devices holding job `id`, by name.
std::vector<std::string> holding(const DaemonProcess& daemon, const std::string& id) {
  std::vector<std::string> out;
  const json devices = daemon.call("GET", "/v1/devices").second;
  for (const auto& device : devices["devices"])
    for (const auto& job : device.value("jobs", json::array()))
      if (job["id"] == id) out.push_back(device["name"]);
  return out;
}

}  // namespace

TEST(MultiGpuTest, a_job_on_two_gpus_holds_both_gets_the_ddp_environment_and_is_metered_on_both) {
  if (!has_torch()) GTEST_SKIP() << "python3-torch with torch.distributed is not installed";
  const FakeGpus gpus(3);
  DaemonProcess daemon(gpus.options(3));
  ASSERT_TRUE(daemon.start()) << daemon.log();

  // More than one kind's count, or a GPU job on the CPU: refused, naming the field and the node.
  auto [code, refused] = daemon.call("POST", "/v1/jobs", ddp_job(gpus, 4).dump());
  EXPECT_EQ(code, 400u) << refused.dump(2);
  EXPECT_EQ(refused["errors"][0]["pointer"], "/resources/gpus") << refused.dump(2);
  EXPECT_NE(refused["detail"].get<std::string>().find("NVIDIA Fake A100 has 3"), std::string::npos) << refused.dump(2);
  json on_cpu = ddp_job(gpus, 1);
  on_cpu["constraints"] = {{"devices", {"cpu"}}};
  std::tie(code, refused) = daemon.call("POST", "/v1/jobs", on_cpu.dump());
  EXPECT_EQ(code, 400u) << refused.dump(2);
  EXPECT_NE(refused["detail"].get<std::string>().find("cpu is not a GPU"), std::string::npos) << refused.dump(2);

  const std::string id = daemon.submit(ddp_job(gpus, 2));
  ASSERT_FALSE(id.empty());
  const json running = daemon.wait_state(id, {"running", "failed"});
  ASSERT_EQ(running["state"], "running") << running.dump(2) << daemon.log();
  std::vector<std::string> held = holding(daemon, id);
  ASSERT_EQ(held.size(), 2u) << daemon.call("GET", "/v1/devices").second.dump(2);
  ASSERT_EQ(running["devices"].size(), 2u) << running.dump(2);
  EXPECT_EQ(running["devices"][0], running["device"]);
  const auto [shown_code, shown] = joule::testing::run_program(
      {JOULECTL_BINARY, "--server", "http://127.0.0.1:" + std::to_string(daemon.port()), "job", id});
  EXPECT_NE(shown.find("gpus:      " + running["devices"][0].get<std::string>() + ", " +
                       running["devices"][1].get<std::string>()),
            std::string::npos)
      << shown;

  // A second job on two (joulectl's --gpus) waits: one GPU is left.
  json spec = ddp_job(gpus, 1);
  spec.erase("resources");
  std::ofstream(gpus.dir / "job.json") << spec.dump();
  const auto [submit_code, submitted] =
      joule::testing::run_program({JOULECTL_BINARY, "--server", "http://127.0.0.1:" + std::to_string(daemon.port()),
                                   "--json", "submit", "--gpus", "2", (gpus.dir / "job.json").string()});
  ASSERT_EQ(submit_code, 0) << submitted;
  EXPECT_EQ(json::parse(submitted)["spec"]["resources"]["gpus"], 2) << submitted;
  const std::string second = json::parse(submitted)["id"];
  const json waiting =
      joule::testing::wait_until([&] { return daemon.call("GET", "/v1/jobs/" + second).second; },
                                 [](const json& job) { return job.contains("waiting") && job["waiting"].is_object(); });
  EXPECT_EQ(waiting["state"], "queued") << waiting.dump(2);
  EXPECT_NE(waiting["waiting"]["message"].get<std::string>().find("2 GPUs of NVIDIA Fake A100"), std::string::npos)
      << waiting.dump(2);

  // jouled killed and started again: the job is adopted and holds both GPUs again.
  daemon.signal(SIGKILL);
  ASSERT_TRUE(daemon.wait_exit());
  ASSERT_TRUE(daemon.start()) << daemon.log();
  const json adopted = daemon.wait_event(id, "adopted process group");
  EXPECT_EQ(adopted["state"], "running") << adopted.dump(2);
  EXPECT_EQ(holding(daemon, id), held) << daemon.call("GET", "/v1/devices").second.dump(2);

  std::ofstream(gpus.dir / "go") << "go\n";
  const json done = daemon.wait_state(id, {"succeeded", "failed"}, 60s);
  ASSERT_EQ(done["state"], "succeeded") << done.dump(2) << daemon.log();
  const std::string log = daemon.client().request("GET", "/v1/jobs/" + id + "/log")->body;
  // Two ranks met and summed 1 + 2; each saw both GPUs, its own device first, and torchrun's options.
  const std::string visible = held[0].substr(5) + "," + held[1].substr(5);
  for (const std::string rank : {"rank 0 of 2 sum 3", "rank 1 of 2 sum 3"})
    EXPECT_NE(log.find(rank), std::string::npos) << log;
  EXPECT_NE(log.find("gpus " + visible + " torchrun 2 at 127.0.0.1"), std::string::npos) << log;
  EXPECT_EQ(done["energy"]["source"], "nvml") << done.dump(2);
  EXPECT_NE(done["energy"]["scope"].get<std::string>().find("summed over its 2 GPUs"), std::string::npos)
      << done.dump(2);
  EXPECT_TRUE(holding(daemon, id).empty());
  // The third GPU (minor 2 in the fake NVML) is fenced off by the job's cgroup where this host
  // lets jouled make one, or the job is told it is hidden by CUDA_VISIBLE_DEVICES alone.
  const std::string events = done["events"].dump();
  const int third = 3 - std::stoi(held[0].substr(5)) - std::stoi(held[1].substr(5));
  if (daemon.log().find("job cgroups: unavailable") == std::string::npos)
    EXPECT_TRUE(events.find(fmt::format("keep it off GPU node(s) /dev/nvidia{}\"", third)) != std::string::npos ||
                events.find("hidden by CUDA_VISIBLE_DEVICES alone") != std::string::npos)
        << done.dump(2);
  EXPECT_EQ(daemon.wait_state(second, {"running", "succeeded"})["state"], "running")
      << "the GPUs it freed take the next";
}

// A power cap throttles a job on several GPUs as one: the limit its first GPU gets is set on the
// other too, and both come back when the cap goes.
TEST(MultiGpuTest, a_capped_job_on_two_gpus_gets_the_lower_limit_on_both_and_both_come_back) {
  const FakeGpus gpus(2, /*joules_per_reading=*/300);
  const auto policies = gpus.dir / "policies";
  std::filesystem::create_directories(policies);
  auto options = gpus.options(2);
  options.config_toml += "[policy]\ndirectory = \"" + policies.string() + "\"\n";
  std::ofstream(gpus.dir / "script", std::ios::app)
      << "limit_mw 250000\nlimit_constraints_mw 100000 300000\nlog " << (gpus.dir / "nvml.log").string() << "\n";
  DaemonProcess daemon(options);
  ASSERT_TRUE(daemon.start()) << daemon.log();
  const auto go = gpus.dir / "go";
  const std::string id = daemon.submit(waiting_job(go, 2));
  const json running = daemon.wait_state(id, {"running"});
  ASSERT_EQ(running["state"], "running") << daemon.log();
  std::ofstream(policies / "10-cap.toml")
      << "[[power_caps]]\nname = \"gpu\"\nscope = \"device\"\ntarget = \"" << running["device"].get<std::string>()
      << "\"\nwatts = 200\naverage_seconds = 2\n";
  daemon.signal(SIGHUP);
  const json throttled = daemon.wait_state(id, {"throttled"});
  ASSERT_EQ(throttled["state"], "throttled") << throttled.dump(2) << daemon.log();
  std::filesystem::remove(policies / "10-cap.toml");
  daemon.signal(SIGHUP);
  joule::testing::wait_until([&] { return daemon.call("GET", "/v1/jobs/" + id).second; },
                             [](const json& job) { return job["state"] == "running"; });
  std::ofstream(go) << "go\n";
  ASSERT_EQ(daemon.wait_state(id, {"succeeded", "failed"})["state"], "succeeded");

  // Each GPU's limits in order: lowered by the cap, then its original (250 W) again.
  const auto limits = limits_set(gpus.dir / "nvml.log");
  ASSERT_EQ(limits.size(), 2u) << daemon.log();
  for (const auto& [gpu, set] : limits) {
    ASSERT_GE(set.size(), 2u) << gpu;
    EXPECT_LT(std::stoi(set.front()), 250000) << gpu;
    EXPECT_EQ(set.back(), "250000") << gpu;
  }
}

// A job on two GPUs with a power limit knob runs with it on both (they run in step), and both
// originals come back when it ends, and after a kill -9 of jouled at its next start.
TEST(MultiGpuTest, a_job_on_two_gpus_runs_at_its_power_limit_on_both_and_both_come_back_after_a_kill_9_too) {
  const FakeGpus gpus(2);
  std::ofstream(gpus.dir / "script", std::ios::app)
      << "limit_mw 250000\nlimit_constraints_mw 100000 300000\nlog " << (gpus.dir / "nvml.log").string() << "\n";
  const auto state = gpus.dir / "state";
  const auto options = gpus.options(2);
  std::string id;
  {
    DaemonProcess daemon(options, state);
    ASSERT_TRUE(daemon.start()) << daemon.log();
    const auto go = gpus.dir / "go";
    json job = waiting_job(go, 2);
    job["knobs"] = {{"gpu_power_limit_watts", 180}};
    const std::string ended = daemon.submit(job);
    const json running = daemon.wait_state(ended, {"running", "failed"});
    ASSERT_EQ(running["state"], "running") << running.dump(2) << daemon.log();
    const std::string in_force = running["knobs"]["in_force"];
    EXPECT_NE(in_force.find("gpu_power_limit_watts 180 (set 180 W)"), std::string::npos) << in_force;
    EXPECT_NE(in_force.find("gpu_power_limit_watts 180 on cuda:"), std::string::npos) << in_force;
    auto limits = limits_set(gpus.dir / "nvml.log");
    ASSERT_EQ(limits.size(), 2u) << daemon.log();
    for (const auto& [gpu, set] : limits) EXPECT_EQ(set, std::vector<std::string>{"180000"}) << gpu;
    std::ofstream(go) << "go\n";
    ASSERT_EQ(daemon.wait_state(ended, {"succeeded", "failed"})["state"], "succeeded");
    limits = limits_set(gpus.dir / "nvml.log");
    for (const auto& [gpu, set] : limits) EXPECT_EQ(set, (std::vector<std::string>{"180000", "250000"})) << gpu;
    std::filesystem::remove(go);

    std::filesystem::remove(gpus.dir / "nvml.log");
    id = daemon.submit(job);
    ASSERT_EQ(daemon.wait_state(id, {"running", "failed"})["state"], "running") << daemon.log();
    daemon.signal(SIGKILL);
    EXPECT_EQ(daemon.wait_exit(), 128 + SIGKILL);
  }
  // Nobody put them back: each GPU was last set to the job's limit.
  for (const auto& [gpu, set] : limits_set(gpus.dir / "nvml.log"))
    EXPECT_EQ(set, std::vector<std::string>{"180000"}) << gpu;
  {
    DaemonProcess restarted(options, state);
    ASSERT_TRUE(restarted.start()) << restarted.log();
    const json adopted = restarted.wait_event(id, "its knobs were put back when jouled restarted");
    EXPECT_EQ(adopted["state"], "running") << adopted.dump(2) << restarted.log();
    const auto limits = limits_set(gpus.dir / "nvml.log");
    ASSERT_EQ(limits.size(), 2u) << restarted.log();
    for (const auto& [gpu, set] : limits)
      EXPECT_EQ(set, (std::vector<std::string>{"180000", "250000"})) << gpu << restarted.log();
    EXPECT_EQ(restarted.call("DELETE", "/v1/jobs/" + id).first, 202u);
    EXPECT_EQ(restarted.wait_state(id, {"cancelled"})["state"], "cancelled");
  }
}

// Through a coordinator: an agent reports its GPUs' model, the coordinator holds two of one
// agent's GPUs for a job asking for two (never GPUs of two nodes), and the agent runs it on
// exactly those, with the same environment as a job submitted to it.
TEST(MultiGpuTest, a_coordinator_places_a_job_on_two_gpus_of_one_agent_and_the_agent_runs_it_on_both) {
  const FakeGpus gpus(2);
  const auto port = joule::testing::free_loopback_port();
  const auto coordinator_dir = gpus.dir / "coordinator";
  std::filesystem::create_directories(coordinator_dir);
  DaemonProcess coordinator(
      {.config_toml = fmt::format("[node]\nname = \"coord\"\n[server]\nlisten = \"127.0.0.1:{}\"\n[cluster]\nrole = "
                                  "\"coordinator\"\nheartbeat_seconds = 0.2\n[probing]\nenabled = false\n"
                                  "[[devices]]\nname = \"sim:laptop-cpu\"\nprobes = 40\n",
                                  port),
       .listen_loopback_any_port = false},
      coordinator_dir);
  ASSERT_TRUE(coordinator.start()) << coordinator.log();
  auto options = gpus.options(2);
  options.config_toml =
      fmt::format("[node]\nname = \"gpu-node\"\n[cluster]\nrole = \"agent\"\ncoordinator = \"http://127.0.0.1:{}\"\n",
                  port) +
      options.config_toml;
  DaemonProcess agent(options);
  ASSERT_TRUE(agent.start()) << agent.log();
  const json nodes = joule::testing::wait_until(
      [&] { return coordinator.call("GET", "/v1/nodes").second; },
      [](const json& n) { return n.contains("nodes") && !n["nodes"].empty() && n["nodes"][0]["state"] == "ready"; });
  ASSERT_EQ(nodes["nodes"][0]["state"], "ready") << nodes.dump(2) << coordinator.log();

  const std::string id = coordinator.submit(
      {{"name", "ddp"},
       {"resources", {{"gpus", 2}}},
       {"run",
        {{"command",
          {"sh", "-c",
           "echo \"gpus $CUDA_VISIBLE_DEVICES world $WORLD_SIZE on $JOULE_DEVICES; order $CUDA_DEVICE_ORDER\""}}}}});
  ASSERT_FALSE(id.empty()) << coordinator.log();
  const json done = coordinator.wait_state(id, {"succeeded", "failed"}, 30s);
  ASSERT_EQ(done["state"], "succeeded") << done.dump(2) << coordinator.log() << agent.log();
  ASSERT_EQ(done["devices"].size(), 2u) << done.dump(2);
  for (const auto& device : done["devices"]) EXPECT_EQ(device.get<std::string>().rfind("gpu-node/cuda:", 0), 0u);
  EXPECT_EQ(done["energy"]["source"], "nvml") << done.dump(2);
  // On the agent, under its own id for the placement: on the two GPUs the coordinator held (the
  // agent's placer picks which of them is its first).
  const std::string one = done["devices"][0].get<std::string>().substr(9);
  const std::string two = done["devices"][1].get<std::string>().substr(9);
  const std::string log = agent.client().request("GET", "/v1/jobs/" + id + ".1/log")->body;
  const bool as_held =
      log.find(fmt::format("gpus {},{} world 2 on {},{}", one.substr(5), two.substr(5), one, two)) != std::string::npos;
  const bool swapped =
      log.find(fmt::format("gpus {},{} world 2 on {},{}", two.substr(5), one.substr(5), two, one)) != std::string::npos;
  EXPECT_TRUE(as_held || swapped) << log << agent.log();
  EXPECT_NE(log.find("order PCI_BUS_ID"), std::string::npos) << "CUDA numbers the GPUs as NVML does: " << log;
}

// MIG (issue 36): a GPU in MIG mode, named by its MIG devices, gives a device each; a job there
// sees its own MIG device alone and is metered by its share of the GPU's counter, said so in its
// scope; a job asking for two GPUs finds none to gang; the GPU named whole is refused at start,
// naming what to write instead.
TEST(MultiGpuTest, mig_devices_are_devices_of_their_own_metered_by_their_share_of_the_gpus_counter) {
  const FakeGpus gpus(1);
  std::ofstream(gpus.dir / "script", std::ios::app) << "mig 0 3g.20gb 3g.20gb\n";
  auto options = gpus.options(0);
  options.config_toml += "[[devices]]\nname = \"mig:0.0\"\n[[devices]]\nname = \"mig:0.1\"\n";
  DaemonProcess daemon(options);
  ASSERT_TRUE(daemon.start()) << daemon.log();
  const json devices = daemon.call("GET", "/v1/devices").second;
  std::map<std::string, json> by_name;
  for (const auto& device : devices["devices"]) by_name[device["name"]] = device;
  ASSERT_TRUE(by_name.contains("mig:0.1")) << devices.dump(2);
  EXPECT_EQ(by_name["mig:0.1"]["meter"]["source"], "nvml") << by_name["mig:0.1"].dump(2);
  EXPECT_NE(by_name["mig:0.1"].dump().find("NVIDIA Fake A100 MIG 3g.20gb (MIG-"), std::string::npos)
      << by_name["mig:0.1"].dump(2);

  const std::string id = daemon.submit({{"name", "on-mig"},
                                        {"constraints", {{"devices", {"mig:0.1"}}}},
                                        {"resources", {{"gpus", 1}}},
                                        {"run", {{"command", {"sh", "-c", "echo \"sees $CUDA_VISIBLE_DEVICES\""}}}}});
  const json done = daemon.wait_state(id, {"succeeded", "failed"});
  ASSERT_EQ(done["state"], "succeeded") << done.dump(2) << daemon.log();
  const std::string log = daemon.client().request("GET", "/v1/jobs/" + id + "/log")->body;
  EXPECT_NE(log.find("sees MIG-fa4e0000-0000-4000-8000-000000000001"), std::string::npos) << log;
  EXPECT_EQ(done["energy"]["source"], "nvml") << done.dump(2);
  EXPECT_NE(done["energy"]["scope"].get<std::string>().find("its share of GPU 0's energy counter"), std::string::npos)
      << done.dump(2);

  auto [code, refused] = daemon.call("POST", "/v1/jobs", ddp_job(gpus, 2).dump());
  EXPECT_EQ(code, 400u) << refused.dump(2);
  EXPECT_EQ(refused["errors"][0]["pointer"], "/resources/gpus") << refused.dump(2);

  // The GPU named whole: jouled does not start, and says what to name instead.
  auto whole = gpus.options(1);
  DaemonProcess refusing(whole);
  EXPECT_FALSE(refusing.start(std::chrono::seconds(5)));
  EXPECT_NE(refusing.log().find("GPU 0 is in MIG mode: a job cannot use it whole; name its MIG devices as devices "
                                "instead: mig:0.0 (NVIDIA Fake A100 MIG 3g.20gb), mig:0.1"),
            std::string::npos)
      << refusing.log();
}
