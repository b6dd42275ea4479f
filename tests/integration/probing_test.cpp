// Real background probing end to end: jouled runs joule-worker on the cpu when it is idle,
// learns its energy model, yields the device to jobs at once, keeps samples across restarts and
// withdraws a model learnt under another worker environment (threads are part of it).

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "daemon_process.hpp"

using joule::testing::DaemonProcess;
using joule::testing::run_program;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// The modelled meter is forced so the assertions hold on machines with readable RAPL too.
std::string config(const std::string& probing) {
  return "[[devices]]\nname = \"cpu\"\nmeter = \"modelled\"\n\n[probing]\n" + probing;
}
// Probes of a fraction of a second, a refit every other probe: a model within seconds.
// No interpreter: these tests are about layer probes (the runtime probe has tests of its own).
const std::string kQuick =
    "warmup_steps = 2\nsteps_per_repetition = 3\nreading_seconds = 0.02\nrepetitions = 3\nrefit_every = 2\n"
    "python = \"\"\n";
const std::string kLearn = "idle_seconds = 0\n" + kQuick;

// A temp state directory shared by a daemon and its restart, removed however the test ends, with
// the jobs' directories that jouled keeps beside it when it runs as root (`<state>-jobs`).
struct StateDir {
  std::filesystem::path path;
  explicit StateDir(const std::string& name)
      : path(std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()))) {
    remove();
  }
  ~StateDir() { remove(); }
  void remove() const {
    std::filesystem::remove_all(path);
    std::filesystem::remove_all(path.string() + "-jobs");
  }
};

json cpu_device(const DaemonProcess& daemon) {
  auto [status, body] = daemon.call("GET", "/v1/devices");
  if (status == 200u)
    for (const auto& device : body["devices"])
      if (device["name"] == "cpu") return device;
  return json();
}

// Polls `check` until it holds or the deadline passes; whether it held.
bool eventually(const std::function<bool()>& check, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (check()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(50ms);
  }
}

// Polls GET /v1/devices until the cpu device satisfies `done`; the last cpu device seen.
json wait_cpu(const DaemonProcess& daemon, const std::function<bool(const json&)>& done,
              std::chrono::seconds timeout = 90s) {
  json device;
  eventually([&] { return done(device = cpu_device(daemon)); }, timeout);
  return device;
}

// The member at a JSON pointer as text ("null" where there is none): checked, and readable
// in a failure message.
std::string text(const json& j, const std::string& pointer) {
  const json::json_pointer at(pointer);
  if (!j.contains(at)) return "null";
  return j.at(at).is_string() ? j.at(at).get<std::string>() : j.at(at).dump();
}
long number(const json& j, const std::string& pointer) {
  const json::json_pointer at(pointer);
  return j.contains(at) && j.at(at).is_number() ? j.at(at).get<long>() : -1;
}

bool model_ready(const json& device) { return text(device, "/model/state") == "ready"; }

// Command lines (NULs as spaces) of live processes containing `needle`; zombies have none.
std::vector<std::string> processes_with(const std::string& needle) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const auto name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(needle) != std::string::npos) found.push_back(cmdline);
  }
  return found;
}

// The first request file of a live probe process under `probes_dir` ("" when there is none):
// a worker measures a batch of plans, one request-N.json each.
std::string probe_request(const std::string& probes_dir) {
  for (const auto& cmdline : processes_with(probes_dir)) {
    std::istringstream words(cmdline);
    for (std::string word; words >> word;)
      if (word.ends_with("/request-0.json")) return word;
  }
  return "";
}

// The value of one exposition line such as `joule_probe_runs_total{device="cpu"}`; -1 if absent.
double metric(const std::string& exposition, const std::string& series) {
  std::istringstream lines(exposition);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  return -1.0;
}

// The version of the last "energy model version N fitted" in a daemon's log; -1 if none.
long last_fit(const std::string& log) {
  static const std::regex fitted(R"(energy model version ([0-9]+) fitted)");
  long last = -1;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), fitted); it != std::sregex_iterator(); ++it)
    last = std::stol((*it)[1]);
  return last;
}

