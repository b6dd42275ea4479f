#include "joule/adapters/job_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "temp_dir.hpp"

using joule::adapters::LaunchSpec;
using joule::testing::TempDir;

namespace {

LaunchSpec spec_in(const TempDir& dir, std::vector<std::string> argv) {
  LaunchSpec spec;
  spec.argv = std::move(argv);
  spec.workdir = dir.path();
  spec.env = {"PATH=/usr/bin:/bin", "GREETING=hello"};
  spec.stdout_path = dir / "stdout.log";
  spec.stderr_path = dir / "stderr.log";
  spec.status_path = dir / "status";
  spec.runner = JOULED_BINARY;
  return spec;
}

// Waits for the process to end through its pidfd, as the daemon does.
void wait_for_exit(pid_t pid) {
  auto fd = joule::adapters::open_pidfd(pid);
  ASSERT_TRUE(fd) << fd.error().message;
  pollfd entry{*fd, POLLIN, 0};
  ASSERT_EQ(::poll(&entry, 1, 20000), 1);
  ::close(*fd);
}

std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TEST(JobProcessTest, runs_in_workdir_with_env_and_records_exit_status) {
  TempDir dir;
  auto process = joule::adapters::launch_job(spec_in(dir, {"sh", "-c", "pwd; echo $GREETING; echo oops >&2; exit 3"}));
  ASSERT_TRUE(process) << process.error().message;
  EXPECT_GT(process->start_ticks, 0u);
  wait_for_exit(process->pid);
  auto runner = joule::adapters::reap_child(process->pid);
  ASSERT_TRUE(runner);
  EXPECT_EQ(runner->value, 3);
  auto status = joule::adapters::read_status_file(dir / "status");
  ASSERT_TRUE(status);
  EXPECT_FALSE(status->signaled);
  EXPECT_EQ(status->value, 3);
  EXPECT_EQ(status->describe(), "exit code 3");
  EXPECT_EQ(slurp(dir / "stdout.log"), dir.path().string() + "\nhello\n");
  EXPECT_EQ(slurp(dir / "stderr.log"), "oops\n");
}

TEST(JobProcessTest, job_leads_its_own_process_group_and_group_signals_reach_the_command) {
  TempDir dir;
  auto process = joule::adapters::launch_job(spec_in(dir, {"sleep", "30"}));
  ASSERT_TRUE(process);
  EXPECT_EQ(::getpgid(process->pid), process->pid);
  EXPECT_TRUE(joule::adapters::is_alive(*process));
  ASSERT_TRUE(joule::adapters::signal_process_group(process->pid, SIGTERM));
  wait_for_exit(process->pid);
  (void)joule::adapters::reap_child(process->pid);
  auto status = joule::adapters::read_status_file(dir / "status");
  ASSERT_TRUE(status);  // the runner outlived TERM to record how the command ended
  EXPECT_TRUE(status->signaled);
  EXPECT_EQ(status->value, SIGTERM);
  EXPECT_FALSE(joule::adapters::is_alive(*process));
}

TEST(JobProcessTest, a_missing_program_is_exit_127_with_a_message) {
  TempDir dir;
  auto process = joule::adapters::launch_job(spec_in(dir, {"no-such-program-xyz"}));
  ASSERT_TRUE(process);
  wait_for_exit(process->pid);
  (void)joule::adapters::reap_child(process->pid);
  EXPECT_EQ(joule::adapters::read_status_file(dir / "status")->value, 127);
  EXPECT_NE(slurp(dir / "stderr.log").find("cannot execute no-such-program-xyz"), std::string::npos);
}

TEST(JobProcessTest, a_job_given_cpus_runs_on_those_only_and_one_the_kernel_refuses_fails_it) {
  const auto usable = joule::adapters::usable_cpus();
  ASSERT_FALSE(usable.empty());
  EXPECT_EQ(joule::adapters::cpu_list_text({0, 1, 2, 5, 7, 8}), "0-2,5,7-8");
  TempDir dir;
  auto spec = spec_in(dir, {"sh", "-c", "grep Cpus_allowed_list /proc/self/status"});
  spec.cpus = {usable.back()};
  auto process = joule::adapters::launch_job(spec);
  ASSERT_TRUE(process);
  wait_for_exit(process->pid);
  (void)joule::adapters::reap_child(process->pid);
  EXPECT_EQ(joule::adapters::read_status_file(dir / "status")->value, 0);
  EXPECT_NE(slurp(dir / "stdout.log").find(fmt::format(":\t{}\n", usable.back())), std::string::npos)
      << slurp(dir / "stdout.log");

  TempDir other;
  auto absent = spec_in(other, {"true"});
  absent.cpus = {1000};  // no such CPU here
  process = joule::adapters::launch_job(absent);
  ASSERT_TRUE(process);
  wait_for_exit(process->pid);
  (void)joule::adapters::reap_child(process->pid);
  EXPECT_EQ(joule::adapters::read_status_file(other / "status")->value, 127);
  EXPECT_NE(slurp(other / "stderr.log").find("cannot confine the job to CPUs 1000"), std::string::npos)
      << slurp(other / "stderr.log");
}

TEST(JobProcessTest, a_missing_workdir_fails_the_launch) {
  TempDir dir;
  auto spec = spec_in(dir, {"true"});
  spec.workdir = dir / "absent";
  auto process = joule::adapters::launch_job(spec);
  ASSERT_FALSE(process);
  EXPECT_NE(process.error().message.find("absent"), std::string::npos);
}

TEST(JobProcessTest, the_daemon_descriptors_are_not_inherited) {
  TempDir dir;
  // A descriptor without close-on-exec, like Asio's sockets.
  const int leaked = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(leaked, 3);
  auto process = joule::adapters::launch_job(spec_in(dir, {"sh", "-c", "ls /proc/self/fd"}));
  ASSERT_TRUE(process);
  wait_for_exit(process->pid);
  (void)joule::adapters::reap_child(process->pid);
  ::close(leaked);
  std::istringstream fds(slurp(dir / "stdout.log"));
  std::string fd;
  while (fds >> fd) EXPECT_LE(std::stoi(fd), 3) << "descriptor " << fd << " leaked into the job";
}

TEST(JobProcessTest, a_runner_is_found_again_by_its_status_path) {
  TempDir dir;
  auto process = joule::adapters::launch_job(spec_in(dir, {"sleep", "30"}));
  ASSERT_TRUE(process);
  // posix_spawn returns while the kernel is still finishing the runner's exec, when its
  // cmdline can read empty for a moment: look again until it is there (a restarted daemon
  // only looks seconds later).
  std::optional<joule::adapters::ProcessIdentity> found;
  for (int attempt = 0; attempt < 200 && !found; ++attempt) {
    found = joule::adapters::find_job_runner(dir / "status");
    if (!found) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(found);
  EXPECT_EQ(found->pid, process->pid);
  EXPECT_EQ(found->start_ticks, process->start_ticks);
  EXPECT_FALSE(joule::adapters::find_job_runner(dir / "other-status"));
  (void)joule::adapters::signal_process_group(process->pid, SIGKILL);
  wait_for_exit(process->pid);
  auto runner = joule::adapters::reap_child(process->pid);
  ASSERT_TRUE(runner);
  EXPECT_TRUE(runner->signaled);
  EXPECT_EQ(runner->describe().rfind("killed by signal 9", 0), 0u);
}

TEST(JobProcessTest, process_identity_reads_fake_proc_stat) {
  TempDir proc;
  // The command name may hold spaces and parentheses; fields resume after the last ')'.
  proc.write("4242/stat",
             "4242 (my (odd) job) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 1 0 987654 1000 100 "
             "18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n");
  EXPECT_EQ(joule::adapters::process_start_ticks(4242, proc.path()), 987654u);
  EXPECT_TRUE(joule::adapters::is_alive({4242, 987654}, proc.path()));
  EXPECT_FALSE(joule::adapters::is_alive({4242, 987655}, proc.path()));  // pid reused
  proc.write("4343/stat", "4343 (zombie) Z 1 4343 4343 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0\n");
  EXPECT_FALSE(joule::adapters::process_start_ticks(4343, proc.path()));
  EXPECT_FALSE(joule::adapters::process_start_ticks(1, proc.path()));
}

TEST(JobProcessTest, boot_id_comes_from_proc) {
  TempDir proc;
  proc.write("sys/kernel/random/boot_id", "0f5c7b3e-2f1d-4c9a-9d4e-1b2c3d4e5f60\n");
  EXPECT_EQ(joule::adapters::read_boot_id(proc.path()), "0f5c7b3e-2f1d-4c9a-9d4e-1b2c3d4e5f60");
  EXPECT_FALSE(joule::adapters::read_boot_id().empty());
}

TEST(JobProcessTest, the_runner_records_the_commands_cpu_time_with_its_childrens) {
  TempDir dir;
  // A child that burns CPU and is waited for, then the command itself exits: both count.
  auto process = joule::adapters::launch_job(
      spec_in(dir, {"sh", "-c", "(i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done); sleep 0.2"}));
  ASSERT_TRUE(process) << process.error().message;
  wait_for_exit(process->pid);
  ASSERT_TRUE(joule::adapters::reap_child(process->pid));
  auto status = joule::adapters::read_status_file(dir / "status");
  ASSERT_TRUE(status);
  EXPECT_EQ(status->value, 0);
  ASSERT_TRUE(status->cpu_seconds) << slurp(dir / "status");
  EXPECT_GT(*status->cpu_seconds, 0.05) << slurp(dir / "status");
  EXPECT_LT(*status->cpu_seconds, 30.0);
  // A status file of an older runner, without the CPU time, still reads.
  dir.write("old-status", "signal 15\n");
  auto old = joule::adapters::read_status_file(dir / "old-status");
  ASSERT_TRUE(old);
  EXPECT_TRUE(old->signaled);
  EXPECT_FALSE(old->cpu_seconds);
  dir.write("bad-status", "exit 0 cpu -3\n");
  EXPECT_FALSE(joule::adapters::read_status_file(dir / "bad-status")->cpu_seconds);
}

TEST(JobProcessTest, a_process_groups_cpu_time_sums_its_members_and_their_waited_children) {
  TempDir proc;
  const long hz = ::sysconf(_SC_CLK_TCK);
  // Fields 14-17: utime stime cutime cstime, in clock ticks. Group 500 has two members.
  const auto stat = [&](int pid, int group, long utime, long stime, long cutime, long cstime) {
    return fmt::format("{} (py (torch)) R 1 {} {} 0 -1 0 0 0 0 0 {} {} {} {} 20 0 3 0 100 0 0\n", pid, group, group,
                       utime, stime, cutime, cstime);
  };
  proc.write("500/stat", stat(500, 500, 0, 0, 3 * hz, hz));  // the runner: its waited command
  proc.write("501/stat", stat(501, 500, 2 * hz, hz / 2, 0, 0));
  proc.write("600/stat", stat(600, 600, 50 * hz, 0, 0, 0));  // another group
  proc.write("self/stat", "not a pid\n");
  auto seconds = joule::adapters::process_group_cpu_seconds(500, proc.path());
  ASSERT_TRUE(seconds);
  EXPECT_NEAR(*seconds, 3.0 + 1.0 + 2.0 + 0.5, 1e-9);
  EXPECT_FALSE(joule::adapters::process_group_cpu_seconds(700, proc.path()));
  // Several groups in one walk: each with a live process, with its sum.
  const auto groups = joule::adapters::process_groups_cpu_seconds({500, 600, 700}, proc.path());
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_NEAR(groups.at(500), 6.5, 1e-9);
  EXPECT_NEAR(groups.at(600), 50.0, 1e-9);
  EXPECT_TRUE(joule::adapters::process_groups_cpu_seconds({}, proc.path()).empty());

  // The CPUs its command was confined to (the runner's own are not the job's).
  proc.write("500/status", "Name:\tjouled\nCpus_allowed_list:\t0-7\n");
  proc.write("501/status", "Name:\tpython3\nCpus_allowed_list:\t2-3,6\n");
  EXPECT_EQ(joule::adapters::process_group_cpus(500, proc.path()), (std::vector<int>{2, 3, 6}));
  EXPECT_FALSE(joule::adapters::process_group_cpus(600, proc.path()));
}

namespace {

// The state letter (R, S, T...) of the one process of `group` that is not its leader (the
// runner's command), or '?' while there is none.
char command_state(pid_t group) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos || std::stol(name) == group) continue;
    const std::string line = slurp(entry.path() / "stat");
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(line.substr(close + 2));
    char state = '?';
    long parent = 0, pgrp = 0;
    if (fields >> state >> parent >> pgrp && pgrp == group) return state;
  }
  return '?';
}

