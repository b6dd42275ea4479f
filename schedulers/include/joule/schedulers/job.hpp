#pragma once
// Jobs: what a user submits (JobSpec, parsed and checked here), and the job's lifecycle state.
// Pure logic: no file system, no clock. Checks that need the world (does the workdir exist?)
// are the daemon's.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "joule/common/result.hpp"
#include "joule/estimator/model_spec.hpp"
#include "joule/schedulers/time_format.hpp"

namespace joule::schedulers {

/// `run.builtin`: jouled trains the job's own model spec with joule-worker (the probes' code, at
/// the device's thread count) instead of running a program of the user's.
struct BuiltinRun {
  /// `run.builtin.dataset` as given (format and files); checked where the job runs, by the code
  /// that loads it. Absent: synthetic data.
  nlohmann::json dataset = nlohmann::json::object();
  bool checkpoints = true;
  /// Where checkpoints go: empty for the job's own work directory (kept across pauses, restarts
  /// and a requeue on this node); an absolute directory (shared storage) to resume on another.
  std::string checkpoint_directory;
};

/// What a job runs: a program (argv, no shell) or the built-in trainer, in an optional working
/// directory, with extra environment.
struct RunCommand {
  std::vector<std::string> argv;  ///< empty for the built-in trainer
  std::optional<BuiltinRun> builtin;
  std::string workdir;  ///< empty: the job's own directory under the state directory
  std::map<std::string, std::string> env;
};

/// Where and by when a job may run.
struct Constraints {
  std::vector<std::string> devices;  ///< glob patterns ("cuda:*", "cpu"); empty: any device
  std::optional<UnixMillis> deadline;
  /// It may not start before this time (a window the user chose; before its deadline).
  std::optional<UnixMillis> not_before;
  std::optional<double> max_energy_joules;
  /// How much slower than at its device's defaults a knob setting placement chooses may make it
  /// (0.1: 10 %); replaces the policy's knobs.max_slowdown.
  std::optional<double> max_slowdown;
};

/// Device settings a job asks to run at (`knobs`): set on its device just before it starts and
/// put back when it lets go of the device. CPU knobs belong to the `cpu` device, the GPU knob to
/// an NVIDIA GPU, a power mode to any device of a Jetson (the mode is the module's), so a job that
/// asks for one runs only on a device that has it.
struct Knobs {
  std::optional<double> cpu_max_frequency_mhz;       ///< every cpufreq policy's scaling_max_freq
  std::optional<std::string> cpu_energy_preference;  ///< energy_performance_preference ("power", ...)
  std::optional<double> gpu_power_limit_watts;       ///< NVML power limit
  std::optional<double> gpu_max_frequency_mhz;       ///< a Jetson GPU's devfreq max_freq
  std::optional<std::string> power_mode;             ///< nvpmodel mode, by name ("15W") or id ("1")
  bool empty() const { return !wants_cpu() && !wants_gpu() && !power_mode; }
  bool wants_cpu() const { return cpu_max_frequency_mhz || cpu_energy_preference; }
  bool wants_gpu() const { return gpu_power_limit_watts || gpu_max_frequency_mhz; }
};

/// What a job gets of its node beside its device (`resources`).
struct Resources {
  /// CPU cores of its own: its processes may run on that many of the node's CPUs only, and its
  /// thread variables (OMP_NUM_THREADS...) say as many; nullopt: the device's thread count and
  /// any CPU. On a device that shares its cores it holds only those (see JobSpec::shared_cores).
  std::optional<int> cores;
  /// `"cores": {"min": a, "max": b}`: placement chooses the count in [cores, cores_max] (the
  /// energy-time curve the device measured over counts); nullopt: `cores` exactly.
  std::optional<int> cores_max;
  /// GPUs of its own, all of one kind on one node, held whole for its run (a data-parallel job:
  /// torchrun, DDP); nullopt: any one device its constraints allow, a CPU included.
  std::optional<int> gpus;
  bool empty() const { return !cores && !gpus; }
};

/// What happens to a job whose node is lost while it is placed or running there.
enum class RestartPolicy { requeue, fail };

/// A job as submitted (POST /v1/jobs). The model spec is kept for estimation.
struct JobSpec {
  std::string name;
  /// The project it is accounted to (policies.d [[projects]]); empty at submission: its owner's
  /// default. jouled stores the project it chose.
  std::string project;
  std::optional<estimator::ModelSpec> model;
  std::optional<estimator::TrainingConfig> training;
  RunCommand run;
  Constraints constraints;
  Knobs knobs;
  Resources resources;
  int priority = 0;  ///< higher runs first; equal priorities run in submission order
  RestartPolicy restart = RestartPolicy::requeue;

  /// The cores it holds on a device that shares its cores, side by side with other jobs: its
  /// resources.cores, unless it sets knobs (they reach the whole device, so it holds all of it);
  /// 0: the whole device.
  int shared_cores() const { return knobs.empty() ? resources.cores.value_or(0) : 0; }
  /// How many devices it runs on at once: its resources.gpus, else one.
  int device_count() const { return resources.gpus.value_or(1); }
  /// Whether placement chooses its number of cores (resources.cores {min, max}, min < max).
  bool chooses_cores() const { return knobs.empty() && resources.cores_max && *resources.cores_max > *resources.cores; }
};

/// Limits a submission is checked against.
struct JobLimits {
  std::size_t max_argv = 4096;
  std::size_t max_env = 1024;
  std::size_t max_name_length = 256;
  int max_abs_priority = 1000000;
};

/// Parses a submitted job. Every error names the field by JSON pointer.
Result<JobSpec> parse_job_spec(const nlohmann::json& body, const JobLimits& limits = {});

/// The canonical JSON form of a spec (what is stored and shown back).
nlohmann::json to_json(const JobSpec& spec);

/// The knobs as a job's JSON has them (only those set).
nlohmann::json to_json(const Knobs& knobs);

/// Whether a device name ("cpu", "cuda:0") satisfies the job's device constraint.
bool device_allowed(const Constraints& constraints, std::string_view device);

/// queued → placed → running ⇄ throttled → succeeded | failed | cancelled.
/// A placed or running job whose node is lost goes back to queued.
enum class JobState { queued, placed, running, throttled, succeeded, failed, cancelled };

std::string_view to_string(JobState state);
std::optional<JobState> job_state_from_string(std::string_view text);
bool is_terminal(JobState state);
/// Whether the lifecycle allows going from `from` to `to`.
bool can_transition(JobState from, JobState to);

}  // namespace joule::schedulers