std::string server_of(const DaemonProcess& daemon) { return "http://127.0.0.1:" + std::to_string(daemon.port()); }

}  // namespace

TEST(ProbingTest, background_probing_learns_a_cpu_model_and_shows_it) {
  DaemonProcess daemon({.config_toml = config(kLearn)});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  const auto cpu = wait_cpu(daemon, model_ready);
  ASSERT_TRUE(model_ready(cpu)) << cpu.dump(2) << daemon.log();
  EXPECT_GE(number(cpu, "/model/version"), 1);
  EXPECT_GT(number(cpu, "/model/samples"), 0);
  EXPECT_GT(number(cpu, "/model/last_probe_ms"), 0) << cpu.dump(2);
  EXPECT_EQ(text(cpu, "/model/source"), "modelled");
  const auto environment = text(cpu, "/model/probing/environment");
  EXPECT_NE(environment.find("torch"), std::string::npos) << environment;
  EXPECT_NE(environment.find("blas"), std::string::npos) << environment;

  auto [status, runs] = daemon.call("GET", "/v1/probes");
  ASSERT_EQ(status, 200u);
  ASSERT_TRUE(runs.is_array()) << runs.dump();
  json probed;
  for (const auto& run : runs)
    if (run["device"] == "cpu" && number(run, "/probes") > 0) probed = run;
  ASSERT_TRUE(probed.is_object()) << runs.dump(2);
  EXPECT_EQ(text(probed, "/energy/source"), "modelled");
  EXPECT_EQ(text(probed, "/energy/measured"), "false");  // a modelled meter is no measurement
  EXPECT_GT(probed["energy"]["joules"].get<double>(), 0.0);

  auto metrics = daemon.client().request("GET", "/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_GT(metric(metrics->body, R"(joule_probe_runs_total{device="cpu"})"), 0.0) << metrics->body;
  EXPECT_GE(metric(metrics->body, R"(joule_model_version{device="cpu"})"), 1.0) << metrics->body;

  auto [devices_code, devices] = run_program({JOULECTL_BINARY, "--server", server_of(daemon), "devices"});
  EXPECT_EQ(devices_code, 0) << devices;
  EXPECT_NE(devices.find("samples (modelled)"), std::string::npos) << devices;
  auto [probes_code, probes] = run_program({JOULECTL_BINARY, "--server", server_of(daemon), "probes"});
  EXPECT_EQ(probes_code, 0) << probes;
  EXPECT_NE(probes.find("modelled (not measured)"), std::string::npos) << probes;
}

TEST(ProbingTest, a_job_preempts_a_probe) {
  // Probes of thousands of steps (seconds each): one surely still runs when the job comes.
  DaemonProcess daemon({.config_toml = config("idle_seconds = 0\nsteps_per_repetition = 2000\npython = \"\"\n")});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  const auto cpu = wait_cpu(
      daemon, [](const json& d) { return text(d, "/model/probing/state") == "probing"; }, 60s);
  ASSERT_EQ(text(cpu, "/model/probing/state"), "probing") << cpu.dump(2) << daemon.log();
  const auto run_id = text(cpu, "/model/probing/run");
  // The probe's runner and worker both carry its request file, under this daemon's state dir.
  const auto probes_dir = (daemon.state_dir() / "probes").string();
  std::string request;
  ASSERT_TRUE(eventually([&] { return !(request = probe_request(probes_dir)).empty(); }, 5s)) << probes_dir;

  const auto submitted = std::chrono::steady_clock::now();
  const auto id = daemon.submit(json{{"name", "needs-the-cpu"}, {"run", {{"command", {"sleep", "1"}}}}});
  ASSERT_FALSE(id.empty());
  const auto job = daemon.wait_state(id, {"running", "succeeded", "failed"}, 20s);
  EXPECT_TRUE(text(job, "/state") == "running" || text(job, "/state") == "succeeded") << job.dump(2);
  EXPECT_LT(std::chrono::steady_clock::now() - submitted, 5s) << "the job waited for the probe";
  EXPECT_EQ(text(job, "/device"), "cpu");

  json run;
  EXPECT_TRUE(eventually(
      [&] { return number(run = daemon.call("GET", "/v1/probes/" + run_id).second, "/preempted") >= 1; }, 10s))
      << run.dump(2);
  std::vector<std::string> left;
  EXPECT_TRUE(eventually([&] { return (left = processes_with(request)).empty(); }, 5s)) << "still running: " << left[0];
  EXPECT_EQ(text(daemon.wait_state(id, {"succeeded", "failed"}), "/state"), "succeeded");
}

TEST(ProbingTest, requested_probe_run_via_api_and_joulectl) {
  DaemonProcess daemon({.config_toml = config("enabled = false\n" + kQuick)});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  auto [status, accepted] = daemon.call("POST", "/v1/probes", R"({"device": "cpu", "seconds": 8})");
  ASSERT_EQ(status, 202u) << accepted.dump();
  EXPECT_EQ(text(accepted, "/state"), "running");
  EXPECT_EQ(text(accepted, "/reason"), "requested");
  const auto first = text(accepted, "/id");

  auto [code, out] = run_program(
      {JOULECTL_BINARY, "--server", server_of(daemon), "probe", "--device", "cpu", "--seconds", "5", "--wait"});
  EXPECT_EQ(code, 0) << out << daemon.log();
  EXPECT_NE(out.find("probe run p"), std::string::npos) << out;
  EXPECT_NE(out.find("(modelled, not measured)"), std::string::npos) << out;
  EXPECT_NE(out.find("model: "), std::string::npos) << out;

  // The second request superseded the first; the one joulectl waited for has ended and probed.
  auto runs = daemon.call("GET", "/v1/probes").second;
  ASSERT_TRUE(runs.is_array() && runs.size() >= 2u) << runs.dump(2);
  EXPECT_EQ(text(daemon.call("GET", "/v1/probes/" + first).second, "/state"), "done");
  const auto& last = runs.back();
  EXPECT_NE(text(last, "/id"), first);
  EXPECT_EQ(text(last, "/state"), "done") << last.dump(2);
  EXPECT_GT(number(last, "/probes"), 0) << last.dump(2) << daemon.log();
  EXPECT_EQ(daemon.call("GET", "/v1/probes/no-such-run").first, 404u);

  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"device": "cuda:7", "seconds": 5})", "/device"},
      {R"({"seconds": 5})", "/device"},
      {R"({"device": "cpu", "seconds": -1})", "/seconds"},
      {R"({"device": "cpu", "seconds": "long"})", "/seconds"},
      {R"({"device": "cpu", "minutes": 5})", "/minutes"},
      {R"({"device": "cpu", "models": [{"model": {"input": {"shape": [784]}, "layers": [{"type": "linear"}]}}]})",
       "/models/0/model/layers/0/out_features"},
  };
  for (const auto& [body, pointer] : bad) {
    auto [refused, problem] = daemon.call("POST", "/v1/probes", body);
    EXPECT_EQ(refused, 400u) << body;
    EXPECT_EQ(text(problem, "/errors/0/pointer"), pointer) << body << " -> " << problem.dump();
  }
  EXPECT_EQ(daemon.call("GET", "/v1/probes").second.size(), runs.size());  // refusals open no run
}

