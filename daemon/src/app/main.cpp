// jouled: the Joule daemon of one node. See docs/design.md and `jouled --help`.

#include <cstring>
#include <exception>
#include <iostream>

#include <CLI/CLI.hpp>

#include "joule/adapters/job_process.hpp"
#include "joule/cli/command_docs.hpp"
#include "joule/daemon/daemon_app.hpp"

namespace {

// What `jouled --man-page` says besides its options (packaging/ installs the page).
joule::cli::ManPage man_page() {
  joule::cli::ManPage page;
  page.name = "jouled";
  page.source = "joule " JOULE_VERSION;
  page.description = {
      "jouled is the daemon of Joule, an energy-aware scheduler for deep-learning training jobs. It runs on "
      "every node, accepts jobs over its REST API (/v1; joulectl is its client), places each on the device "
      "where it costs the least energy within its deadline, budgets, power caps and battery floors, runs it "
      "under an account of its own, meters its energy (RAPL, NVML, Jetson INA3221 rails, hwmon, batteries, or "
      "a CPU-time model that is labelled as not a measurement), learns each device's energy model by probing it "
      "with joule-worker while it is idle, and exports everything to Prometheus (/metrics). Its state is kept "
      "in SQLite: an accepted job survives a crash, and running jobs are adopted by the next jouled.",
      "Without --config it runs on embedded defaults: one cpu device, the API on 127.0.0.1:8571. The whole "
      "configuration is validated at start; each problem is reported as file:line: reason. Under systemd it "
      "runs as Type=notify with a watchdog (the jouled.service unit)."};
  page.sections = {
      {"SIGNALS",
       {{"SIGHUP",
         "Re-read the configuration and the policies (systemctl reload jouled). A valid set replaces the running "
         "one whole; a bad one is refused with file:line: reason and the running one stays."},
        {"SIGTERM, SIGINT",
         "Stop: the API closes and jouled exits; running jobs keep running and the next jouled adopts them."}}},
      {"FILES",
       {{"/etc/jouled/jouled.toml", "The node's configuration (--config); every key is documented in it."},
        {"/etc/jouled/policies.d/*.toml",
         "Placement objective and risk, energy budgets, power caps and battery floors; read in order, validated as "
         "a set."},
        {"/var/lib/jouled",
         "State under systemd ($STATE_DIRECTORY): the SQLite database, job logs, energy models. Otherwise "
         "/var/lib/jouled for root, ~/.local/state/jouled for others, or --state-dir."}}},
      {"ENVIRONMENT",
       {{"STATE_DIRECTORY", "Set by systemd (StateDirectory=): the state directory where --state-dir is not given."},
        {"NOTIFY_SOCKET", "Set by systemd: jouled reports readiness, reloads, stopping and the watchdog there."}}},
      {"SEE ALSO", {{"", "joulectl(1), joule-sim(1), systemd.service(5); joule-worker --help."}}}};
  return page;
}

}  // namespace

int main(int argc, char** argv) {
  // jouled starts each job through itself as a tiny runner (see job_process.hpp).
  if (argc >= 2 && std::strcmp(argv[1], "--job-runner") == 0)
    return joule::adapters::job_runner_main(argc - 2, argv + 2);

  CLI::App app{"jouled: energy-aware scheduler daemon for deep-learning training jobs"};
  joule::daemon::CommandLine command_line;
  std::string config_file, listen, state_dir, log_level;
  app.add_option("--config", config_file, "config file (jouled.toml); without it, embedded defaults")
      ->check(CLI::ExistingFile);
  app.add_option("--listen", listen, "HOST:PORT to serve the API on (default 127.0.0.1:8571; port 0 picks one)")
      ->type_name("ADDRESS");
  app.add_option("--state-dir", state_dir,
                 "where the SQLite state and job logs live (default $STATE_DIRECTORY or /var/lib/jouled)")
      ->type_name("DIR");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, critical or off")->type_name("LEVEL");
  app.set_version_flag("--version", JOULE_VERSION);
  joule::cli::add_man_page_flag(app, man_page());
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
