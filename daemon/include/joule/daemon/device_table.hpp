#pragma once
// The devices a node places jobs on (its own, and on a coordinator its agents'), with their
// meters, latest samples, average power and history: one table shared by the job book, the
// executors and probing. Lives on the daemon's event loop; entries never move or go away, so a
// Device& stays valid while the table lives.

#include <chrono>
#include <cstddef>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "joule/adapters/energy_meter.hpp"
#include "joule/adapters/frequency_limits.hpp"
#include "joule/adapters/jetson_power_mode.hpp"
#include "joule/cluster/sync.hpp"
#include "joule/config/daemon_config.hpp"
#include "joule/schedulers/policy.hpp"

namespace joule::daemon {

/// A job placed or running on a device, and the cores it holds there (0: the whole device).
struct DeviceHold {
  std::string job;
  int cores = 0;
};

/// A device of this node (or of one of its agents) with its meter and what it is doing.
struct Device {
  std::string name;
  /// Its [[devices]] table (probing reads its meter and threads): this node's own devices have
  /// one (the defaults under its name where none was given); an agent's device has none.
  std::optional<config::DeviceConfig> config;
  std::unique_ptr<adapters::EnergyMeter> meter;
  std::string meter_note;  ///< why this meter was chosen, shown in GET /v1/devices
  bool runs_jobs = true;   ///< false for simulated devices: they estimate, they run nothing
  /// Threads a job placed here gets (thread_settings.hpp), the count its probes use; 0: unset.
  int threads = 0;
  /// Cores it shares among jobs that ask for cores (resources.cores), each on cores of its own:
  /// this node's CPU when it has more than one usable CPU; 0: one job at a time.
  int shared_cores = 0;
  /// The GPUs a job asking for several (resources.gpus) may hold together with this one: this
  /// node's GPUs of one model share it ("NVIDIA H200"), an agent's "node/NVIDIA H200"; a MIG
  /// device has one of its own (a process sees one MIG device); empty: not a GPU.
  std::string gpu_group;
  /// What CUDA_VISIBLE_DEVICES names it by: "0" for cuda:0, "MIG-..." for a MIG device; empty:
  /// not a GPU of this node.
  std::string cuda_visible;
  /// A MIG device's GPU: its siblings (other MIG devices of that GPU) share its meter's counter,
  /// so none is probed while another has work.
  std::optional<unsigned> mig_gpu;
  /// The minor of the /dev/nvidiaN its jobs open (its GPU's, for a MIG device): jobs on other
  /// devices are fenced off it by their cgroup's device rules (gpu_fence.hpp).
  std::optional<unsigned> gpu_minor;
  /// The joule-worker its probes and built-in jobs run, where it has one of its own (its
  /// [[devices]] worker, or a joule-worker-cuda beside jouled for a GPU); empty: the node's.
  std::filesystem::path worker;
  /// cpu, where its [[devices]] table sets no modelled figures: the board they were chosen for
  /// (as its firmware or `board` names it; empty when unreadable), whether they are the board's
  /// published ones, and where they come from (adapters/board_power.hpp).
  std::string board_model;
  bool board_figures_published = false;
  std::string board_note;
  std::vector<DeviceHold> holds;   ///< the jobs placed or running on it, in the order they came
  double energy_joules = 0.0;      ///< metered since start
  double power_watts = 0.0;
  std::optional<std::string> meter_error;
  std::optional<std::chrono::steady_clock::time_point> last_sample;
  /// Recent (time, cumulative joules) readings: power averaged over a cap's period.
  std::deque<std::pair<std::chrono::steady_clock::time_point, double>> history;
  double work_seconds = 0.0;              ///< seconds of jobs it has run since start
  std::optional<double> battery_percent;  ///< state of charge, where a battery meters it
  /// A GPU whose power limit can be lowered (its meter is NVML), and the lowest limit allowed.
  bool can_limit_gpu = false;
  double gpu_min_watts = 0.0;
  double gpu_max_watts = 0.0;
  /// The CPU frequency knob (cpufreq), where this is the CPU and its policies are writable; else
  /// `knob_note` says why there is none.
  std::optional<adapters::CpuFrequencyKnob> cpu_frequency;
  std::string knob_note;
  /// A Jetson's power modes (nvpmodel), shared by every local device of the node.
  std::shared_ptr<const adapters::JetsonPowerModes> power_modes;
  /// A Jetson GPU's clock limit (devfreq), where this is that GPU; else `knob_note` says why.
  std::optional<adapters::DevfreqKnob> gpu_frequency;
  /// Coordinator: the agent this device belongs to ("" for this node's own devices). Its name
  /// is then "node/device", its meter reports what the agent read, and jobs on it run there.
  std::string node;
  std::string agent_device;    ///< the agent's own name for it
  bool node_ready = true;      ///< its agent is heard from (placement skips it otherwise)
  bool reported_busy = false;  ///< the agent says something else holds it (a probe)
  double reported_power_watts = 0.0;
  /// Coordinator: the carbon and price signals its agent has of its own (its jouled.toml's
  /// [carbon] and [price]); null: the coordinator's stand for it.
  std::shared_ptr<const cluster::ReportedSignal> reported_carbon;
  std::shared_ptr<const cluster::ReportedSignal> reported_price;
  /// Its node, name and the policy's groups of its node, as budgets and caps scope it: kept
  /// (refreshed with the policy) since every placement pass asks it of every device.
  schedulers::DeviceRef ref;