TEST(ProbingTest, samples_survive_a_restart) {
  StateDir state("joule-probing-restart");
  json before;
  std::string first_log;
  long fitted = -1;
  {
    DaemonProcess daemon({.config_toml = config(kLearn)}, state.path);
    ASSERT_TRUE(daemon.start()) << daemon.log();
    before = wait_cpu(daemon, [](const json& d) { return model_ready(d) && text(d, "/model/probing/run") != "null"; });
    ASSERT_TRUE(model_ready(before)) << before.dump(2) << daemon.log();
    daemon.signal(SIGTERM);  // during a probe run
    EXPECT_EQ(daemon.wait_exit(), 0) << daemon.log();
    // A fit may land between the last GET and SIGTERM: the log has the one installed last.
    first_log = daemon.log();
    fitted = last_fit(first_log);
  }
  ASSERT_GE(fitted, number(before, "/model/version"));
  DaemonProcess restarted({.config_toml = config("enabled = false\n" + kQuick)}, state.path);
  ASSERT_TRUE(restarted.start()) << restarted.log();
  const auto after = cpu_device(restarted);
  ASSERT_TRUE(model_ready(after)) << after.dump(2) << restarted.log();
  EXPECT_EQ(number(after, "/model/version"), fitted) << first_log << restarted.log();
  // Samples only grow between fits (the log's count includes decompositions the model dropped).
  if (fitted == number(before, "/model/version"))
    EXPECT_EQ(number(after, "/model/samples"), number(before, "/model/samples")) << after.dump(2);
  else
    EXPECT_GE(number(after, "/model/samples"), number(before, "/model/samples")) << after.dump(2);
  EXPECT_EQ(text(after, "/model/source"), "modelled");
  EXPECT_GT(number(after, "/model/last_probe_ms"), 0);
  // Every stored sample resumes the model being learnt, not just those of its last snapshot.
  EXPECT_GE(number(after, "/model/probing/samples_learning"), number(before, "/model/probing/samples_learning"));

  auto runs = restarted.call("GET", "/v1/probes").second;
  ASSERT_TRUE(runs.is_array() && !runs.empty()) << runs.dump(2);
  for (const auto& run : runs) EXPECT_NE(run["state"], "running") << run.dump(2);
  const auto run = restarted.call("GET", "/v1/probes/" + text(before, "/model/probing/run")).second;
  EXPECT_TRUE(text(run, "/state") == "interrupted" || text(run, "/state") == "done") << run.dump(2);
  // Still ready once the worker has reported its (unchanged) environment.
  const auto env_status = state.path / "probes" / "env-cpu" / "status";
  ASSERT_TRUE(eventually([&] { return std::filesystem::exists(env_status); }, 20s)) << restarted.log();
  EXPECT_FALSE(eventually([&] { return !model_ready(cpu_device(restarted)); }, 2s)) << restarted.log();
}

