#pragma once
// What a replay runs on: the devices, the jobs, and for every job on every device it may use,
// what the scheduler is told it costs (the estimate) and what it really costs (the truth).
//
// build_world() makes one from a cluster and a trace the way jouled would meet them:
//  - Estimate: each device gets an estimator::DeviceEnergyModel learnt from THOR probes run on a
//    estimator::SimulatedDevice of its profile (run_campaign with the simulated meter: noisy,
//    with outliers), planned from the trace's own networks at their batch sizes as the
//    workload, as jouled plans from queued jobs. The estimate is the model's prediction; a job
//    whose layers the model cannot predict gets none ("no model"), and the FLOPs baseline
//    (flops_baseline_joules) comes from the same probes.
//  - Truth: the simulated device's noise-free step cost (SimulatedDevice::step_cost) × steps,
//    times a per-job factor drawn log-normal(0, truth_sigma): run-to-run variation (data
//    order, clocks, temperature) that no model of the device can know. The factor
//    is the job's, the same on every device, so it moves a job's cost but not which device is
//    cheapest. Energy and time share it: power is the device's power for that network.
//  - Cores: on a device that shares its cores (the cluster's `cores`), a job asking for k of
//    its C cores runs at the truth of estimator::cores_slice (k/C of the compute, bandwidth and
//    static power; the step's serial part as it is), with the device's whole static power in its
//    truth as if alone; the estimate is the device model's scaled as jouled scales it at the
//    job's core count: the network measured (5 noisy steps each) on the slice, metered whole,
//    and on the whole device. Such a job gets no knob settings (they would reach the jobs
//    beside it).
//  - GPUs: a job asking for N GPUs (`resources.gpus`) runs data-parallel on N devices of one
//    node's group (its `cuda:*` devices of one profile): each trains 1/N of the steps at the
//    job's batch size, and after every step the gradients are all-reduced over a ring, taking
//    2(N-1)/N × the parameters' bytes / kLinkBytesPerSecond + 2(N-1) × kLinkLatencySeconds, not
//    overlapped with the backward pass, while every GPU draws its static power. The link
//    figures are assumptions (an NVLink-class 100 GB/s per GPU, 10 µs per hop), not
//    calibrated. Its estimate is estimator::across_gpus of the device model's (the overhead
//    a stated prior, as jouled's); its one-GPU truth and estimate are kept too, for the run
//    that gives each job one device.
//  - Knobs: each profile's knob settings (SimulatedKnob) have their own truth; their estimate
//    is the default's times an estimator::KnobResponse learnt by measuring THOR probe networks
//    of the device's workload at every setting and at the defaults, as jouled would probe.
// Every joule in a World is simulated. Deterministic for a seed.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "joule/common/result.hpp"
#include "joule/schedulers/placement.hpp"
#include "joule/schedulers/policy.hpp"
#include "joule/simulator/cluster.hpp"
#include "joule/simulator/trace.hpp"

