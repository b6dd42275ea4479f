#include "joule/schedulers/job.hpp"

#include <gtest/gtest.h>

using joule::schedulers::JobState;
using joule::schedulers::parse_job_spec;
using nlohmann::json;

namespace {

json minimal_job() { return json::parse(R"({"name": "t", "run": {"command": ["python3", "train.py"]}})"); }

std::string error_pointer(const json& body) {
  auto parsed = parse_job_spec(body);
  return parsed ? "<accepted>" : parsed.error().where;
}

}  // namespace

TEST(JobSpecTest, parses_the_architecture_example) {
  auto spec = parse_job_spec(json::parse(R"({
    "name": "lenet-mnist",
    "model": {"input": {"shape": [1, 28, 28]}, "layers": [{"type": "flatten"}, {"type": "linear", "out_features": 10}],
              "loss": "cross_entropy"},
    "training": {"batch_size": 64, "epochs": 5, "samples_per_epoch": 60000},
    "run": {"command": ["python3", "train.py"], "workdir": "/srv/lenet", "env": {"SEED": "1"}},
    "constraints": {"devices": ["cuda:*", "cpu"], "deadline": "2026-12-01T18:00:00Z", "max_energy_joules": 500000},
    "priority": 3})"));
  ASSERT_TRUE(spec) << spec.error().message << " at " << spec.error().where;
  EXPECT_EQ(spec->run.argv, (std::vector<std::string>{"python3", "train.py"}));
  EXPECT_EQ(spec->run.env.at("SEED"), "1");
  EXPECT_EQ(spec->priority, 3);
  EXPECT_EQ(*spec->constraints.max_energy_joules, 500000);
  ASSERT_TRUE(spec->constraints.deadline);
  // The canonical form parses back to the same thing.
  auto again = parse_job_spec(joule::schedulers::to_json(*spec));
  ASSERT_TRUE(again);
  EXPECT_EQ(joule::schedulers::to_json(*again), joule::schedulers::to_json(*spec));
}

TEST(JobSpecTest, not_before_must_come_before_the_deadline) {
  json body = minimal_job();
  body["constraints"] = {{"not_before", "2026-12-01T08:00:00Z"}, {"deadline", "2026-12-01T18:00:00Z"}};
  auto spec = parse_job_spec(body);
  ASSERT_TRUE(spec) << spec.error().message;
  EXPECT_EQ(joule::schedulers::to_json(*spec)["constraints"]["not_before"], "2026-12-01T08:00:00.000Z");
  body["constraints"]["not_before"] = "2026-12-01T19:00:00Z";
  auto late = parse_job_spec(body);
  ASSERT_FALSE(late);
  EXPECT_EQ(late.error().where, "/constraints/not_before");
  EXPECT_NE(late.error().message.find("must be before constraints.deadline"), std::string::npos);
  body["constraints"]["not_before"] = "tomorrow";
  EXPECT_EQ(error_pointer(body), "/constraints/not_before");
}

TEST(JobSpecTest, every_bad_field_is_named_by_pointer) {
  json body = minimal_job();
  body["run"]["command"] = json::array();
  EXPECT_EQ(error_pointer(body), "/run/command");
  body["run"]["command"] = "python3 train.py";
  EXPECT_EQ(error_pointer(body), "/run/command");
  body["run"]["command"] = json::array({"python3", 7});
  EXPECT_EQ(error_pointer(body), "/run/command/1");
  body = minimal_job();
  body["run"]["workdir"] = "relative/dir";
  EXPECT_EQ(error_pointer(body), "/run/workdir");
  body = minimal_job();
  body["run"]["env"] = json{{"A", 1}};
  EXPECT_EQ(error_pointer(body), "/run/env/A");
  body = minimal_job();
  body.erase("run");
  EXPECT_EQ(error_pointer(body), "/run");
  body = minimal_job();
  body["priority"] = "high";
  EXPECT_EQ(error_pointer(body), "/priority");
  body = minimal_job();
  body["constraints"] = json{{"deadline", "tomorrow"}};
  EXPECT_EQ(error_pointer(body), "/constraints/deadline");
  body = minimal_job();
  body["constraints"] = json{{"max_energy_joules", -1}};
  EXPECT_EQ(error_pointer(body), "/constraints/max_energy_joules");
  for (const json slowdown : {json(0), json(11), json("10%")}) {
    body = minimal_job();
    body["constraints"] = json{{"max_slowdown", slowdown}};
    EXPECT_EQ(error_pointer(body), "/constraints/max_slowdown") << slowdown;
  }
  body = minimal_job();
  body["colour"] = "blue";
  EXPECT_EQ(error_pointer(body), "/colour");
  body = minimal_job();
  body["model"] = json{{"input", {{"shape", {1}}}}, {"layers", {{{"type", "linear"}}}}};
  EXPECT_EQ(error_pointer(body), "/model/layers/0/out_features");
  EXPECT_EQ(error_pointer(json::array()), "");
}

