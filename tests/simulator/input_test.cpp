// joule-sim's inputs: the cluster TOML and the JSONL trace, their errors with line numbers.

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <numbers>

#include "example_models.hpp"
#include "joule/estimator/simulated_device.hpp"
#include "joule/schedulers/policy.hpp"
#include "joule/simulator/cluster.hpp"
#include "joule/simulator/trace.hpp"
#include "joule/simulator/world.hpp"
#include "temp_dir.hpp"

namespace joule::simulator {
namespace {

const char* kCluster = R"(start = "2026-11-26T06:00:00Z"
utc_offset_minutes = 60

[[nodes]]
name = "jetson-1"
groups = ["edge"]
devices = [{name = "cuda:0", profile = "jetson-orin", probes = 40, idle_watts = 4.5}]
battery = {capacity_wh = 100, start_percent = 80}
solar = {peak_watts = 30, sunrise_hour = 7, sunset_hour = 19}

[[nodes]]
name = "server"
devices = [{name = "cuda:0", profile = "server-gpu"}, {name = "cuda:1", profile = "server-gpu"}]
)";

std::string problems(const std::string& text) {
  auto parsed = parse_cluster(text, "c.toml");
  return parsed ? "(accepted)" : parsed.error().message;
}

// A model reader over an in-memory set of files.
ModelReader files(std::map<std::string, nlohmann::json> models) {
  return [models = std::move(models)](const std::string& path) -> Result<nlohmann::json> {
    auto it = models.find(path);
    if (it == models.end()) return make_error(ErrorCode::not_found, "cannot read model spec " + path);
    return it->second;
  };
}

std::string trace_error(const std::string& text) {
  auto parsed = parse_trace(text, "t.jsonl", files({{"lenet.json", testing::example_model("lenet5")}}));
  return parsed ? "(accepted)" : parsed.error().message;
}

WorldOptions few_probes() {
  WorldOptions options;
  options.probes = 5;
  return options;
}

const std::string kTraining = R"("training": {"batch_size": 32, "epochs": 1, "samples_per_epoch": 1000})";

}  // namespace

TEST(ClusterTest, a_cluster_file_is_read_with_defaults_filled_in) {
  auto cluster = parse_cluster(kCluster, "c.toml");
  ASSERT_TRUE(cluster) << cluster.error().message;
  EXPECT_EQ(cluster->start, schedulers::parse_rfc3339("2026-11-26T06:00:00Z"));
  EXPECT_EQ(cluster->utc_offset_minutes, 60);
  ASSERT_EQ(cluster->nodes.size(), 2u);
  const auto& jetson = cluster->nodes[0];
  EXPECT_EQ(jetson.groups, std::vector<std::string>{"edge"});
  EXPECT_EQ(jetson.devices[0].probes, 40u);
  EXPECT_DOUBLE_EQ(jetson.devices[0].idle_watts, 4.5);
  EXPECT_DOUBLE_EQ(jetson.battery->capacity_wh, 100.0);
  EXPECT_DOUBLE_EQ(jetson.solar->peak_watts, 30.0);
  const auto& server = cluster->nodes[1];
  ASSERT_EQ(server.devices.size(), 2u);
  EXPECT_EQ(server.devices[1].name, "cuda:1");
  EXPECT_EQ(server.devices[1].probes, 300u);
  EXPECT_DOUBLE_EQ(server.devices[1].idle_watts, estimator::find_simulated_profile("server-gpu")->static_watts);
  EXPECT_FALSE(server.battery);
}

TEST(ClusterTest, every_problem_is_reported_with_its_file_and_line) {
  const std::string text = R"([[nodes]]
name = "a"
devices = [{name = "cpu", profile = "cray-1"}]
colour = "red"

[[nodes]]
name = "a"
devices = [{name = "cpu", profile = "laptop-cpu", probes = 0, cores = 1}]
solar = {peak_watts = 10}
)";
  const std::string message = problems(text);
  EXPECT_NE(message.find("c.toml:3: nodes[0].devices[0].profile: no simulated profile \"cray-1\""), std::string::npos)
      << message;
  EXPECT_NE(message.find("c.toml:4: unknown key nodes[0].colour"), std::string::npos) << message;
  EXPECT_NE(message.find("c.toml:7: nodes[1].name \"a\" is used twice"), std::string::npos) << message;
  EXPECT_NE(message.find("c.toml:8: nodes[1].devices[0].probes must be an integer from 1 to 100000"), std::string::npos)
      << message;
  EXPECT_NE(message.find("c.toml:8: nodes[1].devices[0].cores must be a whole number of cores from 2 to 4096"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("c.toml:9: nodes[1].solar needs a battery"), std::string::npos) << message;
  // In line order, one per line.
  EXPECT_LT(message.find("c.toml:3:"), message.find("c.toml:4:"));
  EXPECT_EQ(std::count(message.begin(), message.end(), '\n'), 5);
}