namespace joule::simulator {

/// What a job really costs on a device.
struct TrueCost {
  double joules = 0.0;
  double seconds = 0.0;
  double watts() const { return seconds > 0.0 ? joules / seconds : 0.0; }
};

/// A job at one of its device's knob settings other than the default.
struct SettingCost {
  std::string knob;  ///< the profile's knob: gpu_power_limit_watts, power_mode, cpu_max_frequency_mhz
  double value = 0.0;
  std::string label;
  /// The default's estimate times the device's learnt knob response; nullopt: no estimate.
  std::optional<schedulers::Estimate> estimate;
  double slowdown_log_std = 0.0;  ///< the response's spread of the time ratio (log space)
  double saving_log_std = 0.0;    ///< ... and of the energy ratio
  TrueCost truth;
  /// A job on several GPUs: the same job on this GPU alone at the setting (a run with one job
  /// per device), as JobCost::alone_truth.
  std::optional<TrueCost> alone_truth;
};

/// A job that lets placement choose its cores, at one count of a device that shares them.
struct CoresOption {
  int cores = 0;
  TrueCost truth;
  std::optional<schedulers::Estimate> estimate;  ///< jouled's at that count; nullopt: no model
};

/// A job on one device it may run on.
struct JobCost {
  std::size_t device = 0;                        ///< index into World::devices
  std::optional<schedulers::Estimate> estimate;  ///< the device model's; nullopt: no model
  std::optional<double> flops_joules;            ///< the FLOPs baseline's joules
  TrueCost truth;                                ///< at the device's default setting
  std::vector<SettingCost> settings;             ///< the profile's other knob settings
  /// On a device that shares its cores: its static power, all of it in `truth` (as if the job
  /// ran alone); side by side, the replay gives each job its share by cores instead.
  double static_watts = 0.0;
  /// A job on several GPUs: `truth` and `estimate` are its run on all of them from this one;
  /// these are the same job on this GPU alone (a run with one job per device).
  std::optional<TrueCost> alone_truth;
  std::optional<schedulers::Estimate> alone_estimate;
  /// A job with a range of cores on a device that shares them: the job at each end of its range
  /// (`truth` and `estimate` are at its least); empty otherwise.
  std::vector<CoresOption> cores_options;
};

struct SimJob {
  std::string id;  ///< unique: "<line>:<name>"
  std::string name;
  schedulers::UnixMillis submit = 0;
  int priority = 0;
  std::string owner;    ///< fair share and the per-owner figures; empty: none
  std::string project;  ///< fair share's project; empty: none
  std::optional<schedulers::UnixMillis> deadline;
  std::optional<schedulers::UnixMillis> not_before;
  std::optional<double> max_energy_joules;
  std::optional<double> max_slowdown;
  int epochs = 1;              ///< progress reports: one per epoch
  int cores = 0;               ///< resources.cores; 0: a whole device
  int gpus = 0;                ///< resources.gpus; 0: any one device
  int cores_max = 0;           ///< resources.cores {min, max}: its max (`cores` its min); 0: none
  std::vector<JobCost> costs;  ///< one per eligible device, in device order
};

struct SimNode {
  std::string name;
  std::optional<BatterySpec> battery;
  std::optional<SolarSpec> solar;
};

struct SimDevice {
  schedulers::DeviceRef ref;  ///< groups: the node's own plus the policy's
  std::size_t node = 0;       ///< index into World::nodes
  std::string profile;
  double idle_watts = 0.0;
  int cores = 0;  ///< shared among jobs that ask for cores; 0: one job at a time
  /// A `cuda:*` device's GPU group ("node: profile"), as jouled groups a node's GPUs of one
  /// model; empty: not a GPU.
  std::string group;
};

struct World {
  schedulers::UnixMillis start = 0;
  int utc_offset_minutes = 0;
  std::optional<schedulers::GridSignal> carbon;  ///< the cluster's carbon intensity, if it has one
  std::optional<schedulers::GridSignal> price;   ///< the cluster's price per kWh, if it has one
  std::vector<SimNode> nodes;
  std::vector<SimDevice> devices;
  std::vector<SimJob> jobs;        ///< in submission order (stable for equal times)
  std::vector<std::string> notes;  ///< e.g. how many estimates failed and why
};

struct WorldOptions {
  std::uint64_t seed = 1;
  double truth_sigma = 0.08;  ///< per-job run-to-run variation (log-normal sigma)
  /// Overrides every device's `probes` (0: use the cluster file's). Fewer is faster and less sure.
  std::size_t probes = 0;
  int gp_restarts = 1;           ///< as jouled's model service
  std::size_t refit_every = 10;  ///< probes between GP refits while probing (jouled: probing.refit_every)
  /// What the knob responses are learnt from: `layers`, THOR probe networks of the device's
  /// workload (what carries over to networks never measured); `networks`, the workload's own
  /// networks measured at every setting (as probing queued jobs' whole models would: exact up
  /// to the measurement noise, for networks that were queued). Probes' energy is never counted.
  enum class KnobProbes { layers, networks };
  KnobProbes knob_probes = KnobProbes::layers;
  /// Threads that learn device models at once (each device's campaign is independent, so the
  /// World is the same for any number).
  std::size_t threads = 1;
};

/// Learns every device's model, estimates and costs every job. `policy` supplies node groups.
/// Fails when a job's device constraints match no device of the cluster, or a model cannot be
/// analysed at its batch size (with the trace line).
Result<World> build_world(const ClusterSpec& cluster, const Trace& trace, const schedulers::Policy& policy,
                          const WorldOptions& options);

}  // namespace joule::simulator
