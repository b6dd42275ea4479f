// Background probing on a manual clock: idleness, back-offs and requested runs are timed by the
// clock ProbeService is given, while its worker is a real process (a stand-in for joule-worker
// with its command line and its `env` answer) started through the real job runner.

#include "joule/daemon/probe_service.hpp"

#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include <fmt/format.h>

#include "../fakes/sysfs_fixtures.hpp"
#include "counting_meter.hpp"
#include "job_book.hpp"
#include "joule/adapters/job_process.hpp"
#include "joule/daemon/device_knobs.hpp"
#include "joule/estimator/thread_count.hpp"
#include "joule/worker/protocol.hpp"

namespace joule::daemon {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

/// How the stand-in joule-worker behaves.
struct FakeWorker {
  double seconds_per_plan = 0.0;  ///< before each plan's result
  int fail_at = -1;               ///< the plan (0-based, within a process) that fails; -1: none
  /// Answers `runtime` (the interpreter's cost); otherwise [probing] python is emptied, so that
  /// only layer probes run.
  bool runtime = false;
  bool runtime_fails = false;  ///< `runtime` exits 1 as an interpreter without torch makes it
  bool env_fails = false;      ///< `env` exits 1 as a worker without LibTorch's libraries does
  /// The node has this worker; false: none (only devices with a worker of their own probe).
  bool node_worker = true;
  /// A cpufreq scaling_max_freq the stand-in reads as the device's clock cap: below its top
  /// (4.7 GHz) a step takes (4.7 GHz / cap)^0.5 as long and (cap / 4.7 GHz)^0.3 the energy.
  std::string clock_cap_file;
  // A request at more threads than its template's one takes threads^-0.7 the time and
  // threads^0.25 the energy, and its result says it ran at that count.
  /// Each reading of the same request (the same networks at the same batch) costs this much more
  /// than the one before (1, 1 + drift, 1 + 2 drift...): a device whose speed moves between
  /// readings of its reference network.
  double drift = 0.0;
};

class ProbeServiceTest : public ::testing::Test, protected joule::testing::JobBook {
 protected:
  ProbeServiceTest() : JobBook(devices(), 1'900'000'000'000) {}

  static std::vector<Device> devices() {
    std::vector<Device> out(1);
    out[0].name = "cpu";
    out[0].meter = std::make_unique<joule::testing::CountingMeter>();
    return out;
  }

  ~ProbeServiceTest() override {
    probes_.reset();
    models_.reset();
  }

  /// A stand-in for joule-worker at its process boundary: `env` answers with an environment,
  /// `probe --request F ...` reads each request and prints one result line per request in the
  /// real format (a network costs the sum of its layers, so probes decompose), flushed as it goes. Each
  /// process is a line of calls.log and each plan done a line of done.log.
  void start(config::ProbingConfig probing, FakeWorker fake = {}) {
    worker::WorkerEnvironment environment;
    environment.torch_version = "1.13.1";
    environment.blas = "fake BLAS";
    environment.threads = 1;
    environment.device = "cpu";
    environment.device_name = "fake CPU";
    worker::ProbeResult result;
    result.environment = environment;
    result.meter_source = "modelled";
    worker::NetworkResult network;
    network.name = "net";
    network.repetitions = {{0.01, 0.001, 10}};
    network.joules_per_step = 0.01;
    network.seconds_per_step = 0.001;
    network.steps_per_repetition = 10;
    network.final_loss = 1.0;
    result.networks = {network};
    worker::RuntimeProbeResult runtime;
    runtime.environment = environment;
    runtime.interpreter = "python3";
    runtime.version = "Python 3.11.2, torch 1.13.0";
    runtime.meter_source = "modelled";
    // 0.2 ms + 10 µs per module beyond LibTorch's 0.1 ms; 1.5 s and 30 J to start.
    runtime.steps = {{3, 2.3e-3, 2.3e-4, 1e-3, 1e-4, 0.02}, {9, 2.9e-3, 2.9e-4, 1e-3, 1e-4, 0.02}};
    runtime.starts = {{30.0, 1.5}, {31.0, 1.6}};
    runtime.joules = 70.0;
    if (!fake.runtime) probing.python = "";
    // The stand-in (tests/fakes/fake_joule_worker.py) reads how to behave from the file beside it.
    const auto worker = dir_ / "fake-worker";
    std::filesystem::copy_file(JOULE_SOURCE_DIR "/tests/fakes/fake_joule_worker.py", worker,
                               std::filesystem::copy_options::overwrite_existing);
    dir_.write("fake-worker.json", json{{"env", worker::to_json(environment)},
                                        {"result", worker::to_json(result)},
                                        {"runtime_result", worker::to_json(runtime)},
                                        {"env_fails", fake.env_fails},
                                        {"runtime_fails", fake.runtime_fails},
                                        {"fail_at", fake.fail_at},
                                        {"seconds", fake.seconds_per_plan},
                                        {"cap_file", fake.clock_cap_file},
                                        {"drift", fake.drift},
                                        {"calls", (dir_ / "calls.log").string()},
                                        {"done", (dir_ / "done.log").string()},
                                        {"requests", (dir_ / "requests.log").string()},
                                        {"runtime_calls", (dir_ / "runtime.log").string()},
                                        {"caps", (dir_ / "caps.log").string()},
                                        {"threads_log", (dir_ / "threads.log").string()}}
                                       .dump());
    ::chmod(worker.c_str(), 0755);
    models_ = std::make_unique<ModelService>(io_, writer_, metrics_, [] {});
    ProbeServiceOptions options;
    options.probing = probing;
    options.state_directory = dir_.path();
    options.worker = fake.node_worker ? worker : std::filesystem::path();
    options.runner = JOULED_BINARY;
    options.tick_seconds = 0.005;
    probes_ = std::make_unique<ProbeService>(io_, writer_, metrics_, *models_, jobs_, jobs_.budgets(), device_table_,
                                             options, clock_);
    probes_->start(StoredProbeState{});
  }

