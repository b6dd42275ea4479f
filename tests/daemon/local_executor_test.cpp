// The local executor against a fake job book on a manual clock: real processes started through
// the real job runner (jouled --job-runner), their ends, cancels and energy as the book hears
// them, and the checks a submission must pass before it may run here.

#include "jobs/executors/local_executor.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "counting_meter.hpp"
#include "fake_executor_host.hpp"
#include "jobs/job_record.hpp"
#include "temp_dir.hpp"
#include "text_file.hpp"

using joule::daemon::Device;
using joule::daemon::DeviceTable;
using joule::daemon::JobRecord;
using joule::daemon::LocalExecutor;
using joule::daemon::LocalRunOptions;
using joule::schedulers::JobState;

namespace {

using FakeBook = joule::testing::FakeExecutorHost;

std::vector<Device> one_cpu() {
  std::vector<Device> devices(1);
  devices[0].name = "cpu";
  devices[0].threads = 2;
  devices[0].meter = std::make_unique<joule::testing::CountingMeter>();
  return devices;
}

class LocalExecutorTest : public ::testing::Test {
 protected:
  LocalExecutorTest() : devices(one_cpu()), run_options(options()), executor(io, book, run_options) {}

  LocalRunOptions options() const {
    LocalRunOptions o;
    o.state_directory = dir.path();
    o.runner = JOULED_BINARY;
    o.kill_grace_seconds = 0.2;
    return o;
  }

  // A job as the book holds it once it is stored: its spec parsed from `spec`.
  JobRecord& job(const std::string& id, const nlohmann::json& spec) {
    JobRecord record;
    record.row.id = id;
    record.row.sequence = static_cast<std::int64_t>(book.jobs.size()) + 1;
    record.row.spec_json = spec.dump();
    record.spec = joule::schedulers::parse_job_spec(spec).value();
    return book.jobs.emplace(id, std::move(record)).first->second;
  }

  // Places and starts `job` on the cpu the way the book does: prepare, store (here at once), start.
  void place(JobRecord& job) {
    Device& cpu = *devices.find("cpu");
    cpu.hold(job.row.id, 0);
    job.row.device = cpu.name;
    (void)executor.prepare(job, cpu);
    job.state = JobState::placed;
    executor.start(job, cpu);
  }

  // Runs the loop until `done` holds: the runner's end arrives through it (pidfd).
  template <typename Predicate>
  bool run_until(Predicate done) {
    auto busy = boost::asio::make_work_guard(io);
    for (int i = 0; i < 2500 && !done(); ++i) {
      io.run_for(std::chrono::milliseconds(2));
      io.restart();
    }
    return done();
  }

