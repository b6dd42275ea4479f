// The built-in trainer run by jouled (`run.builtin`): a job's own model spec trained by
// joule-worker on MNIST-format files the test writes, its epochs (loss, accuracy, EAT's firing
// rates) reported with no code from the user and followed by STEP, its weights kept with the
// job, a dataset that does not fit refused at submit naming the file, and a run whose process
// died with its node requeued to resume from its last checkpoint.

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "daemon_process.hpp"

using joule::testing::DaemonProcess;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// A directory the jobs' own accounts may read (mkdtemp's 0700 would keep them out).
class DataDir {
 public:
  DataDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "joule-data-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
    ::chmod(path_.c_str(), 0755);
  }
  ~DataDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

void put_be32(std::ofstream& out, std::uint32_t value) {
  const char bytes[4] = {static_cast<char>(value >> 24), static_cast<char>(value >> 16), static_cast<char>(value >> 8),
                         static_cast<char>(value)};
  out.write(bytes, 4);
}

// MNIST's IDX pair of `count` 8×8 images in 4 classes: class k is bright in quadrant k.
void write_idx_pair(const std::filesystem::path& images, const std::filesystem::path& labels, std::uint32_t count,
                    std::uint32_t label_magic = 0x00000801) {
  std::ofstream image_out(images, std::ios::binary), label_out(labels, std::ios::binary);
  put_be32(image_out, 0x00000803);
  put_be32(image_out, count);
  put_be32(image_out, 8);
  put_be32(image_out, 8);
  put_be32(label_out, label_magic);
  put_be32(label_out, count);
  for (std::uint32_t i = 0; i < count; ++i) {
    const int label = static_cast<int>((i * 7) % 4);
    for (int row = 0; row < 8; ++row)
      for (int col = 0; col < 8; ++col) {
        const int quadrant = (row / 4) * 2 + col / 4;
        const int noise = static_cast<int>((i * 31 + static_cast<std::uint32_t>(row * 8 + col) * 17) % 60);
        image_out.put(static_cast<char>(quadrant == label ? 180 + noise : noise));
      }
    label_out.put(static_cast<char>(label));
  }
}

json builtin_job(const DataDir& data, std::int64_t samples_per_epoch, std::int64_t epochs) {
  return {{"name", "quadrants"},
          {"model",
           {{"input", {{"shape", {1, 8, 8}}}},
            {"layers",
             {{{"type", "flatten"}},
              {{"type", "linear"}, {"out_features", 64}},
              {{"type", "relu"}, {"name", "hidden"}},
              {{"type", "linear"}, {"out_features", 4}}}}}},
          {"training",
           {{"batch_size", 32},
            {"epochs", epochs},
            {"samples_per_epoch", samples_per_epoch},
            {"optimizer", "sgd_momentum"},
            {"eat", {{"lambda", 0.1}, {"sigma", 0.001}}}}},
          {"run",
           {{"builtin",
             {{"dataset",
               {{"format", "mnist-idx"},
                {"images", (data / "images-idx3-ubyte").string()},
                {"labels", (data / "labels-idx1-ubyte").string()}}}}}}}};
}

// jouled finds joule-worker in the build tree; a build without LibTorch (or a sanitized build
// that leaves the worker out) has none: empty then.
std::string worker_binary() {
#ifdef JOULE_WORKER_BINARY
  return JOULE_WORKER_BINARY;
#else
  return {};
#endif
}

bool worker_built() { return !worker_binary().empty(); }

// A built-in job of 90 samples, one epoch: it trains to its end.
void expect_a_small_builtin_job_trains(DaemonProcess& daemon, const DataDir& data) {
  const std::string id = daemon.submit(builtin_job(data, 90, 1));
  ASSERT_FALSE(id.empty()) << daemon.log();
  const json done = daemon.wait_state(id, {"succeeded", "failed"});
  EXPECT_EQ(done["state"], "succeeded") << done.dump(2)
                                        << daemon.client().request("GET", "/v1/jobs/" + id + "/log")->body;
}

}  // namespace

