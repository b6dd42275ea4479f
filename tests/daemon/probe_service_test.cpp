// Background probing on a manual clock: idleness, back-offs and requested runs are timed by the
// clock ProbeService is given, while its worker is a real process (a stand-in for joule-worker
// with its command line and its `env` answer) started through the real job runner.

#include "joule/daemon/probe_service.hpp"

#include <sys/stat.h>

#include <fstream>
#include <memory>
#include <sstream>

#include <gtest/gtest.h>

#include "counting_meter.hpp"
#include "job_book.hpp"

namespace joule::daemon {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

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

  /// A joule-worker that knows its environment and whose probes fail after `probe_seconds`;
  /// each probe's command line is appended to calls.log.
  void start(config::ProbingConfig probing, double probe_seconds = 0.0) {
    const auto worker = dir_ / "fake-worker";
    {
      std::ofstream out(worker);
      out << "#!/bin/sh\n"
          << "case \"$1\" in\n"
          << "  env) echo '{\"fingerprint\": \"fake worker; threads 1\"}' ;;\n"
          << "  probe) echo \"$*\" >> '" << (dir_ / "calls.log").string() << "'; sleep " << probe_seconds
          << "; echo 'no LibTorch here' >&2; exit 1 ;;\n"
          << "  *) exit 2 ;;\n"
          << "esac\n";
    }
    ::chmod(worker.c_str(), 0755);
    models_ = std::make_unique<ModelService>(io_, writer_, metrics_, [] {});
    ProbeServiceOptions options;
    options.probing = probing;
    options.state_directory = dir_.path();
    options.worker = worker;
    options.runner = JOULED_BINARY;
    options.tick_seconds = 0.005;
    probes_ = std::make_unique<ProbeService>(io_, writer_, metrics_, *models_, jobs_, options, clock_);
    config::DeviceConfig cpu;
    cpu.name = "cpu";
    probes_->start({cpu}, StoredProbeState{});
  }

  json shown() { return probes_->info("cpu")["probing"]; }
  std::string state() { return shown()["state"]; }
  std::string waiting() { return shown().value("waiting", ""); }

  int probes_started() const {
    std::ifstream in(dir_ / "calls.log");
    int lines = 0;
    for (std::string line; std::getline(in, line);) ++lines;
    return lines;
  }

  /// Runs the loop for `real` time with the manual clock standing still.
  void idle_for(std::chrono::milliseconds real) {
    const auto until = std::chrono::steady_clock::now() + real;
    run_until([&] { return std::chrono::steady_clock::now() >= until; });
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
  start(probing);
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
  start(probing, /*probe_seconds=*/0.3);
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

}  // namespace
}  // namespace joule::daemon
