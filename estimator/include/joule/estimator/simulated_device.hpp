#pragma once
// Simulated devices: hidden, non-linear "hardware" that answers probe and measurement requests
// so the whole estimation pipeline runs, and is tested, without hardware. Every figure a
// simulated device produces is labelled "simulated" by whoever shows it.
//
// The hidden per-layer cost is roofline-like:
//   compute = FLOPs on channels padded to the device's block size / (peak × utilisation),
//             utilisation = work / (work + half_saturation_flops)   (small layers run slowly)
//   memory  = bytes moved × (cache_penalty when the working set exceeds the cache) / bandwidth
//   seconds = max(compute, memory) + kernel launches × launch_seconds
//   joules  = static_watts × seconds + joules_per_flop × FLOPs + joules_per_byte × bytes
// A training step adds the loss and a per-step overhead (optimizer update over every
// parameter, data loading). Measurements carry multiplicative log-normal noise plus rare upward
// outliers, the one-sided noise real probes show.
//
// Knobs (a profile's SimulatedKnob): a setting scales the compute clock (compute time ÷ clock,
// dynamic energy per FLOP × voltage², the voltage linear in the clock), the compute units
// (Jetson power modes gate TPCs), the memory clock and the host CPU's clock (the per-step
// overhead and launches); memory-bound layers barely slow. A GPU power limit lowers the clock
// until the step's average power fits. The curves are checked against published sweeps
// (tests/estimator/simulated_knobs_test.cpp; sources in each knob's `source`).

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "joule/common/result.hpp"
#include "joule/estimator/layer_analysis.hpp"

namespace joule::estimator {

/// One setting of a simulated device's knob: what it does to the hardware. A power limit sets
/// no clock itself: the clock drops until a step's average power fits under it, as a GPU's
/// firmware does, so a job that never draws the limit runs as at full power.
struct SimulatedSetting {
  double value = 0.0;          ///< the knob's value: watts, MHz, or the power mode's id
  std::string label;           ///< "150 W", "MODE_15W", "1200 MHz"
  double compute_clock = 1.0;  ///< fraction of the profile's compute clock
  double compute_units = 1.0;  ///< fraction of the compute units left powered (Jetson TPC gating)
  double memory_clock = 1.0;   ///< fraction of the memory bandwidth
  double host_clock = 1.0;     ///< fraction of the clock of the CPU that runs the per-step overhead
  std::optional<double> power_limit_watts;
};

/// The knob a simulated profile offers: one per profile, named as the job's knob field.
struct SimulatedKnob {
  std::string name;  ///< "gpu_power_limit_watts", "power_mode", "cpu_max_frequency_mhz"; empty: none
  std::vector<SimulatedSetting> settings;  ///< the first is the default: the profile as calibrated
  /// Supply voltage at the lowest clock, relative to the highest, linear in between: dynamic
  /// energy per operation goes as the voltage squared.
  double voltage_floor = 0.7;
  double min_clock = 0.25;  ///< the lowest compute clock a power limit can force
  /// Share of the static power under load that is clocked (clock trees, switching in busy
  /// units): it goes as frequency × voltage², so a lower clock saves energy on it.
  double clocked_static_share = 0.0;
  double gated_static_share = 0.0;  ///< share of the static power that gated compute units stop drawing
  std::string source;               ///< where the settings and the curve come from
  /// Each core clocked alone (x86 cpufreq: a policy per CPU), so a job on a slice of the cores
  /// may run at a setting without reaching the jobs beside it.
  bool per_core = false;
};

/// The hidden parameters of one kind of simulated hardware.
struct SimulatedProfile {
  std::string name;
  std::string description;
  double peak_flops_per_second = 1e11;
  double half_saturation_flops = 1e6;  ///< a layer this big reaches half the peak
  double bandwidth_bytes_per_second = 2e10;
  double cache_bytes = 8e6;
  double cache_penalty = 2.5;   ///< memory time multiplier once the working set spills
  int channel_block = 16;       ///< channels are processed in blocks of this many
  double launch_seconds = 5e-6; ///< per kernel launch
  double static_watts = 8.0;
  double joules_per_flop = 5e-11;
  double joules_per_byte = 2e-10;
  double step_overhead_seconds = 2e-4;  ///< zero_grad, data loading, bookkeeping
  double noise_sigma = 0.02;            ///< log-normal multiplicative noise
  double outlier_probability = 0.03;
  double outlier_scale = 0.3;           ///< an outlier is up to +30 %
  SimulatedKnob knob;
};

/// The built-in profiles: "jetson-orin" (embedded GPU), "raspberry-pi-4" (small ARM CPU),
/// "server-gpu" (data-centre GPU), "laptop-cpu" (x86 with wide vectors) and "server-cpu" (a
/// 64-core server socket).
const std::vector<SimulatedProfile>& simulated_profiles();
/// What a job holding `cores` of a profile's `of` cores runs on: that share of its compute rate,
/// of the layer size that saturates it, of its memory bandwidth and of its static power (the
/// slice's own, for telling a job's dynamic energy apart); cache, launches and the per-step
/// overhead stay as they are, so small layers and the step's serial part do not speed up with
/// more cores. Memory contention among jobs side by side is not modelled. The whole profile
/// where `cores` is 0 or at least `of`.
SimulatedProfile cores_slice(const SimulatedProfile& whole, int cores, int of);
/// Looks a profile up by name; the error lists the known names.
Result<SimulatedProfile> find_simulated_profile(const std::string& name);

/// Energy and time of one training step (or one layer of it).
struct StepCost {
  double joules = 0.0;
  double seconds = 0.0;
};

class SimulatedDevice {
 public:
  /// `seed` fixes the measurement noise, so runs are reproducible.
  SimulatedDevice(SimulatedProfile profile, std::uint64_t seed);