TEST(BuiltinTest, a_builtin_job_trains_its_spec_reports_its_epochs_and_keeps_its_weights) {
  if (!worker_built()) GTEST_SKIP() << "joule-worker is not built here";
  DataDir data;
  write_idx_pair(data / "images-idx3-ubyte", data / "labels-idx1-ubyte", 20000);
  DaemonProcess daemon({.config_toml = "[node]\nname = \"lab1\"\n[probing]\nenabled = false\n"});
  ASSERT_TRUE(daemon.start()) << daemon.log();

  // samples_per_epoch is the training split (20,000 less the tenth held out): what the estimate counts.
  const auto id = daemon.submit(builtin_job(data, 18000, 4));
  ASSERT_FALSE(id.empty());
  auto done = daemon.wait_state(id, {"succeeded", "failed"}, 90s);
  ASSERT_EQ(done["state"], "succeeded")
      << done.dump(2) << daemon.client().request("GET", "/v1/jobs/" + id + "/log?stream=stderr")->body;
  EXPECT_EQ(done["progress"]["epoch"], 4) << done.dump(2);
  ASSERT_TRUE(done["progress"].contains("accuracy")) << done.dump(2);
  EXPECT_GT(done["progress"]["accuracy"].get<double>(), 0.9) << done.dump(2);  // the quadrants are learnt
  ASSERT_TRUE(done["progress"].contains("firing_rates")) << done.dump(2);
  EXPECT_GT(done["progress"]["firing_rates"]["hidden"].get<double>(), 0.0) << done.dump(2);
  EXPECT_LT(done["progress"]["firing_rates"]["hidden"].get<double>(), 1.0) << done.dump(2);
  // STEP on the trainer's real epochs: it projects from the epochs after power settled.
  ASSERT_TRUE(done.contains("projection")) << done.dump(2);
  EXPECT_EQ(done["projection"]["method"], "step") << done.dump(2);
  EXPECT_GE(done["projection"]["stable_from_epoch"].get<int>(), 1) << done.dump(2);
  EXPECT_EQ(done["projection"]["stable_from_epoch"].get<int>() + done["projection"]["stable_epochs"].get<int>(), 4)
      << done.dump(2);
  // The trained weights stay with the job.
  ASSERT_TRUE(done.contains("builtin")) << done.dump(2);
  EXPECT_EQ(done["builtin"]["weights_saved"], true) << done.dump(2);
  EXPECT_TRUE(std::filesystem::exists(done["builtin"]["weights"].get<std::string>())) << done.dump(2);
  const auto err = daemon.client().request("GET", "/v1/jobs/" + id + "/log?stream=stderr")->body;
  EXPECT_EQ(err.find("could not report progress"), std::string::npos) << err;
}

TEST(BuiltinTest, a_dataset_that_does_not_fit_is_refused_at_submit_naming_the_file) {
  if (!worker_built()) GTEST_SKIP() << "joule-worker is not built here";
  DataDir data;
  // A labels file with an image file's magic number.
  write_idx_pair(data / "images-idx3-ubyte", data / "labels-idx1-ubyte", 100, 0x00000803);
  DaemonProcess daemon({.config_toml = "[probing]\nenabled = false\n"});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  auto [status, body] = daemon.call("POST", "/v1/jobs", builtin_job(data, 90, 1).dump());
  EXPECT_EQ(status, 400u) << body.dump(2);
  EXPECT_NE(body.dump().find("labels-idx1-ubyte"), std::string::npos) << body.dump(2);

  // A fitting file, but samples_per_epoch is not what the trainer will train on.
  write_idx_pair(data / "images-idx3-ubyte", data / "labels-idx1-ubyte", 100);
  std::tie(status, body) = daemon.call("POST", "/v1/jobs", builtin_job(data, 100, 1).dump());
  EXPECT_EQ(status, 400u) << body.dump(2);
  EXPECT_NE(body.dump().find("/training/samples_per_epoch"), std::string::npos) << body.dump(2);
  EXPECT_NE(body.dump().find("set samples_per_epoch to 90"), std::string::npos) << body.dump(2);

  // A relative path without run.workdir, and a model whose input is not the images'.
  json relative = builtin_job(data, 90, 1);
  relative["run"]["builtin"]["dataset"]["images"] = "images-idx3-ubyte";
  std::tie(status, body) = daemon.call("POST", "/v1/jobs", relative.dump());
  EXPECT_EQ(status, 400u) << body.dump(2);
  EXPECT_NE(body.dump().find("relative path"), std::string::npos) << body.dump(2);
  json wide = builtin_job(data, 90, 1);
  wide["model"]["input"]["shape"] = {1, 28, 28};
  std::tie(status, body) = daemon.call("POST", "/v1/jobs", wide.dump());
  EXPECT_EQ(status, 400u) << body.dump(2);
  EXPECT_NE(body.dump().find("the dataset's samples are [1, 8, 8] but the model's input is [1, 28, 28]"),
            std::string::npos)
      << body.dump(2);
  // Nothing was accepted.
  auto [list_status, list] = daemon.call("GET", "/v1/jobs");
  EXPECT_EQ(list_status, 200u);
  EXPECT_TRUE(list["jobs"].empty()) << list.dump(2);

  // joulectl reads a job file's relative dataset paths from the file's directory.
  relative["run"]["builtin"]["dataset"]["labels"] = "labels-idx1-ubyte";
  std::ofstream(data / "job.json") << relative.dump();
  auto [code, out] = joule::testing::run_program(
      {JOULECTL_BINARY, "--server", "http://127.0.0.1:" + std::to_string(daemon.port()), "--json", "submit",
       (data / "job.json").string()});
  ASSERT_EQ(code, 0) << out;
  const json submitted = json::parse(out, nullptr, false);
  ASSERT_TRUE(submitted.is_object()) << out;
  EXPECT_EQ(submitted["spec"]["run"]["workdir"], (data / "job.json").parent_path().string()) << out;
}