  json shown() { return probes_->info("cpu")["probing"]; }
  std::string state() { return shown()["state"]; }
  std::string waiting() { return shown().value("waiting", ""); }

  int lines_of(const std::string& name) const {
    std::ifstream in(dir_ / name);
    int lines = 0;
    for (std::string line; std::getline(in, line);) ++lines;
    return lines;
  }
  /// Worker processes started for probes.
  int probes_started() const { return lines_of("calls.log"); }
  /// Each request a worker read, in order (its batch size and networks, as one line).
  std::vector<std::string> requests_read() const {
    std::ifstream in(dir_ / "requests.log");
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  }
  /// Plans whose result was printed.
  int plans_done() const { return lines_of("done.log"); }

  /// Runs the loop for `real` time with the manual clock standing still.
  void idle_for(std::chrono::milliseconds real) {
    const auto until = std::chrono::steady_clock::now() + real;
    run_until([&] { return std::chrono::steady_clock::now() >= until; });
  }

  /// run_until for longer than its few seconds of loop: seeding the starter set's kinds takes more.
  template <typename Predicate>
  bool within(Predicate done, std::chrono::seconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!run_until(done))
      if (std::chrono::steady_clock::now() > deadline) return false;
    return true;
  }
  /// A small network a requested run names, to be measured whole.
  static json small_mlp() {
    return json::parse(R"({"input": {"shape": [32]}, "layers": [
        {"type": "linear", "out_features": 16}, {"type": "relu"}, {"type": "linear", "out_features": 10}]})");
  }

  /// Background probing off, a refit every other sample: only requested runs probe.
  void start_requested_only(FakeWorker fake = {}, std::optional<double> max_speed_spread = std::nullopt) {
    config::ProbingConfig probing;
    probing.enabled = false;
    probing.refit_every = 2;
    if (max_speed_spread) probing.max_speed_spread = *max_speed_spread;
    start(probing, fake);
  }
  /// POST /v1/probes for the cpu, `seconds` long, naming `model` at batch 8 to measure whole.
  bool request_run_measuring(const json& model, int seconds) {
    auto requested = probes_->request(
        {{"device", "cpu"}, {"seconds", seconds}, {"models", {{{"model", model}, {"training", {{"batch_size", 8}}}}}}});
    EXPECT_TRUE(requested) << requested.error().message;
    return requested.ok();
  }
  /// The cpu device gets an intel_pstate frequency knob written under `tree`, and the policy a
  /// knob goal: probing measures networks at the CPU's settings.
  void choose_settings_on_a_cpu_under(const joule::testing::TempDir& tree) {
    device_table_.find("cpu")->cpu_frequency = joule::testing::intel_pstate_knob(tree);
    schedulers::Policy policy;
    policy.knobs.goal = schedulers::KnobGoal::min_energy;
    jobs_.set_policy(policy);
  }

  std::unique_ptr<ModelService> models_;
  std::unique_ptr<ProbeService> probes_;
};

TEST_F(ProbeServiceTest, probes_once_the_device_has_been_idle_for_idle_seconds_of_its_clock) {
  config::ProbingConfig probing;
  probing.idle_seconds = 60.0;
  start(probing);
  ASSERT_TRUE(run_until([&] { return waiting().starts_with("waiting for 60 s of idleness"); })) << shown().dump();
  EXPECT_EQ(state(), "settling");
  idle_for(100ms);  // real time passes, the service's clock does not
  EXPECT_EQ(probes_started(), 0);
  EXPECT_EQ(state(), "settling");
  clock_.advance(30s);
  ASSERT_TRUE(run_until([&] { return waiting().starts_with("waiting for 30 s"); })) << shown().dump();
  clock_.advance(30s);
  ASSERT_TRUE(run_until([&] { return probes_started() >= 1; })) << shown().dump();
  const auto runs = probes_->runs();
  ASSERT_FALSE(runs.empty());
  EXPECT_EQ(runs.back()["reason"], "initial");
}

TEST_F(ProbeServiceTest, three_failed_probes_pause_probing_for_ten_minutes_of_its_clock) {
  config::ProbingConfig probing;
  probing.idle_seconds = 0.0;
  start(probing, {.fail_at = 0});
  ASSERT_TRUE(run_until([&] { return state() == "backing_off"; })) << shown().dump();
  EXPECT_EQ(probes_started(), 3);
  EXPECT_EQ(waiting(), "paused for 10 minutes after 3 failed probes in a row (see GET /v1/probes)");
  const auto run = probes_->runs().back();
  EXPECT_EQ(run["state"], "failed");
  EXPECT_EQ(run["failed"], 3);
  EXPECT_NE(run["message"].get<std::string>().find("no LibTorch here"), std::string::npos) << run.dump();

  clock_.advance(9min + 59s);
  idle_for(100ms);
  EXPECT_EQ(probes_started(), 3);
  EXPECT_EQ(state(), "backing_off");
  clock_.advance(1s);
  ASSERT_TRUE(run_until([&] { return probes_started() >= 4; })) << shown().dump();
}

TEST_F(ProbeServiceTest, a_requested_run_probes_while_background_probing_is_off_and_ends_on_its_clock) {
  config::ProbingConfig probing;
  probing.enabled = false;
  start(probing, {.seconds_per_plan = 0.3, .fail_at = 0});
  ASSERT_TRUE(run_until([&] { return state() == "refused"; })) << shown().dump();
  EXPECT_EQ(waiting(), "probing is disabled ([probing] enabled = false)");

  auto requested = probes_->request({{"device", "cpu"}, {"seconds", 30}});
  ASSERT_TRUE(requested) << requested.error().message;
  const std::string id = (*requested)["id"];
  ASSERT_TRUE(run_until([&] { return probes_started() >= 1; })) << shown().dump();
  clock_.advance(31s);  // while the first probe still runs: the run ends when it has
  ASSERT_TRUE(run_until([&] { return probes_->run(id).value()["state"] != "running"; }));
  const auto run = probes_->run(id).value();
  EXPECT_EQ(run["state"], "done") << run.dump();
  EXPECT_EQ(run["message"], "the requested time is over");
  EXPECT_EQ(run["failed"], 1);
  EXPECT_EQ(state(), "refused");
  idle_for(100ms);
  EXPECT_EQ(probes_started(), 1);
}

