#include "joule/adapters/job_process.hpp"

#include "spawn_setup.hpp"

#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace joule::adapters {
namespace {

ExitStatus from_wait_status(int status) {
  if (WIFSIGNALED(status)) return ExitStatus{true, WTERMSIG(status), std::nullopt};
  return ExitStatus{false, WEXITSTATUS(status), std::nullopt};
}

using detail::c_strings;
using detail::SpawnSetup;

// The fields of a /proc/PID/stat file after the command name, which may hold spaces and
// parentheses: they resume after the last ')', starting with state (field 3), ppid, pgrp.
std::optional<std::istringstream> stat_fields(const std::filesystem::path& stat_path) {
  std::ifstream in(stat_path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  const auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 > line.size()) return std::nullopt;
  return std::istringstream(line.substr(close + 2));
}

// The process group of a /proc entry, where it reads.
std::optional<long> process_group_of(const std::filesystem::path& proc_entry) {
  auto fields = stat_fields(proc_entry / "stat");
  std::string state;
  long parent = 0, group = 0;
  if (!fields || !(*fields >> state >> parent >> group)) return std::nullopt;
  return group;
}

}  // namespace

std::string ExitStatus::describe() const {
  if (!signaled) return fmt::format("exit code {}", value);
  const char* name = ::strsignal(value);
  return fmt::format("killed by signal {} ({})", value, name ? name : "unknown");
}

namespace {

// The command's environment as the runner reads it: NAME=value entries, each ended by NUL, in
// an anonymous file (memfd) that the runner finds as descriptor 3.
Result<int> environment_file(const std::vector<std::string>& env) {
  const int fd = ::memfd_create("joule-job-env", MFD_CLOEXEC);
  if (fd < 0) return make_error(ErrorCode::io, fmt::format("memfd_create: {}", std::strerror(errno)));
  std::string block;
  for (const auto& entry : env) {
    block += entry;
    block.push_back('\0');
  }
  std::size_t done = 0;
  while (done < block.size()) {
    const ssize_t n = ::write(fd, block.data() + done, block.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      return make_error(ErrorCode::io, fmt::format("cannot write the job's environment: {}", std::strerror(error)));
    }
    done += static_cast<std::size_t>(n);
  }
  ::lseek(fd, 0, SEEK_SET);
  return fd;
}

constexpr int kEnvironmentFd = 3;

}  // namespace

std::optional<std::string> unreachable_by(const std::filesystem::path& path, const JobIdentity& identity,
                                          mode_t last_access) {
  const auto allows = [&](const struct stat& info, mode_t bit) {
    if (info.st_uid == identity.uid) return (info.st_mode & (bit << 6)) != 0;
    const bool in_group = info.st_gid == identity.gid || std::find(identity.groups.begin(), identity.groups.end(),
                                                                   info.st_gid) != identity.groups.end();
    return (info.st_mode & (in_group ? bit << 3 : bit)) != 0;
  };
  std::filesystem::path walked = path.root_path();
  for (const auto& part : path.relative_path()) {
    walked /= part;
    struct stat parent {};
    if (::stat(walked.parent_path().c_str(), &parent) == 0 && !allows(parent, S_IXOTH)) {
      return fmt::format("{} is mode {:04o}, owned by uid {}", walked.parent_path().string(), parent.st_mode & 07777,
                         parent.st_uid);
    }
  }
  struct stat last {};
  if (::stat(path.c_str(), &last) == 0 && !allows(last, last_access))
    return fmt::format("{} is mode {:04o}, owned by uid {}", path.string(), last.st_mode & 07777, last.st_uid);
  return std::nullopt;
}