TEST(ProbingTest, a_changed_environment_withdraws_the_model) {
  StateDir state("joule-probing-environment");
  {
    DaemonProcess daemon({.config_toml = config("threads = 1\n" + kLearn)}, state.path);
    ASSERT_TRUE(daemon.start()) << daemon.log();
    auto cpu = wait_cpu(daemon, model_ready);
    ASSERT_TRUE(model_ready(cpu)) << cpu.dump(2) << daemon.log();
    EXPECT_NE(text(cpu, "/model/probing/environment").find("threads 1"), std::string::npos);
    daemon.signal(SIGTERM);
    EXPECT_EQ(daemon.wait_exit(), 0) << daemon.log();
  }
  // Threads are part of the worker's fingerprint: a model learnt with one thread says nothing
  // about probes with two, so it is withdrawn even though probing is off.
  DaemonProcess restarted({.config_toml = config("threads = 2\nenabled = false\n" + kQuick)}, state.path);
  ASSERT_TRUE(restarted.start()) << restarted.log();
  auto cpu = wait_cpu(
      restarted, [](const json& d) { return text(d, "/model/probing/campaign") == "environment"; }, 30s);
  EXPECT_EQ(text(cpu, "/model/probing/campaign"), "environment") << cpu.dump(2) << restarted.log();
  EXPECT_NE(text(cpu, "/model/state"), "ready") << cpu.dump(2);
  EXPECT_NE(text(cpu, "/model/probing/environment").find("threads 2"), std::string::npos) << cpu.dump(2);

  const json request = json::parse(R"({"training": {"batch_size": 64, "epochs": 1, "samples_per_epoch": 6400},
      "model": {"input": {"shape": [784]}, "layers": [{"type": "linear", "out_features": 10}]}})");
  auto [status, answer] = restarted.call("POST", "/v1/estimate", request.dump());
  ASSERT_EQ(status, 200u) << answer.dump();
  EXPECT_EQ(text(answer, "/estimates/0/device"), "cpu") << answer.dump(2);
  EXPECT_EQ(text(answer, "/estimates/0/status"), "no-model") << answer.dump(2);
}