json builtin_job() {
  return json::parse(R"({"name": "lenet",
    "model": {"input": {"shape": [1, 28, 28]}, "layers": [{"type": "flatten"}, {"type": "linear", "out_features": 10}]},
    "training": {"batch_size": 64, "epochs": 2, "samples_per_epoch": 600, "eat": {"lambda": 0.1, "sigma": 0.001}},
    "run": {"builtin": {"dataset": {"format": "mnist-idx", "images": "/data/i", "labels": "/data/l"},
                        "checkpoint": "/shared/ckpt"}}})");
}

TEST(JobSpecTest, a_builtin_run_trains_the_jobs_own_spec_and_round_trips) {
  auto spec = parse_job_spec(builtin_job());
  ASSERT_TRUE(spec) << spec.error().message << " at " << spec.error().where;
  ASSERT_TRUE(spec->run.builtin);
  EXPECT_TRUE(spec->run.argv.empty());
  EXPECT_EQ(spec->run.builtin->dataset["format"], "mnist-idx");
  EXPECT_EQ(spec->run.builtin->checkpoint_directory, "/shared/ckpt");
  ASSERT_TRUE(spec->training->eat);
  EXPECT_DOUBLE_EQ(spec->training->eat->lambda, 0.1);
  EXPECT_DOUBLE_EQ(spec->training->eat->sigma, 0.001);
  auto again = parse_job_spec(joule::schedulers::to_json(*spec));
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(joule::schedulers::to_json(*again), joule::schedulers::to_json(*spec));
  // No dataset: synthetic data; checkpoints in the job's own directory unless told otherwise.
  json body = builtin_job();
  body["run"] = json{{"builtin", json::object()}};
  spec = parse_job_spec(body);
  ASSERT_TRUE(spec) << spec.error().message;
  EXPECT_TRUE(spec->run.builtin->checkpoints);
  EXPECT_TRUE(spec->run.builtin->checkpoint_directory.empty());
  body["run"] = json{{"builtin", {{"checkpoint", false}}}};
  spec = parse_job_spec(body);
  ASSERT_TRUE(spec) << spec.error().message;
  EXPECT_FALSE(spec->run.builtin->checkpoints);
}

TEST(JobSpecTest, a_builtin_run_that_cannot_train_is_refused_naming_the_field) {
  auto with_run = [](json run) {
    json body = builtin_job();
    body["run"] = std::move(run);
    return error_pointer(body);
  };
  EXPECT_EQ(with_run({{"builtin", {{"dataset", {}}}}, {"command", {"x"}}}), "/run/builtin");
  EXPECT_EQ(with_run({{"builtin", "mnist"}}), "/run/builtin");
  EXPECT_EQ(with_run({{"builtin", {{"dataset", "mnist"}}}}), "/run/builtin/dataset");
  EXPECT_EQ(with_run({{"builtin", {{"checkpoint", "relative/dir"}}}}), "/run/builtin/checkpoint");
  EXPECT_EQ(with_run({{"builtin", {{"eat", true}}}}), "/run/builtin/eat");
  json body = builtin_job();
  body.erase("training");
  EXPECT_EQ(error_pointer(body), "/training");
  body.erase("model");
  EXPECT_EQ(error_pointer(body), "/model");
  // EAT's settings, each named.
  body = builtin_job();
  body["training"]["eat"] = {{"lambda", -1}};
  EXPECT_EQ(error_pointer(body), "/training/eat/lambda");
  body["training"]["eat"] = {{"lambda", 0.1}, {"sigma", 0}};
  EXPECT_EQ(error_pointer(body), "/training/eat/sigma");
  body["training"]["eat"] = {{"sigma", 0.1}};
  EXPECT_EQ(error_pointer(body), "/training/eat/lambda");
  body["training"]["eat"] = {{"lambda", 0.1}, {"beta", 1}};
  EXPECT_EQ(error_pointer(body), "/training/eat/beta");
  body["training"]["eat"] = 0.1;
  EXPECT_EQ(error_pointer(body), "/training/eat");
}

