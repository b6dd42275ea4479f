#include "joule/config/daemon_config.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "joule/estimator/simulated_device.hpp"

namespace joule::config {
namespace {

class Checker {
 public:
  explicit Checker(std::string file) : file_(std::move(file)) {}

  void problem(const toml::node& node, std::string message) {
    problems_.push_back(ConfigProblem{file_, static_cast<int>(node.source().begin.line), std::move(message)});
  }
  void warning(const toml::node& node, std::string message) {
    warnings_.push_back(ConfigProblem{file_, static_cast<int>(node.source().begin.line), std::move(message)});
  }
  void warn_unknown(const toml::table& table, const std::string& where, const std::set<std::string>& known) {
    for (const auto& [key, node] : table) {
      if (!known.contains(std::string(key.str())))
        warning(node, fmt::format("unknown key {}{} (ignored)", where, key.str()));
    }
  }

  template <class T>
  std::optional<T> get(const toml::table& table, const char* key, const std::string& name) {
    const toml::node* node = table.get(key);
    if (!node) return std::nullopt;
    if constexpr (std::is_same_v<T, double>) {
      if (auto v = node->value<double>()) return *v;  // integers convert too
      problem(*node, fmt::format("{} must be a number", name));
    } else if constexpr (std::is_same_v<T, std::int64_t>) {
      if (node->is_integer()) return node->value<std::int64_t>();
      problem(*node, fmt::format("{} must be an integer", name));
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (node->is_string()) return node->value<std::string>();
      problem(*node, fmt::format("{} must be a string", name));
    }
    return std::nullopt;
  }

  double positive(const toml::table& table, const char* key, const std::string& name, double fallback,
                  bool allow_zero = false) {
    auto value = get<double>(table, key, name);
    if (!value) return fallback;
    if (*value < 0.0 || (!allow_zero && *value == 0.0)) {
      problem(*table.get(key), fmt::format("{} must be {} 0, got {}", name, allow_zero ? ">=" : ">", *value));
      return fallback;
    }
    return *value;
  }

  std::int64_t integer_in(const toml::table& table, const char* key, const std::string& name, std::int64_t low,
                          std::int64_t high, std::int64_t fallback) {
    auto value = get<std::int64_t>(table, key, name);
    if (!value) return fallback;
    if (*value < low || *value > high) {
      problem(*table.get(key), fmt::format("{} must be between {} and {}, got {}", name, low, high, *value));
      return fallback;
    }
    return *value;
  }

  std::vector<ConfigProblem> problems_;
  std::vector<ConfigProblem> warnings_;