  joule::testing::TempDir dir;
  boost::asio::io_context io;
  FakeBook book;
  DeviceTable devices;
  LocalRunOptions run_options;  // the executor keeps a reference
  LocalExecutor executor;
};

TEST_F(LocalExecutorTest, a_job_runs_as_a_process_group_and_its_exit_code_ends_it) {
  JobRecord& ok = job("job-ok", {{"run", {{"command", {"true"}}}}});
  place(ok);
  EXPECT_EQ(ok.state, JobState::running);
  EXPECT_GT(ok.row.pid, 0);
  EXPECT_EQ(ok.row.started_ms, book.time.unix_ms());
  ASSERT_TRUE(run_until([&] { return ok.state != JobState::running; }));
  EXPECT_EQ(ok.state, JobState::succeeded);
  EXPECT_EQ(ok.row.exit_code, 0);

  JobRecord& failing = job("job-3", {{"run", {{"command", {"sh", "-c", "echo out; echo err >&2; exit 3"}}}}});
  place(failing);
  ASSERT_TRUE(run_until([&] { return failing.state != JobState::running; }));
  EXPECT_EQ(failing.state, JobState::failed);
  EXPECT_EQ(failing.row.exit_code, 3);
  // Its output lands in the state directory, which only jouled may enter.
  EXPECT_EQ(joule::testing::read_text(executor.job_directory("job-3") / "stdout.log"), "out\n");
  EXPECT_EQ(joule::testing::read_text(executor.job_directory("job-3") / "stderr.log"), "err\n");
}

TEST_F(LocalExecutorTest, the_job_sees_its_id_device_threads_and_own_directory) {
  JobRecord& env = job(
      "job-env",
      {{"run", {{"command", {"sh", "-c", "echo $JOULE_JOB_ID $JOULE_DEVICE $OMP_NUM_THREADS; pwd; echo $TMPDIR"}}}}});
  place(env);
  ASSERT_TRUE(run_until([&] { return env.state == JobState::succeeded; }));
  const auto work = executor.work_directory("job-env");
  EXPECT_EQ(joule::testing::read_text(executor.job_directory("job-env") / "stdout.log"),
            "job-env cpu 2\n" + work.string() + "\n" + (work / "tmp").string() + "\n");
  // Only the hash of its progress token is kept.
  EXPECT_EQ(env.row.token_sha256.size(), 64u);
}

TEST_F(LocalExecutorTest, a_stopped_job_gets_term_and_ends_cancelled) {
  JobRecord& sleeper = job("job-sleep", {{"run", {{"command", {"sleep", "30"}}}}});
  place(sleeper);
  ASSERT_EQ(sleeper.state, JobState::running);
  sleeper.cancel_requested = true;
  executor.stop(sleeper);
  ASSERT_TRUE(run_until([&] { return sleeper.state != JobState::running; }));
  EXPECT_EQ(sleeper.state, JobState::cancelled);
  EXPECT_NE(sleeper.row.reason.find("cancelled"), std::string::npos) << sleeper.row.reason;
}

TEST_F(LocalExecutorTest, a_program_that_cannot_start_fails_the_job_with_why) {
  JobRecord& missing = job("job-missing", {{"run", {{"command", {"/nonexistent/program"}}}}});
  place(missing);
  ASSERT_TRUE(run_until([&] { return joule::schedulers::is_terminal(missing.state); }));
  EXPECT_EQ(missing.state, JobState::failed);
  EXPECT_FALSE(missing.row.reason.empty());
}

TEST_F(LocalExecutorTest, a_finished_runs_energy_is_settled_on_its_row_with_the_meters_source) {
  JobRecord& ok = job("job-energy", {{"run", {{"command", {"true"}}}}});
  place(ok);
  ASSERT_TRUE(run_until([&] { return ok.state == JobState::succeeded; }));
  Device& cpu = *devices.find("cpu");
  // The counting meter adds a joule per reading: one when the run began, one now.
  ASSERT_TRUE(executor.settle_energy(ok, &cpu, nullptr));
  EXPECT_EQ(ok.row.energy_source, "simulated");
  EXPECT_GT(*ok.row.energy_joules, 0.0);
  executor.release(ok, /*ended=*/true);
  // Released: nothing of the run is left to settle.
  EXPECT_FALSE(executor.settle_energy(ok, &cpu, nullptr));
}

TEST_F(LocalExecutorTest, a_submission_that_could_not_start_here_is_refused_naming_the_field) {
  const auto check = [&](const nlohmann::json& run) -> joule::Status {
    return executor.check(joule::schedulers::parse_job_spec({{"run", run}}).value(), std::nullopt);
  };
  EXPECT_TRUE(check({{"command", {"true"}}}));
  EXPECT_TRUE(check({{"command", {"sh", "-c", "exit 0"}}, {"workdir", dir.path().string()}}));

  const auto refused = [&](const nlohmann::json& run, const std::string& where, const std::string& says) {
    const auto status = check(run);
    ASSERT_FALSE(status) << run.dump();
    EXPECT_EQ(status.error().where, where) << status.error().message;
    EXPECT_NE(status.error().message.find(says), std::string::npos) << status.error().message;
  };
  refused({{"command", {"true"}}, {"workdir", (dir / "missing").string()}}, "/run/workdir", "does not exist");
  refused({{"command", {"./train.sh"}}}, "/run/command/0", "needs run.workdir");
  refused({{"command", {"no-such-program-anywhere"}}}, "/run/command/0", "not found in PATH");
  // A PATH of the job's own is where its program is looked for.
  refused({{"command", {"true"}}, {"env", {{"PATH", dir.path().string()}}}}, "/run/command/0", dir.path().string());
  const auto script = dir.write("train.sh", "#!/bin/sh\n");
  refused({{"command", {"./train.sh"}}, {"workdir", dir.path().string()}}, "/run/command/0", "not executable");
  ::chmod(script.c_str(), 0755);
  EXPECT_TRUE(check({{"command", {"./train.sh"}}, {"workdir", dir.path().string()}}));
  // The built-in trainer needs joule-worker, which these options do not name.
  const nlohmann::json builtin = {
      {"model", {{"input", {{"shape", {4}}}}, {"layers", {{{"type", "linear"}, {"out_features", 2}}}}}},
      {"training", {{"batch_size", 8}, {"epochs", 1}, {"samples_per_epoch", 64}}},
      {"run",
       {{"builtin",
         {{"dataset",
           {{"format", "mnist-idx"},
            {"images", (dir / "images").string()},
            {"labels", (dir / "labels").string()}}}}}}}};
  const auto no_worker = executor.check(joule::schedulers::parse_job_spec(builtin).value(), std::nullopt);
  ASSERT_FALSE(no_worker);
  EXPECT_EQ(no_worker.error().where, "/run/builtin");
  EXPECT_NE(no_worker.error().message.find("joule-worker"), std::string::npos) << no_worker.error().message;
}

}  // namespace
