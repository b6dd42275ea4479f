#include "joule/simulator/cluster.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numbers>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include "joule/config/grid_signal_file.hpp"
#include "joule/estimator/simulated_device.hpp"

namespace joule::simulator {
namespace {

using schedulers::UnixMillis;

// Collects a file's problems, each at the line of the node it is about.
class Problems {
 public:
  explicit Problems(std::string file) : file_(std::move(file)) {}

  void add(const toml::node& node, std::string message) { add(static_cast<int>(node.source().begin.line), message); }
  void add(int line, std::string message) { items_.emplace_back(line, std::move(message)); }

  void reject_unknown(const toml::table& table, const std::string& where, const std::vector<std::string>& known) {
    for (const auto& [key, node] : table)
      if (std::find(known.begin(), known.end(), key.str()) == known.end())
        add(node, fmt::format("unknown key {}{} (known: {})", where, key.str(), fmt::join(known, ", ")));
  }

  std::optional<double> number(const toml::table& table, const char* key, const std::string& name) {
    const toml::node* node = table.get(key);
    if (!node) return std::nullopt;
    if (auto value = node->value<double>()) return *value;
    add(*node, fmt::format("{} must be a number", name));
    return std::nullopt;
  }
  std::optional<std::string> string(const toml::table& table, const char* key, const std::string& name) {
    const toml::node* node = table.get(key);
    if (!node) return std::nullopt;
    if (node->is_string()) return node->value<std::string>();
    add(*node, fmt::format("{} must be a string", name));
    return std::nullopt;
  }
  // A number in [low, high] (open at the ends where asked), or nothing after a problem.
  std::optional<double> in_range(const toml::table& table, const char* key, const std::string& name, double low,
                                 double high, bool low_open = false) {
    auto value = number(table, key, name);
    if (!value) return std::nullopt;
    if (!std::isfinite(*value) || *value < low || *value > high || (low_open && *value == low)) {
      add(*table.get(key),
          fmt::format("{} must be {} {} and <= {}, got {}", name, low_open ? ">" : ">=", low, high, *value));
      return std::nullopt;
    }
    return value;
  }