TEST_F(ProbeServiceTest, a_device_whose_worker_cannot_start_refuses_a_requested_run_with_the_reason) {
  config::ProbingConfig probing;
  probing.enabled = false;
  start(probing, {.env_fails = true});
  ASSERT_TRUE(run_until([&] { return state() == "unavailable"; })) << shown().dump();

  const auto requested = probes_->request({{"device", "cpu"}, {"seconds", 30}});
  ASSERT_FALSE(requested);
  EXPECT_EQ(requested.error().code, ErrorCode::conflict);
  EXPECT_EQ(requested.error().where, "/device");
  EXPECT_NE(requested.error().message.find("device cpu cannot be probed: joule-worker env failed: joule-worker: error "
                                           "while loading shared libraries: libtorch.so"),
            std::string::npos)
      << requested.error().message;
  EXPECT_TRUE(probes_->runs().empty());
}

TEST_F(ProbeServiceTest, a_run_requested_while_the_worker_is_checked_fails_when_the_check_does) {
  config::ProbingConfig probing;
  probing.enabled = false;
  start(probing, {.env_fails = true});
  // Before the loop has run: the environment check has not ended, so the request is taken.
  const auto requested = probes_->request({{"device", "cpu"}, {"seconds", 30}});
  ASSERT_TRUE(requested) << requested.error().message;
  const std::string id = (*requested)["id"];
  ASSERT_TRUE(run_until([&] { return probes_->run(id).value()["state"] != "running"; })) << shown().dump();
  const auto run = probes_->run(id).value();
  EXPECT_EQ(run["state"], "failed") << run.dump();
  EXPECT_NE(run["message"].get<std::string>().find("joule-worker env failed"), std::string::npos) << run.dump();
  EXPECT_EQ(state(), "unavailable");
  EXPECT_EQ(probes_started(), 0);
}

TEST_F(ProbeServiceTest, one_worker_process_measures_a_batch_of_plans_and_each_joins_the_model) {
  config::ProbingConfig probing;
  probing.idle_seconds = 0.0;
  probing.plans_per_run = 3;
  start(probing, {.seconds_per_plan = 0.05});
  ASSERT_TRUE(run_until([&] { return plans_done() >= 3; })) << shown().dump();
  ASSERT_TRUE(run_until([&] { return probes_->runs().back()["probes"] >= 3; })) << probes_->runs().dump();
  std::ifstream calls(dir_ / "calls.log");
  std::string first;
  std::getline(calls, first);
  std::size_t requests = 0;
  for (auto at = first.find("--request"); at != std::string::npos; at = first.find("--request", at + 1)) ++requests;
  EXPECT_EQ(requests, 3u) << first;
  const auto run = probes_->runs().back();
  EXPECT_EQ(run["failed"], 0) << run.dump();
  EXPECT_EQ(run["energy"]["source"], "modelled");
  EXPECT_GT(run["energy"]["joules"].get<double>(), 0.0);
  EXPECT_GE(shown()["samples_learning"].get<int>(), 2) << shown().dump();
}

TEST_F(ProbeServiceTest, a_preempted_batch_keeps_the_plans_it_finished_and_plans_the_rest_again) {
  config::ProbingConfig probing;
  probing.idle_seconds = 0.0;
  probing.plans_per_run = 3;
  start(probing, {.seconds_per_plan = 1.0});
  ASSERT_TRUE(run_until([&] { return plans_done() >= 1; })) << shown().dump();
  ASSERT_TRUE(run_until([&] { return requests_read().size() >= 2; }));  // the second plan runs now
  probes_->preempt("cpu");
  ASSERT_TRUE(run_until([&] { return probes_->runs().back()["preempted"] == 1; })) << probes_->runs().dump();
  const auto run = probes_->runs().back();
  EXPECT_EQ(run["probes"], 1) << run.dump();
  EXPECT_EQ(run["failed"], 0);
  // The next worker starts with the plan that was cut short, not with one after it.
  ASSERT_TRUE(run_until([&] { return requests_read().size() >= 3; }));
  const auto read = requests_read();
  EXPECT_EQ(read[2], read[1]);
  EXPECT_NE(read[1], read[0]);
}

TEST_F(ProbeServiceTest, background_probing_stops_when_a_probe_no_longer_pays_and_resumes_for_jobs_worth_it) {
  config::ProbingConfig probing;
  probing.idle_seconds = 0.0;
  probing.target_sigma = 0.0;  // only what a probe is worth stops it
  start(probing);
  // No job has used any energy here: once the seeds are in, no further probe is worth its joules.
  const auto not_paying = [&] { return waiting().starts_with("probing no longer pays"); };
  for (int i = 0; i < 20 && !not_paying(); ++i) run_until(not_paying);
  ASSERT_TRUE(not_paying()) << shown().dump();
  EXPECT_EQ(state(), "converged");
  EXPECT_NE(waiting().find("of the 0 J that jobs estimated here used in the last day"), std::string::npos) << waiting();
  const auto run = probes_->runs().back();
  EXPECT_EQ(run["message"], waiting()) << run.dump();
  const int before = probes_started();
  idle_for(200ms);
  EXPECT_EQ(probes_started(), before);

  // A job estimated here that used a great deal: a better estimate is now worth probes again.
  JobFeedback job;
  job.device = "cpu";
  job.estimate.ok = true;
  job.estimate.source = joule::EnergySource::modelled;
  job.source = joule::EnergySource::modelled;
  job.joules = 1e9;
  job.finished_ms = 1'900'000'000'000;
  probes_->feedback(job);
  ASSERT_TRUE(run_until([&] { return probes_started() > before; })) << shown().dump();
  EXPECT_EQ(waiting().find("probing no longer pays"), std::string::npos) << waiting();
}

