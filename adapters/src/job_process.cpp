#include "joule/adapters/job_process.hpp"

#include "spawn_setup.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace joule::adapters {
namespace {

ExitStatus from_wait_status(int status) {
  if (WIFSIGNALED(status)) return ExitStatus{true, WTERMSIG(status)};
  return ExitStatus{false, WEXITSTATUS(status)};
}

using detail::c_strings;
using detail::SpawnSetup;

}  // namespace

std::string ExitStatus::describe() const {
  if (!signaled) return fmt::format("exit code {}", value);
  const char* name = ::strsignal(value);
  return fmt::format("killed by signal {} ({})", value, name ? name : "unknown");
}

Result<ProcessIdentity> launch_job(const LaunchSpec& spec) {
  if (spec.argv.empty()) return make_error(ErrorCode::invalid_argument, "empty argv");
  SpawnSetup setup;
  const int log_flags = O_WRONLY | O_CREAT | O_APPEND;
  posix_spawn_file_actions_addopen(&setup.actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&setup.actions, 1, spec.stdout_path.c_str(), log_flags, 0640);
  posix_spawn_file_actions_addopen(&setup.actions, 2, spec.stderr_path.c_str(), log_flags, 0640);
  // Asio does not open its sockets close-on-exec: without this a job would inherit the
  // listening socket and keep the port busy after the daemon restarts.
  posix_spawn_file_actions_addclosefrom_np(&setup.actions, 3);
  if (!spec.workdir.empty()) posix_spawn_file_actions_addchdir_np(&setup.actions, spec.workdir.c_str());

  sigset_t all_signals;
  sigfillset(&all_signals);
  sigset_t held_signals;  // see job_runner_main: held until the command can receive them
  sigemptyset(&held_signals);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&held_signals, sig);
  posix_spawnattr_setflags(&setup.attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&setup.attr, 0);
  posix_spawnattr_setsigdefault(&setup.attr, &all_signals);
  posix_spawnattr_setsigmask(&setup.attr, &held_signals);

  std::vector<std::string> args = {"joule-job-runner", "--job-runner", spec.status_path.string(), "--"};
  args.insert(args.end(), spec.argv.begin(), spec.argv.end());
  auto argv = c_strings(args);
  auto envp = c_strings(spec.env);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, spec.runner.c_str(), &setup.actions, &setup.attr, argv.data(), envp.data());
  if (rc != 0) {
    return make_error(ErrorCode::io,
                      fmt::format("cannot start the job (workdir {}): {}", spec.workdir.string(), std::strerror(rc)));
  }
  const auto start = process_start_ticks(pid);
  return ProcessIdentity{pid, start.value_or(0)};
}

std::optional<std::uint64_t> process_start_ticks(pid_t pid, const std::filesystem::path& proc_root) {
  std::ifstream in(proc_root / std::to_string(pid) / "stat");
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  // The command name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
  const auto close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(line.substr(close + 2));
  std::string field;
  // Field 3 (state) is the first here; starttime is field 22.
  std::string state;
  fields >> state;
  if (state == "Z" || state == "X") return std::nullopt;  // ended, waiting to be reaped
  for (int i = 4; i < 22 && fields >> field; ++i) {
  }
  std::uint64_t start = 0;
  if (!(fields >> start)) return std::nullopt;
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
  if (kind == "exit") return ExitStatus{false, value};
  if (kind == "signal") return ExitStatus{true, value};
  return std::nullopt;
}

int job_runner_main(int argc, char** argv) {
  if (argc < 3 || std::strcmp(argv[1], "--") != 0) {
    std::fprintf(stderr, "usage: jouled --job-runner STATUS_FILE -- PROGRAM [ARGS...]\n");
    return 2;
  }
  const std::filesystem::path status_path = argv[0];
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
    ::execvp(argv[2], argv + 2);
    std::fprintf(stderr, "joule: cannot execute %s: %s\n", argv[2], std::strerror(errno));
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
  while (::waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) return 127;
  }
  const ExitStatus exit = from_wait_status(status);
  const auto tmp = status_path.string() + ".tmp";
  if (FILE* out = std::fopen(tmp.c_str(), "w")) {
    std::fprintf(out, "%s %d\n", exit.signaled ? "signal" : "exit", exit.value);
    std::fflush(out);
    ::fsync(::fileno(out));
    std::fclose(out);
    std::rename(tmp.c_str(), status_path.c_str());
  }
  return exit.signaled ? 128 + exit.value : exit.value;
}

}  // namespace joule::adapters

namespace joule::adapters {

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
    std::ifstream stat_file(entry.path() / "stat");
    std::string stat_line;
    std::getline(stat_file, stat_line);
    const auto close = stat_line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat_line.substr(close + 2));
    std::string state;
    long parent = 0, group = 0;
    if (!(fields >> state >> parent >> group) || group != pid) continue;
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
