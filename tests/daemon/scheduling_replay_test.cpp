// One trace through jouled's job book and through joule-sim's replay: both drive the same
// scheduling core, so the same submissions, estimates and run times give the same placements
// at the same moments. jouled runs here as a coordinator (its agents' reports are the test's;
// no processes), on a manual clock moved from event to event.

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "job_book.hpp"
#include "joule/schedulers/time_format.hpp"
#include "joule/simulator/replay.hpp"
#include "reported_job.hpp"

using joule::schedulers::UnixMillis;
using nlohmann::json;

namespace {

constexpr UnixMillis kStart = 1'900'000'000'000;

// Three agents' devices, cheapest per job varying with the network.
const std::vector<std::pair<std::string, std::string>> kDevices = {
    {"agent-1", "cpu"}, {"agent-2", "cpu"}, {"agent-3", "cuda:0"}};

struct TraceJob {
  std::string name;
  UnixMillis submit = 0;
  int priority = 0;
  std::optional<UnixMillis> deadline;
  std::vector<std::size_t> devices;     // the devices it may use
  std::vector<double> estimate_joules;  // on each of kDevices
  std::vector<double> estimate_seconds;
  double truth_factor = 1.0;  // its true cost: the estimate times this (the same on every device)
};

// A seeded trace: bursts that queue work, deadlines, priorities, jobs held to some devices, and
// true run times off the estimates both ways (so devices free earlier and later than expected).
std::vector<TraceJob> make_trace(unsigned seed, std::size_t count) {
  std::mt19937 random(seed);
  auto uniform = [&](double low, double high) { return std::uniform_real_distribution<double>(low, high)(random); };
  std::vector<TraceJob> out;
  UnixMillis at = kStart + 1'000;
  for (std::size_t i = 0; i < count; ++i) {
    TraceJob job;
    job.name = "job-" + std::to_string(i);
    at += static_cast<UnixMillis>(uniform(i % 7 < 4 ? 3.0 : 200.0, i % 7 < 4 ? 40.0 : 900.0) * 1000.0) + 7;
    job.submit = at;
    job.priority = i % 5 == 0 ? 2 : 0;
    const double work = uniform(60.0, 600.0);  // seconds on the slowest device
    job.estimate_seconds = {work, work * uniform(0.8, 1.2), work * uniform(0.15, 0.5)};
    job.estimate_joules = {work * 15.0, job.estimate_seconds[1] * uniform(12.0, 18.0),
                           job.estimate_seconds[2] * uniform(40.0, 120.0)};
    job.devices = i % 6 == 3 ? std::vector<std::size_t>{0, 1} : std::vector<std::size_t>{0, 1, 2};
    if (i % 4 == 1) job.deadline = job.submit + static_cast<UnixMillis>(work * uniform(0.5, 3.0) * 1000.0);
    job.truth_factor = uniform(0.7, 1.4);
    out.push_back(std::move(job));
  }
  return out;
}

UnixMillis true_millis(const TraceJob& job, std::size_t device) {
  return static_cast<UnixMillis>(std::llround(job.estimate_seconds[device] * job.truth_factor * 1000.0));
}

struct Start {
  UnixMillis at = 0;
  std::string device;
  bool operator==(const Start&) const = default;
};
std::ostream& operator<<(std::ostream& out, const Start& start) {
  return out << start.device << " at +" << (start.at - kStart) << " ms";
}

// joule-sim's side: a World with the trace's estimates and truths.
std::map<std::string, Start> through_the_simulator(const std::vector<TraceJob>& trace) {
  joule::simulator::World world;
  world.start = kStart;
  for (const auto& [node, device] : kDevices) {
    world.nodes.push_back({node, std::nullopt, std::nullopt});
    world.devices.push_back({joule::schedulers::DeviceRef{node, device, {}}, world.nodes.size() - 1, "test", 0.0});
  }
  for (const auto& job : trace) {
    joule::simulator::SimJob sim;
    sim.id = job.name;
    sim.name = job.name;
    sim.submit = job.submit;
    sim.priority = job.priority;
    sim.deadline = job.deadline;
    for (const std::size_t d : job.devices) {
      joule::simulator::JobCost cost;
      cost.device = d;
      cost.estimate =
          joule::schedulers::Estimate{job.estimate_joules[d], 0.1 * job.estimate_joules[d], job.estimate_seconds[d]};
      const double seconds = static_cast<double>(true_millis(job, d)) / 1000.0;
      cost.truth = {job.estimate_joules[d] * job.truth_factor, seconds};
      sim.costs.push_back(cost);
    }
    world.jobs.push_back(std::move(sim));
  }
  std::map<std::string, Start> starts;
  joule::simulator::ReplayOptions options;
  options.on_placement = [&](UnixMillis at, const joule::schedulers::Placement& placement) {
    starts[placement.job] = {at, world.devices[placement.device].ref.qualified()};
  };
  const joule::simulator::PolicyRun run{"min-energy", joule::schedulers::Policy{},
                                        joule::simulator::Knowledge::estimates, false};
  const auto metrics = joule::simulator::replay(world, run, options);
  EXPECT_EQ(metrics.completed, trace.size()) << metrics.end_reason;
  return starts;
}

// jouled's side: the job book as a coordinator, its agents played by the test.
class Coordinator : joule::testing::JobBook {
 public:
  Coordinator() : JobBook({}, kStart) {
    for (const auto& [node, device] : kDevices) {
      joule::cluster::ReportedDevice reported;
      reported.name = device;
      reported.source = "rapl";
      jobs_.nodes().update_node(node, {reported});
    }
  }