TEST(JobSpecTest, knobs_are_checked_by_field_and_round_trip) {
  json body = minimal_job();
  body["knobs"] = {{"cpu_max_frequency_mhz", 1600}, {"cpu_energy_preference", "balance_power"}};
  auto spec = parse_job_spec(body);
  ASSERT_TRUE(spec) << spec.error().message;
  EXPECT_DOUBLE_EQ(*spec->knobs.cpu_max_frequency_mhz, 1600);
  EXPECT_TRUE(spec->knobs.wants_cpu());
  EXPECT_EQ(joule::schedulers::to_json(*spec)["knobs"], body["knobs"]);
  auto again = parse_job_spec(joule::schedulers::to_json(*spec));
  ASSERT_TRUE(again);
  EXPECT_EQ(joule::schedulers::to_json(*again), joule::schedulers::to_json(*spec));
  EXPECT_FALSE(joule::schedulers::to_json(*parse_job_spec(minimal_job())).contains("knobs"));
  body["knobs"] = {{"power_mode", 2}, {"gpu_power_limit_watts", 150}};  // a mode goes with any knob
  spec = parse_job_spec(body);
  ASSERT_TRUE(spec) << spec.error().message;
  EXPECT_EQ(*spec->knobs.power_mode, "2");
  EXPECT_TRUE(spec->knobs.wants_gpu());

  const std::vector<std::pair<json, std::string>> bad = {
      {json::array(), "/knobs"},
      {{{"cpu_max_frequency_mhz", 0}}, "/knobs/cpu_max_frequency_mhz"},
      {{{"cpu_max_frequency_mhz", "fast"}}, "/knobs/cpu_max_frequency_mhz"},
      {{{"gpu_power_limit_watts", 1e9}}, "/knobs/gpu_power_limit_watts"},
      {{{"cpu_energy_preference", "eco"}}, "/knobs/cpu_energy_preference"},
      {{{"nvpmodel", 2}}, "/knobs/nvpmodel"},
      {{{"power_mode", ""}}, "/knobs/power_mode"},
      {{{"power_mode", -1}}, "/knobs/power_mode"},
      {{{"cpu_max_frequency_mhz", 1600}, {"gpu_power_limit_watts", 200}}, "/knobs/gpu_power_limit_watts"},
      {{{"cpu_energy_preference", "power"}, {"gpu_max_frequency_mhz", 600}}, "/knobs/gpu_max_frequency_mhz"},
      {{{"gpu_max_frequency_mhz", 0}}, "/knobs/gpu_max_frequency_mhz"},
  };
  for (const auto& [knobs, pointer] : bad) {
    body["knobs"] = knobs;
    EXPECT_EQ(error_pointer(body), pointer) << knobs;
  }
}

TEST(JobSpecTest, resources_ask_for_cores_checked_by_field_and_round_trip) {
  json body = minimal_job();
  body["resources"] = {{"cores", 2}};
  auto spec = parse_job_spec(body);
  ASSERT_TRUE(spec) << spec.error().message;
  EXPECT_EQ(spec->resources.cores, 2);
  EXPECT_EQ(spec->shared_cores(), 2) << "it holds two cores of a device that shares them";
  EXPECT_EQ(joule::schedulers::to_json(*spec)["resources"], body["resources"]);
  body["knobs"] = {{"cpu_max_frequency_mhz", 1600}};
  EXPECT_EQ(parse_job_spec(body)->shared_cores(), 0) << "its knobs reach the whole device: it holds all of it";
  body.erase("knobs");
  EXPECT_FALSE(joule::schedulers::to_json(*parse_job_spec(minimal_job())).contains("resources"));
  const std::vector<std::pair<json, std::string>> bad = {
      {json::array(), "/resources"},          {{{"cores", 0}}, "/resources/cores"},
      {{{"cores", -2}}, "/resources/cores"},  {{{"cores", 1.5}}, "/resources/cores"},
      {{{"cores", "2"}}, "/resources/cores"}, {{{"cores", 100000}}, "/resources/cores"},
      {{{"gpus", 0}}, "/resources/gpus"},     {{{"gpus", 65}}, "/resources/gpus"},
      {{{"gpus", 1.5}}, "/resources/gpus"},   {{{"cores", 2}, {"gpus", 2}}, "/resources/gpus"},
      {{{"memory", 2}}, "/resources/memory"},
  };
  for (const auto& [resources, pointer] : bad) {
    body["resources"] = resources;
    EXPECT_EQ(error_pointer(body), pointer) << resources;
  }
}

