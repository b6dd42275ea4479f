// Simulated devices end to end: jouled probes them by simulator on a worker thread, learns
// their models, estimates jobs on them, and keeps the models across a restart.

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "daemon_process.hpp"

using joule::testing::DaemonProcess;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

const char* kConfig = "[[devices]]\nname = \"cpu\"\n[[devices]]\nname = \"sim:laptop-cpu\"\nprobes = 120\n";

json mlp() {
  return json::parse(R"({"input": {"shape": [784]}, "layers": [
      {"type": "linear", "out_features": 256}, {"type": "relu"}, {"type": "linear", "out_features": 10}]})");
}

json wait_model_ready(const DaemonProcess& daemon, const std::string& device) {
  json found;
  for (int i = 0; i < 600; ++i) {
    auto [status, body] = daemon.call("GET", "/v1/devices");
    for (const auto& d : body["devices"])
      if (d["name"] == device) found = d;
    if (found.is_object() && found["model"]["state"] == "ready") return found;
    std::this_thread::sleep_for(50ms);
  }
  return found;
}

}  // namespace

TEST(EstimatesTest, a_simulated_device_learns_its_model_and_estimates_jobs) {
  auto state = std::filesystem::temp_directory_path() / ("joule-estimates-" + std::to_string(::getpid()));
  std::filesystem::remove_all(state);
  std::filesystem::remove_all(state.string() + "-jobs");  // the jobs' directories, beside it
  {
    DaemonProcess daemon({.config_toml = kConfig}, state);
    ASSERT_TRUE(daemon.start()) << daemon.log();
    auto device = wait_model_ready(daemon, "sim:laptop-cpu");
    ASSERT_EQ(device["model"]["state"], "ready") << device.dump(2) << daemon.log();
    EXPECT_EQ(device["runs_jobs"], false);
    EXPECT_EQ(device["meter"]["source"], "simulated");
    EXPECT_EQ(device["meter"]["measured"], false);
    EXPECT_GT(device["model"]["samples"].get<int>(), 50);
    auto metrics = daemon.client().request("GET", "/metrics");
    ASSERT_TRUE(metrics);
    EXPECT_NE(metrics->body.find("joule_probe_runs_total{device=\"sim:laptop-cpu\"}"), std::string::npos);
    EXPECT_NE(metrics->body.find("joule_model_samples{device=\"sim:laptop-cpu\",layer=\"linear@output\"}"),
              std::string::npos);

    json request = {{"model", mlp()}, {"training", {{"batch_size", 64}, {"epochs", 1}, {"samples_per_epoch", 6400}}}};
    auto [status, answer] = daemon.call("POST", "/v1/estimate", request.dump());
    ASSERT_EQ(status, 200u) << answer.dump();
    ASSERT_EQ(answer["estimates"].size(), 2u);
    for (const auto& row : answer["estimates"]) {
      if (row["device"] == "cpu") {
        EXPECT_EQ(row["status"], "no-model");  // no number is invented for the real device
      } else {
        EXPECT_EQ(row["status"], "ok") << row.dump();
        EXPECT_EQ(row["source"], "simulated");
        EXPECT_EQ(row["steps"], 100);
        EXPECT_GT(row["joules"]["mean"].get<double>(), 0.0);
      }
    }
    // EAT's penalty is work probes never ran: the estimate says it leaves it out.
    request["training"]["eat"] = {{"lambda", 0.1}};
    std::tie(status, answer) = daemon.call("POST", "/v1/estimate", request.dump());
    ASSERT_EQ(status, 200u) << answer.dump();
    for (const auto& row : answer["estimates"]) {
      if (row["status"] == "ok") {
        EXPECT_NE(row["warnings"].dump().find("training.eat"), std::string::npos) << row.dump();
      }
    }

    // A job with a model carries its estimates; it runs on the cpu, never on the simulated device.
    json job = {{"name", "with-model"},
                {"model", mlp()},
                {"training", {{"batch_size", 64}, {"epochs", 1}, {"samples_per_epoch", 6400}}},
                {"run", {{"command", {"true"}}}}};
    const auto id = daemon.submit(job);
    ASSERT_FALSE(id.empty());
    auto done = daemon.wait_state(id, {"succeeded", "failed"});
    EXPECT_EQ(done["device"], "cpu");
    ASSERT_TRUE(done["estimate"].is_array()) << done.dump(2);
    EXPECT_EQ(done["estimate"].size(), 2u);
    json only_sim = job;
    only_sim["constraints"] = {{"devices", {"sim:*"}}};
    auto [refused, problem] = daemon.call("POST", "/v1/jobs", only_sim.dump());
    EXPECT_EQ(refused, 400u);
    EXPECT_EQ(problem["errors"][0]["pointer"], "/constraints/devices");
  }
  // The model is a snapshot in SQLite: a restart has it at once, without probing again.
  DaemonProcess restarted({.config_toml = kConfig}, state);
  ASSERT_TRUE(restarted.start()) << restarted.log();
  auto [status, devices] = restarted.call("GET", "/v1/devices");
  json sim;
  for (const auto& d : devices["devices"])
    if (d["name"] == "sim:laptop-cpu") sim = d;
  EXPECT_EQ(sim["model"]["state"], "ready") << sim.dump(2);
  EXPECT_NE(restarted.log().find("energy model version 1 loaded"), std::string::npos) << restarted.log();
  std::filesystem::remove_all(state);
  std::filesystem::remove_all(state.string() + "-jobs");  // the jobs' directories, beside it
}