TEST(ClusterTest, syntax_errors_and_missing_parts_name_the_line) {
  EXPECT_EQ(problems("[[nodes]]\nname = \"a\"\ndevices = [\n").substr(0, 9), "c.toml:3:");
  EXPECT_NE(problems("").find("c.toml:1: no nodes"), std::string::npos);
  EXPECT_NE(problems("[[nodes]]\nname = \"a\"\n").find("c.toml:1: nodes[0].devices must be a non-empty array"),
            std::string::npos);
  EXPECT_NE(problems("start = \"yesterday\"\n[[nodes]]\nname = \"a\"\ndevices = [{name = \"cpu\", profile = "
                     "\"laptop-cpu\"}]\n")
                .find("c.toml:1: start \"yesterday\" is not an RFC 3339 time"),
            std::string::npos);
}

TEST(ClusterTest, a_carbon_signal_file_is_read_beside_the_cluster_file_and_its_errors_name_the_row) {
  joule::testing::TempDir dir;
  const std::string cluster_text =
      "carbon = \"grid.csv\"\n[[nodes]]\nname = \"n\"\ndevices = [{name = \"cpu\", profile = \"laptop-cpu\"}]\n";
  std::ofstream(dir.path() / "cluster.toml") << cluster_text;
  std::ofstream(dir.path() / "grid.csv") << "time,gco2_per_kwh\n2026-11-26T00:00:00Z,300\n2026-11-26T01:00:00Z,200\n";
  auto cluster = load_cluster(dir.path() / "cluster.toml");
  ASSERT_TRUE(cluster) << cluster.error().message;
  ASSERT_TRUE(cluster->carbon);
  EXPECT_EQ(cluster->carbon->points().size(), 2u);

  std::ofstream(dir.path() / "grid.csv") << "time,gco2_per_kwh\n2026-11-26T00:00:00Z,300\n2026-11-26T01:00:00Z,much\n";
  auto bad = load_cluster(dir.path() / "cluster.toml");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message,
            (dir.path() / "grid.csv").string() + ":3: \"much\" is not a number 0-5000 (gCO2e/kWh)");
  std::filesystem::remove(dir.path() / "grid.csv");
  auto missing = load_cluster(dir.path() / "cluster.toml");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("carbon: cannot read"), std::string::npos);
  // Without a carbon key, no signal.
  EXPECT_FALSE(
      parse_cluster("[[nodes]]\nname = \"n\"\ndevices = [{name = \"cpu\", profile = \"laptop-cpu\"}]\n", "c.toml")
          ->carbon);
}

TEST(ClusterTest, solar_power_is_a_half_sine_and_its_energy_is_integrated_in_closed_form) {
  const SolarSpec solar{40.0, 6.0, 18.0};
  EXPECT_DOUBLE_EQ(solar_watts(solar, 12.0), 40.0);
  EXPECT_DOUBLE_EQ(solar_watts(solar, 5.0), 0.0);
  EXPECT_NEAR(solar_watts(solar, 9.0), 40.0 * std::sin(std::numbers::pi / 4), 1e-9);
  const auto midnight = schedulers::parse_rfc3339("2026-11-26T00:00:00Z").value();
  const double day = 40.0 * 12.0 * 2.0 / std::numbers::pi * 3600.0;  // peak × length × 2/π, in joules
  EXPECT_NEAR(solar_joules(solar, midnight, midnight + 86'400'000, 0), day, 1e-6 * day);
  EXPECT_NEAR(solar_joules(solar, midnight, midnight + 2 * 86'400'000 + 6 * 3'600'000, 0), 2 * day, 1e-6 * day);
  EXPECT_NEAR(solar_joules(solar, midnight, midnight + 12 * 3'600'000, 0), day / 2, 1e-6 * day);
  // Local time: at UTC+2 the local noon is 10:00 UTC.
  EXPECT_NEAR(solar_joules(solar, midnight, midnight + 10 * 3'600'000, 120), day / 2, 1e-6 * day);
}

