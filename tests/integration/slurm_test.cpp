// jouled placing onto a real single-host Slurm: submit, suspend, resume, cancel, a failing
// job, Slurm's own error message, and exactly-once hand-off across a slurmctld killed right
// after submissions. Run by tests/slurm/run.sh, which brings Slurm up and sets
// JOULE_SLURM_RUN_DIR and SLURM_CONF; skipped without them.

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "daemon_process.hpp"

using joule::testing::DaemonOptions;
using joule::testing::DaemonProcess;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

std::string env_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

json wait_until(const std::function<json()>& read, const std::function<bool(const json&)>& done,
                std::chrono::milliseconds timeout = 30s) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  json last;
  while (std::chrono::steady_clock::now() < until) {
    last = read();
    if (done(last)) return last;
    std::this_thread::sleep_for(100ms);
  }
  return last;
}

std::vector<std::string> lines_of(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::size_t line_count(const std::filesystem::path& path) { return lines_of(path).size(); }

class SlurmThroughJouled : public ::testing::Test {
 protected:
  void SetUp() override {
    run_dir_ = env_or_empty("JOULE_SLURM_RUN_DIR");
    if (run_dir_.empty() || env_or_empty("SLURM_CONF").empty())
      GTEST_SKIP() << "needs a Slurm from scripts/slurm-up.sh (ctest runs this through tests/slurm/run.sh)";
    char pattern[] = "/tmp/joule-slurm-jobs-XXXXXX";
    work_ = ::mkdtemp(pattern);
    std::filesystem::permissions(work_, std::filesystem::perms::all);
  }
  void TearDown() override {
    std::error_code ec;
    if (!work_.empty()) std::filesystem::remove_all(work_, ec);
  }

  std::unique_ptr<DaemonProcess> start_jouled(int slots) {
    const std::string config = fmt::format(
        "[node]\nname = \"head\"\n[probing]\nenabled = false\n"
        "[[devices]]\nname = \"sim:laptop-cpu\"\nprobes = 40\n"
        "[slurm]\nconf = \"{}\"\nworkdir = \"{}\"\npoll_seconds = 0.3\n"
        "[[slurm.node_types]]\nname = \"cpu\"\npartition = \"joule\"\nslots = {}\nmodel = \"sim:laptop-cpu\"\n"
        "probes = 40\nthreads = 3\n"
        "[[slurm.node_types]]\nname = \"odd\"\npartition = \"joule\"\nconstraint = \"no-such-feature\"\nslots = 1\n"
        "model = \"sim:server-gpu\"\nprobes = 40\n",
        env_or_empty("SLURM_CONF"), work_.string(), slots);
    auto daemon = std::make_unique<DaemonProcess>(DaemonOptions{.config_toml = config});
    EXPECT_TRUE(daemon->start()) << daemon->log();
    return daemon;
  }

  json job(const std::string& name, const std::string& script, const std::string& devices = "slurm:cpu/*") const {
    return {{"name", name},
            {"model",
             {{"input", {{"shape", {64}}}},
              {"layers", {{{"type", "linear"}, {"out_features", 32}}, {{"type", "relu"}}, {{"type", "linear"}, {"out_features", 4}}}},
              {"loss", "cross_entropy"}}},
            {"training", {{"batch_size", 32}, {"epochs", 1}, {"samples_per_epoch", 3200}}},
            {"run", {{"command", {"/bin/sh", "-c", script}}, {"workdir", work_.string()}}},
            {"constraints", {{"devices", {devices}}}}};
  }

  // Slurm's own state of the job whose comment carries `joule_id` (scontrol, as Slurm says it).
  std::string slurm_state(const std::string& joule_id) const {
    const auto [code, text] = joule::testing::run_program(
        {"/usr/bin/scontrol", "show", "job", "--oneliner"}, {{"SLURM_CONF", env_or_empty("SLURM_CONF")}});
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      if (line.find("Comment=joule:" + joule_id) == std::string::npos) continue;
      const auto at = line.find("JobState=");
      if (at != std::string::npos) return line.substr(at + 9, line.find(' ', at) - at - 9);
    }
    return "";
  }

  // What Slurm captured of a job's stdout and stderr.
  std::string output_of(const std::string& joule_id) const {
    std::string text;
    for (const char* stream : {"out", "err"}) {
      std::ifstream in(work_ / fmt::format("joule-{}.{}", joule_id, stream));
      text += fmt::format("--- {}:\n{}\n", stream, std::string(std::istreambuf_iterator<char>(in), {}));
    }
    return text;
  }

  std::filesystem::path run_dir_;
  std::filesystem::path work_;
};

}  // namespace

