#pragma once
// Running a short command-line tool (sbatch, squeue, scontrol...) and capturing what it says.
//
// Why not Boost.Process: Boost 1.74's Boost.Process is not header-only (it needs
// libboost-filesystem, which Joule does not otherwise link) and its wait_for() is unreliable in
// that release. This is posix_spawn + two pipes + poll, about a hundred lines.

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "joule/common/result.hpp"

namespace joule::adapters {

struct CommandOptions {
  /// "NAME=value" entries added to (or replacing those of) this process's environment.
  std::vector<std::string> env;
  /// false: `env` is the command's whole environment.
  bool inherit_environment = true;
  /// The command is killed (SIGKILL to its process group) when it runs longer.
  std::chrono::milliseconds timeout{15000};
  /// Output beyond this (stdout and stderr together) kills the command: a runaway tool must
  /// not exhaust the daemon's memory.
  std::size_t max_output_bytes = std::size_t{256} << 20;
};

/// How a command ended and what it wrote.
struct CommandOutput {
  int exit_code = 0;  ///< valid when signal == 0
  int signal = 0;     ///< the signal that ended it, 0 if it exited
  std::string out;    ///< everything it wrote to stdout
  std::string err;    ///< everything it wrote to stderr
  bool success() const { return signal == 0 && exit_code == 0; }
};

/// Runs argv (no shell: argv[0] is looked up in PATH unless it contains a '/'), stdin from
/// /dev/null, in its own process group, with no descriptor of ours inherited, and waits for
/// it. A non-zero exit is not an error here (the caller reads `err`); errors are: empty argv
/// (invalid_argument), a program that cannot be started (unavailable, message names it), a
/// timeout (unavailable, "timed out after N s"), too much output (internal).
/// Thread-safe; blocks the calling thread for up to `timeout`.
Result<CommandOutput> run_command(const std::vector<std::string>& argv, const CommandOptions& options = {});

}  // namespace joule::adapters
