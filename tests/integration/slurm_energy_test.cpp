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
        echo "JobId=$(basename "$f") UserId=$(id -un)($(id -u)) JobState=COMPLETED Reason=None NodeList=localhost ExitCode=0:0 StartTime=$t EndTime=$((t + 1)) Comment=$comment"
      done
      [ $found = 1 ] || echo "No jobs in the system"
    fi
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

}  // namespace

TEST(SlurmEnergyTest, a_slurm_job_on_a_metered_cluster_gets_its_energy_from_sacct_labelled_slurm) {
  char pattern[] = "/tmp/joule-fake-slurm-XXXXXX";
  const std::filesystem::path dir = ::mkdtemp(pattern);
  std::filesystem::permissions(dir, std::filesystem::perms::all);
  const auto bin = dir / "bin";
  std::filesystem::create_directories(bin);
  std::ofstream(bin / "fake-slurm") << fake_slurm(dir / "state");
  std::filesystem::permissions(bin / "fake-slurm",
                               std::filesystem::perms::owner_all | std::filesystem::perms::group_read |
                                   std::filesystem::perms::group_exec | std::filesystem::perms::others_read |
                                   std::filesystem::perms::others_exec);
  for (const char* tool : {"sbatch", "scontrol", "sacct", "scancel"})
    std::filesystem::create_symlink(bin / "fake-slurm", bin / tool);
  const std::string config = fmt::format(
      "[node]\nname = \"head\"\n[probing]\nenabled = false\n"
      "[[devices]]\nname = \"sim:laptop-cpu\"\nprobes = 40\n"
      "[slurm]\nbin_dir = \"{}\"\nworkdir = \"{}\"\npoll_seconds = 0.3\n"
      "[[slurm.node_types]]\nname = \"cpu\"\npartition = \"joule\"\nslots = 1\nmodel = \"sim:laptop-cpu\"\nprobes = "
      "40\n",
      bin.string(), dir.string());
  DaemonProcess jouled(DaemonOptions{.config_toml = config});
  ASSERT_TRUE(jouled.start()) << jouled.log();
  const json spec{
      {"name", "metered"},
      {"model",
       {{"input", {{"shape", {64}}}},
        {"layers",
         {{{"type", "linear"}, {"out_features", 32}}, {{"type", "relu"}}, {{"type", "linear"}, {"out_features", 4}}}},
        {"loss", "cross_entropy"}}},
      {"training", {{"batch_size", 32}, {"epochs", 1}, {"samples_per_epoch", 3200}}},
      {"run", {{"command", {"true"}}, {"workdir", dir.string()}}},
      {"constraints", {{"devices", {"slurm:cpu/*"}}}}};
  const std::string id = jouled.submit(spec);
  ASSERT_FALSE(id.empty()) << jouled.log();
  const json done = jouled.wait_state(id, {"succeeded", "failed", "cancelled"});
  EXPECT_EQ(done["state"], "succeeded") << done.dump(2) << jouled.log();
  EXPECT_EQ(done["energy"]["source"], "slurm") << done.dump(2);
  EXPECT_EQ(done["energy"]["measured"], true) << done.dump(2);
  EXPECT_DOUBLE_EQ(done["energy"]["joules"].get<double>(), 15230.0) << "the batch step's, the job's own line empty";
  EXPECT_NE(done["energy"]["scope"].get<std::string>().find("sacct ConsumedEnergyRaw"), std::string::npos)
      << done.dump(2);
  EXPECT_NE(jouled.log().find("energy accounting acct_gather_energy/rapl"), std::string::npos) << jouled.log();
  std::filesystem::remove_all(dir);
}