 private:
  std::string file_;
};

bool is_hex_sha256(const std::string& text) {
  return text.size() == 64 &&
         std::all_of(text.begin(), text.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

void parse_server(Checker& check, const toml::table& table, DaemonConfig& config) {
  check.warn_unknown(table, "server.",
                     {"listen", "max_body_bytes", "request_timeout_seconds", "max_connections", "max_queued_jobs"});
  if (auto listen = check.get<std::string>(table, "listen", "server.listen")) {
    auto parsed = parse_listen_address(*listen);
    if (!parsed) {
      check.problem(*table.get("listen"), fmt::format("server.listen: {}", parsed.error().message));
    } else {
      config.server.host = parsed->first;
      config.server.port = parsed->second;
    }
  }
  config.server.max_body_bytes =
      static_cast<std::size_t>(check.integer_in(table, "max_body_bytes", "server.max_body_bytes", 1024, 1LL << 30,
                                                static_cast<std::int64_t>(config.server.max_body_bytes)));
  config.server.request_timeout_seconds = check.positive(
      table, "request_timeout_seconds", "server.request_timeout_seconds", config.server.request_timeout_seconds);
  config.server.max_connections =
      static_cast<std::size_t>(check.integer_in(table, "max_connections", "server.max_connections", 1, 100000,
                                                static_cast<std::int64_t>(config.server.max_connections)));
  config.server.max_queued_jobs =
      static_cast<std::size_t>(check.integer_in(table, "max_queued_jobs", "server.max_queued_jobs", 1, 10000000,
                                                static_cast<std::int64_t>(config.server.max_queued_jobs)));
}

void parse_devices(Checker& check, const toml::node& node, DaemonConfig& config) {
  const auto* array = node.as_array();
  if (!array || !array->is_array_of_tables()) {
    check.problem(node, "devices must be an array of tables: [[devices]]");
    return;
  }
  std::vector<DeviceConfig> devices;
  std::set<std::string> names;
  for (const auto& element : *array) {
    const auto& table = *element.as_table();
    check.warn_unknown(table, "devices.", {"name", "meter", "idle_watts", "watts_per_busy_core", "probes"});
    DeviceConfig device;
    if (auto name = check.get<std::string>(table, "name", "devices.name"))
      device.name = *name;
    else if (!table.get("name"))
      check.problem(table, "each [[devices]] needs a name, e.g. name = \"cpu\"");
    const bool simulated = device.name.rfind("sim:", 0) == 0;
    if (simulated) {
      if (auto profile = estimator::find_simulated_profile(device.name.substr(4)); !profile)
        check.problem(table, fmt::format("device \"{}\": {}", device.name, profile.error().message));
      device.meter = "simulated";
    } else if (device.name != "cpu") {
      check.problem(table, fmt::format("device \"{}\": this build supports \"cpu\" and simulated devices "
                                       "\"sim:<profile>\" (GPU and board meters come with the probing work)",
                                       device.name));
    }
    if (!names.insert(device.name).second)
      check.problem(table, fmt::format("device \"{}\" is listed twice", device.name));
    if (auto meter = check.get<std::string>(table, "meter", "devices.meter"); meter && simulated) {
      if (*meter != "simulated")
        check.problem(*table.get("meter"), fmt::format("a simulated device's meter is \"simulated\", got \"{}\"", *meter));
    } else if (meter) {
      if (*meter != "auto" && *meter != "modelled")
        check.problem(*table.get("meter"),
                      fmt::format("devices.meter must be \"auto\" or \"modelled\", got \"{}\"", *meter));
      else
        device.meter = *meter;
    }
    device.idle_watts = check.positive(table, "idle_watts", "devices.idle_watts", device.idle_watts, true);
    device.watts_per_busy_core =
        check.positive(table, "watts_per_busy_core", "devices.watts_per_busy_core", device.watts_per_busy_core, true);
    device.probes = static_cast<std::size_t>(
        check.integer_in(table, "probes", "devices.probes", 10, 100000, static_cast<std::int64_t>(device.probes)));
    devices.push_back(device);
  }
  if (devices.empty())
    check.problem(node, "devices is empty; a node needs at least the \"cpu\" device");
  else
    config.devices = std::move(devices);
}

}  // namespace

std::string ConfigProblem::describe() const { return fmt::format("{}:{}: {}", file, line, message); }

Result<std::pair<std::string, std::uint16_t>> parse_listen_address(const std::string& text) {
  std::string host;
  std::string port_text;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      return make_error(ErrorCode::invalid_argument, fmt::format("\"{}\" is not [IPv6]:PORT", text));
    host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0)
      return make_error(ErrorCode::invalid_argument, fmt::format("\"{}\" is not HOST:PORT", text));
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
  }
  if (port_text.empty() || port_text.size() > 5 || !std::all_of(port_text.begin(), port_text.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      }))
    return make_error(ErrorCode::invalid_argument, fmt::format("\"{}\": port must be a number 0-65535", text));
  const int port = std::stoi(port_text);
  if (port > 65535) return make_error(ErrorCode::invalid_argument, fmt::format("\"{}\": port must be 0-65535", text));
  if (host == "localhost") host = "127.0.0.1";
  unsigned char buffer[16];
  if (inet_pton(AF_INET, host.c_str(), buffer) != 1 && inet_pton(AF_INET6, host.c_str(), buffer) != 1)
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("\"{}\": host must be an IP address or localhost", text));
  return std::pair{host, static_cast<std::uint16_t>(port)};
}

bool is_loopback_host(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  return false;
}

bool is_valid_log_level(const std::string& level) {
  static const std::set<std::string> levels = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  return levels.contains(level);
}

