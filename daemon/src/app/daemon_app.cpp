#include "joule/daemon/daemon_app.hpp"

#include <unistd.h>

#include <cstdlib>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "daemon.hpp"
#include "joule/config/daemon_config.hpp"
#include "node_setup.hpp"

#ifndef JOULE_VERSION
#define JOULE_VERSION "0.0.0"
#endif

namespace joule::daemon {

namespace {

std::filesystem::path default_state_directory() {
  // systemd's StateDirectory= hands us the path (several, colon-separated, take the first).
  if (const char* from_systemd = std::getenv("STATE_DIRECTORY"); from_systemd && *from_systemd) {
    const std::string all = from_systemd;
    return all.substr(0, all.find(':'));
  }
  if (::geteuid() == 0) return "/var/lib/jouled";
  if (const char* xdg = std::getenv("XDG_STATE_HOME"); xdg && *xdg) return std::filesystem::path(xdg) / "jouled";
  if (const char* home = std::getenv("HOME"); home && *home) return std::filesystem::path(home) / ".local/state/jouled";
  return "/var/lib/jouled";
}

}  // namespace

config::DaemonConfig resolve_config(const CommandLine& command_line, std::vector<config::ConfigProblem>* warnings) {
  config::DaemonConfig defaults;
  defaults.state_directory = default_state_directory();
  config::DaemonConfig resolved = defaults;
  if (command_line.config_file) {
    auto loaded = config::load_config_file(*command_line.config_file, defaults);
    if (!loaded) throw std::runtime_error(loaded.error().message);
    resolved = loaded->config;
    if (warnings) *warnings = loaded->warnings;
  }
  if (command_line.listen) {
    auto address = config::parse_listen_address(*command_line.listen);
    if (!address) throw std::runtime_error("--listen: " + address.error().message);
    resolved.server.host = address->first;
    resolved.server.port = address->second;
  }
  if (command_line.state_directory) resolved.state_directory = std::filesystem::absolute(*command_line.state_directory);
  if (command_line.log_level) {
    if (!config::is_valid_log_level(*command_line.log_level))
      throw std::runtime_error(
          fmt::format("--log-level {}: use trace, debug, info, warn, error, critical or off", *command_line.log_level));
    resolved.log_level = *command_line.log_level;
  }
  if (!config::is_loopback_host(resolved.server.host) && resolved.token_sha256.empty() && resolved.tokens.empty()) {
    throw std::runtime_error(
        fmt::format("refusing to listen on {} (not loopback) without API tokens: add [auth] token_sha256 to the config "
                    "(joulectl token new prints a token and its hash)",
                    resolved.server.host));
  }
  return resolved;
}

int run_daemon(const CommandLine& command_line) {
  auto logger = spdlog::stderr_logger_mt("jouled");
  spdlog::set_default_logger(logger);
  // Under systemd the journal stamps time and unit; elsewhere we do.
  spdlog::set_pattern(std::getenv("JOURNAL_STREAM") ? "%l: %v" : "%Y-%m-%dT%H:%M:%S.%e %l: %v");

  std::vector<config::ConfigProblem> warnings;
  config::DaemonConfig config = resolve_config(command_line, &warnings);
  apply_log_level(config.log_level);
  for (const auto& warning : warnings) spdlog::warn("{}", warning.describe());
  spdlog::info("jouled {} starting; effective config: {}", JOULE_VERSION, config::to_json(config).dump());
  Daemon daemon(command_line, std::move(config));
  return daemon.run();
}

}  // namespace joule::daemon