// Polls `condition` every 50 ms for up to `seconds`.
template <typename Condition>
bool within(double seconds, Condition condition) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return condition();
}

}  // namespace

TEST(JobProcessTest, a_job_whose_lease_lapses_is_paused_resumed_when_renewed_and_ended_when_it_stays_away) {
  TempDir dir;
  auto spec = spec_in(dir, {"sleep", "60"});
  spec.lease_path = dir / "lease";
  spec.lease_seconds = 0.6;
  ASSERT_TRUE(joule::adapters::renew_lease(spec.lease_path));
  auto process = joule::adapters::launch_job(spec);
  ASSERT_TRUE(process) << process.error().message;
  ASSERT_TRUE(within(5, [&] { return command_state(process->pid) == 'S'; }));

  // Renewed: it runs on past its lease.
  for (int i = 0; i < 8; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    ASSERT_TRUE(joule::adapters::renew_lease(spec.lease_path));
  }
  EXPECT_EQ(command_state(process->pid), 'S');
  // Not renewed (its jouled is gone): paused, though its runner still waits for it.
  ASSERT_TRUE(within(3, [&] { return command_state(process->pid) == 'T'; }));
  EXPECT_TRUE(joule::adapters::is_alive(*process));
  // Renewed again (a jouled adopted it in time): it runs again.
  ASSERT_TRUE(joule::adapters::renew_lease(spec.lease_path));
  ASSERT_TRUE(within(3, [&] { return command_state(process->pid) == 'S'; }));
  // Gone for good: ended, and its end recorded by the runner.
  wait_for_exit(process->pid);
  (void)joule::adapters::reap_child(process->pid);
  auto status = joule::adapters::read_status_file(dir / "status");
  ASSERT_TRUE(status);
  EXPECT_TRUE(status->signaled);
  EXPECT_EQ(status->value, SIGTERM);
  const std::string log = slurp(dir / "stderr.log");
  EXPECT_NE(log.find("the job is paused"), std::string::npos) << log;
  EXPECT_NE(log.find("the lease is renewed"), std::string::npos) << log;
  EXPECT_NE(log.find("the job is ended"), std::string::npos) << log;
}