TEST_F(SlurmThroughJouled, submit_suspend_resume_cancel_a_failing_job_and_slurms_own_errors) {
  auto jouled = start_jouled(2);
  const auto ticks = work_ / "ticks";

  const std::string ticking =
      jouled->submit(job("ticking", fmt::format("while :; do echo x >> {}; sleep 0.1; done", ticks.string())));
  ASSERT_FALSE(ticking.empty());
  json running = jouled->wait_state(ticking, {"running"});
  ASSERT_EQ(running["state"], "running") << running.dump(2) << jouled->log();
  EXPECT_EQ(running["device"].get<std::string>().rfind("slurm:cpu/", 0), 0u) << running.dump(2);
  ASSERT_EQ(slurm_state(ticking + ".1"), "RUNNING");
  // Slurm says RUNNING before its batch step has started the command (about a second here):
  // the command must have run a little before pausing means anything.
  ASSERT_GE(wait_until([&] { return json(line_count(ticks)); }, [](const json& n) { return n.get<std::size_t>() >= 3; })
                .get<std::size_t>(),
            3u)
      << output_of(ticking + ".1");

  // Paused by hand: jouled suspends it in Slurm, and its output stops growing.
  auto [paused_code, paused] = jouled->call("POST", "/v1/jobs/" + ticking + "/pause");
  EXPECT_EQ(paused_code, 200u) << paused.dump(2);
  const json suspended = wait_until([&] { return json(slurm_state(ticking + ".1")); },
                                    [](const json& s) { return s == "SUSPENDED"; });
  ASSERT_EQ(suspended, "SUSPENDED");
  EXPECT_EQ(jouled->call("GET", "/v1/jobs/" + ticking).second["state"], "throttled");
  std::this_thread::sleep_for(300ms);
  const auto frozen = line_count(ticks);
  std::this_thread::sleep_for(700ms);
  EXPECT_EQ(line_count(ticks), frozen) << "a suspended job must not run";

  auto [resumed_code, resumed] = jouled->call("POST", "/v1/jobs/" + ticking + "/resume");
  EXPECT_EQ(resumed_code, 200u) << resumed.dump(2);
  ASSERT_EQ(wait_until([&] { return json(slurm_state(ticking + ".1")); }, [](const json& s) { return s == "RUNNING"; }),
            "RUNNING");
  EXPECT_GT(wait_until([&] { return json(line_count(ticks)); }, [&](const json& n) { return n.get<std::size_t>() > frozen; },
                       10s)
                .get<std::size_t>(),
            frozen)
      << output_of(ticking + ".1") << jouled->log();

  // Cancelled: scancel, and the job ends cancelled.
  auto [cancel_code, cancel] = jouled->call("DELETE", "/v1/jobs/" + ticking);
  EXPECT_LT(cancel_code, 300u) << cancel.dump(2);
  const json cancelled = jouled->wait_state(ticking, {"cancelled", "failed", "succeeded"});
  EXPECT_EQ(cancelled["state"], "cancelled") << cancelled.dump(2);
  EXPECT_EQ(wait_until([&] { return json(slurm_state(ticking + ".1")); }, [](const json& s) { return s == "CANCELLED"; }),
            "CANCELLED");

  // joulectl nodes shows the node types and what was handed over.
  const auto [nodes_code, nodes_text] = joule::testing::run_program(
      {JOULECTL_BINARY, "--server", fmt::format("http://127.0.0.1:{}", jouled->port()), "nodes"});
  EXPECT_EQ(nodes_code, 0) << nodes_text;
  EXPECT_NE(nodes_text.find("slurm:cpu"), std::string::npos) << nodes_text;

  // A failing job fails with its exit code; a good one succeeds, charged its estimate (no meter there).
  const std::string failing = jouled->submit(job("failing", "exit 3"));
  // The good one also writes the thread count and allocator settings it was given (the node
  // type's `threads`, the probes' malloc settings), as a local device's jobs get them.
  const auto seen = work_ / "environment-seen";
  const std::string good = jouled->submit(
      job("good",
          fmt::format("echo hello; echo \"$OMP_NUM_THREADS $JOULE_THREADS $MALLOC_MMAP_MAX_\" > {}", seen.string())));
  const json failed = jouled->wait_state(failing, {"failed", "succeeded", "cancelled"});
  EXPECT_EQ(failed["state"], "failed") << failed.dump(2);
  EXPECT_EQ(failed["exit_code"], 3) << failed.dump(2);
  const json succeeded = jouled->wait_state(good, {"failed", "succeeded", "cancelled"});
  EXPECT_EQ(succeeded["state"], "succeeded") << succeeded.dump(2);
  EXPECT_EQ(succeeded["energy"]["source"], "simulated") << succeeded.dump(2);
  EXPECT_EQ(succeeded["energy"]["measured"], false);
  std::ifstream seen_file(seen);
  std::string seen_line;
  std::getline(seen_file, seen_line);
  EXPECT_EQ(seen_line, "3 3 0") << output_of(good + ".1");

  // Slurm refuses a node type's constraint: the job fails with Slurm's own words.
  const std::string refused = jouled->submit(job("refused", "true", "slurm:odd/*"));
  const json refusal = jouled->wait_state(refused, {"failed", "succeeded", "cancelled"});
  EXPECT_EQ(refusal["state"], "failed") << refusal.dump(2);
  EXPECT_NE(refusal["reason"].get<std::string>().find("sbatch: error"), std::string::npos) << refusal.dump(2);
}

