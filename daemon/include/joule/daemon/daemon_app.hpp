#pragma once
// jouled as a whole: config, state, devices, the job service, the API server, timers, signals
// and systemd notifications, wired on one io_context.

#include <filesystem>
#include <optional>
#include <string>

#include "joule/config/daemon_config.hpp"

namespace joule::daemon {

/// What the command line says; each set field overrides the config file.
struct CommandLine {
  std::optional<std::filesystem::path> config_file;
  std::optional<std::string> listen;
  std::optional<std::filesystem::path> state_directory;
  std::optional<std::string> log_level;
};

/// The config the daemon starts with: embedded defaults, then the file, then the flags.
/// Throws std::runtime_error naming the problem (file:line) when it is unusable.
config::DaemonConfig resolve_config(const CommandLine& command_line,
                                    std::vector<config::ConfigProblem>* warnings = nullptr);

/// Runs the daemon until SIGTERM/SIGINT; returns the process exit code.
int run_daemon(const CommandLine& command_line);

}  // namespace joule::daemon