// Finished jobs teach the estimates: a simulated device that runs jobs meters each (simulated
// joules, the same source as its model), and once enough have ended the next estimates are
// calibrated, say so, keep the model's own figure, and the rows are rebuilt after a restart.
TEST(EstimatesTest, finished_jobs_calibrate_the_next_estimates_and_survive_a_restart) {
  auto state = std::filesystem::temp_directory_path() / ("joule-outcomes-" + std::to_string(::getpid()));
  std::filesystem::remove_all(state);
  std::filesystem::remove_all(state.string() + "-jobs");
  const std::string config = "[[devices]]\nname = \"sim:laptop-cpu\"\nprobes = 120\nruns_jobs = true\n";
  const json training = {{"batch_size", 64}, {"epochs", 1}, {"samples_per_epoch", 6400}};
  const auto rows_of = [](const DaemonProcess& daemon) {
    auto [status, devices] = daemon.call("GET", "/v1/devices");
    for (const auto& d : devices["devices"])
      if (d["name"] == "sim:laptop-cpu") return d["model"]["calibration"];
    return json();
  };
  {
    DaemonProcess daemon({.config_toml = config}, state);
    ASSERT_TRUE(daemon.start()) << daemon.log();
    ASSERT_EQ(wait_model_ready(daemon, "sim:laptop-cpu")["model"]["state"], "ready") << daemon.log();
    EXPECT_EQ(rows_of(daemon)["rows"], 0);
    for (int i = 0; i < 6; ++i) {
      json job = {{"name", "learn-" + std::to_string(i)},
                  {"model", mlp()},
                  {"training", training},
                  {"run", {{"command", {"sh", "-c", "sleep 0.3"}}}}};
      const auto id = daemon.submit(job);
      ASSERT_FALSE(id.empty());
      auto done = daemon.wait_state(id, {"succeeded", "failed"});
      ASSERT_EQ(done["state"], "succeeded") << done.dump(2);
      ASSERT_EQ(done["energy"]["source"], "simulated") << done.dump(2);
    }
    const json calibration = rows_of(daemon);
    EXPECT_EQ(calibration["rows"], 6) << calibration.dump(2);
    EXPECT_TRUE(calibration["error_raw"].is_number()) << calibration.dump(2);
    EXPECT_TRUE(calibration["coverage_2sigma_calibrated_leave_one_out"].is_number()) << calibration.dump(2);
    // The job overhead line is fitted from the same rows (jobs of one size: all of it per job).
    EXPECT_GE(calibration["overhead"]["joules"]["per_job"].get<double>(), 0.0) << calibration.dump(2);
    EXPECT_EQ(calibration["overhead"]["joules"]["per_epoch"], 0.0) << calibration.dump(2);
    json request = {{"model", mlp()}, {"training", training}};
    auto [status, answer] = daemon.call("POST", "/v1/estimate", request.dump());
    ASSERT_EQ(status, 200u) << answer.dump();
    const auto& row = answer["estimates"][0];
    EXPECT_EQ(row["calibration"]["rows"], 6) << row.dump(2);
    EXPECT_GT(row["raw_joules"]["mean"].get<double>(), 0.0) << row.dump(2);
    EXPECT_GT(row["joules"]["std"].get<double>(), 0.0) << row.dump(2);
    const auto metrics = daemon.client().request("GET", "/metrics");
    ASSERT_TRUE(metrics);
    for (const char* series : {"joule_calibration_rows{device=\"sim:laptop-cpu\"} 6",
                               "joule_calibration_error_ratio{device=\"sim:laptop-cpu\",estimate=\"corrected\"}",
                               "joule_calibration_coverage_ratio{device=\"sim:laptop-cpu\",estimate=\"calibrated\"}",
                               "joule_job_overhead_joules{device=\"sim:laptop-cpu\",per=\"job\"}"})
      EXPECT_NE(metrics->body.find(series), std::string::npos) << series;
  }
  DaemonProcess restarted({.config_toml = config}, state);
  ASSERT_TRUE(restarted.start()) << restarted.log();
  EXPECT_EQ(rows_of(restarted)["rows"], 6) << restarted.log();
  EXPECT_NE(restarted.log().find("estimates: learnt from 6 finished jobs"), std::string::npos) << restarted.log();
  EXPECT_NE(
      restarted.client().request("GET", "/metrics")->body.find("joule_calibration_rows{device=\"sim:laptop-cpu\"} 6"),
      std::string::npos);
  std::filesystem::remove_all(state);
  std::filesystem::remove_all(state.string() + "-jobs");
}