Result<ProcessIdentity> launch_job(const LaunchSpec& spec) {
  if (spec.argv.empty()) return make_error(ErrorCode::invalid_argument, "empty argv");
  auto env_fd = environment_file(spec.env);
  if (!env_fd) return env_fd.error();
  SpawnSetup setup;
  // O_NOFOLLOW: a link planted where a log goes must not redirect the output of a job.
  const int log_flags = O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW;
  posix_spawn_file_actions_addopen(&setup.actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&setup.actions, 1, spec.stdout_path.c_str(), log_flags, 0640);
  posix_spawn_file_actions_addopen(&setup.actions, 2, spec.stderr_path.c_str(), log_flags, 0640);
  posix_spawn_file_actions_adddup2(&setup.actions, *env_fd, kEnvironmentFd);
  // Asio does not open its sockets close-on-exec: without this a job would inherit the
  // listening socket and keep the port busy after the daemon restarts.
  posix_spawn_file_actions_addclosefrom_np(&setup.actions, kEnvironmentFd + 1);
  // With another identity the runner enters the workdir after the switch (see LaunchSpec).
  if (!spec.workdir.empty() && !spec.identity)
    posix_spawn_file_actions_addchdir_np(&setup.actions, spec.workdir.c_str());

  sigset_t all_signals;
  sigfillset(&all_signals);
  sigset_t held_signals;  // see job_runner_main: held until the command can receive them
  sigemptyset(&held_signals);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&held_signals, sig);
  posix_spawnattr_setflags(&setup.attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&setup.attr, 0);
  posix_spawnattr_setsigdefault(&setup.attr, &all_signals);
  posix_spawnattr_setsigmask(&setup.attr, &held_signals);

  std::vector<std::string> args = {"joule-job-runner", "--job-runner", spec.status_path.string(), "--env-fd",
                                   std::to_string(kEnvironmentFd)};
  if (spec.identity) {
    std::string groups;
    for (const gid_t group : spec.identity->groups) groups += (groups.empty() ? "" : ",") + std::to_string(group);
    args.insert(args.end(), {"--uid", std::to_string(spec.identity->uid), "--gid", std::to_string(spec.identity->gid),
                             "--groups", groups});
    if (!spec.workdir.empty()) args.insert(args.end(), {"--workdir", spec.workdir.string()});
  }
  if (!spec.lease_path.empty())
    args.insert(args.end(), {"--lease", spec.lease_path.string(), "--lease-ms",
                             std::to_string(static_cast<long>(std::lround(spec.lease_seconds * 1000.0)))});
  if (!spec.cpus.empty()) {
    std::string cpus;
    for (const int cpu : spec.cpus) cpus += (cpus.empty() ? "" : ",") + std::to_string(cpu);
    args.insert(args.end(), {"--cpus", cpus});
  }
  args.push_back("--");
  args.insert(args.end(), spec.argv.begin(), spec.argv.end());
  auto argv = c_strings(args);
  std::vector<std::string> no_environment;
  auto envp = c_strings(no_environment);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, spec.runner.c_str(), &setup.actions, &setup.attr, argv.data(), envp.data());
  ::close(*env_fd);
  if (rc != 0) {
    return make_error(ErrorCode::io,
                      fmt::format("cannot start the job (workdir {}): {}", spec.workdir.string(), std::strerror(rc)));
  }
  const auto start = process_start_ticks(pid);
  return ProcessIdentity{pid, start.value_or(0)};
}

std::optional<std::uint64_t> process_start_ticks(pid_t pid, const std::filesystem::path& proc_root) {
  auto fields = stat_fields(proc_root / std::to_string(pid) / "stat");
  if (!fields) return std::nullopt;
  std::string field;
  // Field 3 (state) is the first here; starttime is field 22.
  std::string state;
  *fields >> state;
  if (state == "Z" || state == "X") return std::nullopt;  // ended, waiting to be reaped
  for (int i = 4; i < 22 && *fields >> field; ++i) {
  }
  std::uint64_t start = 0;
  if (!(*fields >> start)) return std::nullopt;
  return start;
}

bool is_alive(const ProcessIdentity& identity, const std::filesystem::path& proc_root) {
  if (identity.pid <= 0) return false;
  const auto start = process_start_ticks(identity.pid, proc_root);
  return start && *start == identity.start_ticks;
}

Result<int> open_pidfd(pid_t pid) {
  const long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd < 0) {
    return make_error(errno == ESRCH ? ErrorCode::not_found : ErrorCode::io,
                      fmt::format("pidfd_open({}): {}", pid, std::strerror(errno)));
  }
  ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
  return static_cast<int>(fd);
}