  std::map<std::string, Start> replay(const std::vector<TraceJob>& trace) {
    std::map<std::string, const TraceJob*> by_name;
    for (const auto& job : trace) by_name[job.name] = &job;
    estimate_with([&](const joule::schedulers::JobSpec& spec) {
      const TraceJob& job = *by_name.at(spec.name);
      std::vector<joule::daemon::EstimateRow> rows;
      for (const std::size_t d : job.devices)
        rows.push_back(joule::testing::estimate_row(kDevices[d].first + "/" + kDevices[d].second, "modelled",
                                                    job.estimate_joules[d], 0.1 * job.estimate_joules[d],
                                                    job.estimate_seconds[d]));
      return rows;
    });
    std::size_t next = 0;
    while (true) {
      std::optional<UnixMillis> at;
      if (next < trace.size()) at = trace[next].submit;
      for (const auto& [id, run] : running_) at = std::min(at.value_or(run.ends), run.ends);
      if (!at) break;
      clock_.advance(std::chrono::milliseconds(*at - clock_.unix_ms()));
      // As in the simulator: what ends at this moment first, then what is submitted.
      for (auto it = running_.begin(); it != running_.end();) {
        if (it->second.ends != *at) {
          ++it;
          continue;
        }
        auto ended = joule::testing::reported_job(it->first, it->second.epoch, "succeeded");
        ended.started_ms = it->second.started;
        ended.finished_ms = *at;
        ended.energy_joules = it->second.joules;
        ended.energy_source = "rapl";
        ended.exit_code = 0;
        (void)jobs_.nodes().apply_reports(it->second.node, {ended});
        it = running_.erase(it);
      }
      for (; next < trace.size() && trace[next].submit == *at; ++next) submit(trace[next]);
      start_what_was_placed(by_name);
    }
    return starts_;
  }

 private:
  void submit(const TraceJob& job) {
    std::vector<std::string> devices;
    for (const std::size_t d : job.devices) devices.push_back(kDevices[d].first + "/" + kDevices[d].second);
    json body = {{"name", job.name},
                 {"priority", job.priority},
                 {"run", {{"command", {"train"}}}},
                 {"model", {{"input", {{"shape", {1, 8}}}}, {"layers", {{{"type", "linear"}, {"out_features", 2}}}}}},
                 {"training", {{"batch_size", 8}, {"epochs", 1}, {"samples_per_epoch", 64}}},
                 {"constraints", {{"devices", devices}}}};
    if (job.deadline) body["constraints"]["deadline"] = joule::schedulers::format_rfc3339(*job.deadline);
    const auto answer = JobBook::submit(body);
    ASSERT_TRUE(answer) << job.name << ": " << answer.error().message;
    names_[(*answer)["id"]] = job.name;
  }

  // Every placement published to an agent starts there now and ends after its true time.
  void start_what_was_placed(const std::map<std::string, const TraceJob*>& by_name) {
    ASSERT_TRUE(run_until([&] { return jobs_.writes_in_flight() == 0; }));
    for (std::size_t d = 0; d < kDevices.size(); ++d) {
      const std::string& node = kDevices[d].first;
      for (const auto& assignment : jobs_.nodes().desired_for(node)) {
        if (running_.contains(assignment.id)) continue;
        const std::string& name = names_.at(assignment.id);
        const TraceJob& job = *by_name.at(name);
        const UnixMillis now = clock_.unix_ms();
        starts_[name] = {now, node + "/" + assignment.device};
        running_[assignment.id] = {node, assignment.epoch, now, now + true_millis(job, d),
                                   job.estimate_joules[d] * job.truth_factor};
        auto report = joule::testing::reported_job(assignment.id, assignment.epoch, "running");
        report.started_ms = now;
        (void)jobs_.nodes().apply_reports(node, {report});
      }
    }
    ASSERT_TRUE(run_until([&] { return jobs_.writes_in_flight() == 0; }));
  }

  struct Run {
    std::string node;
    std::int64_t epoch = 0;
    UnixMillis started = 0;
    UnixMillis ends = 0;
    double joules = 0.0;
  };

  std::map<std::string, std::string> names_;  // job id → trace name
  std::map<std::string, Run> running_;        // by job id
  std::map<std::string, Start> starts_;       // by trace name
};

TEST(SchedulingReplayTest, jouled_and_joule_sim_place_one_trace_alike) {
  const auto trace = make_trace(20261127, 40);
  const auto simulated = through_the_simulator(trace);
  Coordinator coordinator;
  const auto daemon = coordinator.replay(trace);
  ASSERT_EQ(simulated.size(), trace.size());
  ASSERT_EQ(daemon.size(), trace.size());
  std::size_t waited = 0;
  std::set<std::string> devices_used;
  for (const auto& job : trace) {
    EXPECT_EQ(daemon.at(job.name), simulated.at(job.name)) << job.name;
    if (simulated.at(job.name).at > job.submit) ++waited;
    devices_used.insert(simulated.at(job.name).device);
  }
  // The trace is worth comparing: jobs queue, and every device is used.
  EXPECT_GE(waited, trace.size() / 4);
  EXPECT_EQ(devices_used.size(), kDevices.size());
}

}  // namespace