TEST(ProbingTest, a_reload_with_other_threads_withdraws_the_model) {
  DaemonProcess daemon({.config_toml = config("threads = 1\n" + kLearn)});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  ASSERT_TRUE(model_ready(wait_cpu(daemon, model_ready))) << daemon.log();
  std::ofstream(daemon.state_dir().parent_path() / "jouled.toml") << config("threads = 2\nenabled = false\n" + kQuick);
  daemon.signal(SIGHUP);
  ASSERT_TRUE(daemon.wait_notification("config reloaded", 5000ms)) << daemon.log();
  // Probing is off now, so no probe reports the new environment: the reload itself must check it.
  auto cpu = wait_cpu(
      daemon, [](const json& d) { return text(d, "/model/probing/campaign") == "environment"; }, 20s);
  EXPECT_EQ(text(cpu, "/model/probing/campaign"), "environment") << cpu.dump(2) << daemon.log();
  EXPECT_NE(text(cpu, "/model/state"), "ready") << cpu.dump(2);
}

TEST(ProbingTest, samples_before_the_first_model_survive_a_restart) {
  StateDir state("joule-probing-early");
  long learnt = 0;
  {
    // Probes of seconds: the daemon stops after the first sample, before the model's first fit.
    DaemonProcess daemon({.config_toml = config("idle_seconds = 0\nsteps_per_repetition = 2000\n")}, state.path);
    ASSERT_TRUE(daemon.start()) << daemon.log();
    auto cpu = wait_cpu(
        daemon, [](const json& d) { return number(d, "/model/probing/samples_learning") >= 1; }, 60s);
    learnt = number(cpu, "/model/probing/samples_learning");
    ASSERT_GE(learnt, 1) << cpu.dump(2) << daemon.log();
    ASSERT_NE(text(cpu, "/model/state"), "ready") << "precondition: no model fitted yet";
    daemon.signal(SIGTERM);
    EXPECT_EQ(daemon.wait_exit(), 0) << daemon.log();
  }
  DaemonProcess restarted({.config_toml = config("enabled = false\n")}, state.path);
  ASSERT_TRUE(restarted.start()) << restarted.log();
  auto cpu = wait_cpu(
      restarted, [&](const json& d) { return number(d, "/model/probing/samples_learning") >= learnt; }, 10s);
  EXPECT_GE(number(cpu, "/model/probing/samples_learning"), learnt) << cpu.dump(2) << restarted.log();
}

TEST(ProbingTest, a_broken_worker_is_reported_once_and_not_rerun) {
  DaemonProcess daemon({.config_toml = config("idle_seconds = 0\nworker = \"/bin/false\"\n")});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  const auto failed = [](const json& d) {
    return text(d, "/model/probing/waiting").starts_with("joule-worker env failed");
  };
  auto cpu = wait_cpu(daemon, failed, 30s);
  ASSERT_TRUE(failed(cpu)) << cpu.dump(2) << daemon.log();
  // Off until a reload: the reason stays visible and the worker is not started again each tick.
  const auto count = [&] {
    const std::string log = daemon.log(), needle = "joule-worker env failed";
    int n = 0;
    for (auto at = log.find(needle); at != std::string::npos; at = log.find(needle, at + 1)) ++n;
    return n;
  };
  EXPECT_FALSE(eventually([&] { return !failed(cpu = cpu_device(daemon)) || count() > 1; }, 4s))
      << cpu.dump(2) << daemon.log();
}

