// jouled: the Joule daemon of one node. See docs/design.md and `jouled --help`.

#include <cstring>
#include <exception>
#include <iostream>

#include <CLI/CLI.hpp>

#include "joule/adapters/job_process.hpp"
#include "joule/daemon/daemon_app.hpp"

int main(int argc, char** argv) {
  // jouled starts each job through itself as a tiny runner (see job_process.hpp).
  if (argc >= 2 && std::strcmp(argv[1], "--job-runner") == 0)
    return joule::adapters::job_runner_main(argc - 2, argv + 2);

  CLI::App app{"jouled: energy-aware scheduler daemon for deep-learning training jobs"};
  joule::daemon::CommandLine command_line;
  std::string config_file, listen, state_dir, log_level;
  app.add_option("--config", config_file, "config file (jouled.toml); without it, embedded defaults")
      ->check(CLI::ExistingFile);
  app.add_option("--listen", listen, "HOST:PORT to serve the API on (default 127.0.0.1:8571; port 0 picks one)");
  app.add_option("--state-dir", state_dir,
                 "where the SQLite state and job logs live (default $STATE_DIRECTORY or /var/lib/jouled)");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, critical or off");
  app.set_version_flag("--version", JOULE_VERSION);
  CLI11_PARSE(app, argc, argv);
  if (!config_file.empty()) command_line.config_file = config_file;
  if (!listen.empty()) command_line.listen = listen;
  if (!state_dir.empty()) command_line.state_directory = state_dir;
  if (!log_level.empty()) command_line.log_level = log_level;
  try {
    return joule::daemon::run_daemon(command_line);
  } catch (const std::exception& error) {
    std::cerr << "jouled: " << error.what() << "\n";
    return 1;
  }
}
