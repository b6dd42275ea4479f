// The real joule-worker binary as jouled runs it: a child process, JSON on stdout, one line on
// stderr and an exit code (0 ok, 1 run-time failure, 2 bad input) otherwise.

#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <torch/cuda.h>

#include "example_models.hpp"
#include "joule/worker/protocol.hpp"
#include "temp_dir.hpp"

namespace joule::worker {
namespace {

using nlohmann::json;

struct WorkerRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

class WorkerProcessTest : public ::testing::Test {
 protected:
  // Runs `joule-worker <arguments>` (shell words) with stdout and stderr captured in files.
  WorkerRun worker(const std::string& arguments, const std::string& stdin_file = "/dev/null") {
    const auto out = dir_ / "stdout";
    const auto err = dir_ / "stderr";
    const std::string command = fmt::format("'{}' {} < '{}' > '{}' 2> '{}'", JOULE_WORKER_BINARY, arguments, stdin_file,
                                            out.string(), err.string());
    const int status = std::system(command.c_str());
    WorkerRun run;
    run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    run.out = slurp(out);
    run.err = slurp(err);
    return run;
  }

  std::string write_json(const std::string& name, const json& value) { return dir_.write(name, value.dump()).string(); }

  static std::string example(const std::string& name) {
    return fmt::format("{}/examples/models/{}.json", JOULE_SOURCE_DIR, name);
  }

  static json small_request() {
    return {
        {"batch_size", 4},           {"warmup_steps", 1},
        {"steps_per_repetition", 3}, {"repetitions", 3},
        {"meter", "modelled"},       {"networks", {testing::example_model("lenet5"), testing::example_model("mlp")}}};
  }

  testing::TempDir dir_;
};

TEST_F(WorkerProcessTest, probe_gives_positive_modelled_medians) {
  const WorkerRun run = worker("probe --request " + write_json("request.json", small_request()));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  auto result = parse_probe_result(json::parse(run.out));
  ASSERT_TRUE(result) << result.error().where << ": " << result.error().message;
  EXPECT_EQ(result->meter_source, "modelled");
  EXPECT_FALSE(result->measured);
  EXPECT_EQ(result->environment.threads, 1);
  EXPECT_EQ(result->batch_size, 4);
  ASSERT_EQ(result->networks.size(), 2u);
  EXPECT_EQ(result->networks[0].name, "lenet5");
  EXPECT_EQ(result->networks[1].name, "har-mlp");
  for (const auto& network : result->networks) {
    EXPECT_EQ(network.repetitions.size(), 3u);
    EXPECT_GT(network.joules_per_step, 0.0) << network.name;
    EXPECT_GT(network.seconds_per_step, 0.0) << network.name;
  }
  EXPECT_TRUE(run.err.empty()) << run.err;
}

TEST_F(WorkerProcessTest, probe_reads_the_request_from_stdin) {
  const WorkerRun run = worker("probe --request -", write_json("request.json", small_request()));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(parse_probe_result(json::parse(run.out)));
}

TEST_F(WorkerProcessTest, probe_runs_a_batch_of_requests_in_one_process_one_result_line_each) {
  json mlp_only = small_request();
  mlp_only["networks"] = {testing::example_model("mlp")};
  mlp_only["batch_size"] = 8;
  const WorkerRun run = worker("probe --request " + write_json("a.json", small_request()) + " --request " +
                               write_json("b.json", mlp_only));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::istringstream lines(run.out);
  std::vector<ProbeResult> results;
  for (std::string line; std::getline(lines, line);) {
    auto result = parse_probe_result(json::parse(line));
    ASSERT_TRUE(result) << result.error().where << ": " << result.error().message;
    results.push_back(std::move(result).value());
  }
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].networks.size(), 2u);
  EXPECT_EQ(results[0].batch_size, 4);
  ASSERT_EQ(results[1].networks.size(), 1u);
  EXPECT_EQ(results[1].batch_size, 8);
  EXPECT_GT(results[1].networks[0].joules_per_step, 0.0);
}