// A worker whose LibTorch has no CUDA (Debian's), for a GPU (NVML faked at the library boundary,
// found by dlopen through LD_LIBRARY_PATH): the GPU says why it cannot be probed, and a requested
// run is refused with that reason instead of waiting out its seconds.
TEST(ProbingTest, a_cpu_only_worker_leaves_a_gpu_unprobed_and_says_why) {
  const auto dir = std::filesystem::temp_directory_path() / ("joule-cpu-worker-gpu-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::create_symlink(JOULE_FAKE_NVML, dir / "libnvidia-ml.so.1");
  std::string energy = "energy_mj";
  for (int i = 0; i < 2000; ++i) energy += " " + std::to_string(i * 100000LL);
  std::ofstream(dir / "script") << "devices 1\nname NVIDIA Fake A100\n" << energy << "\n";
  DaemonProcess daemon(
      {.config_toml = "[[devices]]\nname = \"cpu\"\nmeter = \"modelled\"\n[[devices]]\nname = "
                      "\"cuda:0\"\nmeter = \"nvml\"\n\n[probing]\nidle_seconds = 3600\n" +
                      kQuick,
       .env = {{"LD_LIBRARY_PATH", dir.string()}, {"JOULE_FAKE_NVML_SCRIPT", (dir / "script").string()}}});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  json gpu;
  const auto unavailable = [&] {
    auto [status, body] = daemon.call("GET", "/v1/devices");
    if (status != 200u) return false;
    for (const auto& device : body["devices"])
      if (device["name"] == "cuda:0") gpu = device;
    return text(gpu, "/model/probing/state") == "unavailable";
  };
  ASSERT_TRUE(eventually(unavailable, 30s)) << gpu.dump(2) << daemon.log();
  EXPECT_NE(text(gpu, "/model/probing/waiting").find("CUDA is not available"), std::string::npos) << gpu.dump(2);

  const auto [status, body] = daemon.call("POST", "/v1/probes", R"({"device": "cuda:0", "seconds": 5})");
  EXPECT_EQ(status, 409u) << body.dump(2);
  EXPECT_NE(body.value("detail", "")
                .find("device cuda:0 cannot be probed: joule-worker env failed: joule-worker: "
                      "device cuda:0 asked for, but CUDA is not available"),
            std::string::npos)
      << body.dump(2);
  std::filesystem::remove_all(dir);
}

TEST(ProbingTest, a_requested_run_learns_the_optimizer_its_models_name) {
  DaemonProcess daemon({.config_toml = config("enabled = false\n" + kQuick)});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  const json mlp = json::parse(R"({"input": {"shape": [64]}, "layers": [
      {"type": "linear", "out_features": 32}, {"type": "relu"}, {"type": "linear", "out_features": 10}]})");
  const json adam_job = {{"model", mlp}, {"training", {{"batch_size", 16}, {"optimizer", "adam"}, {"samples_per_epoch", 160}}}};
  // Before: the optimizer has no model, and the estimate says which one is missing.
  auto [before_status, before] = daemon.call("POST", "/v1/estimate", adam_job.dump());
  ASSERT_EQ(before_status, 200u) << before.dump();
  EXPECT_EQ(text(before, "/estimates/0/status"), "no-model") << before.dump(2);

  const json bad = {{"device", "cpu"}, {"models", {{{"model", mlp}, {"training", {{"batch_size", 16}, {"optimizer", "lion"}}}}}}};
  auto [refused, problem] = daemon.call("POST", "/v1/probes", bad.dump());
  EXPECT_EQ(refused, 400u);
  EXPECT_EQ(text(problem, "/errors/0/pointer"), "/models/0/training/optimizer") << problem.dump();

  const json request = {{"device", "cpu"}, {"seconds", 60}, {"models", {{{"model", mlp}, {"training", {{"batch_size", 16}, {"optimizer", "adam"}}}}}}};
  auto [status, accepted] = daemon.call("POST", "/v1/probes", request.dump());
  ASSERT_EQ(status, 202u) << accepted.dump();
  json estimate;
  const bool learnt = eventually(
      [&] {
        estimate = daemon.call("POST", "/v1/estimate", adam_job.dump()).second;
        return text(estimate, "/estimates/0/status") == "ok";
      },
      90s);
  ASSERT_TRUE(learnt) << estimate.dump(2) << daemon.log();
  const auto& layers = estimate["estimates"][0]["layers"];
  ASSERT_FALSE(layers.empty());
  EXPECT_EQ(layers.back()["type"], "optimizer") << layers.dump(2);
  EXPECT_EQ(layers.back()["model"], "optimizer:adam@output");
  EXPECT_GT(layers.back()["joules_per_step"]["mean"].get<double>(), 0.0);
  EXPECT_NE(text(cpu_device(daemon), "/model/layers/optimizer:adam@output"), "null") << cpu_device(daemon).dump(2);
}

