// slurm_adapter_bench: what the Slurm adapter costs over plain sbatch, on one Slurm, in one run.
// Run by bench/slurm_adapter_bench.sh (which brings up the single-host Slurm of
// scripts/slurm-up.sh); alone it needs SLURM_CONF.
//
// Alternating rounds of
//   adapter: SlurmCli::submit (sbatch --parsable --comment ... --export=ALL --wrap <script>),
//            then SlurmCli::list() every 5 ms until the job shows RUNNING;
//   plain:   sbatch --parsable --wrap '<same command>' (sbatch's defaults: --export=ALL of the caller's environment),
//            then squeue -h -j ID -o %T every 5 ms until RUNNING;
// each job writes the wall clock when its command starts and sleeps 1 s; the next round starts
// when the node is idle again. Prints p50/p90/mean of: the submit call, submit → RUNNING as
// seen by polling, submit → the job's command running.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "joule/adapters/command_runner.hpp"
#include "joule/adapters/slurm.hpp"

namespace {

using Clock = std::chrono::system_clock;
using joule::adapters::run_command;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

struct Sample {
  double submit_ms = 0;
  double running_ms = 0;  // submit → RUNNING, polled
  double started_ms = 0;  // submit → the command's first line
};

struct Series {
  std::vector<double> values;
  std::string line(const char* what) const {
    auto v = values;
    std::sort(v.begin(), v.end());
    auto pct = [&](double p) { return v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5)]; };
    const double mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
    return fmt::format("{:<28} p50 {:8.1f}  p90 {:8.1f}  mean {:8.1f}  (ms, n={})", what, pct(0.5), pct(0.9), mean,
                       v.size());
  }
};

// The job's command writes the wall clock (ns) when it starts.
double started_ms(const std::filesystem::path& stamp, Clock::time_point submitted) {
  for (int i = 0; i < 2000; ++i) {
    std::ifstream in(stamp);
    long long ns = 0;
    if (in >> ns && ns > 0) {
      const auto at = Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(ns)));
      return std::chrono::duration<double, std::milli>(at - submitted).count();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return -1;
}

void wait_idle() {
  for (int i = 0; i < 2000; ++i) {
    auto out = run_command({"squeue", "-h", "-t", "PD,R,CG,CF,S", "-o", "%i"});
    if (out && out->success() && out->out.empty()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 10;
  if (std::getenv("SLURM_CONF") == nullptr) {
    fmt::print(stderr, "slurm_adapter_bench: set SLURM_CONF (bench/slurm_adapter_bench.sh does)\n");
    return 2;
  }
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("joule-slurm-bench-{}", ::getpid());
  std::filesystem::create_directories(dir);
  joule::adapters::SlurmCli cli;
  std::vector<Sample> adapter, plain;

  for (int round = 0; round < rounds; ++round) {
    {  // adapter
      wait_idle();
      const auto stamp = dir / fmt::format("a{}", round);
      joule::adapters::SlurmSubmission s;
      s.joule_id = fmt::format("bench-{}-{}", ::getpid(), round);
      s.partition = "joule";
      s.argv = {"/bin/sh", "-c", "date +%s%N > \"$0\"; sleep 1", stamp.string()};
      s.workdir = dir.string();
      s.stdout_path = "/dev/null";
      s.stderr_path = "/dev/null";
      Sample sample;
      const auto t0 = Clock::now();
      auto id = cli.submit(s);
      sample.submit_ms = ms_since(t0);
      if (!id) {
        fmt::print(stderr, "{}\n", id.error().message);
        return 1;
      }
      for (bool running = false; !running;) {
        auto jobs = cli.list();
        for (const auto& job : jobs ? *jobs : std::vector<joule::adapters::SlurmJob>{}) {
          running = running || (job.slurm_id == *id && job.state != "PENDING");
        }
        if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      sample.running_ms = ms_since(t0);
      sample.started_ms = started_ms(stamp, t0);
      adapter.push_back(sample);
    }
    {  // plain sbatch, sbatch's defaults
      wait_idle();
      const auto stamp = dir / fmt::format("p{}", round);
      Sample sample;
      const auto t0 = Clock::now();
      auto out = run_command({"sbatch", "--parsable", "--partition=joule", "--output=/dev/null",
                              fmt::format("--chdir={}", dir.string()),
                              fmt::format("--wrap=date +%s%N > {}; sleep 1", stamp.string())});
      sample.submit_ms = ms_since(t0);
      if (!out || !out->success()) {
        fmt::print(stderr, "plain sbatch failed: {}\n", out ? out->err : out.error().message);
        return 1;
      }
      const std::string id = out->out.substr(0, out->out.find_first_of(";\n"));
      for (;;) {
        auto state = run_command({"squeue", "-h", "-j", id, "-o", "%T"});
        if (state && state->success() && !state->out.empty() && state->out.rfind("PENDING", 0) != 0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      sample.running_ms = ms_since(t0);
      sample.started_ms = started_ms(stamp, t0);
      plain.push_back(sample);
    }
  }
  wait_idle();
  std::filesystem::remove_all(dir);

  auto report = [](const char* who, const std::vector<Sample>& samples) {
    Series submit, running, started;
    for (const auto& s : samples) {
      submit.values.push_back(s.submit_ms);
      running.values.push_back(s.running_ms);
      started.values.push_back(s.started_ms);
    }
    fmt::print("{}\n  {}\n  {}\n  {}\n", who, submit.line("submit call"), running.line("submit -> RUNNING (polled)"),
               started.line("submit -> command started"));
  };
  report("adapter (SlurmCli::submit, list() polling, --export=ALL, clean env)", adapter);
  report("plain sbatch (--wrap, squeue -j polling, --export=ALL)", plain);
  return 0;
}