  const SimulatedProfile& profile() const { return profile_; }

  /// The noise-free cost of one layer in its position (its `input_gradient` flag) in a step.
  StepCost layer_cost(const AnalyzedLayer& layer) const;
  /// The noise-free cost of one training step of a whole network: layers + loss + overhead
  /// (the optimizer's update: passes over the parameters, 3 for sgd up to 8 for adamw).
  StepCost step_cost(const std::vector<AnalyzedLayer>& layers, const std::string& loss,
                     const std::string& optimizer = "sgd") const;
  /// The same at one of the profile's knob settings.
  StepCost step_cost(const std::vector<AnalyzedLayer>& layers, const std::string& loss, const std::string& optimizer,
                     const SimulatedSetting& setting) const;
  /// One measured step: step_cost with measurement noise.
  StepCost measure_step(const std::vector<AnalyzedLayer>& layers, const std::string& loss,
                        const std::string& optimizer = "sgd");
  StepCost measure_step(const std::vector<AnalyzedLayer>& layers, const std::string& loss, const std::string& optimizer,
                        const SimulatedSetting& setting);

 private:
  /// What a setting leaves of the hardware (a power limit resolved to a clock).
  struct Clocks {
    double compute = 1.0;
    double units = 1.0;
    double memory = 1.0;
    double host = 1.0;
  };
  StepCost cost_at(const std::vector<AnalyzedLayer>& layers, const std::string& loss, const std::string& optimizer,
                   const Clocks& clocks) const;
  StepCost layer_cost(const AnalyzedLayer& layer, const Clocks& clocks) const;
  StepCost loss_cost(const std::vector<AnalyzedLayer>& layers, const std::string& loss, const Clocks& clocks) const;
  StepCost overhead_cost(const std::vector<AnalyzedLayer>& layers, const std::string& optimizer,
                         const Clocks& clocks) const;
  StepCost with_noise(StepCost cost);
  double static_watts(const Clocks& clocks) const;
  double dynamic_scale(const Clocks& clocks) const;

  SimulatedProfile profile_;
  std::mt19937_64 rng_;
};

}  // namespace joule::estimator
