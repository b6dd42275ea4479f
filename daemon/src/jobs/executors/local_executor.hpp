#pragma once
// Jobs run on this node: each one a process group started through the job runner (jouled
// --job-runner) under the job's account, in a directory of its own, watched by pidfd, metered
// by its device's meter, paused with SIGSTOP and limited through its cgroup or NVML, and
// adopted by the next jouled when this one stops.

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "executor.hpp"
#include "joule/adapters/job_controls.hpp"
#include "joule/adapters/measurement_window.hpp"
#include "joule/daemon/child_process.hpp"
#include "joule/daemon/device_knobs.hpp"
#include "joule/daemon/device_table.hpp"
#include "joule/daemon/local_run_options.hpp"

namespace joule::daemon {

class LocalExecutor final : public Executor {
 public:
  LocalExecutor(boost::asio::io_context& io, ExecutorHost& host, const LocalRunOptions& options);
  ~LocalExecutor() override;

  std::string prepare(JobRecord& job, Device& device) override;
  void start(JobRecord& job, Device& device) override;
  void stop(JobRecord& job) override;
  Status throttle(JobRecord& job, Device& device, const schedulers::ThrottleAction& action) override;
  void switch_setting(JobRecord& job, Device& device, bool at_defaults) override;
  bool can_limit_cpu(const JobRecord& job) const override;
  std::optional<double> energy_so_far(JobRecord& job, Device& device, const adapters::ExitStatus* exit) override;
  std::optional<double> energy_as_sampled(JobRecord& job, Device& device) override;
  bool settle_energy(JobRecord& job, Device* device, const adapters::ExitStatus* exit) override;
  void release(JobRecord& job, bool ended) override;
  void recover(JobRecord& job, Device* device) override;

  /// Whether a job could start here, checked at submission rather than failing at start: its
  /// workdir, program (in its PATH), or built-in trainer and dataset files exist, and are within
  /// reach of `identity`, the account it would run as (nothing: jouled's own). The error names
  /// the field at fault.
  Status check(const schedulers::JobSpec& spec, const std::optional<adapters::JobIdentity>& identity) const;
  /// The joules a job has used since it started on `device`, as of the device's last sample.
  std::optional<double> sampled_energy(const JobRecord& job, const Device& device) const;
  /// A sample of a device that shares its cores (`joules` over `seconds`): while several of its
  /// jobs run, each is given its share by CPU time (meter_shares.hpp), of the meter's joules or,
  /// on a CPU-time model, of the idle power; a job alone keeps all of it.
  void share_sample(const Device& device, double joules, double seconds);
  /// A meter sample begins: the CPU time of every running job on a device for which
  /// `reads_cpu_time` says so (a CPU-time model, or cores shared) is read in one walk of /proc,
  /// and stands for this sample until end_sample (the split of a shared device and each job's
  /// energy read it again otherwise: a walk of /proc per job, twice per sample).
  void begin_sample(const std::function<bool(const std::string& device)>& reads_cpu_time);
  void end_sample() { sample_cpu_.reset(); }
  /// Who the job with this number, submitted by `owner_uid`, runs as (nothing: as jouled).
  std::optional<adapters::JobIdentity> job_identity(std::int64_t sequence,
                                                    const std::optional<std::int64_t>& owner_uid) const;
  /// Where jouled keeps a job's logs and exit status (the state directory, jouled's own).
  std::filesystem::path job_directory(const std::string& id) const;
  /// The job's own directory: its default workdir, HOME and TMPDIR (LocalRunOptions::work_directory).
  std::filesystem::path work_directory(const std::string& id) const;
  /// Where a `run.builtin` job's checkpoints go (its own or its work directory's checkpoint/);
  /// empty when it keeps none. The trained weights are model.pt there.
  std::filesystem::path checkpoint_directory(const JobRecord& job) const;
  /// The URL jobs reach the API at (JOULE_URL), known once the server listens.
  void set_api_url(std::string url) { api_url_ = std::move(url); }
  /// Jobs run for a coordinator from now on hold a lease of this many seconds (0: none): their
  /// runner pauses them when jouled stops renewing it, and ends them after twice that, so a job
  /// whose agent died cannot run on beside its next placement (adapters::LaunchSpec::lease_path).
  void set_lease_seconds(double seconds);
  /// Renews the lease of every run that holds one; then again after a quarter of the lease.
  void renew_leases();

