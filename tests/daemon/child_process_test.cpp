#include "joule/daemon/child_process.hpp"

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <thread>

#include <gtest/gtest.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "temp_dir.hpp"

namespace joule::daemon {
namespace {

using namespace std::chrono_literals;
using joule::testing::TempDir;

class ChildProcessTest : public ::testing::Test {
 protected:
  adapters::LaunchSpec spec(std::vector<std::string> argv) const {
    adapters::LaunchSpec spec;
    spec.argv = std::move(argv);
    spec.workdir = dir_.path();
    spec.env = {"PATH=/usr/bin:/bin"};
    spec.stdout_path = dir_ / "stdout.log";
    spec.stderr_path = dir_ / "stderr.log";
    spec.status_path = dir_ / "status";
    spec.runner = JOULED_BINARY;
    return spec;
  }

  /// Runs the loop until the end is reported or `limit` passes.
  void run_until_ended(std::chrono::milliseconds limit = 20s) {
    auto busy = boost::asio::make_work_guard(io_);
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!ended_ && std::chrono::steady_clock::now() < deadline) {
      io_.run_for(10ms);
      io_.restart();
    }
  }

  ChildProcess::Ended record() {
    return [this](std::optional<adapters::ExitStatus> exit) {
      ended_ = true;
      ++calls_;
      exit_ = exit;
    };
  }

  TempDir dir_;
  boost::asio::io_context io_;
  bool ended_ = false;
  int calls_ = 0;
  std::optional<adapters::ExitStatus> exit_;
};

TEST_F(ChildProcessTest, reports_the_status_the_runner_wrote_once) {
  auto child = ChildProcess::launch(io_, spec({"sh", "-c", "exit 3"}), "test", record());
  ASSERT_TRUE(child) << child.error().message;
  EXPECT_GT((*child)->process().pid, 0);
  run_until_ended();
  ASSERT_TRUE(ended_);
  ASSERT_TRUE(exit_);
  EXPECT_FALSE(exit_->signaled);
  EXPECT_EQ(exit_->value, 3);
  run_until_ended(200ms);
  EXPECT_EQ(calls_, 1);
}

TEST_F(ChildProcessTest, the_callback_may_destroy_the_process_object) {
  std::unique_ptr<ChildProcess> held;
  auto child = ChildProcess::launch(io_, spec({"true"}), "test", [&](std::optional<adapters::ExitStatus> exit) {
    held.reset();  // as a job's run is erased when the book settles it
    ended_ = true;
    exit_ = exit;
  });
  ASSERT_TRUE(child);
  held = std::move(*child);
  run_until_ended();
  ASSERT_TRUE(ended_);
  EXPECT_FALSE(held);
  ASSERT_TRUE(exit_);
  EXPECT_TRUE(exit_->success());
}

TEST_F(ChildProcessTest, terminate_kills_what_ignores_term_after_the_grace_period) {
  auto child = ChildProcess::launch(io_, spec({"sh", "-c", "trap '' TERM; echo ready; sleep 30"}), "test", record());
  ASSERT_TRUE(child);
  // Signalled before the trap is set, sh would just end: wait for it to say it is ready.
  for (int i = 0; i < 500 && std::filesystem::file_size(dir_ / "stdout.log") == 0; ++i)
    std::this_thread::sleep_for(10ms);
  const auto sent = std::chrono::steady_clock::now();
  (*child)->terminate(300ms);
  run_until_ended();
  ASSERT_TRUE(ended_);
  EXPECT_GE(std::chrono::steady_clock::now() - sent, 300ms);
  ASSERT_TRUE(exit_);  // the runner's own status: KILL reached it too
  EXPECT_TRUE(exit_->signaled);
  EXPECT_EQ(exit_->value, SIGKILL);
}

TEST_F(ChildProcessTest, destroying_it_stops_watching_and_leaves_the_process_running) {
  auto child = ChildProcess::launch(io_, spec({"sh", "-c", "sleep 0.3; exit 5"}), "test", record());
  ASSERT_TRUE(child);
  const auto process = (*child)->process();
  child->reset();
  run_until_ended(1s);
  EXPECT_FALSE(ended_);
  // It ran to its own end, as a job does after its daemon stopped.
  const auto status = adapters::read_status_file(dir_ / "status");
  ASSERT_TRUE(status);
  EXPECT_EQ(status->value, 5);
  (void)adapters::reap_child(process.pid);
}

TEST_F(ChildProcessTest, a_watched_runner_that_already_ended_is_reported_at_once) {
  auto started = adapters::launch_job(spec({"sh", "-c", "exit 7"}));
  ASSERT_TRUE(started);
  for (int i = 0; i < 500 && !adapters::read_status_file(dir_ / "status"); ++i) std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(50ms);
  (void)adapters::reap_child(started->pid);  // gone before anyone watches: an adoption after it ended
  auto child = ChildProcess::watch(io_, *started, dir_ / "status", "test", record());
  run_until_ended(2s);
  ASSERT_TRUE(ended_);
  ASSERT_TRUE(exit_);
  EXPECT_EQ(exit_->value, 7);
}

}  // namespace
}  // namespace joule::daemon