Status signal_process_group(pid_t pgid, int signal) {
  if (pgid <= 1) return make_error(ErrorCode::internal, fmt::format("refusing to signal group {}", pgid));
  if (::kill(-pgid, signal) != 0 && errno != ESRCH) {
    return make_error(ErrorCode::io, fmt::format("kill(-{}, {}): {}", pgid, signal, std::strerror(errno)));
  }
  return {};
}

std::optional<ExitStatus> reap_child(pid_t pid) {
  int status = 0;
  pid_t rc = 0;
  do {
    rc = ::waitpid(pid, &status, WNOHANG);
  } while (rc < 0 && errno == EINTR);
  if (rc != pid) return std::nullopt;
  return from_wait_status(status);
}

std::optional<ExitStatus> read_status_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string kind;
  int value = 0;
  if (!(in >> kind >> value)) return std::nullopt;
  if (kind != "exit" && kind != "signal") return std::nullopt;
  ExitStatus status{kind == "signal", value, std::nullopt};
  std::string key;
  double seconds = 0.0;
  if (in >> key >> seconds && key == "cpu" && std::isfinite(seconds) && seconds >= 0.0) status.cpu_seconds = seconds;
  if (in >> key && key == "fenced") status.fenced = true;
  return status;
}

std::optional<std::vector<int>> process_group_cpus(pid_t pgid, const std::filesystem::path& proc_root) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(proc_root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    if (name == std::to_string(pgid) || process_group_of(entry.path()) != pgid) continue;
    std::ifstream status(entry.path() / "status");
    for (std::string line; std::getline(status, line);) {
      if (!line.starts_with("Cpus_allowed_list:")) continue;
      // "0-3,6": ranges and single CPUs, comma-separated.
      std::vector<int> cpus;
      std::stringstream list(line.substr(line.find(':') + 1));
      for (std::string item; std::getline(list, item, ',');) {
        const auto dash = item.find('-');
        const int first = std::atoi(item.c_str());
        const int last = dash == std::string::npos ? first : std::atoi(item.c_str() + dash + 1);
        for (int cpu = first; cpu <= last && cpu < CPU_SETSIZE; ++cpu) cpus.push_back(cpu);
      }
      return cpus;
    }
  }
  return std::nullopt;
}

std::map<pid_t, double> process_groups_cpu_seconds(const std::vector<pid_t>& groups,
                                                   const std::filesystem::path& proc_root) {
  static const long ticks_per_second = ::sysconf(_SC_CLK_TCK);
  std::map<pid_t, double> totals;
  if (groups.empty()) return totals;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(proc_root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    // state(3) ppid(4) pgrp(5) ... utime(14) stime(15) cutime(16) cstime(17), as proc(5) numbers them.
    auto fields = stat_fields(entry.path() / "stat");
    if (!fields) continue;
    std::vector<std::string> values;
    std::string field;
    while (values.size() < 15 && *fields >> field) values.push_back(field);
    if (values.size() < 15) continue;
    const auto group = static_cast<pid_t>(std::strtol(values[2].c_str(), nullptr, 10));
    if (std::find(groups.begin(), groups.end(), group) == groups.end()) continue;
    double ticks = 0.0;
    for (std::size_t i = 11; i <= 14; ++i) ticks += std::strtod(values[i].c_str(), nullptr);
    totals[group] += ticks / static_cast<double>(ticks_per_second > 0 ? ticks_per_second : 100);
  }
  return totals;
}

std::optional<double> process_group_cpu_seconds(pid_t pgid, const std::filesystem::path& proc_root) {
  const auto totals = process_groups_cpu_seconds({pgid}, proc_root);
  if (totals.empty()) return std::nullopt;
  return totals.begin()->second;
}