TEST(ProbingTest, python_jobs_are_estimated_with_the_interpreter_the_device_measured) {
  if (!std::filesystem::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  std::string probing = kLearn;
  probing.replace(probing.find("python = \"\""), 11, "python = \"/usr/bin/python3\"");
  DaemonProcess daemon({.config_toml = config(probing)});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  const json classifier = json::parse(R"({"input": {"shape": [784]}, "layers": [
      {"type": "linear", "out_features": 256}, {"type": "relu"}, {"type": "linear", "out_features": 10}]})");
  const json training = {{"batch_size", 64}, {"epochs", 1}, {"samples_per_epoch", 6400}};  // 100 steps
  const auto cpu = wait_cpu(
      daemon,
      [](const json& device) {
        return model_ready(device) && text(device, "/model/runtimes/python/runtime") == "python";
      },
      180s);
  ASSERT_EQ(text(cpu, "/model/runtimes/python/runtime"), "python") << cpu.dump(2) << daemon.log();
  EXPECT_EQ(text(cpu, "/model/probing/runtime/state"), "measured");
  EXPECT_EQ(text(cpu, "/model/runtimes/python/source"), "modelled");
  EXPECT_EQ(text(cpu, "/model/runtimes/python/measured"), "false");
  EXPECT_NE(text(cpu, "/model/runtimes/python/version").find("Python 3."), std::string::npos) << cpu.dump(2);
  EXPECT_GT(cpu["model"]["runtimes"]["python"]["start"]["seconds"].get<double>(), 0.05) << cpu.dump(2);

  // The same network, estimated as a built-in job and as a Python one: the difference is the
  // interpreter's start-up and its per-step cost over the network's 3 modules, 100 steps.
  json rows[2];
  ASSERT_TRUE(eventually(
      [&] {
        for (int i = 0; i < 2; ++i) {
          auto [status, answer] = daemon.call(
              "POST", "/v1/estimate",
              json{{"model", classifier}, {"training", training}, {"runtime", i ? "python" : "none"}}.dump());
          if (status != 200u || text(answer, "/estimates/0/status") != "ok") return false;
          rows[i] = answer["estimates"][0];
        }
        return true;
      },
      120s))
      << daemon.log();
  ASSERT_FALSE(rows[0].contains("runtime")) << rows[0].dump(2);
  ASSERT_TRUE(rows[1].contains("runtime")) << rows[1].dump(2);
  EXPECT_EQ(rows[1]["runtime"]["modules"], 3);
  const double added = rows[1]["runtime"]["start_joules"]["mean"].get<double>() +
                       100.0 * rows[1]["runtime"]["step_joules"]["mean"].get<double>();
  EXPECT_GT(added, 0.0);
  EXPECT_NEAR(rows[1]["joules"]["mean"].get<double>() - rows[0]["joules"]["mean"].get<double>(), added,
              1e-6 * added + 1e-9)
      << rows[1].dump(2);
  EXPECT_GT(rows[1]["joules"]["std"].get<double>(), rows[0]["joules"]["std"].get<double>());
  EXPECT_EQ(
      daemon
          .call("POST", "/v1/estimate", json{{"model", classifier}, {"training", training}, {"runtime", "ruby"}}.dump())
          .second["errors"][0]["pointer"],
      "/runtime");

  // A job's runtime comes from its command: Python's is added, another program's is named.
  auto submit = [&](const json& command) {
    auto [status, job] =
        daemon.call("POST", "/v1/jobs",
                    json{{"model", classifier}, {"training", training}, {"run", {{"command", command}}}}.dump());
    EXPECT_EQ(status, 201u) << job.dump(2);
    return job;
  };
  const json python_job = submit({"/usr/bin/python3", "-c", "pass"});
  ASSERT_TRUE(python_job["estimate"].is_array()) << python_job.dump(2);
  EXPECT_TRUE(python_job["estimate"][0].contains("runtime")) << python_job.dump(2);
  const json other_job = submit({"/bin/true"});
  ASSERT_TRUE(other_job["estimate"].is_array()) << other_job.dump(2);
  EXPECT_FALSE(other_job["estimate"][0].contains("runtime"));
  EXPECT_NE(other_job["estimate"][0]["warnings"].dump().find("/bin/true is not a runtime Joule measures"),
            std::string::npos)
      << other_job.dump(2);
}