// The installed model names the environment its samples came from, and so do its estimates:
// the outcome calibration keeps jobs' lessons apart by it (OutcomeServiceTest).
TEST_F(ProbeServiceTest, the_installed_model_names_the_environment_it_was_learnt_under) {
  config::ProbingConfig probing;
  probing.idle_seconds = 0.0;
  probing.plans_per_run = 8;
  start(probing, {});
  ASSERT_TRUE(run_until([&] { return models_->models().contains("cpu"); })) << shown().dump();
  const auto& model = *models_->models().at("cpu");
  EXPECT_NE(model.environment().find("fake BLAS"), std::string::npos) << model.environment();
  EXPECT_EQ(model.environment(), shown()["environment"]) << shown().dump();
}

TEST_F(ProbeServiceTest, the_runtime_probe_runs_first_and_its_cost_joins_the_served_model) {
  config::ProbingConfig probing;
  probing.idle_seconds = 0.0;
  start(probing, {.runtime = true});
  EXPECT_EQ(shown()["runtime"]["state"], "pending");
  ASSERT_TRUE(run_until([&] { return lines_of("runtime.log") == 1 && probes_started() >= 1; })) << shown().dump();
  // Measured before any layer: its line names the interpreter, the device's threads and meter.
  const std::string call = [&] {
    std::ifstream in(dir_ / "runtime.log");
    std::string line;
    std::getline(in, line);
    return line;
  }();
  EXPECT_NE(call.find("--python python3"), std::string::npos) << call;
  EXPECT_NE(call.find("--threads 1"), std::string::npos) << call;
  EXPECT_EQ(shown()["runtime"]["state"], "measured");
  EXPECT_FALSE(probes_->runtime_problem("cpu"));
  ASSERT_TRUE(run_until([&] { return models_->models().contains("cpu"); })) << shown().dump();
  const auto model = models_->models().at("cpu");
  ASSERT_TRUE(model->runtimes().contains("python"));
  const auto& cost = model->runtimes().at("python");
  EXPECT_NEAR(cost.step_seconds_base, 1e-4, 1e-9);
  EXPECT_NEAR(cost.step_seconds_per_module, 1e-5, 1e-9);
  EXPECT_DOUBLE_EQ(cost.start_joules, 30.5);
  EXPECT_EQ(cost.source, "modelled");
  EXPECT_EQ(cost.version, "Python 3.11.2, torch 1.13.0");
  // More probing straight after does not repeat it.
  const int started = probes_started();
  ASSERT_TRUE(run_until([&] { return probes_started() >= started + 2; })) << shown().dump();
  EXPECT_EQ(lines_of("runtime.log"), 1);
  // Its energy counts as probing's.
  EXPECT_GE(probes_->runs().front()["energy"]["joules"].get<double>(), 70.0);

  // Read again minutes later, and pooled, until it holds kRuntimeRunsPooled runs.
  for (int run = 2; run <= estimator::kRuntimeRunsPooled; ++run) {
    idle_for(50ms);
    EXPECT_EQ(lines_of("runtime.log"), run - 1);
    clock_.advance(std::chrono::minutes(5));
    ASSERT_TRUE(run_until([&] { return lines_of("runtime.log") == run && shown()["runtime"].value("runs", 0) == run; }))
        << shown().dump();
  }
  ASSERT_TRUE(run_until([&] { return models_->models().at("cpu")->runtimes().at("python").runs() == 3; }));
  const auto& pooled = models_->models().at("cpu")->runtimes().at("python");
  EXPECT_EQ(pooled.steps.size(), 6u);
  EXPECT_NEAR(pooled.step_seconds_base, 1e-4, 1e-9);  // the stand-in reads the same every time
  // Then with the reference network, every [probing] reference_minutes (30).
  clock_.advance(std::chrono::minutes(6));
  idle_for(100ms);
  EXPECT_EQ(lines_of("runtime.log"), 3);
  clock_.advance(std::chrono::minutes(25));
  ASSERT_TRUE(run_until([&] { return lines_of("runtime.log") == 4; })) << shown().dump();
  EXPECT_EQ(shown()["runtime"]["runs"], 3);
}

// The workload's own layer kinds are read on their own networks: a requested run naming a
// network asks for its convolutions, batch norm and GRU, the model prices them so, and a kind the worker
// could not read is said and not asked for again.
TEST_F(ProbeServiceTest, the_runtime_probe_reads_the_workloads_layer_kinds) {
  config::ProbingConfig probing;
  probing.idle_seconds = 0.0;
  start(probing, {.runtime = true});
  const json cnn = json::parse(R"({"input": {"shape": [3, 16]}, "layers": [
      {"type": "conv1d", "out_channels": 4, "kernel_size": 3}, {"type": "batchnorm1d"}, {"type": "relu"},
      {"type": "conv1d", "out_channels": 4, "kernel_size": 3}, {"type": "gru", "hidden_size": 4},
      {"type": "linear", "out_features": 10}]})");
  ASSERT_TRUE(request_run_measuring(cnn, 600));
  ASSERT_TRUE(within([&] { return lines_of("runtime.log") == 1 && shown()["runtime"]["state"] == "measured"; }, 30s))
      << shown().dump();
  std::string call;
  {
    std::ifstream in(dir_ / "runtime.log");
    std::getline(in, call);
  }
  // The most layers first; relu is the line's own.
  EXPECT_NE(call.find("--kinds conv1d,batchnorm1d,gru,linear"), std::string::npos) << call;
  const json runtime = shown()["runtime"];
  EXPECT_EQ(runtime["kinds_read"], (json{"conv1d", "batchnorm1d", "linear"})) << runtime.dump();
  EXPECT_EQ(runtime["kinds_not_read"], (json{"gru"})) << runtime.dump();
  ASSERT_TRUE(within([&] { return models_->models().contains("cpu"); }, 30s)) << shown().dump();
  const auto& cost = models_->models().at("cpu")->runtimes().at("python");
  ASSERT_TRUE(cost.kinds.contains("conv1d"));
  EXPECT_NEAR(cost.kinds.at("conv1d").seconds_per_layer, 2e-5, 1e-9);
  EXPECT_FALSE(cost.kinds.contains("gru"));
  // Five minutes on, it is read again (it pools one run of three) and gru is not asked for.
  clock_.advance(std::chrono::minutes(5));
  ASSERT_TRUE(within([&] { return lines_of("runtime.log") == 2; }, 30s)) << shown().dump();
  std::ifstream in(dir_ / "runtime.log");
  std::getline(in, call);
  std::getline(in, call);
  EXPECT_NE(call.find("--kinds conv1d,batchnorm1d,linear"), std::string::npos) << call;
  EXPECT_EQ(call.find("gru"), std::string::npos) << call;
}