 private:
  /// What runs one job here.
  struct Run {
    // On its device's meter from its start (partial from an adoption); nullopt: unreadable then.
    std::optional<adapters::MeasurementWindow> window;
    std::optional<double> cpu_seconds;    // its process group's CPU time, last read (CpuTimeModel meters)
    std::unique_ptr<ChildProcess> child;  // its runner, watched for its end
    std::optional<adapters::JobCgroup> cgroup;
    std::unique_ptr<adapters::JobPauser> pauser;
    std::unique_ptr<adapters::CpuQuota> quota;
    std::unique_ptr<adapters::GpuPowerLimit> gpu_limit;          // a power cap's, or the job's knob
    std::unique_ptr<DeviceKnobs> knobs;                          // the job's knobs but its GPU power limit
    bool knobs_held_back = false;  // its knobs were put back for a pause: set them again on resume
    std::filesystem::path lease;   // its lease file, renewed while jouled runs it; empty: none
    std::vector<int> cpus;         // its cores (resources.cores); empty: any CPU
    // On a device that shares its cores: its CPU time at the last sample, and what of the
    // meter's joules (or, on a CPU-time model, of its idle seconds) went to the jobs beside it.
    std::optional<double> cpu_at_last_sample;
    double joules_to_others = 0.0;
    double idle_seconds_to_others = 0.0;
    bool shared = false;  // it has run beside another job
    // A job on several GPUs: the others it holds (JobRecord row.companions), each on its own
    // meter from its start, their joules added to its device's.
    struct Companion {
      Device* device = nullptr;
      std::optional<adapters::MeasurementWindow> window;
      std::unique_ptr<adapters::GpuPowerLimit> limit;  // a power cap's, as on its first GPU
    };
    std::vector<Companion> companions;
  };
  /// The job's other GPUs (row.companions) as `run`'s companions, once, without windows yet.
  void attach_companions(const JobRecord& job, Run& run);
  /// Opens a window on each of the job's other GPUs (row.companions) for `run`.
  void open_companion_windows(const JobRecord& job, Run& run, bool partial);
  /// The job's GPU power limit knob on its other GPUs (journalled first); the first refusal is
  /// the error (the caller puts back what was set). Returns a line per GPU for knobs_in_force.
  Result<std::vector<std::string>> limit_companions_to_knob(Run& run, double watts);
  /// Its other GPUs' joules since its start: read from their meters now, or as of their last
  /// sample (`sampled`); nullopt where one cannot be read.
  std::optional<double> companions_energy(const Run& run, bool sampled) const;
  /// A power cap's limit on the job's first GPU set on its others too (they run in step: one
  /// slower GPU keeps the rest waiting), or, with nullopt, put back; what fails is logged.
  void limit_companions(const JobRecord& job, Run& run, std::optional<double> watts);
  /// `count` of this node's CPUs for a job: those no other running job of ours holds first,
  /// lowest first; then, where too few are free, shared ones.
  std::vector<int> choose_cpus(int count) const;

  // This sample's CPU time by process group (begin_sample); nullopt between samples.
  std::optional<std::map<pid_t, double>> sample_cpu_;

  Run& run_of(const JobRecord& job);
  /// Its process group's CPU time into `run.cpu_seconds` (the exit's total where it has ended).
  void read_cpu_seconds(const JobRecord& job, Run& run, const adapters::ExitStatus* exit) const;
  /// Creates the job's directory and its tmp/ (taking back one a run before left to the job's
  /// account), lets `fill` write into it, then hands both to `identity` when there is one.
  Status prepare_work_directory(const std::string& id, const std::optional<adapters::JobIdentity>& identity,
                                const std::function<Status()>& fill = {}) const;
  std::vector<std::string> job_environment(const JobRecord& job, const Device& device) const;
  /// `joule-worker train` for a `run.builtin` job, reading its job file (write_builtin_job).
  Result<std::vector<std::string>> builtin_command(const JobRecord& job, const Device& device,
                                                   const std::optional<adapters::JobIdentity>& identity) const;
  /// The job file of a `run.builtin` job in its work directory, the job account's to read.
  Status write_builtin_job(const JobRecord& job, const std::optional<adapters::JobIdentity>& identity) const;
  /// Sets the job's knobs on `device` before it starts. A knob the hardware refuses, or that reads
  /// back different, is put back and noted on the job, which runs at the device's default.
  void apply_knobs(JobRecord& job, Device& device, Run& run);
  /// Puts back what apply_knobs set (the GPU's limit only while no power cap holds it).
  void restore_knobs(JobRecord& job, Run& run);
  /// Puts back the job's knobs and `gpu` (the GPU's limit, where it goes back too; a power cap's
  /// stays otherwise), the power mode last, logging what cannot be.
  static void put_back(const JobRecord& job, Run& run, adapters::RestorableControl* gpu);
  /// When the job is paused: its knobs go back until it resumes (apply_knobs again), noted.
  void put_knobs_back(JobRecord& job, Run& run);
  /// The GPU power limit control of `run` on `device` (made on first use, journalled).
  adapters::GpuPowerLimit* gpu_limit_of(Run& run, Device& device);
  /// Called by the job's ChildProcess when its runner has ended.
  void on_exit(const std::string& id, const std::optional<adapters::ExitStatus>& exit);
  /// A window on the device's meter from now; nullopt (and the meter's error noted on the
  /// device) if it cannot be read.
  std::optional<adapters::MeasurementWindow> open_window(Device& device, bool partial) const;

  boost::asio::io_context& io_;
  ExecutorHost& host_;
  const LocalRunOptions& options_;
  std::string api_url_;
  double lease_seconds_ = 0.0;
  boost::asio::steady_timer lease_timer_;
  std::map<std::string, Run> runs_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace joule::daemon