// A requested run naming a network measures it whole once its layers have a model; the estimate
// of that network is then the measurement (its layers apportioning it), and a restart keeps it.
TEST(ProbingTest, a_requested_run_measures_its_networks_whole_and_estimates_them_from_it) {
  StateDir state("joule-probing-whole");
  const json mlp = json::parse(R"({"input": {"shape": [48]}, "layers": [
      {"type": "linear", "out_features": 24}, {"type": "relu"}, {"type": "linear", "out_features": 10}]})");
  const json job = {{"model", mlp}, {"training", {{"batch_size", 16}, {"samples_per_epoch", 160}}}};
  json measured;
  {
    DaemonProcess daemon({.config_toml = config("enabled = false\n" + kQuick)}, state.path);
    ASSERT_TRUE(daemon.start()) << daemon.log();
    const json request = {
        {"device", "cpu"}, {"seconds", 60}, {"models", {{{"model", mlp}, {"training", {{"batch_size", 16}}}}}}};
    auto [status, accepted] = daemon.call("POST", "/v1/probes", request.dump());
    ASSERT_EQ(status, 202u) << accepted.dump();
    const bool whole = eventually(
        [&] {
          measured = daemon.call("POST", "/v1/estimate", job.dump()).second;
          return text(measured, "/estimates/0/whole/basis") == "measured";
        },
        90s);
    ASSERT_TRUE(whole) << measured.dump(2) << daemon.log();
    const json& row = measured["estimates"][0];
    EXPECT_EQ(text(row, "/whole/family"), "dense");
    EXPECT_GT(row["whole"]["layers_joules_per_step"].get<double>(), 0.0);
    // Never tighter than the drift between a measurement and a job.
    EXPECT_GE(row["joules_per_step"]["std"].get<double>(), 0.099 * row["joules_per_step"]["mean"].get<double>());
    const auto cpu = cpu_device(daemon);
    EXPECT_GE(number(cpu, "/model/probing/whole_networks/measured"), 1) << cpu.dump(2);
    EXPECT_NE(daemon.log().find("measured whole at batch 16"), std::string::npos) << daemon.log();
    auto [devices_code, devices] = run_program({JOULECTL_BINARY, "--server", server_of(daemon), "devices"});
    EXPECT_EQ(devices_code, 0) << devices;
    EXPECT_NE(devices.find("networks measured whole"), std::string::npos) << devices;
    daemon.signal(SIGTERM);
    EXPECT_EQ(daemon.wait_exit(), 0) << daemon.log();
  }
  DaemonProcess restarted({.config_toml = config("enabled = false\n" + kQuick)}, state.path);
  ASSERT_TRUE(restarted.start()) << restarted.log();
  const json again = restarted.call("POST", "/v1/estimate", job.dump()).second;
  EXPECT_EQ(text(again, "/estimates/0/whole/basis"), "measured") << again.dump(2) << restarted.log();
  EXPECT_GE(number(cpu_device(restarted), "/model/probing/whole_networks/measured"), 1);
  // A job of that network keeps the basis in the estimate it was placed by.
  json submitted = job;
  submitted["run"] = {{"command", {"/bin/true"}}};
  auto [status, placed] = restarted.call("POST", "/v1/jobs", submitted.dump());
  ASSERT_EQ(status, 201u) << placed.dump(2);
  EXPECT_EQ(text(placed, "/estimate/0/whole/basis"), "measured") << placed.dump(2);
}