TEST_F(WorkerProcessTest, a_bad_request_in_a_batch_is_bad_input_before_anything_runs) {
  json bad = small_request();
  bad["batch_size"] = 0;
  const WorkerRun run =
      worker("probe --request " + write_json("a.json", small_request()) + " --request " + write_json("b.json", bad));
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_TRUE(run.out.empty()) << run.out;
  EXPECT_NE(run.err.find("b.json"), std::string::npos) << run.err;
}

TEST_F(WorkerProcessTest, measure_lenet5_as_json) {
  const WorkerRun run = worker(
      fmt::format("measure --model {} --batch-size 4 --steps 3 --warmup 1 --repetitions 3 --json", example("lenet5")));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  auto result = parse_probe_result(json::parse(run.out));
  ASSERT_TRUE(result) << result.error().message;
  ASSERT_EQ(result->networks.size(), 1u);
  EXPECT_EQ(result->networks[0].name, "lenet5");
  EXPECT_GT(result->networks[0].seconds_per_step, 0.0);
  EXPECT_GT(result->networks[0].joules_per_step, 0.0);
  EXPECT_EQ(result->steps_per_repetition, 3);
  EXPECT_FALSE(result->measured);
}

TEST_F(WorkerProcessTest, measure_prints_a_table_that_says_modelled) {
  const WorkerRun run = worker(fmt::format(
      "measure --model {} --batch-size 2 --steps 2 --warmup 1 --repetitions 2 --threads 2", example("mlp")));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("har-mlp"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("NOT a measurement"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("2 thread(s)"), std::string::npos) << run.out;
}

TEST_F(WorkerProcessTest, measure_takes_a_job_and_its_training_config) {
  json job = {{"name", "job-name"},
              {"model", testing::example_model("mlp")},
              {"training", {{"batch_size", 3}, {"samples_per_epoch", 30}, {"optimizer", "adam"}}}};
  job["model"].erase("name");
  const WorkerRun run =
      worker("measure --json --steps 2 --warmup 0 --repetitions 1 --model " + write_json("job.json", job));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json out = json::parse(run.out);
  EXPECT_EQ(out["batch_size"], 3);
  EXPECT_EQ(out["optimizer"], "adam");
  EXPECT_EQ(out["networks"][0]["name"], "job-name");
}

TEST_F(WorkerProcessTest, env_and_meters_print_json) {
  WorkerRun run = worker("env --threads 2");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  json env = json::parse(run.out);
  EXPECT_EQ(env["threads"], 2);
  EXPECT_EQ(env["device"], "cpu");
  EXPECT_FALSE(env["blas"].get<std::string>().empty());
  EXPECT_FALSE(env["fingerprint"].get<std::string>().empty());
  // Debian's LibTorch is CPU-only; a CUDA build names its runtime and the GPUs it sees.
  const std::string cuda = env["cuda"];
  EXPECT_TRUE(cuda.starts_with("none: this LibTorch was built without CUDA") || cuda.starts_with("CUDA Runtime"))
      << cuda;
  EXPECT_EQ(env["fingerprint"].get<std::string>().find("CUDA"), std::string::npos) << "not in the fingerprint";

  run = worker("meters --seconds 0.1");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json meters = json::parse(run.out);
  ASSERT_FALSE(meters["considered"].empty());
  EXPECT_TRUE(meters["considered"].back()["taken"].get<bool>());
  EXPECT_EQ(meters["considered"].back()["source"], meters["meter_source"]);
  EXPECT_GE(meters["joules"].get<double>(), 0.0);
}

TEST_F(WorkerProcessTest, bad_input_exits_2_naming_the_problem) {
  const auto expect_bad = [&](const std::string& arguments, const std::string& needle) {
    const WorkerRun run = worker(arguments);
    EXPECT_EQ(run.exit_code, 2) << arguments << "\n" << run.err;
    EXPECT_NE(run.err.find(needle), std::string::npos) << arguments << "\nstderr: " << run.err;
    EXPECT_TRUE(run.out.empty()) << run.out;
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  };
  expect_bad("probe --request " + (dir_ / "missing.json").string(), "missing.json: cannot open");
  expect_bad("probe --request " + dir_.write("broken.json", "{\"networks\": [").string(), "not JSON");

  json request = small_request();
  request["networks"][1]["layers"][0]["out_features"] = 0;
  expect_bad("probe --request " + write_json("bad_layer.json", request), "/networks/1/layers/0/out_features");
  request = small_request();
  request["networks"][0]["layers"].erase(6);
  expect_bad("probe --request " + write_json("bad_shape.json", request), "/networks/0/layers/6");

  json model = testing::example_model("lenet5");
  model["layers"][3]["type"] = "conv3d";
  expect_bad("measure --model " + write_json("lenet.json", model), "/layers/3/type");
  expect_bad(fmt::format("measure --model {} --device tpu", example("lenet5")), "--device");
  expect_bad(fmt::format("measure --model {} --steps 0", example("lenet5")), "--steps");
  expect_bad("fly", "unknown subcommand \"fly\": use probe, measure, train, runtime, meters or env");
}

// A job of the built-in trainer on a CSV dataset written here: two classes a line apart, an MLP.
json points_job(const testing::TempDir& dir) {
  std::ostringstream csv;
  csv << "x,y,class\n";
  for (int i = 0; i < 240; ++i) {
    // A grid visited in a scrambled order (7 is prime to 240), so the held-out rows are like the rest.
    const int cell = (7 * i) % 240;
    const double x = (cell % 24) / 12.0 - 1.0, y = (cell / 24) / 5.0 - 1.0;
    csv << x << "," << y << "," << (x + y > 0 ? 1 : 0) << "\n";
  }
  dir.write("points.csv", csv.str());
  return {
      {"name", "points"},
      {"model",
       {{"input", {{"shape", {2}}}},
        {"layers",
         {{{"type", "linear"}, {"out_features", 16}}, {{"type", "relu"}}, {{"type", "linear"}, {"out_features", 2}}}}}},
      {"training", {{"batch_size", 16}, {"epochs", 6}, {"samples_per_epoch", 216}, {"optimizer", "sgd_momentum"}}},
      {"run",
       {{"builtin",
         {{"dataset",
           {{"format", "csv"}, {"file", (dir / "points.csv").string()}, {"header", true}, {"holdout", 0.25}}}}}}}};
}

TEST_F(WorkerProcessTest, train_reports_each_epoch_checkpoints_and_resumes_after_the_last_epoch) {
  json job = points_job(dir_);
  const auto checkpoint = (dir_ / "checkpoint").string();
  WorkerRun run = worker(fmt::format("train --job {} --checkpoint {}", write_json("job.json", job), checkpoint));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::vector<json> lines;
  std::istringstream out(run.out);
  for (std::string line; std::getline(out, line);) lines.push_back(json::parse(line));
  ASSERT_EQ(lines.size(), 7u) << run.out;
  EXPECT_EQ(lines[0]["epoch"], 1);
  EXPECT_EQ(lines[5]["epoch"], 6);
  EXPECT_EQ(lines[5]["epochs"], 6);
  EXPECT_EQ(lines[5]["train_samples"], 180);
  EXPECT_EQ(lines[5]["holdout_samples"], 60);
  EXPECT_LT(lines[5]["loss"].get<double>(), lines[0]["loss"].get<double>()) << run.out;
  ASSERT_TRUE(lines[5].contains("accuracy"));
  EXPECT_GT(lines[5]["accuracy"].get<double>(), 0.8) << run.out;  // a separable set, learnt
  EXPECT_EQ(lines[6]["done"], true);
  EXPECT_EQ(lines[6]["first_epoch"], 1);
  EXPECT_TRUE(std::filesystem::exists(lines[6]["weights"].get<std::string>()));

  // Two more epochs asked of the same checkpoint: it goes on from epoch 7.
  job["training"]["epochs"] = 8;
  run = worker(fmt::format("train --job {} --checkpoint {}", write_json("job.json", job), checkpoint));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(json::parse(run.out.substr(0, run.out.find('\n')))["epoch"], 7) << run.out;
  EXPECT_NE(run.out.find(R"("first_epoch":7)"), std::string::npos) << run.out;

  // Another network is not resumed from this checkpoint; a dataset that does not fit is refused.
  job["model"]["layers"][0]["out_features"] = 8;
  run = worker(fmt::format("train --job {} --checkpoint {}", write_json("other.json", job), checkpoint));
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_NE(run.err.find("holds a checkpoint of another network or training"), std::string::npos) << run.err;
  job["model"]["input"]["shape"] = {3};
  run = worker(fmt::format("train --job {}", write_json("wide.json", job)));
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_NE(run.err.find("/run/builtin/dataset: the dataset's samples are [2] but the model's input is [3]"),
            std::string::npos)
      << run.err;
}

// EAT (seed 004): the penalty on activations makes fewer of them fire, and each epoch says how
// many fire per layer (the logits, the last layer, are not counted).
TEST_F(WorkerProcessTest, train_with_eat_fires_fewer_activations_and_reports_their_rates) {
  auto last_epoch = [&](double lambda, const std::string& file) {
    json job = points_job(dir_);
    job["training"]["eat"] = {{"lambda", lambda}, {"sigma", 1e-3}};
    const WorkerRun run = worker("train --job " + write_json(file, job));
    EXPECT_EQ(run.exit_code, 0) << run.err;
    std::istringstream out(run.out);
    std::string line, last;
    while (std::getline(out, line))
      if (line.find(R"("done")") == std::string::npos) last = line;
    return last.empty() ? json::object() : json::parse(last);
  };
  const json plain = last_epoch(0.0, "plain.json");
  const json sparse = last_epoch(5.0, "sparse.json");
  ASSERT_TRUE(plain.contains("firing_rates")) << plain.dump();
  ASSERT_TRUE(sparse.contains("firing_rates")) << sparse.dump();
  EXPECT_TRUE(plain["firing_rates"].contains("0_linear")) << plain.dump();
  EXPECT_FALSE(plain["firing_rates"].contains("2_linear")) << plain.dump();
  EXPECT_TRUE(plain.contains("sparsity_penalty")) << plain.dump();
  const double plain_relu = plain["firing_rates"]["1_relu"], sparse_relu = sparse["firing_rates"]["1_relu"];
  EXPECT_GT(plain_relu, 0.0);
  EXPECT_LT(sparse_relu, plain_relu) << plain.dump() << "\n" << sparse.dump();
  EXPECT_LT(sparse["sparsity_penalty"].get<double>(), plain["sparsity_penalty"].get<double>());
  // Both still classify (accuracy is reported for both, on the held-out rows).
  EXPECT_TRUE(sparse.contains("accuracy")) << sparse.dump();
}

TEST_F(WorkerProcessTest, train_on_synthetic_data_by_default) {
  json job = {{"model", testing::example_model("lenet5")},
              {"training", {{"batch_size", 8}, {"epochs", 1}, {"samples_per_epoch", 40}}}};
  const WorkerRun run = worker("train --job " + write_json("lenet.json", job));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json first = json::parse(run.out.substr(0, run.out.find('\n')));
  EXPECT_EQ(first["train_samples"], 40);   // samples_per_epoch, as estimated
  EXPECT_EQ(first["holdout_samples"], 4);  // and a tenth of that more, held out
  EXPECT_TRUE(first.contains("accuracy"));
}

TEST_F(WorkerProcessTest, cuda_without_cuda_exits_1) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "this machine has CUDA";
  const WorkerRun run = worker(fmt::format("measure --model {} --device cuda:0", example("lenet5")));
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_NE(run.err.find("CUDA is not available"), std::string::npos) << run.err;
}