// A joule-worker the jobs' accounts cannot reach (a build tree under a 0700 home): jouled gives
// them a copy in the jobs' directory, and a built-in job trains with it.
TEST(BuiltinTest, a_worker_out_of_the_jobs_reach_is_given_to_them_as_a_copy_and_the_job_trains) {
  if (!worker_built()) GTEST_SKIP() << "joule-worker is not built here";
  DataDir data;
  write_idx_pair(data / "images-idx3-ubyte", data / "labels-idx1-ubyte", 100);
  char pattern[] = "/tmp/joule-private-XXXXXX";  // mkdtemp: mode 0700, root's
  const std::filesystem::path private_dir = ::mkdtemp(pattern);
  std::filesystem::copy_file(worker_binary(), private_dir / "joule-worker");
  DaemonProcess daemon(
      {.config_toml = "[probing]\nenabled = false\nworker = \"" + (private_dir / "joule-worker").string() + "\"\n"});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  EXPECT_NE(daemon.log().find("joule-worker at " + (private_dir / "joule-worker").string() +
                              " is out of reach of the jobs' accounts (" + private_dir.string() + " is mode 0700"),
            std::string::npos)
      << daemon.log();
  expect_a_small_builtin_job_trains(daemon, data);
  std::filesystem::remove_all(private_dir);
}

// A device with a joule-worker of its own ([[devices]] worker: a GPU node's CUDA build) trains
// its built-in jobs with that one.
TEST(BuiltinTest, a_devices_own_worker_trains_its_builtin_jobs) {
  if (!worker_built()) GTEST_SKIP() << "joule-worker is not built here";
  DataDir data;
  write_idx_pair(data / "images-idx3-ubyte", data / "labels-idx1-ubyte", 100);
  const auto log = data / "own-worker.log";
  std::ofstream(log).close();
  ::chmod(log.c_str(), 0666);  // the job's account appends to it
  // The job's own account runs it: a worker in a checkout it may not enter (a clone in a 0700
  // directory) is linked, or copied, beside the data it may read.
  const auto worker = data / "joule-worker";
  std::error_code ec;
  std::filesystem::create_hard_link(worker_binary(), worker, ec);
  if (ec) std::filesystem::copy_file(worker_binary(), worker);
  ::chmod(worker.c_str(), 0755);
  const auto own = data / "own-worker";
  std::ofstream(own) << "#!/bin/sh\necho \"$1\" >> " << log.string() << "\nexec " << worker.string() << " \"$@\"\n";
  ::chmod(own.c_str(), 0755);
  DaemonProcess daemon(
      {.config_toml = "[probing]\nenabled = false\n[[devices]]\nname = \"cpu\"\nworker = \"" + own.string() + "\"\n"});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  EXPECT_NE(daemon.log().find("device cpu: probes and built-in jobs run " + own.string()), std::string::npos)
      << daemon.log();
  EXPECT_EQ(daemon.call("GET", "/v1/devices").second["devices"][0]["worker"], own.string());
  expect_a_small_builtin_job_trains(daemon, data);
  std::ifstream written(log);
  std::vector<std::string> commands;
  for (std::string line; std::getline(written, line);) commands.push_back(line);
  EXPECT_NE(std::find(commands.begin(), commands.end(), "train"), commands.end())
      << "the device's worker trained it; it ran: " << fmt::format("{}", fmt::join(commands, ", "));
}

