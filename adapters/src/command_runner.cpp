#include "joule/adapters/command_runner.hpp"

#include "spawn_setup.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

extern char** environ;

namespace joule::adapters {
namespace {

using Clock = std::chrono::steady_clock;

struct Pipe {
  int read = -1;
  int write = -1;
  ~Pipe() {
    if (read >= 0) ::close(read);
    if (write >= 0) ::close(write);
  }
  bool open() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return false;
    read = fds[0];
    write = fds[1];
    return true;
  }
  void close_write() {
    if (write >= 0) ::close(write);
    write = -1;
  }
};

using detail::c_strings;
using detail::SpawnSetup;

// This process's environment with `extra` laid over it (same NAME replaces).
std::vector<std::string> merged_environment(const std::vector<std::string>& extra) {
  std::vector<std::string> out;
  auto name_of = [](std::string_view entry) { return entry.substr(0, entry.find('=')); };
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view entry(*e);
    bool replaced = false;
    for (const auto& x : extra) replaced = replaced || name_of(x) == name_of(entry);
    if (!replaced) out.emplace_back(entry);
  }
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

// Kills the command's group and collects it; used on timeouts and runaway output.
void kill_and_reap(pid_t pid) {
  ::kill(-pid, SIGKILL);
  ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace

Result<CommandOutput> run_command(const std::vector<std::string>& argv, const CommandOptions& options) {
  if (argv.empty() || argv[0].empty()) return make_error(ErrorCode::invalid_argument, "empty command");
  Pipe out_pipe;
  Pipe err_pipe;
  if (!out_pipe.open() || !err_pipe.open()) {
    return make_error(ErrorCode::internal, fmt::format("pipe: {}", std::strerror(errno)));
  }

  SpawnSetup setup;
  posix_spawn_file_actions_addopen(&setup.actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&setup.actions, out_pipe.write, 1);
  posix_spawn_file_actions_adddup2(&setup.actions, err_pipe.write, 2);
  posix_spawn_file_actions_addclosefrom_np(&setup.actions, 3);
  sigset_t all_signals;
  sigset_t no_signals;
  sigfillset(&all_signals);
  sigemptyset(&no_signals);
  posix_spawnattr_setflags(&setup.attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&setup.attr, 0);
  posix_spawnattr_setsigdefault(&setup.attr, &all_signals);
  posix_spawnattr_setsigmask(&setup.attr, &no_signals);

  const auto env = options.inherit_environment ? merged_environment(options.env) : options.env;
  auto c_argv = c_strings(argv);
  auto c_env = c_strings(env);
  pid_t pid = 0;
  const bool search = argv[0].find('/') == std::string::npos;
  const int rc = search
                     ? ::posix_spawnp(&pid, argv[0].c_str(), &setup.actions, &setup.attr, c_argv.data(), c_env.data())
                     : ::posix_spawn(&pid, argv[0].c_str(), &setup.actions, &setup.attr, c_argv.data(), c_env.data());
  if (rc != 0) {
    return make_error(ErrorCode::unavailable, fmt::format("cannot run {}: {}", argv[0], std::strerror(rc)));
  }
  out_pipe.close_write();
  err_pipe.close_write();

  CommandOutput output;
  const auto deadline = Clock::now() + options.timeout;
  std::array<char, 65536> buffer{};
  std::array<pollfd, 2> fds{pollfd{out_pipe.read, POLLIN, 0}, pollfd{err_pipe.read, POLLIN, 0}};
  std::array<std::string*, 2> sinks{&output.out, &output.err};
  int open_fds = 2;
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      kill_and_reap(pid);
      return make_error(ErrorCode::unavailable,
                        fmt::format("{} timed out after {:g} s", argv[0], options.timeout.count() / 1000.0));
    }
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(left));
    if (ready < 0 && errno != EINTR) {
      kill_and_reap(pid);
      return make_error(ErrorCode::internal, fmt::format("poll: {}", std::strerror(errno)));
    }
    for (std::size_t i = 0; i < fds.size() && ready > 0; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = ::read(fds[i].fd, buffer.data(), buffer.size());
      if (n > 0) {
        sinks[i]->append(buffer.data(), static_cast<std::size_t>(n));
        if (output.out.size() + output.err.size() > options.max_output_bytes) {
          kill_and_reap(pid);
          return make_error(ErrorCode::internal,
                            fmt::format("{} wrote more than {} bytes", argv[0], options.max_output_bytes));
        }
      } else if (n == 0 || errno != EINTR) {
        fds[i].fd = -1;  // EOF (or a read error): poll ignores negative descriptors
        --open_fds;
      }
    }
  }

  // Both pipes are closed; the command is exiting. Wait, still under the deadline: a tool that
  // closed its output and lingers is killed like one that hangs.
  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) {
      return make_error(ErrorCode::internal, fmt::format("waitpid {} ({}): {}", pid, argv[0], std::strerror(errno)));
    }
    if (Clock::now() >= deadline) {
      kill_and_reap(pid);
      return make_error(ErrorCode::unavailable,
                        fmt::format("{} timed out after {:g} s", argv[0], options.timeout.count() / 1000.0));
    }
    ::usleep(1000);
  }
  if (WIFSIGNALED(status)) {
    output.signal = WTERMSIG(status);
  } else {
    output.exit_code = WEXITSTATUS(status);
  }
  return output;
}

}  // namespace joule::adapters
