#pragma once
// The simulated cluster of joule-sim: nodes, their devices (simulated hardware profiles) and,
// for off-grid nodes, a battery and a solar panel. Read from a TOML file:
//
//   start = "2026-11-26T00:00:00Z"   # the virtual clock at t = 0 of the trace (default this)
//   utc_offset_minutes = 0            # local time: calendar budgets and solar hours use it
//
//   [[nodes]]
//   name = "jetson-1"
//   groups = ["edge"]                 # added to the groups the policy's [[groups]] give it
//   devices = [{name = "cuda:0", profile = "jetson-orin", probes = 300, idle_watts = 5.0}]
//   battery = {capacity_wh = 200, start_percent = 80}            # optional
//   solar = {peak_watts = 40, sunrise_hour = 6.5, sunset_hour = 18.5}  # optional, needs a battery
//
// `profile` names one of estimator::simulated_profiles(); `probes` (default 300) is how many THOR
// probes the device's energy model learns from before the replay; `idle_watts` (default: the
// profile's static power) is what the device draws while it runs no job; `cores` (2 or more) makes
// it a device that shares its cores, as jouled's CPU does: jobs asking for cores run side by side
// on a slice of the profile each (see world.hpp), its static power split among them by cores. Idle power drains a
// battery but is NOT counted in job energy or budgets (jobs are metered, idle time is not).
// Unknown keys are errors; every problem is "file:line: message" and all of a file's problems
// are reported together.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "joule/common/result.hpp"
#include "joule/schedulers/grid_signal.hpp"
#include "joule/schedulers/time_format.hpp"

namespace joule::simulator {

/// A node's battery: how much it holds and how full it is at t = 0.
struct BatterySpec {
  double capacity_wh = 0.0;
  double start_percent = 100.0;
};

/// A solar panel charging a node's battery: power is peak_watts × sin(π (h − sunrise) / (sunset −
/// sunrise)) between sunrise and sunset (local hours, 0-24), 0 at night. No clouds, no seasons.
struct SolarSpec {
  double peak_watts = 0.0;
  double sunrise_hour = 6.0;
  double sunset_hour = 18.0;
};

struct DeviceSpec {
  std::string name;     ///< node-local, as jouled names it: "cuda:0", "cpu"
  std::string profile;  ///< simulated hardware profile
  std::size_t probes = 300;
  double idle_watts = 0.0;  ///< filled with the profile's static power when not given
  int cores = 0;            ///< cores shared among jobs that ask for cores; 0: one job at a time
};

struct NodeSpec {
  std::string name;
  std::vector<std::string> groups;
  std::vector<DeviceSpec> devices;
  std::optional<BatterySpec> battery;
  std::optional<SolarSpec> solar;
  int line = 0;  ///< where it is defined, for later messages
};

struct ClusterSpec {
  schedulers::UnixMillis start = 0;
  int utc_offset_minutes = 0;
  std::vector<NodeSpec> nodes;
  std::string source;  ///< file name
  /// `carbon`: a carbon-intensity signal file for the whole cluster (CSV or JSON, as
  /// config::parse_grid_signal reads), relative to the cluster file; loaded by load_cluster.
  std::string carbon_path;
  std::optional<schedulers::GridSignal> carbon;
  /// `price`: a price-per-kWh signal file for the whole cluster (CSV, or aWATTar's or Octopus
  /// Energy's JSON), relative to the cluster file; loaded by load_cluster. Its currency is
  /// whatever the file's numbers are in (the report says "per kWh").
  std::string price_path;
  std::optional<schedulers::GridSignal> price;
};

/// The default virtual start: 2026-11-26T00:00:00Z, a Thursday.
schedulers::UnixMillis default_start();

/// Parses a cluster file's text; `file_name` prefixes every problem. The error (invalid_argument)
/// lists every problem, one "file:line: message" per line; `where` is the first "file:line".
Result<ClusterSpec> parse_cluster(const std::string& text, const std::string& file_name);

/// Reads and parses a cluster file.
Result<ClusterSpec> load_cluster(const std::filesystem::path& path);

/// Solar power (W) at `local_hour` (0-24) of a day.
double solar_watts(const SolarSpec& solar, double local_hour);
/// Solar energy (J) between two instants, in closed form; `utc_offset_minutes` gives local time.
double solar_joules(const SolarSpec& solar, schedulers::UnixMillis from, schedulers::UnixMillis to,
                    int utc_offset_minutes);

}  // namespace joule::simulator
