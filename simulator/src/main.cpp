// joule-sim: replays a job trace on a simulated cluster under the policy and the baselines.
// Usage: joule-sim --cluster CLUSTER.toml --trace JOBS.jsonl --policy POLICY.toml [--json]

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "joule/cli/command_docs.hpp"
#include "joule/config/policy_config.hpp"
#include "joule/simulator/cluster.hpp"
#include "joule/simulator/replay.hpp"
#include "joule/simulator/report.hpp"
#include "joule/simulator/trace.hpp"
#include "joule/simulator/world.hpp"

namespace {

int fail(const std::string& message) {
  fmt::print(stderr, "joule-sim: {}\n", message);
  return 1;
}

// What `joule-sim --man-page` says besides its options (packaging/ installs the page).
joule::cli::ManPage man_page() {
  joule::cli::ManPage page;
  page.name = "joule-sim";
  page.source = "joule " JOULE_VERSION;
  page.description = {
      "joule-sim replays a job trace on simulated edge and server devices and reports, for the policy of a "
      "policy file, the same policy choosing devices' knob settings too (power limits, CPU frequency caps, "
      "Jetson power modes), and the baselines (fifo, round-robin, least-loaded, flops-greedy, a Zeus-like "
      "just-in-time power-limit tuner, and an oracle that knows every job's true cost, with and without knobs) "
      "run on the same trace from scratch, the energy, waits, makespan, deadline misses, budget violations and "
      "throttle actions. The scheduler code is jouled's; the devices, their energy models "
      "and the clock are simulated.",
      "Every joule it reports is simulated: the simulator's truth, never a measurement.",
      "The cluster file (TOML) names the nodes, their devices (by simulated profile), batteries and solar "
      "input; the trace has one job per line (JSON) with its arrival, model, training and constraints; the "
      "policy files are jouled's policies.d files. Errors in any input name the file and line (for the trace, "
      "the JSON pointer too)."};
  page.sections = {
      {"EXIT STATUS",
       {{"0", "The replay ran."}, {"1", "An input could not be read or is invalid; the message says where."}}},
      {"SEE ALSO", {{"", "jouled(1), joulectl(1); simulator/README.md in Joule's source."}}}};
  return page;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace joule;
  CLI::App app{
      "joule-sim: replay a job trace on simulated devices under a policy and the baselines "
      "(every joule it reports is simulated)"};
  std::string cluster_path, trace_path;
  std::vector<std::string> policy_paths;
  bool as_json = false;
  std::uint64_t seed = 1;
  std::optional<double> horizon_hours;
  std::size_t probes = 0;
  double truth_sigma = 0.08;
  std::vector<std::string> only;
  std::string events;
  std::string knob_probes = "layers";
  app.add_option("--cluster", cluster_path, "cluster TOML: nodes, devices, batteries, solar")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--trace", trace_path, "job trace, JSON Lines")->required()->check(CLI::ExistingFile);
  app.add_option("--policy", policy_paths, "policy TOML (as in policies.d; several apply in the order given)")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_flag("--json", as_json, "print JSON instead of a table");
  app.add_option("--seed", seed, "seed of the probe noise and the run-to-run variation (default 1)");
  app.add_option("--horizon-hours", horizon_hours, "stop the replay this many virtual hours after the start")
      ->check(CLI::PositiveNumber);
  app.add_option("--probes", probes, "probes per device, overriding the cluster file (fewer: faster, less sure)")
      ->check(CLI::PositiveNumber);
  app.add_option("--truth-sigma", truth_sigma, "log-normal sigma of the per-job run-to-run variation (default 0.08)")
      ->check(CLI::Range(0.0, 2.0));
  app.add_option("--knob-probes", knob_probes,
                 "what the knob responses are learnt from: layers (THOR probe networks, default) or networks (the "
                 "trace's own networks measured at every setting)")
      ->check(CLI::IsMember({"layers", "networks"}));
  app.add_option("--only", only, "run only these policies (names as in the output: min-energy, fifo, oracle...)");
  app.add_option("--events", events, "print the event log (starts, finishes, waits, throttling) of this run to stderr");
  joule::cli::add_man_page_flag(app, man_page());
  CLI11_PARSE(app, argc, argv);

  try {
    auto cluster = simulator::load_cluster(cluster_path);
    if (!cluster) return fail(cluster.error().message);
    auto trace = simulator::load_trace(trace_path);
    if (!trace) return fail(trace.error().message);
    std::vector<std::pair<std::string, std::string>> files;
    for (const auto& path : policy_paths) {
      std::ifstream in(path);
      if (!in) return fail(fmt::format("{}: cannot read the policy file", path));
      std::stringstream text;
      text << in.rdbuf();
      files.emplace_back(path, text.str());
    }
    auto policy = config::parse_policy_files(files);
    if (!policy) return fail(policy.error().message);
    for (const auto& warning : policy->warnings) fmt::print(stderr, "joule-sim: warning: {}\n", warning.describe());

    simulator::WorldOptions world_options;
    world_options.seed = seed;
    world_options.probes = probes;
    world_options.truth_sigma = truth_sigma;
    world_options.knob_probes = knob_probes == "networks" ? simulator::WorldOptions::KnobProbes::networks
                                                          : simulator::WorldOptions::KnobProbes::layers;
    world_options.threads = std::max(1u, std::thread::hardware_concurrency());
    const auto learn_start = std::chrono::steady_clock::now();
    auto world = simulator::build_world(*cluster, *trace, policy->policy, world_options);
    if (!world) return fail(world.error().message);
    const double learn_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - learn_start).count();

    simulator::SimulationReport report;
    report.cluster = cluster_path;
    report.trace = trace_path;
    report.policy = policy->policy.source;
    report.seed = seed;
    report.devices = world->devices.size();
    report.jobs = world->jobs.size();
    report.notes = world->notes;
    report.notes.push_back(
        fmt::format("device models learnt from simulated probes in {:.1f} s of wall time", learn_seconds));
    simulator::ReplayOptions replay_options;
    replay_options.horizon_hours = horizon_hours;
    // Packing (cores side by side, jobs on several GPUs) is compared with one job per device.
    const bool shared_cores =
        std::any_of(world->devices.begin(), world->devices.end(),
                    [](const simulator::SimDevice& device) { return device.cores > 0; }) ||
        std::any_of(world->jobs.begin(), world->jobs.end(), [](const simulator::SimJob& job) { return job.gpus > 1; });
    for (const auto& run :
         simulator::standard_runs(policy->policy, world->carbon.has_value(), shared_cores, world->price.has_value())) {
      if (!only.empty() && std::find(only.begin(), only.end(), run.name) == only.end()) continue;
      simulator::ReplayOptions options = replay_options;
      if (run.name == events)
        options.on_event = [](schedulers::UnixMillis at, const std::string& text) {
          fmt::print(stderr, "{} {}\n", schedulers::format_rfc3339(at), text);
        };
      report.runs.push_back(simulator::replay(*world, run, options));
    }
    if (as_json)
      std::cout << simulator::to_json(report).dump(2) << "\n";
    else
      std::cout << simulator::format_table(report);
    return 0;
  } catch (const std::exception& error) {
    return fail(error.what());
  }
}