  /// Whether it is an agent's device, whose jobs run on that agent.
  bool on_agent() const { return !node.empty(); }
  bool idle() const { return holds.empty(); }
  bool holds_job(const std::string& id) const;
  /// The cores a job asking for `asked` (JobSpec::shared_cores) holds here: 0 (the whole device)
  /// unless it shares its cores.
  int cores_for(int asked) const { return shared_cores > 0 ? asked : 0; }
  /// Whether a job holding `cores` (cores_for) could be added beside what it holds now.
  bool can_hold(int cores) const;
  void hold(const std::string& id, int cores);
  void release(const std::string& id);
  int cores_held() const;
  /// Held whole: by a job that holds the whole device.
  bool held_whole() const;
  /// Its average power over the last `seconds` of its history (its power now, short of two samples).
  double average_power(double seconds) const;
};

/// What one meter sample changed on a device.
struct DeviceSample {
  Device* device = nullptr;
  double joules = 0.0;       ///< energy since its previous sample
  double seconds = 0.0;      ///< since its previous sample; 0 for its first
  bool power_known = false;  ///< power_watts was measured from this sample (this node's own devices)
};

class DeviceTable {
 public:
  DeviceTable() = default;
  /// This node's devices, as the daemon opened them; what their meters offer (a GPU's power
  /// limit range) is read once here.
  explicit DeviceTable(std::vector<Device> devices);
  DeviceTable(const DeviceTable&) = delete;
  DeviceTable& operator=(const DeviceTable&) = delete;

  /// Adds a device (an agent's, as its coordinator hears of it); its index is size() - 1.
  Device& add(Device device);
  /// The minors of this node's GPUs (Device::gpu_minor) that none of the devices named `own`
  /// opens, in order: what a job on `own` is fenced off.
  std::vector<unsigned> gpus_not_of(const std::vector<std::string>& own) const;
  /// An agent's device, known to the coordinator by "node/device": its meter reports what the
  /// agent read under `source` (empty while the agent is not heard from: readings fail meanwhile).
  Device& add_agent_device(const std::string& node, const std::string& agent_device, const std::string& source);

  Device* find(const std::string& name);
  const Device* find(const std::string& name) const;
  /// Its index (what the scheduling core calls a device by), or nothing for unknown names.
  std::optional<std::size_t> index_of(const std::string& name) const;
  Device& operator[](std::size_t index) { return devices_[index]; }
  const Device& operator[](std::size_t index) const { return devices_[index]; }
  std::size_t size() const { return devices_.size(); }
  auto begin() { return devices_.begin(); }
  auto end() { return devices_.end(); }
  auto begin() const { return devices_.begin(); }
  auto end() const { return devices_.end(); }

  /// Indexes of an agent's devices (none for this node's own): a sync of one of thousands of
  /// agents looks up its own devices, not every device.
  const std::vector<std::size_t>& of_node(const std::string& node) const;
  std::vector<std::string> names() const;

  /// Reads every meter at `now`: energy, power (this node's own devices; an agent's come with
  /// its reports), battery and an hour of history. A meter that fails keeps its last figures
  /// and sets meter_error (logged once per new message). Returns what changed, per device read.
  std::vector<DeviceSample> sample(std::chrono::steady_clock::time_point now);

 private:
  std::deque<Device> devices_;  // a deque: add() moves no entry
  std::unordered_map<std::string, std::size_t> index_;
  std::unordered_map<std::string, std::vector<std::size_t>> by_node_;
};

}  // namespace joule::daemon