TEST(TraceTest, jobs_are_read_with_models_inline_or_by_path) {
  const std::string text = "{\"at\": 60, \"name\": \"a\", \"model\": \"lenet.json\", " + kTraining +
                           ", \"constraints\": {\"devices\": [\"cuda:*\"], \"deadline_seconds\": 3600, "
                           "\"max_energy_joules\": 5000, \"max_slowdown\": 0.2}, \"priority\": 2}\n\n"
                           "{\"at\": 0, \"model\": " +
                           testing::example_model("mlp").dump() + ", " + kTraining + "}\n";
  auto trace = parse_trace(text, "t.jsonl", files({{"lenet.json", testing::example_model("lenet5")}}));
  ASSERT_TRUE(trace) << trace.error().message;
  ASSERT_EQ(trace->jobs.size(), 2u);
  const auto& a = trace->jobs[0];
  EXPECT_EQ(a.name, "a");
  EXPECT_DOUBLE_EQ(a.at_seconds, 60.0);
  EXPECT_EQ(a.model.name, "lenet5");
  EXPECT_EQ(a.devices, std::vector<std::string>{"cuda:*"});
  EXPECT_EQ(a.deadline_seconds, 3600.0);
  EXPECT_EQ(a.max_energy_joules, 5000.0);
  EXPECT_EQ(a.max_slowdown, 0.2);
  EXPECT_FALSE(trace->jobs[1].max_slowdown);
  EXPECT_EQ(a.priority, 2);
  EXPECT_EQ(trace->jobs[1].name, "job-3");  // named by its line
  EXPECT_EQ(trace->jobs[1].line, 3);
}

TEST(TraceTest, errors_name_the_line_and_the_json_pointer) {
  const std::string ok = "{\"at\": 0, \"model\": \"lenet.json\", " + kTraining + "}\n";
  EXPECT_EQ(trace_error(ok + "{\"at\": 1,\n").substr(0, 16), "t.jsonl:2: not J");
  EXPECT_EQ(trace_error(ok + "[1]\n"), "t.jsonl:2: each line must be one JSON object (a job)");
  EXPECT_EQ(trace_error(ok + ok + "{\"at\": -1}\n"), "t.jsonl:3: /at: must be a number of seconds >= 0");
  EXPECT_EQ(trace_error("{\"at\": 0, \"model\": \"lenet.json\", \"training\": {\"batch_size\": 0, \"epochs\": 1, "
                        "\"samples_per_epoch\": 10}}\n"),
            "t.jsonl:1: /training/batch_size: training batch_size must be an integer >= 1");
  EXPECT_EQ(
      trace_error("{\"at\": 0, \"model\": \"lenet.json\", " + kTraining + ", \"constraints\": {\"devices\": [7]}}"),
      "t.jsonl:1: /constraints/devices/0: must be a non-empty string");
  EXPECT_EQ(
      trace_error("{\"at\": 0, \"model\": \"lenet.json\", " + kTraining + ", \"colour\": 1}"),
      "t.jsonl:1: /colour: unknown field (known: at, name, model, training, constraints, priority, owner, project, "
      "resources)");
  EXPECT_EQ(trace_error("{\"at\": 0, \"model\": \"lenet.json\", " + kTraining + ", \"resources\": {\"cores\": 0}}"),
            "t.jsonl:1: /resources/cores: must be a whole number of cores from 1 to 4096");
  EXPECT_EQ(trace_error("{\"at\": 0, \"model\": \"lenet.json\", " + kTraining + ", \"resources\": {\"gpus\": 0}}"),
            "t.jsonl:1: /resources/gpus: must be a whole number of GPUs from 1 to 64");
  EXPECT_EQ(trace_error("{\"at\": 0, \"model\": \"lenet.json\", " + kTraining +
                        ", \"resources\": {\"cores\": 2, \"gpus\": 2}}"),
            "t.jsonl:1: /resources/gpus: cores and gpus together: cores are a CPU's, gpus GPUs'");
  EXPECT_EQ(trace_error("{\"at\": 0, \"model\": \"lenet.json\", " + kTraining + ", \"resources\": {\"memory\": 2}}"),
            "t.jsonl:1: /resources/memory: unknown field (known: cores, gpus)");
  EXPECT_EQ(trace_error("{\"at\": 0, \"model\": \"lenet.json\", " + kTraining + ", \"owner\": 7}"),
            "t.jsonl:1: /owner: must be a non-empty string");
  EXPECT_EQ(trace_error("{\"at\": 0, \"model\": \"nope.json\", " + kTraining + "}"),
            "t.jsonl:1: /model: cannot read model spec nope.json");
  EXPECT_EQ(trace_error("{\"at\": 0, \"model\": {\"input\": {\"shape\": [4]}, \"layers\": [{\"type\": \"warp\"}]}, " +
                        kTraining + "}")
                .rfind("t.jsonl:1: /model/layers/0/type: ", 0),
            0u);
  EXPECT_EQ(trace_error("{\"at\": 0, \"model\": \"lenet.json\", " + kTraining +
                        ", \"constraints\": {\"deadline_seconds\": 0}}"),
            "t.jsonl:1: /constraints/deadline_seconds: must be a number of seconds > 0");
  EXPECT_EQ(trace_error("{\"at\": 0, \"model\": \"lenet.json\", " + kTraining +
                        ", \"constraints\": {\"deadline_seconds\": 60, \"not_before_seconds\": 60}}"),
            "t.jsonl:1: /constraints/not_before_seconds: must be less than deadline_seconds");
  EXPECT_EQ(
      trace_error("{\"at\": 0, \"model\": \"lenet.json\", " + kTraining + ", \"constraints\": {\"max_slowdown\": 0}}"),
      "t.jsonl:1: /constraints/max_slowdown: must be a fraction > 0 and at most 10 (0.1: at most 10 % slower at "
      "a knob setting)");
}