namespace {

// What the runner was told besides the command.
struct RunnerOptions {
  std::filesystem::path status_path;
  int env_fd = -1;
  std::optional<JobIdentity> identity;
  std::string workdir;
  std::string lease;
  long lease_ms = 0;
  std::vector<int> cpus;  // the command's affinity; empty: the runner's
  char** command = nullptr;
};

std::optional<RunnerOptions> parse_runner_options(int argc, char** argv) {
  if (argc < 3) return std::nullopt;
  RunnerOptions options;
  options.status_path = argv[0];
  auto number = [](const char* text) -> std::optional<unsigned long> {
    char* end = nullptr;
    errno = 0;
    const unsigned long value = std::strtoul(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0') return std::nullopt;
    return value;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") {
      if (i + 1 >= argc) return std::nullopt;
      options.command = argv + i + 1;
      return options;
    }
    if (i + 1 >= argc) return std::nullopt;
    const char* value = argv[++i];
    if (arg == "--env-fd") {
      const auto fd = number(value);
      if (!fd) return std::nullopt;
      options.env_fd = static_cast<int>(*fd);
    } else if (arg == "--uid" || arg == "--gid") {
      const auto id = number(value);
      if (!id) return std::nullopt;
      if (!options.identity) options.identity.emplace();
      (arg == "--uid" ? options.identity->uid : options.identity->gid) = static_cast<uid_t>(*id);
    } else if (arg == "--groups") {
      if (!options.identity) options.identity.emplace();
      std::string_view list = value;
      while (!list.empty()) {
        const auto comma = list.find(',');
        const std::string item(list.substr(0, comma));
        const auto group = number(item.c_str());
        if (!group) return std::nullopt;
        options.identity->groups.push_back(static_cast<gid_t>(*group));
        if (comma == std::string_view::npos) break;
        list.remove_prefix(comma + 1);
      }
    } else if (arg == "--workdir") {
      options.workdir = value;
    } else if (arg == "--lease") {
      options.lease = value;
    } else if (arg == "--lease-ms") {
      const auto ms = number(value);
      if (!ms || *ms == 0) return std::nullopt;
      options.lease_ms = static_cast<long>(*ms);
    } else if (arg == "--cpus") {
      std::string_view list = value;
      while (!list.empty()) {
        const auto comma = list.find(',');
        const std::string item(list.substr(0, comma));
        const auto cpu = number(item.c_str());
        if (!cpu || *cpu >= CPU_SETSIZE) return std::nullopt;
        options.cpus.push_back(static_cast<int>(*cpu));
        if (comma == std::string_view::npos) break;
        list.remove_prefix(comma + 1);
      }
    } else {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

// Signals every process of the runner's group but the runner: SIGSTOP and SIGKILL cannot be
// ignored, and the runner must stay to record how the command ended.
void signal_group_but_runner(int sig) {
  const pid_t self = ::getpid();
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    if (pid != self && process_group_of(entry.path()) == self) ::kill(pid, sig);
  }
}

// The runner's side of a job's lease: pauses the job when the daemon stops renewing it,
// resumes it when renewals come back, ends it when they stay away.
class LeaseWatch {
 public:
  LeaseWatch(std::string path, long lease_ms) : path_(std::move(path)), lease_ms_(lease_ms) {
    seen_ = modified();
    renewed_ = now_ms();
  }

  /// Whether the runner ended the job for want of a lease.
  bool ended_it() const { return ending_; }

  void check() {
    const auto stamp = modified();
    const long now = now_ms();
    if (stamp != seen_) {
      seen_ = stamp;
      renewed_ = now;
      if (paused_ && !ending_) {
        ::kill(0, SIGCONT);  // the runner is not stopped: the group may be sent it whole
        paused_ = false;
        std::fprintf(stderr, "joule: the lease is renewed: the job runs again\n");
      }
    }
    const long silent = now - renewed_;
    if (!paused_ && silent > lease_ms_) {
      signal_group_but_runner(SIGSTOP);
      paused_ = true;
      std::fprintf(stderr, "joule: jouled has not renewed this job's lease for %.1f s: the job is paused\n",
                   static_cast<double>(silent) / 1000.0);
    }
    if (!ending_ && silent > 2 * lease_ms_) {
      ending_ = true;
      ended_at_ = now;
      std::fprintf(stderr, "joule: no lease for %.1f s: the job is ended (it may run elsewhere now)\n",
                   static_cast<double>(silent) / 1000.0);
      ::kill(0, SIGTERM);  // the runner ignores TERM
      ::kill(0, SIGCONT);  // a stopped process must run to see it
    }
    if (ending_ && !killed_ && now - ended_at_ > 10'000) {
      signal_group_but_runner(SIGKILL);
      killed_ = true;
    }
  }

 private:
  static long now_ms() {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000 + ts.tv_nsec / 1'000'000;
  }
  std::pair<long, long> modified() const {
    struct stat info {};
    if (::stat(path_.c_str(), &info) != 0) return {0, 0};
    return {info.st_mtim.tv_sec, info.st_mtim.tv_nsec};
  }

  std::string path_;
  long lease_ms_;
  std::pair<long, long> seen_;
  long renewed_ = 0;
  bool paused_ = false;
  bool ending_ = false;
  bool killed_ = false;
  long ended_at_ = 0;
};

// The environment block of launch_job, read whole from its descriptor.
std::vector<std::string> read_environment(int fd) {
  std::string block;
  char chunk[65536];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    block.append(chunk, static_cast<std::size_t>(n));
  }
  ::close(fd);
  std::vector<std::string> env;
  std::size_t start = 0;
  while (start < block.size()) {
    const auto end = block.find('\0', start);
    env.push_back(block.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return env;
}

// In the command's process, before exec: becomes the job's account for good and keeps no
// capability. A daemon that is not root but holds CAP_SETUID keeps its permitted set across a
// switch between two non-zero uids, so the sets are cleared explicitly.
[[noreturn]] void fail_in_child(const char* what, const std::string& detail) {
  std::fprintf(stderr, "joule: %s %s: %s\n", what, detail.c_str(), std::strerror(errno));
  ::_exit(127);
}

void become(const JobIdentity& identity) {
  if (::setgroups(identity.groups.size(), identity.groups.data()) != 0)
    fail_in_child("cannot set the supplementary groups of", fmt::format("uid {}", identity.uid));
  if (::setresgid(identity.gid, identity.gid, identity.gid) != 0)
    fail_in_child("cannot switch to", fmt::format("gid {}", identity.gid));
  if (::setresuid(identity.uid, identity.uid, identity.uid) != 0)
    fail_in_child("cannot switch to", fmt::format("uid {}", identity.uid));
  ::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct none[_LINUX_CAPABILITY_U32S_3] = {};
  if (::syscall(SYS_capset, &header, none) != 0) fail_in_child("cannot drop the capabilities of", "the job");
}

}  // namespace

int job_runner_main(int argc, char** argv) {
  const auto options = parse_runner_options(argc, argv);
  if (!options) {
    std::fprintf(stderr,
                 "usage: jouled --job-runner STATUS_FILE [--env-fd N] [--uid U --gid G --groups G,...] "
                 "[--workdir DIR] [--lease FILE --lease-ms MS] [--cpus N,N...] -- PROGRAM [ARGS...]\n");
    return 2;
  }
  const std::filesystem::path status_path = options->status_path;
  std::vector<std::string> environment;
  const bool own_environment = options->env_fd >= 0;
  if (own_environment) environment = read_environment(options->env_fd);
  // launch_job starts us with TERM, INT and HUP blocked, so one sent to the group before the
  // command exists stays pending here instead of killing the runner; it is forwarded below.
  sigset_t forwarded;
  sigemptyset(&forwarded);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&forwarded, sig);
  const pid_t child = ::fork();
  if (child < 0) {
    std::fprintf(stderr, "joule: fork failed: %s\n", std::strerror(errno));
    return 127;
  }
  if (child == 0) {
    ::sigprocmask(SIG_UNBLOCK, &forwarded, nullptr);
    if (!options->cpus.empty()) {
      // Its cores (resources.cores): the command and everything it starts stay on them.
      cpu_set_t set;
      CPU_ZERO(&set);
      for (const int cpu : options->cpus) CPU_SET(cpu, &set);
      if (::sched_setaffinity(0, sizeof(set), &set) != 0) {
        std::string list;
        for (const int cpu : options->cpus) list += (list.empty() ? "" : ",") + std::to_string(cpu);
        fail_in_child("cannot confine the job to CPUs", list);
      }
    }
    if (options->identity) become(*options->identity);
    if (!options->workdir.empty() && ::chdir(options->workdir.c_str()) != 0)
      fail_in_child("cannot enter the workdir", options->workdir);
    char** command = options->command;
    if (own_environment) {
      // execvp looks the program up in the PATH of `environ`: the job's, not the runner's.
      static std::vector<char*> envp;
      envp = c_strings(environment);
      environ = envp.data();
    }
    ::execvp(command[0], command);
    std::fprintf(stderr, "joule: cannot execute %s: %s\n", command[0], std::strerror(errno));
    ::_exit(127);
  }
  sigset_t pending;
  sigemptyset(&pending);
  ::sigpending(&pending);
  // The runner outlives TERM so it can record how the command answered it; KILL still ends it.
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    std::signal(sig, SIG_IGN);  // discards the pending one: the command gets it instead
    if (sigismember(&pending, sig)) ::kill(child, sig);
  }
  ::sigprocmask(SIG_UNBLOCK, &forwarded, nullptr);
  int status = 0;
  struct rusage usage {};
  std::optional<LeaseWatch> lease;
  if (options->lease.empty()) {
    while (::wait4(child, &status, 0, &usage) < 0) {
      if (errno != EINTR) return 127;
    }
  } else {
    // Four looks per lease (at most every 250 ms): a lapse is noticed within a quarter of it.
    lease.emplace(options->lease, options->lease_ms);
    const long step_ms = std::clamp(options->lease_ms / 4, 10L, 250L);
    for (;;) {
      const pid_t done = ::wait4(child, &status, WNOHANG, &usage);
      if (done == child) break;
      if (done < 0 && errno != EINTR) return 127;
      lease->check();
      timespec pause{step_ms / 1000, (step_ms % 1000) * 1'000'000};
      ::nanosleep(&pause, nullptr);
    }
  }
  const ExitStatus exit = from_wait_status(status);
  // The command's CPU time with its waited-for descendants': what a modelled meter charges the job.
  const double cpu_seconds = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                             static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
  const auto tmp = status_path.string() + ".tmp";
  if (FILE* out = std::fopen(tmp.c_str(), "w")) {
    std::fprintf(out, "%s %d cpu %.6f%s\n", exit.signaled ? "signal" : "exit", exit.value, cpu_seconds,
                 lease && lease->ended_it() ? " fenced" : "");
    std::fflush(out);
    ::fsync(::fileno(out));
    std::fclose(out);
    std::rename(tmp.c_str(), status_path.c_str());
  }
  return exit.signaled ? 128 + exit.value : exit.value;
}

}  // namespace joule::adapters