TEST_F(WorkerProcessTest, runtime_meters_python_against_the_same_loop_in_libtorch) {
  // Debian's interpreter with python3-torch: what jobs run.
  if (!std::filesystem::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  const WorkerRun run = worker(
      "runtime --python /usr/bin/python3 --meter modelled --blocks 1,4 --readings 2 --reading-seconds 0.05 --json "
      "--kinds batchnorm2d,lstm,linear");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  auto result = worker::parse_runtime_probe_result(json::parse(run.out));
  ASSERT_TRUE(result) << result.error().message << "\n" << run.out;
  EXPECT_EQ(result->runtime, "python");
  EXPECT_EQ(result->meter_source, "modelled");
  EXPECT_FALSE(result->measured);
  EXPECT_NE(result->version.find("Python 3."), std::string::npos) << result->version;
  EXPECT_NE(result->version.find("torch "), std::string::npos) << result->version;
  ASSERT_EQ(result->starts.size(), 5u);  // one fresh interpreter per network
  ASSERT_EQ(result->steps.size(), 5u);
  EXPECT_EQ(result->steps[0].modules, 3);
  EXPECT_EQ(result->steps[1].modules, 9);
  // Each kind on its own network: 8 layers of it, a flatten and a Linear.
  EXPECT_EQ(result->steps[2].kind, "batchnorm2d");
  EXPECT_EQ(result->steps[2].kind_layers, 8);
  EXPECT_EQ(result->steps[2].modules, 10);
  EXPECT_EQ(result->steps[3].kind, "lstm");
  EXPECT_EQ(result->steps[4].kind, "linear");
  EXPECT_EQ(result->steps[4].modules, 9);  // 8 and the head, no flatten
  for (const auto& start : result->starts) {
    // Importing torch takes a while anywhere; the modelled meter charges idle watts for it.
    EXPECT_GT(start.seconds, 0.05);
    EXPECT_GT(start.joules, 10.0 * start.seconds);
  }
  for (const auto& step : result->steps) {
    EXPECT_GT(step.runtime_seconds, 0.0);
    EXPECT_GT(step.worker_seconds, 0.0);
    EXPECT_GT(step.runtime_joules, 0.0);
  }
  EXPECT_GT(result->joules, 0.0);
  // What jouled learns from it.
  auto cost = estimator::fit_runtime_cost(result->runtime, result->steps, result->starts);
  ASSERT_TRUE(cost) << cost.error().message;
  EXPECT_GT(cost->start_seconds, 0.05);
  EXPECT_TRUE(cost->kinds.contains("batchnorm2d"));
  EXPECT_TRUE(cost->kinds.contains("lstm"));
  EXPECT_TRUE(cost->kinds.contains("linear"));
}

// NetworkBuilderTest trains each kind's network in LibTorch; this builds and trains the same
// specs in the interpreter (worker/runtime_probe.py), where a kind's arguments are read as a
// user's script would pass them: one reading each, for that alone.
TEST_F(WorkerProcessTest, every_kind_the_runtime_probe_reads_runs_in_the_interpreter) {
  if (!std::filesystem::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  std::vector<std::string> kinds;
  for (const auto& type : estimator::known_layer_types())
    if (estimator::runtime_kind_readable(type)) kinds.push_back(type);
  ASSERT_GE(kinds.size(), 20u);
  const WorkerRun run = worker(fmt::format(
      "runtime --python /usr/bin/python3 --meter modelled --blocks 1,2 --readings 1 --reading-seconds 0.02 --json "
      "--kinds {}",
      fmt::join(kinds, ",")));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.err.find("not read"), std::string::npos) << run.err;
  auto result = worker::parse_runtime_probe_result(json::parse(run.out));
  ASSERT_TRUE(result) << result.error().message;
  std::vector<std::string> read;
  for (const auto& step : result->steps)
    if (!step.kind.empty()) read.push_back(step.kind);
  EXPECT_EQ(read, kinds);
}

TEST_F(WorkerProcessTest, runtime_names_an_interpreter_that_cannot_run_the_probe) {
  // No such program.
  WorkerRun run = worker("runtime --python " + (dir_ / "no-python").string() + " --reading-seconds 0.05");
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_NE(run.err.find("cannot start"), std::string::npos) << run.err;
  EXPECT_TRUE(run.out.empty()) << run.out;
  // An interpreter without torch: its own last words are in the message.
  const auto fake =
      dir_.write("python3", "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n");
  std::filesystem::permissions(fake, std::filesystem::perms::owner_all);
  run = worker("runtime --python " + fake.string() + " --reading-seconds 0.05");
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_NE(run.err.find("importing torch"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("No module named 'torch'"), std::string::npos) << run.err;
  // A kind it does not read on its own is refused before any interpreter starts.
  run = worker("runtime --python /usr/bin/python3 --kinds conv2d,relu");
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_NE(run.err.find("\"relu\""), std::string::npos) << run.err;
  // One network size cannot tell a per-module cost from a per-step one.
  run = worker("runtime --python /usr/bin/python3 --blocks 4");
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_NE(run.err.find("--blocks"), std::string::npos) << run.err;
}

}  // namespace
}  // namespace joule::worker