TEST(TraceTest, a_job_no_device_can_take_is_refused_with_its_line) {
  auto cluster = parse_cluster(kCluster, "c.toml");
  const std::string text = "{\"at\": 0, \"model\": \"lenet.json\", " + kTraining + "}\n" +
                           "{\"at\": 0, \"model\": \"lenet.json\", " + kTraining +
                           ", \"constraints\": {\"devices\": [\"tpu:*\"]}}\n";
  auto trace = parse_trace(text, "t.jsonl", files({{"lenet.json", testing::example_model("lenet5")}}));
  ASSERT_TRUE(trace);
  auto world = build_world(*cluster, *trace, schedulers::Policy{}, few_probes());
  ASSERT_FALSE(world);
  EXPECT_EQ(world.error().message, "t.jsonl:2: /constraints/devices: no device of the cluster matches");
}

TEST(TraceTest, device_constraints_match_qualified_and_bare_names_and_groups_come_from_both_files) {
  auto cluster = parse_cluster(kCluster, "c.toml");
  const std::string text = "{\"at\": 0, \"model\": \"lenet.json\", " + kTraining +
                           ", \"constraints\": {\"devices\": [\"server/cuda:1\"]}}\n" +
                           "{\"at\": 0, \"model\": \"lenet.json\", " + kTraining +
                           ", \"constraints\": {\"devices\": [\"cuda:0\"]}}\n";
  auto trace = parse_trace(text, "t.jsonl", files({{"lenet.json", testing::example_model("lenet5")}}));
  schedulers::Policy policy;
  policy.groups.push_back({"lab", {"server"}});
  auto world = build_world(*cluster, *trace, policy, few_probes());
  ASSERT_TRUE(world) << world.error().message;
  ASSERT_EQ(world->devices.size(), 3u);
  EXPECT_EQ(world->devices[0].ref.groups, std::vector<std::string>{"edge"});
  EXPECT_EQ(world->devices[2].ref.groups, std::vector<std::string>{"lab"});
  ASSERT_EQ(world->jobs[0].costs.size(), 1u);
  EXPECT_EQ(world->jobs[0].costs[0].device, 2u);
  ASSERT_EQ(world->jobs[1].costs.size(), 2u);  // jetson-1/cuda:0 and server/cuda:0
  EXPECT_EQ(world->jobs[1].costs[0].device, 0u);
  EXPECT_EQ(world->jobs[1].costs[1].device, 1u);
}