TEST_F(SlurmThroughJouled, every_job_runs_exactly_once_when_slurmctld_is_killed_right_after_submissions) {
  constexpr int kJobs = 8;
  auto jouled = start_jouled(kJobs);
  const auto marks = work_ / "marks";
  std::vector<std::string> ids;
  for (int i = 0; i < kJobs; ++i)
    ids.push_back(jouled->submit(job(fmt::format("once-{}", i), fmt::format("echo $JOULE_JOB_ID >> {}; sleep 1", marks.string()))));
  for (const auto& id : ids) ASSERT_FALSE(id.empty());
  // Every job handed to Slurm (pending or running there), then the controller crashes at once.
  const json handed = wait_until(
      [&] {
        int count = 0;
        for (const auto& id : ids) count += slurm_state(id + ".1").empty() ? 0 : 1;
        return json(count);
      },
      [&](const json& n) { return n.get<int>() == kJobs; }, 20s);
  ASSERT_EQ(handed.get<int>(), kJobs) << jouled->log();
  const auto [code, out] = joule::testing::run_program(
      {"/bin/bash", std::string(JOULE_SOURCE_DIR) + "/scripts/slurm-restart-ctld.sh", run_dir_.string()});
  ASSERT_EQ(code, 0) << out;

  // The controller lost the jobs of its last seconds and hands their ids out again, while the
  // node may still be running (or just ending) one of them: Slurm then drains the node
  // ("Duplicate jobid") and holds the new job ("launch failed requeued held"), eligible again
  // only 2 min later. jouled releases its own held job; resuming a drained node is the
  // operator's part, done here as one would.
  // One deadline for all jobs, well inside ctest's TIMEOUT, so a failure is reported (and Slurm
  // torn down) instead of killed.
  const auto scontrol = [&](std::vector<std::string> words) {
    words.insert(words.begin(), "/usr/bin/scontrol");
    return joule::testing::run_program(words, {{"SLURM_CONF", env_or_empty("SLURM_CONF")}});
  };
  std::map<std::string, json> ended;
  wait_until(
      [&] {
        const auto [node_code, node] = scontrol({"show", "node", "localhost", "--oneliner"});
        if (node.find("DRAIN") != std::string::npos && node.find("Duplicate jobid") != std::string::npos)
          scontrol({"update", "nodename=localhost", "state=resume"});
        for (const auto& id : ids) {
          if (ended.contains(id)) continue;
          auto [code, body] = jouled->call("GET", "/v1/jobs/" + id);
          const auto state = body.value("state", "");
          if (state == "succeeded" || state == "failed" || state == "cancelled") ended[id] = body;
        }
        return json(ended.size());
      },
      [&](const json& n) { return n.get<std::size_t>() == ids.size(); }, 280s);
  const auto slurms_view = [&] { return scontrol({"show", "job", "--oneliner"}).second; };
  for (const auto& id : ids) {
    ASSERT_TRUE(ended.contains(id)) << id << " did not end\n" << slurms_view() << jouled->log();
    EXPECT_EQ(ended[id]["state"], "succeeded") << ended[id].dump(2) << slurms_view() << jouled->log();
  }
  const auto ran = lines_of(marks);
  for (const auto& id : ids) EXPECT_EQ(std::count(ran.begin(), ran.end(), id), 1) << id << "\n" << jouled->log();
  EXPECT_EQ(ran.size(), ids.size());
}