Result<LoadedConfig> parse_config(const std::string& text, const std::string& file_name, const DaemonConfig& defaults) {
  toml::table root;
  try {
    root = toml::parse(text, file_name);
  } catch (const toml::parse_error& error) {
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("{}:{}: {}", file_name, error.source().begin.line, error.description()));
  }
  Checker check(file_name);
  LoadedConfig loaded{defaults, {}};
  DaemonConfig& config = loaded.config;
  config.source = file_name;
  check.warn_unknown(root, "", {"server", "state", "log", "auth", "devices", "meters", "jobs"});

  auto table_of = [&](const char* key) -> const toml::table* {
    const toml::node* node = root.get(key);
    if (!node) return nullptr;
    if (!node->is_table()) {
      check.problem(*node, fmt::format("{} must be a table: [{}]", key, key));
      return nullptr;
    }
    return node->as_table();
  };
  if (const auto* server = table_of("server")) parse_server(check, *server, config);
  if (const auto* state = table_of("state")) {
    check.warn_unknown(*state, "state.", {"directory"});
    if (auto dir = check.get<std::string>(*state, "directory", "state.directory")) {
      if (dir->empty() || dir->front() != '/')
        check.problem(*state->get("directory"), "state.directory must be an absolute path");
      else
        config.state_directory = *dir;
    }
  }
  if (const auto* log = table_of("log")) {
    check.warn_unknown(*log, "log.", {"level"});
    if (auto level = check.get<std::string>(*log, "level", "log.level")) {
      if (!is_valid_log_level(*level))
        check.problem(
            *log->get("level"),
            fmt::format("log.level \"{}\" is not one of trace, debug, info, warn, error, critical, off", *level));
      else
        config.log_level = *level;
    }
  }
  if (const auto* auth = table_of("auth")) {
    check.warn_unknown(*auth, "auth.", {"token_sha256"});
    if (const toml::node* tokens = auth->get("token_sha256")) {
      const auto* array = tokens->as_array();
      if (!array) {
        check.problem(*tokens, "auth.token_sha256 must be an array of hex SHA-256 strings");
      } else {
        config.token_sha256.clear();
        for (const auto& element : *array) {
          auto value = element.value<std::string>();
          if (!value || !is_hex_sha256(*value)) {
            check.problem(element,
                          "auth.token_sha256 entries must be 64 hex digits (joulectl hash-token prints one); "
                          "never put the token itself here");
            continue;
          }
          std::string lower = *value;
          std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
          config.token_sha256.push_back(lower);
        }
      }
    }
  }
  if (const toml::node* devices = root.get("devices")) parse_devices(check, *devices, config);
  if (const auto* meters = table_of("meters")) {
    check.warn_unknown(*meters, "meters.", {"interval_seconds"});
    config.meter_interval_seconds =
        check.positive(*meters, "interval_seconds", "meters.interval_seconds", config.meter_interval_seconds);
    if (config.meter_interval_seconds > 60.0)
      check.problem(*meters->get("interval_seconds"),
                    "meters.interval_seconds must be at most 60 (RAPL counters wrap within minutes)");
  }
  if (const auto* jobs = table_of("jobs")) {
    check.warn_unknown(*jobs, "jobs.", {"kill_grace_seconds"});
    config.kill_grace_seconds =
        check.positive(*jobs, "kill_grace_seconds", "jobs.kill_grace_seconds", config.kill_grace_seconds, true);
  }

  if (!check.problems_.empty()) {
    std::stable_sort(check.problems_.begin(), check.problems_.end(),
                     [](const ConfigProblem& a, const ConfigProblem& b) { return a.line < b.line; });
    std::string message;
    for (const auto& problem : check.problems_) {
      if (!message.empty()) message += '\n';
      message += problem.describe();
    }
    return make_error(ErrorCode::invalid_argument, message);
  }
  loaded.warnings = std::move(check.warnings_);
  std::stable_sort(loaded.warnings.begin(), loaded.warnings.end(),
                   [](const ConfigProblem& a, const ConfigProblem& b) { return a.line < b.line; });
  return loaded;
}

Result<LoadedConfig> load_config_file(const std::filesystem::path& path, const DaemonConfig& defaults) {
  std::ifstream in(path);
  if (!in) return make_error(ErrorCode::unavailable, fmt::format("{}: cannot read the config file", path.string()));
  std::stringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), path.string(), defaults);
}

nlohmann::json to_json(const DaemonConfig& config) {
  nlohmann::json devices = nlohmann::json::array();
  for (const auto& d : config.devices) {
    devices.push_back({{"name", d.name},
                       {"meter", d.meter},
                       {"idle_watts", d.idle_watts},
                       {"watts_per_busy_core", d.watts_per_busy_core},
                       {"probes", d.probes}});
  }
  return {{"source", config.source},
          {"server",
           {{"listen", fmt::format("{}:{}", config.server.host, config.server.port)},
            {"max_body_bytes", config.server.max_body_bytes},
            {"request_timeout_seconds", config.server.request_timeout_seconds},
            {"max_connections", config.server.max_connections},
            {"max_queued_jobs", config.server.max_queued_jobs}}},
          {"state", {{"directory", config.state_directory.string()}}},
          {"log", {{"level", config.log_level}}},
          {"auth", {{"tokens", config.token_sha256.size()}}},
          {"devices", devices},
          {"meters", {{"interval_seconds", config.meter_interval_seconds}}},
          {"jobs", {{"kill_grace_seconds", config.kill_grace_seconds}}}};
}

}  // namespace joule::config