// A device's thread count is the one its probes use and every job on it gets; a job that asks
// for another count in run.env keeps it, and its estimate says that it lies outside the model.
// Jobs also get the malloc thresholds probes run under, unless run.env sets its own.
TEST(EstimatesTest, jobs_get_their_devices_thread_count_and_an_estimate_says_when_they_ask_for_another) {
  auto state = std::filesystem::temp_directory_path() / ("joule-threads-" + std::to_string(::getpid()));
  std::filesystem::remove_all(state);
  std::filesystem::remove_all(state.string() + "-jobs");
  const std::string config = "[[devices]]\nname = \"sim:laptop-cpu\"\nprobes = 40\nruns_jobs = true\nthreads = 3\n";
  const json training = {{"batch_size", 64}, {"epochs", 1}, {"samples_per_epoch", 640}};
  const std::string print =
      "echo $OMP_NUM_THREADS $MKL_NUM_THREADS $OPENBLAS_NUM_THREADS $JOULE_THREADS $MALLOC_MMAP_THRESHOLD_ "
      "$MALLOC_TRIM_THRESHOLD_ $MALLOC_MMAP_MAX_";
  DaemonProcess daemon({.config_toml = config}, state);
  ASSERT_TRUE(daemon.start()) << daemon.log();
  auto device = wait_model_ready(daemon, "sim:laptop-cpu");
  ASSERT_EQ(device["model"]["state"], "ready") << daemon.log();
  EXPECT_EQ(device["threads"], 3) << device.dump(2);

  const auto run = [&](json env) {
    json job = {{"model", mlp()}, {"training", training}, {"run", {{"command", {"sh", "-c", print}}, {"env", env}}}};
    const auto id = daemon.submit(job);
    EXPECT_FALSE(id.empty());
    auto done = daemon.wait_state(id, {"succeeded", "failed"});
    EXPECT_EQ(done["state"], "succeeded") << done.dump(2);
    return std::make_pair(done, daemon.client().request("GET", "/v1/jobs/" + id + "/log")->body);
  };
  auto [plain, plain_log] = run(json::object());
  EXPECT_NE(plain_log.find("3 3 3 3 33554432 1073741824 0"), std::string::npos) << plain_log;
  ASSERT_TRUE(plain["estimate"].is_array()) << plain.dump(2);
  EXPECT_EQ(plain["estimate"][0]["warnings"].dump().find("run.env sets"), std::string::npos) << plain.dump(2);

  auto [own, own_log] = run(json{{"OMP_NUM_THREADS", "1"}, {"MALLOC_TRIM_THRESHOLD_", "131072"}});
  EXPECT_NE(own_log.find("1 3 3 3 33554432 131072 0"), std::string::npos) << own_log;
  ASSERT_TRUE(own["estimate"].is_array()) << own.dump(2);
  const std::string warnings = own["estimate"][0]["warnings"].dump();
  EXPECT_NE(warnings.find("run.env sets OMP_NUM_THREADS=1, but this device's model is learnt at 3 threads"),
            std::string::npos)
      << warnings;

  // A job with cores of its own: its processes run on that many CPUs only, its thread variables
  // say as many, and its estimate says the model was learnt at another count.
  json confined = {{"model", mlp()},
                   {"training", training},
                   {"resources", {{"cores", 1}}},
                   {"run", {{"command", {"sh", "-c", print + "; grep Cpus_allowed_list /proc/self/status"}}}}};
  const auto id = daemon.submit(confined);
  ASSERT_FALSE(id.empty());
  const json done = daemon.wait_state(id, {"succeeded", "failed"});
  EXPECT_EQ(done["state"], "succeeded") << done.dump(2);
  const std::string log = daemon.client().request("GET", "/v1/jobs/" + id + "/log")->body;
  EXPECT_NE(log.find("1 1 1 1 33554432"), std::string::npos) << log;
  const auto allowed = log.find("Cpus_allowed_list:");
  ASSERT_NE(allowed, std::string::npos) << log;
  const std::string cpus = log.substr(allowed + 18, log.find('\n', allowed) - allowed - 18);
  EXPECT_EQ(cpus.find_first_of(",-"), std::string::npos) << "one CPU, not " << cpus;
  EXPECT_NE(done.dump().find("on CPUs "), std::string::npos) << done.dump(2);
  EXPECT_NE(done["estimate"][0]["warnings"].dump().find(
                "resources.cores = 1 runs it at 1 thread, but this device's model is learnt at 3 threads"),
            std::string::npos)
      << done.dump(2);
  // More cores than the node has: refused, naming the field, nothing stored.
  confined["resources"]["cores"] = 4096;
  const auto [status, refused] = daemon.call("POST", "/v1/jobs", confined.dump());
  EXPECT_EQ(status, 400u) << refused.dump(2);
  EXPECT_EQ(refused["errors"][0]["pointer"], "/resources/cores") << refused.dump(2);
  std::filesystem::remove_all(state);
  std::filesystem::remove_all(state.string() + "-jobs");
}