  Status result() {
    if (items_.empty()) return {};
    std::stable_sort(items_.begin(), items_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::string text;
    for (const auto& [line, message] : items_)
      text += fmt::format("{}{}:{}: {}", text.empty() ? "" : "\n", file_, line, message);
    return make_error(ErrorCode::invalid_argument, text, fmt::format("{}:{}", file_, items_.front().first));
  }

 private:
  std::string file_;
  std::vector<std::pair<int, std::string>> items_;
};

bool valid_name(const std::string& name) {
  return !name.empty() && name.size() <= 128 && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == ':';
  });
}

void parse_device(Problems& problems, const toml::table& table, const std::string& what, NodeSpec& node) {
  problems.reject_unknown(table, what + ".", {"name", "profile", "probes", "idle_watts", "cores"});
  DeviceSpec device;
  auto name = problems.string(table, "name", what + ".name");
  auto profile = problems.string(table, "profile", what + ".profile");
  if (!table.get("name")) problems.add(table, what + ": name is required (\"cpu\", \"cuda:0\"...)");
  if (!table.get("profile")) problems.add(table, what + ": profile is required (a simulated profile)");
  if (name) {
    if (!valid_name(*name) || name->find('/') != std::string::npos)
      problems.add(*table.get("name"),
                   fmt::format("{}.name \"{}\": use letters, digits, '-', '_', '.', ':'", what, *name));
    for (const auto& other : node.devices)
      if (other.name == *name)
        problems.add(*table.get("name"),
                     fmt::format("{}.name \"{}\" is used twice on node {}", what, *name, node.name));
    device.name = *name;
  }
  std::optional<estimator::SimulatedProfile> found;
  if (profile) {
    auto known = estimator::find_simulated_profile(*profile);
    if (!known)
      problems.add(*table.get("profile"), fmt::format("{}.profile: {}", what, known.error().message));
    else
      found = *known;
    device.profile = *profile;
  }
  if (const toml::node* probes = table.get("probes")) {
    if (!probes->is_integer() || *probes->value<std::int64_t>() < 1 || *probes->value<std::int64_t>() > 100000)
      problems.add(*probes, fmt::format("{}.probes must be an integer from 1 to 100000", what));
    else
      device.probes = static_cast<std::size_t>(*probes->value<std::int64_t>());
  }
  if (const toml::node* cores = table.get("cores")) {
    if (!cores->is_integer() || *cores->value<std::int64_t>() < 2 || *cores->value<std::int64_t>() > 4096)
      problems.add(*cores, fmt::format("{}.cores must be a whole number of cores from 2 to 4096", what));
    else
      device.cores = static_cast<int>(*cores->value<std::int64_t>());
  }
  if (auto idle = problems.in_range(table, "idle_watts", what + ".idle_watts", 0.0, 1e6))
    device.idle_watts = *idle;
  else if (found)
    device.idle_watts = found->static_watts;
  node.devices.push_back(std::move(device));
}

void parse_node(Problems& problems, const toml::table& table, const std::string& what, ClusterSpec& cluster) {
  problems.reject_unknown(table, what + ".", {"name", "groups", "devices", "battery", "solar"});
  NodeSpec node;
  node.line = static_cast<int>(table.source().begin.line);
  if (auto name = problems.string(table, "name", what + ".name")) {
    if (!valid_name(*name) || name->find(':') != std::string::npos)
      problems.add(*table.get("name"), fmt::format("{}.name \"{}\": use letters, digits, '-', '_', '.'", what, *name));
    for (const auto& other : cluster.nodes)
      if (other.name == *name)
        problems.add(*table.get("name"), fmt::format("{}.name \"{}\" is used twice", what, *name));
    node.name = *name;
  } else if (!table.get("name")) {
    problems.add(table, what + ": name is required");
  }
  if (const toml::node* groups = table.get("groups")) {
    const toml::array* list = groups->as_array();
    if (!list)
      problems.add(*groups, what + ".groups must be an array of group names");
    else
      for (const auto& entry : *list) {
        if (!entry.is_string() || !valid_name(*entry.value<std::string>()))
          problems.add(entry, what + ".groups: each entry must be a group name");
        else
          node.groups.push_back(*entry.value<std::string>());
      }
  }
  const toml::node* devices = table.get("devices");
  const toml::array* list = devices ? devices->as_array() : nullptr;
  if (!list || list->empty()) {
    problems.add(devices ? *devices : static_cast<const toml::node&>(table),
                 what + ".devices must be a non-empty array of {name, profile, probes, idle_watts, cores} tables");
  } else {
    for (std::size_t i = 0; i < list->size(); ++i) {
      const std::string item = fmt::format("{}.devices[{}]", what, i);
      if (const toml::table* device = (*list)[i].as_table())
        parse_device(problems, *device, item, node);
      else
        problems.add((*list)[i], item + " must be a table");
    }
  }
  if (const toml::node* battery = table.get("battery")) {
    if (const toml::table* t = battery->as_table()) {
      problems.reject_unknown(*t, what + ".battery.", {"capacity_wh", "start_percent"});
      BatterySpec spec;
      if (!t->get("capacity_wh")) problems.add(*t, what + ".battery.capacity_wh is required");
      if (auto v = problems.in_range(*t, "capacity_wh", what + ".battery.capacity_wh", 0.0, 1e9, true))
        spec.capacity_wh = *v;
      if (auto v = problems.in_range(*t, "start_percent", what + ".battery.start_percent", 0.0, 100.0))
        spec.start_percent = *v;
      node.battery = spec;
    } else {
      problems.add(*battery, what + ".battery must be a table {capacity_wh, start_percent}");
    }
  }
  if (const toml::node* solar = table.get("solar")) {
    if (const toml::table* t = solar->as_table()) {
      problems.reject_unknown(*t, what + ".solar.", {"peak_watts", "sunrise_hour", "sunset_hour"});
      SolarSpec spec;
      if (!t->get("peak_watts")) problems.add(*t, what + ".solar.peak_watts is required");
      if (auto v = problems.in_range(*t, "peak_watts", what + ".solar.peak_watts", 0.0, 1e9)) spec.peak_watts = *v;
      if (auto v = problems.in_range(*t, "sunrise_hour", what + ".solar.sunrise_hour", 0.0, 24.0))
        spec.sunrise_hour = *v;
      if (auto v = problems.in_range(*t, "sunset_hour", what + ".solar.sunset_hour", 0.0, 24.0)) spec.sunset_hour = *v;
      if (spec.sunset_hour <= spec.sunrise_hour)
        problems.add(*t, what + ".solar: sunset_hour must be after sunrise_hour");
      if (!node.battery) problems.add(*solar, what + ".solar needs a battery to charge: add " + what + ".battery");
      node.solar = spec;
    } else {
      problems.add(*solar, what + ".solar must be a table {peak_watts, sunrise_hour, sunset_hour}");
    }
  }
  cluster.nodes.push_back(std::move(node));
}

constexpr double kHourMillis = 3'600'000.0;
constexpr UnixMillis kDayMillis = 86'400'000;

// ∫ solar power over [a, b] local hours of one day (0 <= a <= b <= 24), in watt-hours.
double solar_watt_hours(const SolarSpec& solar, double a, double b) {
  const double rise = solar.sunrise_hour, set = solar.sunset_hour;
  a = std::clamp(a, rise, set);
  b = std::clamp(b, rise, set);
  if (b <= a) return 0.0;
  const double length = set - rise;
  const double k = std::numbers::pi / length;
  return solar.peak_watts * (std::cos(k * (a - rise)) - std::cos(k * (b - rise))) / k;
}

}  // namespace

UnixMillis default_start() { return schedulers::parse_rfc3339("2026-11-26T00:00:00Z").value(); }