namespace joule::adapters {

std::vector<int> usable_cpus() {
  std::vector<int> out;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) out.push_back(cpu);
  return out;
}

std::string cpu_list_text(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? std::to_string(cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]);
    i = j + 1;
  }
  return out;
}

Status renew_lease(const std::filesystem::path& lease_path) {
  // O_CREAT without O_TRUNC, then a fresh modification time: the runner looks only at that.
  const int fd = ::open(lease_path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return make_error(ErrorCode::io,
                      fmt::format("cannot renew the lease {}: {}", lease_path.string(), std::strerror(errno)));
  const int rc = ::futimens(fd, nullptr);
  const int saved = errno;
  ::close(fd);
  if (rc != 0)
    return make_error(ErrorCode::io,
                      fmt::format("cannot renew the lease {}: {}", lease_path.string(), std::strerror(saved)));
  return {};
}

std::optional<ProcessIdentity> find_job_runner(const std::filesystem::path& status_path,
                                               const std::filesystem::path& proc_root) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(proc_root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::string> args;
    std::size_t start = 0;
    while (start < cmdline.size() && args.size() < 3) {
      const auto end = cmdline.find('\0', start);
      args.push_back(cmdline.substr(start, end == std::string::npos ? std::string::npos : end - start));
      if (end == std::string::npos) break;
      start = end + 1;
    }
    if (args.size() < 3 || args[1] != "--job-runner" || args[2] != status_path.string()) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    // The command, between the runner's fork and its exec, shows the runner's cmdline too; the
    // runner is the one that leads the job's process group.
    if (process_group_of(entry.path()) != pid) continue;
    if (auto ticks = process_start_ticks(pid, proc_root)) return ProcessIdentity{pid, *ticks};
  }
  return std::nullopt;
}

std::string read_boot_id(const std::filesystem::path& proc_root) {
  std::ifstream in(proc_root / "sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

}  // namespace joule::adapters