TEST(TraceTest, a_job_on_some_of_a_shared_devices_cores_costs_its_slice_and_the_whole_static_power_alone) {
  auto cluster = parse_cluster(
      "[[nodes]]\nname = \"s\"\ndevices = [{name = \"cpu\", profile = \"server-cpu\", cores = 64}]\n", "c.toml");
  ASSERT_TRUE(cluster) << cluster.error().message;
  const std::string text = "{\"at\": 0, \"model\": \"lenet.json\", " + kTraining +
                           ", \"resources\": {\"cores\": 8}}\n" + "{\"at\": 0, \"model\": \"lenet.json\", " +
                           kTraining + "}\n";
  auto trace = parse_trace(text, "t.jsonl", files({{"lenet.json", testing::example_model("lenet5")}}));
  ASSERT_TRUE(trace) << trace.error().message;
  auto world = build_world(*cluster, *trace, schedulers::Policy{}, few_probes());
  ASSERT_TRUE(world) << world.error().message;
  EXPECT_EQ(world->devices[0].cores, 64);
  ASSERT_EQ(world->jobs.size(), 2u);
  EXPECT_EQ(world->jobs[0].cores, 8);
  const JobCost& eight = world->jobs[0].costs[0];
  const JobCost& whole = world->jobs[1].costs[0];
  const double static_watts = estimator::find_simulated_profile("server-cpu")->static_watts;
  EXPECT_DOUBLE_EQ(eight.static_watts, static_watts);
  EXPECT_GT(eight.truth.seconds, whole.truth.seconds) << "fewer cores, longer";
  EXPECT_LT(eight.truth.seconds, 8.0 * whole.truth.seconds) << "the step's serial part does not slow down";
  EXPECT_GT(eight.truth.joules, static_watts * eight.truth.seconds) << "the whole static power, and its own";
  // Each core of this profile is clocked alone (a cpufreq policy per CPU), so the slice has the
  // settings too: its own cores at the setting, the rest of the static power as at the defaults.
  ASSERT_FALSE(whole.settings.empty());
  ASSERT_EQ(eight.settings.size(), whole.settings.size());
  for (const auto& setting : eight.settings) {
    EXPECT_GT(setting.truth.seconds, eight.truth.seconds) << setting.label;
    EXPECT_GT(setting.truth.joules, static_watts * (56.0 / 64.0) * setting.truth.seconds) << setting.label;
  }

  // A Pi's cores share one clock (cpufreq-dt's one policy): a cap for a job on two of them would
  // reach the jobs beside it, so it gets none.
  auto pi = parse_cluster(
      "[[nodes]]\nname = \"p\"\ndevices = [{name = \"cpu\", profile = \"raspberry-pi-4\", cores = 4}]\n", "c.toml");
  ASSERT_TRUE(pi) << pi.error().message;
  auto two = parse_trace("{\"at\": 0, \"model\": \"lenet.json\", " + kTraining + ", \"resources\": {\"cores\": 2}}\n",
                         "t.jsonl", files({{"lenet.json", testing::example_model("lenet5")}}));
  ASSERT_TRUE(two) << two.error().message;
  auto pi_world = build_world(*pi, *two, schedulers::Policy{}, few_probes());
  ASSERT_TRUE(pi_world) << pi_world.error().message;
  EXPECT_TRUE(pi_world->jobs[0].costs[0].settings.empty());
}

TEST(TraceTest, files_are_read_relative_to_the_trace) {
  testing::TempDir dir;
  dir.write("models/lenet.json", testing::example_model("lenet5").dump());
  dir.write("runs/t.jsonl", "{\"at\": 0, \"model\": \"../models/lenet.json\", " + kTraining + "}\n");
  auto trace = load_trace(dir / "runs/t.jsonl");
  ASSERT_TRUE(trace) << trace.error().message;
  EXPECT_EQ(trace->jobs[0].model.name, "lenet5");
  EXPECT_FALSE(load_trace(dir / "missing.jsonl"));
}

}  // namespace joule::simulator
