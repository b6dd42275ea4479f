#include "joule/config/daemon_config.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "joule/config/device_names.hpp"
#include "joule/config/grid_signal_file.hpp"
#include "joule/estimator/simulated_device.hpp"
#include "toml_checker.hpp"

namespace joule::config {
namespace {

using detail::Checker;

bool is_hex_sha256(const std::string& text) {
  return text.size() == 64 &&
         std::all_of(text.begin(), text.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

void parse_server(Checker& check, const toml::table& table, DaemonConfig& config) {
  check.warn_unknown(table, "server.",
                     {"listen", "max_body_bytes", "request_timeout_seconds", "idle_timeout_seconds", "max_connections",
                      "max_connections_per_client", "max_queued_jobs", "tls_certificate", "tls_private_key"});
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
  config.server.idle_timeout_seconds =
      check.positive(table, "idle_timeout_seconds", "server.idle_timeout_seconds", config.server.idle_timeout_seconds);
  config.server.max_connections_per_client = static_cast<std::size_t>(
      check.integer_in(table, "max_connections_per_client", "server.max_connections_per_client", 1, 100000,
                       static_cast<std::int64_t>(config.server.max_connections_per_client)));
  config.server.max_queued_jobs =
      static_cast<std::size_t>(check.integer_in(table, "max_queued_jobs", "server.max_queued_jobs", 1, 10000000,
                                                static_cast<std::int64_t>(config.server.max_queued_jobs)));
  if (auto path = check.get<std::string>(table, "tls_certificate", "server.tls_certificate"))
    config.server.tls_certificate = *path;
  if (auto path = check.get<std::string>(table, "tls_private_key", "server.tls_private_key"))
    config.server.tls_private_key = *path;
  if (config.server.tls_certificate.empty() != config.server.tls_private_key.empty())
    check.problem(table, "server.tls_certificate and server.tls_private_key go together: set both for HTTPS, or neither");
}

void parse_token_hashes(Checker& check, const toml::node& tokens, const std::string& key,
                        std::vector<std::string>& out) {
  const auto* array = tokens.as_array();
  if (!array) {
    check.problem(tokens, key + " must be an array of hex SHA-256 strings");
    return;
  }
  out.clear();
  for (const auto& element : *array) {
    auto value = element.value<std::string>();
    if (!value || !is_hex_sha256(*value)) {
      check.problem(element, key + " entries must be 64 hex digits (joulectl token new prints one); "
                                   "never put the token itself here");
      continue;
    }
    std::string lower = *value;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    out.push_back(lower);
  }
}

// [[auth.tokens]]: name, sha256, scopes. Names are owners: each must be unique.
void parse_named_tokens(Checker& check, const toml::node& node, std::vector<DaemonConfig::NamedToken>& out) {
  const auto* array = node.as_array();
  if (!array || !array->is_array_of_tables()) {
    check.problem(node, "auth.tokens must be an array of tables: [[auth.tokens]] name, sha256, scopes");
    return;
  }
  for (std::size_t i = 0; i < array->size(); ++i) {
    const auto& table = *(*array)[i].as_table();
    const std::string key = fmt::format("auth.tokens[{}]", i);
    check.warn_unknown(table, key + ".", {"name", "sha256", "scopes"});
    DaemonConfig::NamedToken token;
    auto name = check.get<std::string>(table, "name", key + ".name");
    if (!name || name->empty() || name->find_first_of(" :/\t\n") != std::string::npos) {
      check.problem(table, key + ".name is required: the token's owner, without spaces, ':' or '/'");
      continue;
    }
    token.name = *name;
    auto hash = check.get<std::string>(table, "sha256", key + ".sha256");
    if (!hash || !is_hex_sha256(*hash)) {
      check.problem(table, key +
                               ".sha256 must be the token's SHA-256, 64 hex digits (joulectl token new); never the "
                               "token itself");
      continue;
    }
    token.sha256 = *hash;
    std::transform(token.sha256.begin(), token.sha256.end(), token.sha256.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (const toml::node* scopes = table.get("scopes")) {
      const auto* list = scopes->as_array();
      for (std::size_t j = 0; list && j < list->size(); ++j) {
        auto scope = (*list)[j].value<std::string>();
        if (!scope || (*scope != "read" && *scope != "submit" && *scope != "admin"))
          check.problem((*list)[j], fmt::format("{}.scopes[{}] must be \"read\", \"submit\" or \"admin\"", key, j));
        else
          token.scopes.push_back(*scope);
      }
      if (!list) check.problem(*scopes, key + ".scopes must be an array such as [\"submit\"]");
    } else {
      token.scopes = {"submit"};
    }
    for (const auto& other : out) {
      if (other.name == token.name) check.problem(table, fmt::format("{}: the name {} is taken", key, token.name));
    }
    out.push_back(std::move(token));
  }
}

// [carbon] or [price] (`name`): the same keys but for the constant and the currency.
void parse_signal(Checker& check, const toml::table& table, const std::string& name, SignalConfig& signal) {
  const bool price = name == "price";
  const char* constant_key = price ? "per_kwh" : "intensity";
  std::set<std::string> known{"file",           "url", "token_file", "token_header", constant_key, "refresh_seconds",
                              "timeout_seconds"};
  if (price) known.insert("currency");
  check.warn_unknown(table, name + ".", known);
  auto key = [&](const char* what) { return fmt::format("{}.{}", name, what); };
  if (auto file = check.get<std::string>(table, "file", key("file"))) {
    if (file->empty() || file->front() != '/')
      check.problem(*table.get("file"), fmt::format("{} must be an absolute path", key("file")));
    else
      signal.file = *file;
  }
  if (auto url = check.get<std::string>(table, "url", key("url"))) {
    if (!url->starts_with("http://") && !url->starts_with("https://"))
      check.problem(*table.get("url"), fmt::format("{} \"{}\" must start with http:// or https://", key("url"), *url));
    else
      signal.url = *url;
  }
  if (!signal.file.empty() && !signal.url.empty())
    check.problem(table, fmt::format("[{}] takes a file or a url, not both", name));
  if (auto path = check.get<std::string>(table, "token_file", key("token_file"))) {
    if (path->empty() || path->front() != '/')
      check.problem(*table.get("token_file"), fmt::format("{} must be an absolute path", key("token_file")));
    else if (signal.url.empty())
      check.problem(*table.get("token_file"),
                    fmt::format("{} is sent with {} requests: set a url", key("token_file"), key("url")));
    else
      signal.token_file = *path;
  }
  if (auto header = check.get<std::string>(table, "token_header", key("token_header"))) {
    const bool token_like = !header->empty() && std::all_of(header->begin(), header->end(), [](unsigned char c) {
      return std::isalnum(c) || c == '-' || c == '_';
    });
    if (!token_like)
      check.problem(
          *table.get("token_header"),
          fmt::format("{} \"{}\" must be a header name (letters, digits, '-', '_')", key("token_header"), *header));
    else if (signal.token_file.empty())
      check.problem(*table.get("token_header"),
                    fmt::format("{} names where {} goes: set a token_file", key("token_header"), key("token_file")));
    else
      signal.token_header = *header;
  }
  if (auto constant = check.get<double>(table, constant_key, key(constant_key))) {
    // The dirtiest grids average about 1,000 g/kWh (coal); 5,000 is a typo, not a grid. A price
    // is in any currency: only its sign and finiteness are checked.
    if (!price && !(*constant >= 0.0 && *constant <= 5000.0))
      check.problem(*table.get(constant_key), "carbon.intensity must be 0-5000 gCO2e/kWh");
    else if (price && !(std::isfinite(*constant) && *constant >= 0.0))
      check.problem(*table.get(constant_key), "price.per_kwh must be a price >= 0");
    else
      signal.constant = *constant;
  }
  if (price) {
    if (auto currency = check.get<std::string>(table, "currency", "price.currency")) {
      if (!is_currency_code(*currency))
        check.problem(*table.get("currency"),
                      fmt::format("price.currency must be a currency code of 3 capital letters (\"EUR\"), got \"{}\"",
                                  *currency));
      else
        signal.currency = *currency;
    } else if (!table.get("currency")) {
      check.problem(table, "[price] needs a currency: the code its prices are in (currency = \"EUR\")");
    }
  }
  signal.refresh_seconds = check.positive(table, "refresh_seconds", key("refresh_seconds"), signal.refresh_seconds);
  signal.timeout_seconds = check.positive(table, "timeout_seconds", key("timeout_seconds"), signal.timeout_seconds);
  if (!signal.configured())
    check.problem(table, price ? "[price] needs a file, a url or a per_kwh price"
                               : "[carbon] needs a file, a url or an intensity (gCO2e/kWh)");
}

void parse_slurm(Checker& check, const toml::table& table, SlurmConfig& slurm) {
  check.warn_unknown(table, "slurm.",
                     {"bin_dir", "conf", "poll_seconds", "timeout_seconds", "workdir", "joule_url", "node_types"});
  if (auto url = check.get<std::string>(table, "joule_url", "slurm.joule_url")) {
    if (!url->starts_with("http://") && !url->starts_with("https://"))
      check.problem(*table.get("joule_url"),
                    fmt::format("slurm.joule_url \"{}\" must start with http:// or https://", *url));
    else
      slurm.joule_url = *url;
  }
  if (auto path = check.get<std::string>(table, "bin_dir", "slurm.bin_dir")) slurm.bin_dir = *path;
  if (auto path = check.get<std::string>(table, "conf", "slurm.conf")) slurm.conf = *path;
  if (auto path = check.get<std::string>(table, "workdir", "slurm.workdir")) slurm.workdir = *path;
  slurm.poll_seconds = check.positive(table, "poll_seconds", "slurm.poll_seconds", slurm.poll_seconds);
  slurm.timeout_seconds = check.positive(table, "timeout_seconds", "slurm.timeout_seconds", slurm.timeout_seconds);
  const toml::node* types = table.get("node_types");
  if (!types) {
    check.problem(table, "slurm needs at least one [[slurm.node_types]] (name, partition, slots, model)");
    return;
  }
  const auto* array = types->as_array();
  if (!array || !array->is_array_of_tables()) {
    check.problem(*types, "slurm.node_types must be an array of tables: [[slurm.node_types]]");
    return;
  }
  std::set<std::string> names;
  for (const auto& element : *array) {
    const auto& type_table = *element.as_table();
    check.warn_unknown(type_table, "slurm.node_types.",
                       {"name", "partition", "nodelist", "constraint", "slots", "model", "probes", "threads"});
    SlurmNodeType type;
    if (auto name = check.get<std::string>(type_table, "name", "slurm.node_types.name")) type.name = *name;
    static const std::regex kName("[A-Za-z0-9._-]{1,48}");
    if (!std::regex_match(type.name, kName))
      check.problem(type_table, fmt::format("slurm.node_types.name \"{}\" must be 1-48 letters, digits, '.', '_' or '-'",
                                            type.name));
    else if (!names.insert(type.name).second)
      check.problem(type_table, fmt::format("slurm node type \"{}\" is listed twice", type.name));
    if (auto v = check.get<std::string>(type_table, "partition", "slurm.node_types.partition")) type.partition = *v;
    if (auto v = check.get<std::string>(type_table, "nodelist", "slurm.node_types.nodelist")) type.nodelist = *v;
    if (auto v = check.get<std::string>(type_table, "constraint", "slurm.node_types.constraint")) type.constraint = *v;
    type.slots = static_cast<int>(check.integer_in(type_table, "slots", "slurm.node_types.slots", 1, 4096, type.slots));
    type.probes = static_cast<std::size_t>(check.integer_in(type_table, "probes", "slurm.node_types.probes", 10, 100000,
                                                            static_cast<std::int64_t>(type.probes)));
    type.threads =
        static_cast<int>(check.integer_in(type_table, "threads", "slurm.node_types.threads", 1, 4096, type.threads));
    if (auto model = check.get<std::string>(type_table, "model", "slurm.node_types.model")) {
      type.model = *model;
      if (model->rfind("sim:", 0) == 0) {
        if (auto profile = estimator::find_simulated_profile(model->substr(4)); !profile)
          check.problem(*type_table.get("model"), fmt::format("slurm.node_types.model: {}", profile.error().message));
      } else if (model->find('/') == std::string::npos) {
        check.problem(*type_table.get("model"),
                      fmt::format("slurm.node_types.model \"{}\" must name an agent's device (\"node/device\") or a "
                                  "simulated profile (\"sim:<profile>\")",
                                  *model));
      }
    } else if (!type_table.get("model")) {
      check.problem(type_table, fmt::format("slurm node type \"{}\" needs a model: an agent's \"node/device\" on such "
                                            "a node, or \"sim:<profile>\"",
                                            type.name));
    }
    slurm.node_types.push_back(std::move(type));
  }
}

void parse_cluster(Checker& check, const toml::table& table, ClusterConfig& cluster) {
  check.warn_unknown(table, "cluster.",
                     {"role", "coordinator", "token_file", "ca_file", "heartbeat_seconds", "lost_after_seconds",
                      "agent_token_sha256"});
  if (auto role = check.get<std::string>(table, "role", "cluster.role")) {
    if (*role != "standalone" && *role != "coordinator" && *role != "agent")
      check.problem(*table.get("role"),
                    fmt::format("cluster.role must be standalone, coordinator or agent; got \"{}\"", *role));
    else
      cluster.role = *role;
  }
  if (auto url = check.get<std::string>(table, "coordinator", "cluster.coordinator")) {
    if (url->rfind("http://", 0) != 0 && url->rfind("https://", 0) != 0)
      check.problem(*table.get("coordinator"),
                    fmt::format("cluster.coordinator must be a URL, http://host:port or https://host:port; got \"{}\"", *url));
    else
      cluster.coordinator = *url;
  }
  if (auto path = check.get<std::string>(table, "token_file", "cluster.token_file")) cluster.token_file = *path;
  if (auto path = check.get<std::string>(table, "ca_file", "cluster.ca_file")) cluster.ca_file = *path;
  cluster.heartbeat_seconds =
      check.positive(table, "heartbeat_seconds", "cluster.heartbeat_seconds", cluster.heartbeat_seconds);
  cluster.lost_after_seconds =
      check.positive(table, "lost_after_seconds", "cluster.lost_after_seconds", cluster.lost_after_seconds);
  if (cluster.lost_after_seconds < 2 * cluster.heartbeat_seconds)
    check.problem(table, fmt::format("cluster.lost_after_seconds ({}) must be at least twice heartbeat_seconds ({}): "
                                     "one late heartbeat must not lose a node",
                                     cluster.lost_after_seconds, cluster.heartbeat_seconds));
  if (const toml::node* tokens = table.get("agent_token_sha256"))
    parse_token_hashes(check, *tokens, "cluster.agent_token_sha256", cluster.agent_token_sha256);
  if (cluster.role == "agent" && cluster.coordinator.empty())
    check.problem(table, "an agent needs cluster.coordinator, the coordinator's URL");
}

// "HH:MM-HH:MM" (24:00 allowed as an end) into minutes of the day.
std::optional<std::pair<int, int>> parse_hours(const std::string& text) {
  int h1 = 0, m1 = 0, h2 = 0, m2 = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%d:%d-%d:%d%c", &h1, &m1, &h2, &m2, &tail) != 4) return std::nullopt;
  const int start = h1 * 60 + m1, end = h2 * 60 + m2;
  if (h1 < 0 || h1 > 23 || m1 < 0 || m1 > 59 || h2 < 0 || h2 > 24 || m2 < 0 || m2 > 59 || end > 24 * 60 ||
      start == end)
    return std::nullopt;
  return std::pair{start, end};
}

void parse_probing(Checker& check, const toml::table& table, ProbingConfig& probing) {
  check.warn_unknown(table, "probing.",
                     {"enabled", "idle_seconds", "hours", "max_joules_per_day", "max_model_age_hours", "target_sigma",
                      "threads", "warmup_steps", "steps_per_repetition", "reading_seconds", "repetitions",
                      "refit_every", "plans_per_run", "worker", "python", "reference_minutes", "max_speed_spread"});
  if (const toml::node* enabled = table.get("enabled")) {
    if (auto value = enabled->value<bool>())
      probing.enabled = *value;
    else
      check.problem(*enabled, "probing.enabled must be true or false");
  }
  probing.idle_seconds = check.positive(table, "idle_seconds", "probing.idle_seconds", probing.idle_seconds, true);
  if (auto hours = check.get<std::string>(table, "hours", "probing.hours")) {
    if (auto range = parse_hours(*hours)) {
      probing.start_minute = range->first;
      probing.end_minute = range->second;
    } else {
      check.problem(*table.get("hours"),
                    fmt::format("probing.hours must look like \"22:00-06:00\" (local time, start-end), got \"{}\"",
                                *hours));
    }
  }
  probing.max_joules_per_day =
      check.positive(table, "max_joules_per_day", "probing.max_joules_per_day", probing.max_joules_per_day, true);
  probing.max_model_age_hours =
      check.positive(table, "max_model_age_hours", "probing.max_model_age_hours", probing.max_model_age_hours);
  probing.target_sigma = check.positive(table, "target_sigma", "probing.target_sigma", probing.target_sigma);
  probing.threads = static_cast<int>(check.integer_in(table, "threads", "probing.threads", 1, 1024, probing.threads));
  probing.warmup_steps =
      static_cast<int>(check.integer_in(table, "warmup_steps", "probing.warmup_steps", 0, 10000, probing.warmup_steps));
  probing.steps_per_repetition = static_cast<int>(check.integer_in(
      table, "steps_per_repetition", "probing.steps_per_repetition", 1, 100000, probing.steps_per_repetition));
  probing.reading_seconds =
      check.positive(table, "reading_seconds", "probing.reading_seconds", probing.reading_seconds, true);
  probing.repetitions =
      static_cast<int>(check.integer_in(table, "repetitions", "probing.repetitions", 1, 1000, probing.repetitions));
  probing.refit_every = static_cast<std::size_t>(check.integer_in(table, "refit_every", "probing.refit_every", 1,
                                                                  10000, static_cast<std::int64_t>(probing.refit_every)));
  probing.plans_per_run =
      static_cast<int>(check.integer_in(table, "plans_per_run", "probing.plans_per_run", 1, 64, probing.plans_per_run));
  if (auto worker = check.get<std::string>(table, "worker", "probing.worker")) probing.worker = *worker;
  if (auto python = check.get<std::string>(table, "python", "probing.python")) probing.python = *python;
  probing.reference_minutes =
      check.positive(table, "reference_minutes", "probing.reference_minutes", probing.reference_minutes, true);
  probing.max_speed_spread =
      check.positive(table, "max_speed_spread", "probing.max_speed_spread", probing.max_speed_spread, true);
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
    check.warn_unknown(table, "devices.",
                       {"name", "meter", "idle_watts", "watts_per_busy_core", "probes", "runs_jobs", "threads",
                        "cpufreq", "devfreq", "worker", "board"});
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
    } else if (device.name != "cpu" && !is_gpu_device_name(device.name)) {
      check.problem(table, fmt::format("device \"{}\": devices are \"cpu\", \"cuda:N\" (an NVIDIA GPU), \"mig:G.I\" "
                                       "(GPU G's MIG device I) or simulated \"sim:<profile>\"",
                                       device.name));
    }
    if (!names.insert(device.name).second)
      check.problem(table, fmt::format("device \"{}\" is listed twice", device.name));
    if (auto meter = check.get<std::string>(table, "meter", "devices.meter"); meter && simulated) {
      if (*meter != "simulated")
        check.problem(*table.get("meter"), fmt::format("a simulated device's meter is \"simulated\", got \"{}\"", *meter));
    } else if (meter) {
      static const std::set<std::string> kMeters = {"auto", "rapl", "nvml", "ina3221", "hwmon", "battery", "modelled"};
      if (!kMeters.contains(*meter))
        check.problem(*table.get("meter"),
                      fmt::format("devices.meter must be one of auto, rapl, nvml, ina3221, hwmon, battery, modelled; "
                                  "got \"{}\"",
                                  *meter));
      else if (*meter == "modelled" && device.name != "cpu")
        check.problem(*table.get("meter"), fmt::format("device \"{}\": the modelled meter models a CPU only",
                                                       device.name));
      else
        device.meter = *meter;
    }
    device.modelled_figures_set = table.contains("idle_watts") || table.contains("watts_per_busy_core");
    device.idle_watts = check.positive(table, "idle_watts", "devices.idle_watts", device.idle_watts, true);
    device.watts_per_busy_core =
        check.positive(table, "watts_per_busy_core", "devices.watts_per_busy_core", device.watts_per_busy_core, true);
    device.probes = static_cast<std::size_t>(
        check.integer_in(table, "probes", "devices.probes", 10, 100000, static_cast<std::int64_t>(device.probes)));
    device.threads = static_cast<int>(check.integer_in(table, "threads", "devices.threads", 1, 1024, device.threads));
    if (const toml::node* runs = table.get("runs_jobs")) {
      if (!runs->value<bool>())
        check.problem(*runs, "devices.runs_jobs must be true or false");
      else if (!simulated)
        check.problem(*runs, fmt::format("device \"{}\": runs_jobs is for simulated devices (real ones always run jobs)",
                                         device.name));
      else
        device.runs_jobs = *runs->value<bool>();
    }
    if (!simulated) device.runs_jobs = true;
    // A knob's sysfs directory: an absolute path, or "off" (none), on the kind of device it is for.
    const auto knob_directory = [&](const char* key, bool applies, const char* whose, std::filesystem::path& into) {
      auto value = check.get<std::string>(table, key, std::string("devices.") + key);
      if (!value) return;
      if (!applies)
        check.problem(*table.get(key), fmt::format("device \"{}\": {} is {}", device.name, key, whose));
      else if (*value == "off")
        into.clear();
      else if (value->empty() || value->front() != '/')
        check.problem(*table.get(key), fmt::format("devices.{} must be an absolute directory, or \"off\"", key));
      else
        into = *value;
    };
    knob_directory("cpufreq", device.name == "cpu", "the CPU's knob; set it on \"cpu\"", device.cpufreq);
    if (auto worker = check.get<std::string>(table, "worker", "devices.worker")) {
      if (simulated)
        check.problem(*table.get("worker"),
                      fmt::format("device \"{}\": a simulated device runs no worker", device.name));
      else if (worker->empty() || worker->front() != '/')
        check.problem(*table.get("worker"), "devices.worker must be an absolute path to a joule-worker");
      else
        device.worker = *worker;
    }
    if (auto board = check.get<std::string>(table, "board", "devices.board")) {
      if (device.name != "cpu")
        check.problem(*table.get("board"),
                      fmt::format("device \"{}\": board names the cpu's board; set it on \"cpu\"", device.name));
      else if (board->empty())
        check.problem(*table.get("board"), "devices.board is empty; leave it out to read the board's own name");
      else
        device.board = *board;
    }
    knob_directory("devfreq", is_cuda_device_name(device.name), "a Jetson GPU's knob; set it on \"cuda:N\"",
                   device.devfreq);
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
  check.warn_unknown(root, "",
                     {"server", "state", "log", "auth", "devices", "meters", "jobs", "probing", "node", "policy",
                      "cluster", "slurm", "carbon", "price"});

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
  if (const auto* node = table_of("node")) {
    check.warn_unknown(*node, "node.", {"name", "nvpmodel", "nvpmodel_conf"});
    if (auto tool = check.get<std::string>(*node, "nvpmodel", "node.nvpmodel")) {
      if (*tool == "off")
        config.nvpmodel.clear();
      else if (tool->empty() || tool->front() != '/')
        check.problem(*node->get("nvpmodel"),
                      "node.nvpmodel must be an absolute path to JetPack's nvpmodel, or \"off\"");
      else
        config.nvpmodel = *tool;
    }
    if (auto conf = check.get<std::string>(*node, "nvpmodel_conf", "node.nvpmodel_conf")) {
      if (conf->empty() || conf->front() != '/')
        check.problem(*node->get("nvpmodel_conf"), "node.nvpmodel_conf must be an absolute path");
      else
        config.nvpmodel_conf = *conf;
    }
    if (auto name = check.get<std::string>(*node, "name", "node.name")) {
      const bool plain = !name->empty() && name->size() <= 64 &&
                         std::all_of(name->begin(), name->end(), [](unsigned char c) {
                           return std::isalnum(c) || c == '-' || c == '_' || c == '.';
                         });
      if (!plain)
        check.problem(*node->get("name"), fmt::format("node.name \"{}\" must be 1-64 letters, digits, '-', '_' or '.'", *name));
      else
        config.node_name = *name;
    }
  }
  if (const auto* policy = table_of("policy")) {
    check.warn_unknown(*policy, "policy.", {"directory"});
    if (auto dir = check.get<std::string>(*policy, "directory", "policy.directory")) {
      if (dir->empty() || dir->front() != '/')
        check.problem(*policy->get("directory"), "policy.directory must be an absolute path");
      else
        config.policy_directory = *dir;
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
    check.warn_unknown(*auth, "auth.", {"token_sha256", "tokens", "local_users"});
    if (const toml::node* tokens = auth->get("token_sha256"))
      parse_token_hashes(check, *tokens, "auth.token_sha256", config.token_sha256);
    if (auto local = check.get<std::string>(*auth, "local_users", "auth.local_users")) {
      if (*local != "submit" && *local != "read" && *local != "none")
        check.problem(*auth->get("local_users"), "auth.local_users must be \"submit\", \"read\" or \"none\"");
      else
        config.local_users = *local;
    }
    if (const toml::node* tokens = auth->get("tokens")) parse_named_tokens(check, *tokens, config.tokens);
  }
  if (const auto* cluster = table_of("cluster")) parse_cluster(check, *cluster, config.cluster);
  if (const auto* slurm = table_of("slurm")) {
    parse_slurm(check, *slurm, config.slurm);
    if (config.cluster.role == "agent")
      check.problem(*slurm, "[slurm] is for a coordinator (or a standalone node), not an agent");
  }
  if (const auto* carbon = table_of("carbon")) parse_signal(check, *carbon, "carbon", config.carbon);
  if (const auto* price = table_of("price")) parse_signal(check, *price, "price", config.price);
  if (const toml::node* devices = root.get("devices")) parse_devices(check, *devices, config);
  if (const auto* meters = table_of("meters")) {
    check.warn_unknown(*meters, "meters.", {"interval_seconds"});
    config.meter_interval_seconds =
        check.positive(*meters, "interval_seconds", "meters.interval_seconds", config.meter_interval_seconds);
    if (config.meter_interval_seconds > 60.0)
      check.problem(*meters->get("interval_seconds"),
                    "meters.interval_seconds must be at most 60 (RAPL counters wrap within minutes)");
  }
  if (const auto* probing = table_of("probing")) parse_probing(check, *probing, config.probing);
  if (const auto* jobs = table_of("jobs")) {
    check.warn_unknown(*jobs, "jobs.",
                       {"kill_grace_seconds", "cgroups", "run_as", "groups", "directory", "keep_finished_days"});
    if (auto run_as = check.get<std::string>(*jobs, "run_as", "jobs.run_as")) {
      if (run_as->empty() || run_as->find_first_of(" \t\n:/") != std::string::npos)
        check.problem(*jobs->get("run_as"),
                      "jobs.run_as must be \"per-job\" (each job its own uid), \"jouled\" (as the daemon) or an "
                      "account name");
      else
        config.job_run_as = *run_as;
    }
    if (const toml::node* groups = jobs->get("groups")) {
      const auto* array = groups->as_array();
      if (!array) check.problem(*groups, "jobs.groups must be an array of group names, e.g. [\"video\", \"render\"]");
      for (std::size_t i = 0; array && i < array->size(); ++i) {
        auto name = (*array)[i].value<std::string>();
        if (!name || name->empty())
          check.problem((*array)[i], fmt::format("jobs.groups[{}] must be a group name", i));
        else
          config.job_groups.push_back(*name);
      }
    }
    if (auto dir = check.get<std::string>(*jobs, "directory", "jobs.directory")) {
      if (dir->empty() || (*dir)[0] != '/')
        check.problem(*jobs->get("directory"), "jobs.directory must be an absolute path");
      else
        config.job_work_directory = *dir;
    }
    if (const toml::node* cgroups = jobs->get("cgroups")) {
      if (auto flag = cgroups->value<bool>())
        config.job_cgroups = *flag;
      else
        check.problem(*cgroups, "jobs.cgroups must be true or false");
    }
    config.kill_grace_seconds =
        check.positive(*jobs, "kill_grace_seconds", "jobs.kill_grace_seconds", config.kill_grace_seconds, true);
    config.keep_finished_days = static_cast<int>(
        check.integer_in(*jobs, "keep_finished_days", "jobs.keep_finished_days", 0, 36500, config.keep_finished_days));
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
                       {"probes", d.probes},
                       {"runs_jobs", d.runs_jobs},
                       {"threads", device_threads(d, config.probing)}});
    if (d.name == "cpu") devices.back()["cpufreq"] = d.cpufreq.empty() ? std::string("off") : d.cpufreq.string();
    if (is_cuda_device_name(d.name))
      devices.back()["devfreq"] = d.devfreq.empty() ? std::string("off") : d.devfreq.string();
    if (!d.worker.empty()) devices.back()["worker"] = d.worker.string();
    if (!d.board.empty()) devices.back()["board"] = d.board;
  }
  return {
      {"source", config.source},
      {"server",
       {{"listen", fmt::format("{}:{}", config.server.host, config.server.port)},
        {"max_body_bytes", config.server.max_body_bytes},
        {"request_timeout_seconds", config.server.request_timeout_seconds},
        {"idle_timeout_seconds", config.server.idle_timeout_seconds},
        {"max_connections", config.server.max_connections},
        {"max_connections_per_client", config.server.max_connections_per_client},
        {"max_queued_jobs", config.server.max_queued_jobs},
        {"tls", !config.server.tls_certificate.empty()}}},
      {"cluster",
       {{"role", config.cluster.role},
        {"coordinator", config.cluster.coordinator},
        {"heartbeat_seconds", config.cluster.heartbeat_seconds},
        {"lost_after_seconds", config.cluster.lost_after_seconds},
        {"agent_tokens", config.cluster.agent_token_sha256.size()}}},
      {"slurm", {{"node_types", config.slurm.node_types.size()}, {"conf", config.slurm.conf.string()}}},
      {"state", {{"directory", config.state_directory.string()}}},
      {"node",
       {{"name", config.node_name.empty() ? "(host name)" : config.node_name},
        {"nvpmodel", config.nvpmodel.empty() ? std::string("off") : config.nvpmodel},
        {"nvpmodel_conf", config.nvpmodel_conf.string()}}},
      {"policy", {{"directory", config.policy_directory.empty() ? "(none)" : config.policy_directory.string()}}},
      {"log", {{"level", config.log_level}}},
      {"auth", {{"tokens", config.token_sha256.size() + config.tokens.size()}, {"local_users", config.local_users}}},
      {"devices", devices},
      {"meters", {{"interval_seconds", config.meter_interval_seconds}}},
      {"jobs",
       {{"kill_grace_seconds", config.kill_grace_seconds},
        {"cgroups", config.job_cgroups},
        {"run_as", config.job_run_as},
        {"groups", config.job_groups},
        {"directory", config.job_work_directory.string()}}},
      {"probing",
       {{"enabled", config.probing.enabled},
        {"idle_seconds", config.probing.idle_seconds},
        {"hours",
         fmt::format("{:02}:{:02}-{:02}:{:02}", config.probing.start_minute / 60, config.probing.start_minute % 60,
                     config.probing.end_minute / 60, config.probing.end_minute % 60)},
        {"max_joules_per_day", config.probing.max_joules_per_day},
        {"max_model_age_hours", config.probing.max_model_age_hours},
        {"target_sigma", config.probing.target_sigma},
        {"threads", config.probing.threads},
        {"plans_per_run", config.probing.plans_per_run},
        {"worker", config.probing.worker.string()},
        {"python", config.probing.python},
        {"reference_minutes", config.probing.reference_minutes},
        {"max_speed_spread", config.probing.max_speed_spread}}}};
}

}  // namespace joule::config