TEST_F(ProbeServiceTest, a_failed_runtime_probe_stores_nothing_says_why_and_layer_probing_goes_on) {
  config::ProbingConfig probing;
  probing.idle_seconds = 0.0;
  start(probing, {.runtime = true, .runtime_fails = true});
  ASSERT_TRUE(run_until([&] { return probes_started() >= 2; })) << shown().dump();
  EXPECT_EQ(lines_of("runtime.log"), 1);  // not retried until the next campaign
  EXPECT_EQ(shown()["runtime"]["state"], "failed");
  const std::string problem = shown()["runtime"]["problem"];
  EXPECT_NE(problem.find("No module named 'torch'"), std::string::npos) << problem;
  const auto why = probes_->runtime_problem("cpu");
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("not in this estimate"), std::string::npos) << *why;
  EXPECT_NE(why->find("No module named 'torch'"), std::string::npos) << *why;
  ASSERT_TRUE(run_until([&] { return models_->models().contains("cpu"); })) << shown().dump();
  EXPECT_TRUE(models_->models().at("cpu")->runtimes().empty());
}

}  // namespace
}  // namespace joule::daemon

namespace joule::daemon {
namespace {

// A network a requested run names is measured whole once its layers have a fitted model: one
// request with that network alone at its batch size, once; the served model then estimates it
// from the measurement, and GET /v1/devices counts it.
TEST_F(ProbeServiceTest, a_named_network_is_measured_whole_once_and_served_from_its_measurement) {
  start_requested_only();
  const json mlp = small_mlp();
  const auto spec = estimator::parse_model_spec(mlp, "/model");
  ASSERT_TRUE(spec);
  auto requested = probes_->request(
      {{"device", "cpu"}, {"seconds", 3600}, {"models", {{{"model", mlp}, {"training", {{"batch_size", 8}}}}}}});
  ASSERT_TRUE(requested) << requested.error().message;
  ASSERT_TRUE(within([&] { return shown()["whole_networks"]["measured"] == 1; }, 60s)) << shown().dump();
  const std::string whole_request = json::array({8, json::array({estimator::to_json(*spec)})}).dump();
  auto requested_whole = [&] {
    const auto read = requests_read();
    return std::count_if(read.begin(), read.end(),
                         [&](const std::string& line) { return json::parse(line) == json::parse(whole_request); });
  };
  EXPECT_EQ(requested_whole(), 1);
  const auto models = models_->models();
  ASSERT_TRUE(models.contains("cpu") && models.at("cpu"));
  auto estimate = models.at("cpu")->estimate(*spec, estimator::TrainingConfig{8, 1, 8, "sgd", std::nullopt});
  ASSERT_TRUE(estimate) << estimate.error().message;
  ASSERT_TRUE(estimate->whole);
  EXPECT_EQ(estimate->whole->basis, "measured");
  // Measured once: the probing that goes on does not measure it again.
  const int plans = plans_done();
  ASSERT_TRUE(within([&] { return plans_done() >= plans + 4; }, 30s));
  EXPECT_EQ(requested_whole(), 1);
  EXPECT_EQ(shown()["whole_networks"]["reference"]["readings"], 1) << shown().dump();

  // Every [probing] reference_minutes the first network measured whole is read again: the
  // device's speed, seen by the same network.
  clock_.advance(std::chrono::minutes(31));
  ASSERT_TRUE(within([&] { return requested_whole() == 2; }, 30s)) << shown().dump();
  ASSERT_TRUE(within([&] { return shown()["whole_networks"]["reference"]["readings"] == 2; }, 30s)) << shown().dump();
  const json reference = shown()["whole_networks"]["reference"];
  EXPECT_NEAR(reference["drift"].get<double>(), 0.0, 1e-9) << reference.dump();  // the stand-in never drifts
  EXPECT_EQ(shown()["whole_networks"]["measured"], 1);                           // the same network, measured afresh
}

// Every network of the workload counts the same when choosing what to measure whole, as every
// job's estimate does: a small network beside one of 16 times its joules per step is measured
// whole too (weighed by joules per step, it never was).
TEST_F(ProbeServiceTest, a_small_network_beside_a_large_one_is_measured_whole_too) {
  start_requested_only();
  const json small = small_mlp();
  json large = json::parse(R"({"input": {"shape": [32]}, "layers": []})");
  for (int i = 0; i < 24; ++i) {
    large["layers"].push_back({{"type", "linear"}, {"out_features", 64}});
    large["layers"].push_back({{"type", "relu"}});
  }
  large["layers"].push_back({{"type", "linear"}, {"out_features", 10}});
  auto requested = probes_->request({{"device", "cpu"},
                                     {"seconds", 3600},
                                     {"models",
                                      {{{"model", small}, {"training", {{"batch_size", 8}}}},
                                       {{"model", large}, {"training", {{"batch_size", 8}}}}}}});
  ASSERT_TRUE(requested) << requested.error().message;
  ASSERT_TRUE(within([&] { return shown()["whole_networks"]["measured"] == 2; }, 60s)) << shown().dump();
  const auto spec = estimator::parse_model_spec(small, "/model");
  ASSERT_TRUE(spec);
  auto estimate = models_->models().at("cpu")->estimate(*spec, estimator::TrainingConfig{8, 1, 8, "sgd", std::nullopt});
  ASSERT_TRUE(estimate) << estimate.error().message;
  ASSERT_TRUE(estimate->whole);
  EXPECT_EQ(estimate->whole->basis, "measured");
}

// A converged device still reads its reference network when it is due, in the background: the
// device's speed may have moved while no probe ran.
TEST_F(ProbeServiceTest, a_converged_device_reads_its_reference_network_when_it_is_due) {
  config::ProbingConfig probing;
  probing.idle_seconds = 0.0;
  probing.target_sigma = 0.0;  // only what a probe is worth stops it
  probing.refit_every = 2;
  start(probing);
  const json mlp = small_mlp();
  // A short requested run names the network; it is measured whole and becomes the reference.
  auto requested = probes_->request(
      {{"device", "cpu"}, {"seconds", 60}, {"models", {{{"model", mlp}, {"training", {{"batch_size", 8}}}}}}});
  ASSERT_TRUE(requested) << requested.error().message;
  ASSERT_TRUE(within([&] { return shown()["whole_networks"]["measured"] == 1; }, 60s)) << shown().dump();
  clock_.advance(61s);  // the run ends; with no job's energy to pay for them, background probes stop
  ASSERT_TRUE(within([&] { return state() == "converged"; }, 60s)) << shown().dump();
  const int readings = shown()["whole_networks"]["reference"]["readings"];
  clock_.advance(std::chrono::minutes(30));
  ASSERT_TRUE(within([&] { return shown()["whole_networks"]["reference"]["readings"] == readings + 1; }, 30s))
      << shown().dump();
  // And not again until the next half hour.
  idle_for(300ms);
  EXPECT_EQ(shown()["whole_networks"]["reference"]["readings"], readings + 1);
  // Prometheus sees the same: no drift (the stand-in's readings are all alike).
  const std::string exposition = metrics_.serialize();
  EXPECT_NE(exposition.find("joule_device_speed_drift_ratio{device=\"cpu\"} 0"), std::string::npos) << exposition;
  EXPECT_NE(exposition.find("joule_device_speed_spread{device=\"cpu\"} 0"), std::string::npos);
}

// With a policy knobs.goal, a network measured whole is measured at each of the CPU's knob
// settings too (a fixture cpufreq tree; the stand-in worker reads the cap as its clock): each
// setting is set for the worker's run and put back after, and the served model estimates the
// network at every setting from its measurements.
TEST_F(ProbeServiceTest, with_a_knob_goal_a_network_is_measured_at_each_setting_and_the_defaults_come_back) {
  joule::testing::TempDir tree;
  const auto cpufreq = tree / "sys/devices/system/cpu/cpufreq";
  choose_settings_on_a_cpu_under(tree);
  ASSERT_TRUE(jobs_.chooses_settings());
  const auto choices = knob_choices(*device_table_.find("cpu"));
  ASSERT_EQ(choices.size(), 3u);
  EXPECT_EQ(choices[0].label, "3800 MHz");
  EXPECT_EQ(choices[2].label, "2100 MHz");

  FakeWorker fake;
  fake.clock_cap_file = (cpufreq / "policy0/scaling_max_freq").string();
  start_requested_only(fake);
  const json mlp = small_mlp();
  ASSERT_TRUE(request_run_measuring(mlp, 3600));
  auto measured_everywhere = [&] {
    const json settings = shown()["whole_networks"].value("settings", json::array());
    return settings.size() == 3 &&
           std::all_of(settings.begin(), settings.end(), [](const json& s) { return s["networks"] == 1; });
  };
  ASSERT_TRUE(within(measured_everywhere, 90s)) << shown().dump();
  ASSERT_TRUE(within([&] { return !probes_->info("cpu")["probing"].contains("measuring_at"); }, 30s));
  // Each worker ran at its setting; the defaults are back after each (and nothing stays noted).
  std::ifstream caps_log(dir_ / "caps.log");
  std::set<std::string> caps;
  for (std::string line; std::getline(caps_log, line);) caps.insert(line);
  EXPECT_TRUE(caps.contains("3800000") && caps.contains("2800000") && caps.contains("2100000"));
  EXPECT_TRUE(caps.contains("4700000"));
  idle_for(100ms);
  std::ifstream limit(cpufreq / "policy0/scaling_max_freq");
  std::string now;
  std::getline(limit, now);
  if (!probes_->info("cpu")["probing"].contains("measuring_at")) EXPECT_EQ(now, "4700000");

  // The served model: the network at each setting, as measured (ratios of the stand-in's law).
  const auto spec = estimator::parse_model_spec(mlp, "/model");
  const auto models = models_->models();
  ASSERT_TRUE(models.contains("cpu") && models.at("cpu"));
  auto estimate = models.at("cpu")->estimate(*spec, estimator::TrainingConfig{8, 1, 800, "sgd", std::nullopt});
  ASSERT_TRUE(estimate) << estimate.error().message;
  ASSERT_EQ(estimate->settings.size(), 3u);
  for (const auto& line : estimate->settings) {
    EXPECT_EQ(line.basis, "measured");
    const double cap = line.setting.value * 1000.0;
    EXPECT_NEAR(line.seconds_ratio, std::pow(4700000.0 / cap, 0.5), 1e-6) << line.setting.label;
    EXPECT_NEAR(line.joules_ratio, std::pow(cap / 4700000.0, 0.3), 1e-6) << line.setting.label;
  }
}

// A queued job asking for cores of its own on a device that shares them: probing measures the
// network whole at that thread count too (no knob goal needed), the worker at that count, and
// the served model estimates the network there by the measured ratio.
TEST_F(ProbeServiceTest, a_network_is_measured_at_the_thread_count_queued_jobs_ask_for) {
  if (adapters::usable_cpus().size() < 2) GTEST_SKIP() << "a job asking for 2 cores needs a node with 2 CPUs";
  device_table_.find("cpu")->shared_cores = 2;
  ASSERT_FALSE(jobs_.chooses_settings());
  // Queued until long after the test: it asks for 2 cores and waits its time.
  const auto queued = submit(json{{"resources", {{"cores", 2}}},
                                  {"constraints", {{"not_before", "2099-01-01T00:00:00Z"}}},
                                  {"run", {{"command", {"true"}}}}});
  ASSERT_TRUE(queued) << queued.error().message;
  EXPECT_EQ(jobs_.core_counts("cpu"), std::vector<int>{2});

  start_requested_only();
  const json mlp = small_mlp();
  ASSERT_TRUE(request_run_measuring(mlp, 3600));
  auto measured_at_two = [&] {
    for (const auto& s : shown()["whole_networks"].value("settings", json::array()))
      if (s["knob"] == "threads" && s["value"] == 2 && s["networks"] == 1) return true;
    return false;
  };
  ASSERT_TRUE(within(measured_at_two, 90s)) << shown().dump();
  std::ifstream threads_log(dir_ / "threads.log");
  std::set<std::string> counts;
  for (std::string line; std::getline(threads_log, line);) counts.insert(line);
  EXPECT_EQ(counts, (std::set<std::string>{"1", "2"})) << "workers at the device's count and at the job's";

  const auto spec = estimator::parse_model_spec(mlp, "/model");
  const auto models = models_->models();
  ASSERT_TRUE(models.contains("cpu") && models.at("cpu"));
  auto estimate = models.at("cpu")->estimate(*spec, estimator::TrainingConfig{8, 1, 800, "sgd", std::nullopt});
  ASSERT_TRUE(estimate) << estimate.error().message;
  ASSERT_EQ(estimate->settings.size(), 1u);
  EXPECT_EQ(estimate->settings[0].basis, "measured");
  EXPECT_NEAR(estimate->settings[0].seconds_ratio, std::pow(2.0, -0.7), 1e-6);
  EXPECT_NEAR(estimate->settings[0].joules_ratio, std::pow(2.0, 0.25), 1e-6);
  // A job at 2 cores is estimated there; at 3 (not measured) it says so.
  estimator::Estimate at_two = *estimate;
  EXPECT_TRUE(estimator::at_thread_count(at_two, 2, 1));
  EXPECT_NEAR(at_two.seconds.mean, estimate->seconds.mean * std::pow(2.0, -0.7), 1e-9);
  EXPECT_NE(at_two.warnings.back().find("measured whole at 2 threads"), std::string::npos) << at_two.warnings.back();
  estimator::Estimate at_three = *estimate;
  EXPECT_FALSE(estimator::at_thread_count(at_three, 3, 1));
  EXPECT_NE(at_three.warnings.back().find("no network was measured at 3 yet"), std::string::npos);
}

// A setting the kernel refuses (here scaling_max_freq cannot be written) stores nothing, is not
// tried again, and the network's estimates say which setting is missing and why.
TEST_F(ProbeServiceTest, a_setting_that_cannot_be_set_stores_nothing_and_the_estimate_says_why) {
  joule::testing::TempDir tree;
  const auto cpufreq = tree / "sys/devices/system/cpu/cpufreq";
  choose_settings_on_a_cpu_under(tree);
  // Gone after discovery, as a driver unloaded under jouled would leave it: no write can land.
  std::filesystem::remove(cpufreq / "policy0/scaling_max_freq");
  std::filesystem::create_directory(cpufreq / "policy0/scaling_max_freq");
  start_requested_only();
  const json mlp = small_mlp();
  const auto spec = estimator::parse_model_spec(mlp, "/model");
  ASSERT_TRUE(request_run_measuring(mlp, 3600));
  const estimator::TrainingConfig training{8, 1, 8, "sgd", std::nullopt};
  auto caveats = [&] { return probes_->estimate_caveats("cpu", *spec, training); };
  ASSERT_TRUE(within([&] { return caveats().size() == 3; }, 60s)) << shown().dump();
  EXPECT_NE(caveats()[0].find("could not be measured at cpu_max_frequency_mhz=2100 on cpu (2100 MHz could not be set"),
            std::string::npos)
      << caveats()[0];
  EXPECT_EQ(shown()["whole_networks"]["measured"], 1);  // at the defaults it was
  EXPECT_EQ(shown()["whole_networks"].value("settings", json::array()).size(), 0u) << shown().dump();
  // Not tried again: probing goes on with the layers.
  const int plans = plans_done();
  ASSERT_TRUE(within([&] { return plans_done() >= plans + 4; }, 30s));
  EXPECT_EQ(caveats().size(), 3u);
  EXPECT_FALSE(shown()["whole_networks"].contains("measuring_at"));
}

// A device whose speed moves more than [probing] max_speed_spread between readings of its
// reference network is marked noisy, and every estimate on it says so.
TEST_F(ProbeServiceTest, a_device_whose_reference_readings_spread_beyond_the_bound_is_noisy_in_its_estimates) {
  FakeWorker fake;
  fake.drift = 0.4;  // readings 1.0, 1.4, 1.8 × apart
  start_requested_only(fake, 0.1);
  const json mlp = small_mlp();
  const auto spec = estimator::parse_model_spec(mlp, "/model");
  ASSERT_TRUE(request_run_measuring(mlp, 7200));
  ASSERT_TRUE(within([&] { return shown()["whole_networks"]["measured"] == 1; }, 60s)) << shown().dump();
  for (int reading = 2; reading <= 4; ++reading) {
    clock_.advance(std::chrono::minutes(31));
    ASSERT_TRUE(within([&] { return shown()["whole_networks"]["reference"]["readings"] == reading; }, 30s))
        << shown().dump();
  }
  const json reference = shown()["whole_networks"]["reference"];
  EXPECT_GT(reference["spread"].get<double>(), 0.1) << reference.dump();
  EXPECT_TRUE(reference["noisy"].get<bool>());
  const auto caveats = probes_->estimate_caveats("cpu", *spec, estimator::TrainingConfig{8, 1, 8, "sgd", std::nullopt});
  ASSERT_EQ(caveats.size(), 1u);
  EXPECT_NE(caveats[0].find("device cpu is noisy"), std::string::npos) << caveats[0];
  EXPECT_NE(caveats[0].find("above [probing] max_speed_spread 0.100"), std::string::npos) << caveats[0];
}

// When the reference network's reading steps by more than max_speed_spread, the other networks
// measured whole before the step are measured again: their measurements describe a device that
// has since moved.
TEST_F(ProbeServiceTest, a_step_in_the_devices_speed_has_the_networks_measured_before_it_measured_again) {
  FakeWorker fake;
  fake.drift = 0.4;  // the reference reads 1.0, 1.4, 1.8 × ...: every reading a step
  start_requested_only(fake, 0.1);
  const json mlp = small_mlp();
  const json other = json::parse(R"({"input": {"shape": [32]}, "layers": [
      {"type": "linear", "out_features": 24}, {"type": "tanh"}, {"type": "linear", "out_features": 4}]})");
  auto requested = probes_->request(
      {{"device", "cpu"},
       {"seconds", 7200},
       {"models",
        {{{"model", mlp}, {"training", {{"batch_size", 8}}}}, {{"model", other}, {"training", {{"batch_size", 8}}}}}}});
  ASSERT_TRUE(requested) << requested.error().message;
  ASSERT_TRUE(within([&] { return shown()["whole_networks"]["measured"] == 2; }, 60s)) << shown().dump();
  const std::string other_request =
      json::array({8, json::array({estimator::to_json(*estimator::parse_model_spec(other, "/model"))})}).dump();
  auto other_measured = [&] {
    const auto read = requests_read();
    return std::count_if(read.begin(), read.end(),
                         [&](const std::string& line) { return json::parse(line) == json::parse(other_request); });
  };
  ASSERT_EQ(other_measured(), 1);
  // The next half-hourly reference reading steps by 40 %: the other network is measured again.
  for (int i = 0; i < 2 && other_measured() < 2; ++i) {
    const int readings = shown()["whole_networks"]["reference"]["readings"];
    clock_.advance(std::chrono::minutes(31));
    ASSERT_TRUE(within([&] { return shown()["whole_networks"]["reference"]["readings"] == readings + 1; }, 30s))
        << shown().dump();
    (void)within([&] { return other_measured() >= 2; }, 5s);
  }
  EXPECT_GE(other_measured(), 2) << shown().dump();
}