Result<ClusterSpec> parse_cluster(const std::string& text, const std::string& file_name) {
  toml::table root;
  try {
    root = toml::parse(text, file_name);
  } catch (const toml::parse_error& error) {
    const int line = static_cast<int>(error.source().begin.line);
    return make_error(ErrorCode::invalid_argument, fmt::format("{}:{}: {}", file_name, line, error.description()),
                      fmt::format("{}:{}", file_name, line));
  }
  Problems problems(file_name);
  ClusterSpec cluster;
  cluster.source = file_name;
  cluster.start = default_start();
  problems.reject_unknown(root, "", {"start", "utc_offset_minutes", "carbon", "price", "nodes"});
  if (auto carbon = problems.string(root, "carbon", "carbon")) cluster.carbon_path = *carbon;
  if (auto price = problems.string(root, "price", "price")) cluster.price_path = *price;
  if (auto start = problems.string(root, "start", "start")) {
    if (auto parsed = schedulers::parse_rfc3339(*start))
      cluster.start = *parsed;
    else
      problems.add(*root.get("start"),
                   fmt::format("start \"{}\" is not an RFC 3339 time (2026-11-26T00:00:00Z)", *start));
  }
  if (const toml::node* offset = root.get("utc_offset_minutes")) {
    if (!offset->is_integer() || std::abs(*offset->value<std::int64_t>()) > 18 * 60)
      problems.add(*offset, "utc_offset_minutes must be an integer from -1080 to 1080");
    else
      cluster.utc_offset_minutes = static_cast<int>(*offset->value<std::int64_t>());
  }
  const toml::node* nodes = root.get("nodes");
  const toml::array* list = nodes ? nodes->as_array() : nullptr;
  if (!list || list->empty()) {
    if (nodes)
      problems.add(*nodes, "nodes must be an array of tables: [[nodes]]");
    else
      problems.add(1, "no nodes: add at least one [[nodes]] table with name and devices");
  } else {
    for (std::size_t i = 0; i < list->size(); ++i) {
      const std::string what = fmt::format("nodes[{}]", i);
      if (const toml::table* node = (*list)[i].as_table())
        parse_node(problems, *node, what, cluster);
      else
        problems.add((*list)[i], what + " must be a table");
    }
  }
  if (auto status = problems.result(); !status) return status.error();
  return cluster;
}

Result<ClusterSpec> load_cluster(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return make_error(ErrorCode::not_found, fmt::format("{}: cannot read the cluster file", path.string()));
  std::stringstream text;
  text << in.rdbuf();
  auto cluster = parse_cluster(text.str(), path.string());
  if (!cluster) return cluster;
  // Its signals, relative to the cluster file.
  auto load = [&](const std::string& relative, const char* key,
                  config::SignalKind kind) -> Result<std::optional<schedulers::GridSignal>> {
    if (relative.empty()) return std::optional<schedulers::GridSignal>();
    const std::filesystem::path signal_path = path.parent_path() / relative;
    std::ifstream signal_in(signal_path);
    if (!signal_in)
      return make_error(ErrorCode::not_found,
                        fmt::format("{}: {}: cannot read {}", path.string(), key, signal_path.string()));
    std::stringstream signal_text;
    signal_text << signal_in.rdbuf();
    auto signal = config::parse_grid_signal(signal_text.str(), signal_path.string(), kind);
    if (!signal) return signal.error();
    return std::optional<schedulers::GridSignal>(std::move(signal).value());
  };
  auto carbon = load(cluster->carbon_path, "carbon", config::SignalKind::carbon);
  if (!carbon) return carbon.error();
  cluster->carbon = std::move(carbon).value();
  auto price = load(cluster->price_path, "price", config::SignalKind::price);
  if (!price) return price.error();
  cluster->price = std::move(price).value();
  return cluster;
}

double solar_watts(const SolarSpec& solar, double local_hour) {
  if (local_hour <= solar.sunrise_hour || local_hour >= solar.sunset_hour) return 0.0;
  return solar.peak_watts *
         std::sin(std::numbers::pi * (local_hour - solar.sunrise_hour) / (solar.sunset_hour - solar.sunrise_hour));
}

double solar_joules(const SolarSpec& solar, UnixMillis from, UnixMillis to, int utc_offset_minutes) {
  if (to <= from) return 0.0;
  const UnixMillis offset = static_cast<UnixMillis>(utc_offset_minutes) * 60'000;
  UnixMillis local = from + offset;
  const UnixMillis local_end = to + offset;
  double watt_hours = 0.0;
  while (local < local_end) {
    const UnixMillis day_start = (local >= 0 ? local / kDayMillis : (local - kDayMillis + 1) / kDayMillis) * kDayMillis;
    const UnixMillis day_end = std::min(local_end, day_start + kDayMillis);
    watt_hours += solar_watt_hours(solar, static_cast<double>(local - day_start) / kHourMillis,
                                   static_cast<double>(day_end - day_start) / kHourMillis);
    local = day_end;
  }
  return watt_hours * 3600.0;
}

}  // namespace joule::simulator
