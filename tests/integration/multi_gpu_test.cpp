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
  const std::string go = (gpus.dir / "go").string();
  const std::string id =
      daemon.submit({{"name", "ddp"},
                     {"resources", {{"gpus", 2}}},
                     {"run", {{"command", {"sh", "-c", "while [ ! -e " + go + " ]; do sleep 0.05; done"}}}}});
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
  std::map<std::string, std::vector<std::string>> limits;  // "0", "1" -> limits set
  std::ifstream log(gpus.dir / "nvml.log");
  for (std::string line; std::getline(log, line);) {
    if (line.rfind("set_limit ", 0) != 0) continue;
    const auto gpu = line.find(" gpu ");
    limits[gpu == std::string::npos ? "0" : line.substr(gpu + 5)].push_back(line.substr(10, line.find(' ', 10) - 10));
  }
  ASSERT_EQ(limits.size(), 2u) << daemon.log();
  for (const auto& [gpu, set] : limits) {
    ASSERT_GE(set.size(), 2u) << gpu;
    EXPECT_LT(std::stoi(set.front()), 250000) << gpu;
    EXPECT_EQ(set.back(), "250000") << gpu;
  }
}