// A device with a joule-worker of its own (a GPU's, built against the node's PyTorch with CUDA)
// is checked and probed with that one, not the node's.
TEST_F(ProbeServiceTest, a_device_with_its_own_worker_is_probed_with_it) {
  const auto own = dir_.write("own-worker", fmt::format("#!/bin/sh\necho \"$1\" >> {}\nexec {} \"$@\"\n",
                                                        (dir_ / "own.log").string(), (dir_ / "fake-worker").string()));
  ::chmod(own.c_str(), 0755);
  device_table_.find("cpu")->worker = own;
  config::ProbingConfig probing;
  probing.idle_seconds = 0.0;
  start(probing);
  ASSERT_TRUE(run_until([&] { return probes_started() >= 1; })) << shown().dump();
  EXPECT_EQ(probes_->worker_for("cpu"), own);
  std::ifstream log(dir_ / "own.log");
  std::vector<std::string> commands;
  for (std::string line; std::getline(log, line);) commands.push_back(line);
  ASSERT_GE(commands.size(), 2u);
  EXPECT_EQ(commands[0], "env") << "the environment check ran the device's worker";
  EXPECT_NE(std::find(commands.begin(), commands.end(), "probe"), commands.end());
}

// A node without the packaged worker (a GPU node with only a joule-worker-cuda) still probes the
// devices that have a worker of their own, and only those.
TEST_F(ProbeServiceTest, without_a_node_worker_only_a_device_with_its_own_is_probed) {
  config::ProbingConfig probing;
  probing.idle_seconds = 0.0;
  start(probing, FakeWorker{.node_worker = false});
  idle_for(50ms);
  EXPECT_EQ(probes_->info("cpu"), json::object()) << "no worker: not probed";

  device_table_.find("cpu")->worker = dir_ / "fake-worker";
  start(probing, FakeWorker{.node_worker = false});
  ASSERT_TRUE(run_until([&] { return probes_started() >= 1; })) << shown().dump();
  EXPECT_EQ(probes_->worker_for("cpu"), dir_ / "fake-worker");
}

// A MIG device is probed only while its siblings have no work: a probe reads their GPU's counter
// whole. (The fixture's device stands in for a MIG device of GPU 0, a second for its sibling.)
TEST_F(ProbeServiceTest, a_mig_device_waits_to_probe_while_a_sibling_has_work) {
  device_table_.find("cpu")->mig_gpu = 0;
  Device sibling;
  sibling.name = "mig:0.1";
  sibling.mig_gpu = 0;
  sibling.meter = std::make_unique<joule::testing::CountingMeter>();
  device_table_.add(std::move(sibling)).hold("someone-elses-job", 0);
  config::ProbingConfig probing;
  probing.idle_seconds = 0.0;
  start(probing);
  ASSERT_TRUE(run_until([&] { return state() == "busy"; })) << shown().dump();
  EXPECT_EQ(waiting(), "another MIG device of its GPU has work (a probe reads the GPU's counter whole)");
  idle_for(50ms);
  EXPECT_EQ(probes_started(), 0);
  device_table_.find("mig:0.1")->release("someone-elses-job");
  ASSERT_TRUE(run_until([&] { return probes_started() >= 1; })) << shown().dump();
}

}  // namespace
}  // namespace joule::daemon