// joulectl advise from a learnt simulated device: the costly layers narrowed to save the target,
// the advised spec written out (and estimated lower by jouled); a target no pruning reaches
// says how far it got and exits 1.
TEST(EstimatesTest, joulectl_advise_narrows_the_costly_layers_and_writes_the_spec) {
  auto state = std::filesystem::temp_directory_path() / ("joule-advise-" + std::to_string(::getpid()));
  std::filesystem::remove_all(state);
  std::filesystem::remove_all(state.string() + "-jobs");
  {
    DaemonProcess daemon({.config_toml = kConfig}, state);
    ASSERT_TRUE(daemon.start()) << daemon.log();
    ASSERT_EQ(wait_model_ready(daemon, "sim:laptop-cpu")["model"]["state"], "ready") << daemon.log();
    const std::string server = "http://127.0.0.1:" + std::to_string(daemon.port());
    const auto spec = state.string() + "-mlp.json";
    const auto out = state.string() + "-narrow.json";
    std::ofstream(spec) << mlp().dump();
    const auto [rc, text] = joule::testing::run_program(
        {JOULECTL_BINARY, "--server", server, "advise", spec, "--target", "0.3", "--batch-size", "64", "--out", out});
    EXPECT_EQ(rc, 0) << text;
    EXPECT_NE(text.find("on sim:laptop-cpu (simulated data)"), std::string::npos) << text;
    EXPECT_NE(text.find("256 -> "), std::string::npos) << text;  // the hidden layer, narrowed
    EXPECT_NE(text.find("cpu: no estimate"), std::string::npos) << text;
    std::ifstream written(out);
    const json narrow = json::parse(written, nullptr, false);
    ASSERT_FALSE(narrow.is_discarded()) << text;
    EXPECT_EQ(narrow["layers"][2]["out_features"], 10);  // the classes stay
    EXPECT_LT(narrow["layers"][0]["out_features"].get<int>(), 256);
    const json training = {{"batch_size", 64}, {"samples_per_epoch", 6400}};
    const auto joules = [&](const json& model) {
      json request = {{"model", model}, {"training", training}, {"devices", {"sim:*"}}};
      return daemon.call("POST", "/v1/estimate", request.dump()).second["estimates"][0]["joules"]["mean"].get<double>();
    };
    EXPECT_LE(joules(narrow), 0.7 * joules(mlp()) * 1.0001);

    const auto [far_rc, far_text] =
        joule::testing::run_program({JOULECTL_BINARY, "--server", server, "advise", spec, "--target", "0.99"});
    EXPECT_EQ(far_rc, 1) << far_text;
    EXPECT_NE(far_text.find("reaches a 99 % saving: the most is"), std::string::npos) << far_text;
    std::filesystem::remove(spec);
    std::filesystem::remove(out);
  }
  std::filesystem::remove_all(state);
  std::filesystem::remove_all(state.string() + "-jobs");
}