namespace {
// Whether process `pid` still runs: /proc/<pid>/stat there, and its state not Z (a zombie) or X.
bool running(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto end = text.rfind(')');
  if (end == std::string::npos || end + 2 >= text.size()) return false;
  return text[end + 2] != 'Z' && text[end + 2] != 'X';
}
}  // namespace

// The node goes down with the job (here: jouled and the job's process group killed with -9):
// the next jouled queues it again, and the trainer goes on after its last checkpoint.
TEST(BuiltinTest, a_builtin_job_whose_process_died_with_its_node_resumes_from_its_checkpoint) {
  if (!worker_built()) GTEST_SKIP() << "joule-worker is not built here";
  DataDir data;
  write_idx_pair(data / "images-idx3-ubyte", data / "labels-idx1-ubyte", 40000);
  auto state = std::filesystem::temp_directory_path() / ("joule-builtin-" + std::to_string(::getpid()));
  std::filesystem::remove_all(state);
  std::filesystem::remove_all(state.string() + "-jobs");
  const std::string config = "[probing]\nenabled = false\n";
  std::string id;
  {
    DaemonProcess daemon({.config_toml = config}, state);
    ASSERT_TRUE(daemon.start()) << daemon.log();
    id = daemon.submit(builtin_job(data, 36000, 16));
    ASSERT_FALSE(id.empty());
    json job;
    for (int i = 0; i < 1200; ++i) {
      job = daemon.call("GET", "/v1/jobs/" + id).second;
      if (job.contains("progress") && job["progress"]["epoch"].get<int>() >= 2) break;
      ASSERT_NE(job["state"], "succeeded") << "the job ended before the test could stop it: make it longer";
      std::this_thread::sleep_for(50ms);
    }
    ASSERT_GE(job["progress"]["epoch"].get<int>(), 2) << job.dump(2);
    std::string pgid;
    for (const auto& e : job["events"]) {
      const std::string message = e["message"];
      if (message.rfind("started as process group ", 0) == 0) pgid = message.substr(25);
    }
    ASSERT_FALSE(pgid.empty()) << job.dump(2);
    daemon.signal(SIGKILL);
    daemon.wait_exit();
    ::kill(-std::stoi(pgid), SIGKILL);
    // Dead before the next jouled looks, as with a node that went down: a SIGKILL lands when the
    // process next leaves the kernel, and on a loaded machine the restart can come first (it
    // would then adopt the group and see it end with no exit status).
    for (int i = 0; i < 200 && running(std::stoi(pgid)); ++i) std::this_thread::sleep_for(25ms);
  }
  DaemonProcess restarted({.config_toml = config}, state);
  ASSERT_TRUE(restarted.start()) << restarted.log();
  auto done = restarted.wait_state(id, {"succeeded", "failed", "cancelled"}, 90s);
  ASSERT_EQ(done["state"], "succeeded") << done.dump(2);
  bool requeued = false;
  for (const auto& e : done["events"])
    if (e["message"].get<std::string>().find("resumes from its last checkpoint") != std::string::npos) requeued = true;
  EXPECT_TRUE(requeued) << done.dump(2);
  // The second run started after the epochs the first one had checkpointed.
  const auto out = restarted.client().request("GET", "/v1/jobs/" + id + "/log")->body;
  const auto first = out.rfind("\"first_epoch\":");
  ASSERT_NE(first, std::string::npos) << out;
  EXPECT_GE(std::stoi(out.substr(first + 14)), 3) << out;
  EXPECT_EQ(done["progress"]["epoch"], 16) << done.dump(2);
  std::filesystem::remove_all(state);
  std::filesystem::remove_all(state.string() + "-jobs");
}
