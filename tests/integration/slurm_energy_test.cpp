// A Slurm job's energy where the cluster meters it (issue 37): jouled reads it from sacct's
// ConsumedEnergyRaw and labels it `slurm`. The loopback Slurm the other Slurm tests start has no
// energy plugin (slurm_test.cpp checks the estimate stands there), so here jouled's [slurm]
// bin_dir points at stand-ins for sbatch, scontrol, sacct and scancel that answer in Slurm's
// formats for a cluster with acct_gather_energy/rapl: the job completes at once, and sacct has
// its figure.

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "daemon_process.hpp"

using joule::testing::DaemonOptions;
using joule::testing::DaemonProcess;
using nlohmann::json;

namespace {

// One script for every Slurm command, by the name it is called by; jobs kept in `state`.
std::string fake_slurm(const std::filesystem::path& state) {
  return fmt::format(R"SH(#!/bin/bash
state='{}'
now=$(date +%s)
case "$(basename "$0")" in
  sbatch)
    comment=""
    for a in "$@"; do case "$a" in --comment=*) comment=${{a#--comment=}};; esac; done
    mkdir -p "$state/jobs"
    n=$(( $(ls "$state/jobs" | wc -l) + 1001 ))
    echo "$comment $now" > "$state/jobs/$n"
    env | grep '^JOULE_' > "$state/env.$n"
    echo "$n" ;;
  scontrol)
    if [ "$1 $2" = "show config" ]; then
      echo "Configuration data as of 2026-11-29T10:00:00"
      echo "AcctGatherEnergyType    = acct_gather_energy/rapl"
      exit 0
    fi
    if [ "$1 $2" = "show job" ]; then
      found=0
      for f in "$state"/jobs/*; do
        [ -e "$f" ] || continue
        found=1
        read -r comment t < "$f"
        if [ -e "$state/hold" ] && [ ! -e "$state/done" ]; then
          echo "JobId=$(basename "$f") UserId=$(id -un)($(id -u)) JobState=RUNNING Reason=None NodeList=localhost ExitCode=0:0 StartTime=$t EndTime=Unknown Comment=$comment"
        else
          echo "JobId=$(basename "$f") UserId=$(id -un)($(id -u)) JobState=COMPLETED Reason=None NodeList=localhost ExitCode=0:0 StartTime=$t EndTime=$((t + 1)) Comment=$comment"
        fi
      done
      [ $found = 1 ] || echo "No jobs in the system"
    fi
    exit 0 ;;
  sstat)
    # Running jobs' energy so far: what state/sstat holds, for each job asked about.
    [ -e "$state/sstat" ] || exit 0
    prev=""
    for a in "$@"; do
      if [ "$prev" = "-j" ]; then
        for id in ${{a//,/ }}; do echo "$id.extern|1"; echo "$id.batch|$(cat "$state/sstat")"; done
        exit 0
      fi
      prev=$a
    done
    exit 0 ;;
  sacct)
    prev=""
    for a in "$@"; do
      if [ "$prev" = "-j" ]; then echo "$a|"; echo "$a.batch|15230"; echo "$a.extern|15300"; exit 0; fi
      prev=$a
    done
    exit 0 ;;
  *) exit 0 ;;
esac
)SH",
                     state.string());
}

// A small MLP on Slurm's "cpu" node type.
json slurm_job(const std::filesystem::path& dir) {
  return json{
      {"name", "metered"},
      {"model",
       {{"input", {{"shape", {64}}}},
        {"layers",
         {{{"type", "linear"}, {"out_features", 32}}, {{"type", "relu"}}, {{"type", "linear"}, {"out_features", 4}}}},
        {"loss", "cross_entropy"}}},
      {"training", {{"batch_size", 32}, {"epochs", 1}, {"samples_per_epoch", 3200}}},
      {"run", {{"command", {"true"}}, {"workdir", dir.string()}}},
      {"constraints", {{"devices", {"slurm:cpu/*"}}}}};
}

// A directory with the stand-ins (bin/) and their jobs (state/), and jouled's config for them.
struct FakeSlurm {
  std::filesystem::path dir;
  std::filesystem::path state;
  std::string config;
};

FakeSlurm fake_slurm_tree() {
  char pattern[] = "/tmp/joule-fake-slurm-XXXXXX";
  FakeSlurm fake{::mkdtemp(pattern), {}, {}};
  fake.state = fake.dir / "state";
  std::filesystem::permissions(fake.dir, std::filesystem::perms::all);
  const auto bin = fake.dir / "bin";
  std::filesystem::create_directories(bin);
  std::filesystem::create_directories(fake.state);
  std::ofstream(bin / "fake-slurm") << fake_slurm(fake.state);
  std::filesystem::permissions(bin / "fake-slurm",
                               std::filesystem::perms::owner_all | std::filesystem::perms::group_read |
                                   std::filesystem::perms::group_exec | std::filesystem::perms::others_read |
                                   std::filesystem::perms::others_exec);
  for (const char* tool : {"sbatch", "scontrol", "sacct", "sstat", "scancel"})
    std::filesystem::create_symlink(bin / "fake-slurm", bin / tool);
  fake.config = fmt::format(
      "[node]\nname = \"head\"\n[probing]\nenabled = false\n"
      "[[devices]]\nname = \"sim:laptop-cpu\"\nprobes = 40\n"
      "[slurm]\nbin_dir = \"{}\"\nworkdir = \"{}\"\npoll_seconds = 0.3\n"
      "[[slurm.node_types]]\nname = \"cpu\"\npartition = \"joule\"\nslots = 1\nmodel = \"sim:laptop-cpu\"\nprobes = "
      "40\n",
      bin.string(), fake.dir.string());
  return fake;
}

}  // namespace

TEST(SlurmEnergyTest, a_slurm_job_on_a_metered_cluster_gets_its_energy_from_sacct_labelled_slurm) {
  const FakeSlurm fake = fake_slurm_tree();
  DaemonProcess jouled(DaemonOptions{.config_toml = fake.config});
  ASSERT_TRUE(jouled.start()) << jouled.log();
  const std::string id = jouled.submit(slurm_job(fake.dir));
  ASSERT_FALSE(id.empty()) << jouled.log();
  const json done = jouled.wait_state(id, {"succeeded", "failed", "cancelled"});
  EXPECT_EQ(done["state"], "succeeded") << done.dump(2) << jouled.log();
  EXPECT_EQ(done["energy"]["source"], "slurm") << done.dump(2);
  EXPECT_EQ(done["energy"]["measured"], true) << done.dump(2);
  EXPECT_DOUBLE_EQ(done["energy"]["joules"].get<double>(), 15230.0) << "the batch step's, the job's own line empty";
  EXPECT_NE(done["energy"]["scope"].get<std::string>().find("sacct ConsumedEnergyRaw"), std::string::npos)
      << done.dump(2);
  EXPECT_NE(jouled.log().find("energy accounting acct_gather_energy/rapl"), std::string::npos) << jouled.log();
  std::filesystem::remove_all(fake.dir);
}

// A Slurm job gets the job URL and its own token, as a local job does: it reports progress and
// gets its energy so far (its estimate pro rata while Slurm meters nothing, labelled so).
TEST(SlurmEnergyTest, a_slurm_job_reports_its_progress_with_its_own_token_to_its_joule_url) {
  const FakeSlurm fake = fake_slurm_tree();
  std::ofstream{fake.state / "hold"};  // its Slurm job runs until state/done exists
  DaemonProcess jouled(DaemonOptions{.config_toml = fake.config});
  ASSERT_TRUE(jouled.start()) << jouled.log();
  EXPECT_NE(jouled.log().find("reaches this jouled only from this host: set [slurm] joule_url"), std::string::npos)
      << jouled.log();
  // Its energy so far is its estimate pro rata: wait for the node type's model.
  const auto ready = joule::testing::wait_until([&] { return jouled.call("GET", "/v1/devices").second; },
                                                [](const json& d) {
                                                  for (const auto& device : d["devices"])
                                                    if (device["name"] == "slurm:cpu/0")
                                                      return device["model"]["state"] == "ready";
                                                  return false;
                                                });
  const std::string id = jouled.submit(slurm_job(fake.dir));
  ASSERT_FALSE(id.empty()) << jouled.log();
  const json running = jouled.wait_state(id, {"running"});
  ASSERT_EQ(running["state"], "running") << running.dump(2) << jouled.log();
  // What sbatch was handed.
  std::map<std::string, std::string> env;
  std::ifstream in(fake.state / "env.1001");
  for (std::string line; std::getline(in, line);)
    if (const auto eq = line.find('='); eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  EXPECT_EQ(env["JOULE_JOB_ID"], id);
  EXPECT_EQ(env["JOULE_URL"], "http://127.0.0.1:" + std::to_string(jouled.port()));
  ASSERT_EQ(env["JOULE_JOB_TOKEN"].size(), 48u);

  const std::string body = R"({"epoch": 1, "epochs": 4})";
  auto reply = jouled.client(env["JOULE_JOB_TOKEN"]).request("POST", "/v1/jobs/" + id + "/progress", body);
  ASSERT_TRUE(reply);
  ASSERT_EQ(reply->status, 200u) << reply->body;
  const json answer = json::parse(reply->body);
  ASSERT_TRUE(answer["energy"].is_object()) << reply->body << ready.dump(2);
  EXPECT_GT(answer["energy"]["joules"].get<double>(), 0.0) << answer.dump(2);
  EXPECT_EQ(answer["energy"]["source"], "simulated") << answer.dump(2);  // the estimate's, not a meter's
  EXPECT_TRUE(answer.contains("projection")) << answer.dump(2);
  auto wrong = jouled.client(std::string(48, 'a'))
                   .request("POST", "/v1/jobs/" + id + "/progress", R"({"epoch": 2, "epochs": 4})");
  ASSERT_TRUE(wrong);
  EXPECT_NE(wrong->status, 200u);

  std::ofstream{fake.state / "done"};
  const json done = jouled.wait_state(id, {"succeeded", "failed", "cancelled"});
  EXPECT_EQ(done["state"], "succeeded") << done.dump(2);
  std::filesystem::remove_all(fake.dir);
}

// While it runs on a metered cluster, a Slurm job's energy so far is what sstat has for its batch
// step (steps are not summed: a node-level plugin charges each with the node's energy), labelled
// slurm: budgets, progress answers and GET /v1/jobs/{id} read it instead of the estimate.
TEST(SlurmEnergyTest, a_running_slurm_job_has_its_energy_so_far_from_sstat_labelled_slurm) {
  const FakeSlurm fake = fake_slurm_tree();
  std::ofstream{fake.state / "hold"};
  std::ofstream{fake.state / "sstat"} << "4200";
  DaemonProcess jouled(DaemonOptions{.config_toml = fake.config});
  ASSERT_TRUE(jouled.start()) << jouled.log();
  const std::string id = jouled.submit(slurm_job(fake.dir));
  ASSERT_FALSE(id.empty()) << jouled.log();
  ASSERT_EQ(jouled.wait_state(id, {"running"})["state"], "running") << jouled.log();
  const json running = joule::testing::wait_until(
      [&] { return jouled.call("GET", "/v1/jobs/" + id).second; },
      [](const json& job) { return job.contains("energy_so_far") && job["energy_so_far"]["source"] == "slurm"; });
  ASSERT_TRUE(running.contains("energy_so_far")) << running.dump(2) << jouled.log();
  EXPECT_DOUBLE_EQ(running["energy_so_far"]["joules"].get<double>(), 4200.0) << running.dump(2);
  EXPECT_EQ(running["energy_so_far"]["source"], "slurm") << running.dump(2);
  EXPECT_EQ(running["energy_so_far"]["measured"], true);
  EXPECT_NE(jouled.log().find("running jobs' energy is read from sstat"), std::string::npos) << jouled.log();

  std::ofstream{fake.state / "done"};
  const json done = jouled.wait_state(id, {"succeeded", "failed", "cancelled"});
  EXPECT_EQ(done["state"], "succeeded") << done.dump(2);
  EXPECT_DOUBLE_EQ(done["energy"]["joules"].get<double>(), 15230.0) << "sacct's, once it ended";
  std::filesystem::remove_all(fake.dir);
}