TEST(JobSpecTest, resources_cores_may_be_a_range_placement_chooses_from) {
  json body = minimal_job();
  body["resources"] = {{"cores", {{"min", 2}, {"max", 8}}}};
  auto spec = parse_job_spec(body);
  ASSERT_TRUE(spec) << spec.error().message;
  EXPECT_EQ(spec->resources.cores, 2);
  EXPECT_EQ(spec->resources.cores_max, 8);
  EXPECT_TRUE(spec->chooses_cores());
  EXPECT_EQ(spec->shared_cores(), 2) << "its least, until placement chooses";
  EXPECT_EQ(joule::schedulers::to_json(*spec)["resources"], body["resources"]);
  body["resources"] = {{"cores", {{"min", 4}, {"max", 4}}}};
  EXPECT_FALSE(parse_job_spec(body)->chooses_cores()) << "one count: nothing to choose";
  const std::vector<std::pair<json, std::string>> bad = {
      {{{"cores", {{"min", 0}, {"max", 4}}}}, "/resources/cores/min"},
      {{{"cores", {{"min", 2}, {"max", 5000}}}}, "/resources/cores/max"},
      {{{"cores", {{"min", 4}, {"max", 2}}}}, "/resources/cores/max"},
      {{{"cores", {{"min", 2}}}}, "/resources/cores"},
      {{{"cores", {{"min", 2}, {"max", 4}, {"step", 2}}}}, "/resources/cores/step"},
  };
  for (const auto& [resources, pointer] : bad) {
    body["resources"] = resources;
    EXPECT_EQ(error_pointer(body), pointer) << resources;
  }
}

TEST(JobSpecTest, resources_ask_for_gpus_held_whole_by_one_job) {
  json body = minimal_job();
  body["resources"] = {{"gpus", 4}};
  auto spec = parse_job_spec(body);
  ASSERT_TRUE(spec) << spec.error().message;
  EXPECT_EQ(spec->device_count(), 4);
  EXPECT_EQ(spec->shared_cores(), 0);
  EXPECT_EQ(joule::schedulers::to_json(*spec)["resources"], body["resources"]);
  EXPECT_EQ(parse_job_spec(minimal_job())->device_count(), 1);
  body["knobs"] = {{"gpu_power_limit_watts", 200}};
  auto limited = parse_job_spec(body);
  ASSERT_TRUE(limited) << "a job on several GPUs sets the limit on each: " << limited.error().message;
  EXPECT_EQ(limited->knobs.gpu_power_limit_watts, 200);
  body["resources"] = {{"gpus", 1}};
  EXPECT_TRUE(parse_job_spec(body)) << "one GPU may set its knobs";
}

TEST(JobSpecTest, device_patterns_are_globs) {
  joule::schedulers::Constraints constraints;
  EXPECT_TRUE(joule::schedulers::device_allowed(constraints, "cpu"));
  constraints.devices = {"cuda:*"};
  EXPECT_TRUE(joule::schedulers::device_allowed(constraints, "cuda:1"));
  EXPECT_FALSE(joule::schedulers::device_allowed(constraints, "cpu"));
  constraints.devices = {"cuda:*", "cpu"};
  EXPECT_TRUE(joule::schedulers::device_allowed(constraints, "cpu"));
}

TEST(JobStateTest, lifecycle_allows_only_the_documented_transitions) {
  using joule::schedulers::can_transition;
  EXPECT_TRUE(can_transition(JobState::queued, JobState::placed));
  EXPECT_TRUE(can_transition(JobState::placed, JobState::running));
  EXPECT_TRUE(can_transition(JobState::running, JobState::throttled));
  EXPECT_TRUE(can_transition(JobState::throttled, JobState::running));
  EXPECT_TRUE(can_transition(JobState::running, JobState::succeeded));
  EXPECT_TRUE(can_transition(JobState::placed, JobState::queued));  // node lost
  EXPECT_TRUE(can_transition(JobState::queued, JobState::cancelled));
  EXPECT_FALSE(can_transition(JobState::queued, JobState::running));
  EXPECT_FALSE(can_transition(JobState::queued, JobState::succeeded));
  EXPECT_FALSE(can_transition(JobState::succeeded, JobState::failed));
  EXPECT_FALSE(can_transition(JobState::cancelled, JobState::queued));
}

TEST(JobStateTest, names_round_trip) {
  for (auto state : {JobState::queued, JobState::placed, JobState::running, JobState::throttled, JobState::succeeded,
                     JobState::failed, JobState::cancelled}) {
    EXPECT_EQ(joule::schedulers::job_state_from_string(joule::schedulers::to_string(state)), state);
  }
  EXPECT_FALSE(joule::schedulers::job_state_from_string("done"));
}
