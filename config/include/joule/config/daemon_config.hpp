#pragma once
// jouled.toml: what a node's daemon listens on, where it keeps state, its devices and meters.
// The whole file is validated before any of it is used; every problem names file and line.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "joule/common/result.hpp"

namespace joule::config {

/// One device of this node and how it is metered.
struct DeviceConfig {
  /// "cpu", or "sim:<profile>" for a simulated device (estimation only in this version: it is
  /// probed by the simulator and estimates jobs, but runs none).
  std::string name = "cpu";
  /// "auto" walks the preference list (RAPL when readable, else modelled); "modelled" forces
  /// the CPU-time model.
  std::string meter = "auto";
  double idle_watts = 10.0;           ///< modelled meter: power of the idle CPU
  double watts_per_busy_core = 12.0;  ///< modelled meter: added power per fully busy core
  std::size_t probes = 200;           ///< simulated devices: THOR probes of the first campaign
};

struct ServerConfig {
  std::string host = "127.0.0.1";
  std::uint16_t port = 8571;
  std::size_t max_body_bytes = 1 << 20;
  double request_timeout_seconds = 30.0;
  std::size_t max_connections = 512;
  std::size_t max_queued_jobs = 10000;
};

struct DaemonConfig {
  ServerConfig server;
  std::filesystem::path state_directory = "/var/lib/jouled";
  std::string log_level = "info";
  std::vector<std::string> token_sha256;  ///< hex SHA-256 of accepted bearer tokens
  std::vector<DeviceConfig> devices = {DeviceConfig{}};
  double meter_interval_seconds = 1.0;
  double kill_grace_seconds = 10.0;
  std::string source = "embedded defaults";  ///< the file it came from
};

/// A problem in a config file, located by file and line.
struct ConfigProblem {
  std::string file;
  int line = 0;
  std::string message;
  std::string describe() const;  ///< "jouled.toml:12: server.port must be ..."
};

struct LoadedConfig {
  DaemonConfig config;
  std::vector<ConfigProblem> warnings;  ///< e.g. unknown keys; the config is still usable
};

/// Parses TOML text on top of `defaults`. On failure the error lists every problem, one per line.
Result<LoadedConfig> parse_config(const std::string& text, const std::string& file_name,
                                  const DaemonConfig& defaults = {});
/// Reads and parses a file.
Result<LoadedConfig> load_config_file(const std::filesystem::path& path, const DaemonConfig& defaults = {});

/// Splits "HOST:PORT" or "[v6]:PORT".
Result<std::pair<std::string, std::uint16_t>> parse_listen_address(const std::string& text);
/// Whether a host string names a loopback address (127.0.0.0/8, ::1, localhost).
bool is_loopback_host(const std::string& host);
/// Level names spdlog understands: trace, debug, info, warn, error, critical, off.
bool is_valid_log_level(const std::string& level);

/// The effective config as JSON for the start-up log; token hashes are counted, not shown.
nlohmann::json to_json(const DaemonConfig& config);

}  // namespace joule::config
