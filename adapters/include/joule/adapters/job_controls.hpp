#pragma once
// Throttling a running job, and putting everything back afterwards: pausing it (cgroup freezer,
// else SIGSTOP), capping its CPU time (cgroup CPU quota), capping a GPU's power (NVML), and the
// per-job cgroups the first two act on. The scheduler decides when; these only know how.
//
// Every control follows geopm's rule (SaveControl.hpp): the value it changes is read and saved
// before its first write, restore() writes the saved value back, restore() is idempotent and is
// what the destructor does; the local executor restores a job's controls when it lets go of the
// job (`LocalExecutor::release`: the job ended, or jouled stops), so nothing stays throttled after
// the daemon exits. Each failure is a Result whose message names
// the file (or GPU) and what to do about it.
//
// Not thread-safe: the daemon drives all of them from one strand. Calls block only for a file
// write, or for up to `settle_timeout` while a freezer settles.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "joule/adapters/energy_meter.hpp"
#include "joule/adapters/nvml_library.hpp"
#include "joule/common/result.hpp"

namespace joule::adapters {

class ControlJournal;

/// The file-system calls the cgroup code makes, each returning 0 or an errno as the kernel does.
/// `system()` gives the real calls, and a member left empty is the real call too. Tests put a
/// fake kernel here, one that refuses "+cpu" with EBUSY while a cgroup has processes or answers
/// EACCES, without patching open() and whether or not they run as root.
struct ControlFiles {
  /// Reads the whole file into `text`.
  std::function<int(const std::filesystem::path&, std::string& text)> read;
  /// One write(2) of `text` to an existing file, truncating it. Never creates a file: cgroupfs
  /// files are the kernel's, and a missing one means a missing controller.
  std::function<int(const std::filesystem::path&, std::string_view text)> write;
  /// mkdir(2), mode 0755; EEXIST is returned as such.
  std::function<int(const std::filesystem::path&)> make_dir;
  /// rmdir(2); on cgroupfs EBUSY while the cgroup has processes or children.
  std::function<int(const std::filesystem::path&)> remove_dir;

  static ControlFiles system();
};

/// A setting that can be put back as it was before Joule first wrote it.
class RestorableControl {
 public:
  virtual ~RestorableControl() = default;
  /// What and where, for logs: "cpu.max of /sys/fs/cgroup/jouled.service/job-42".
  virtual std::string describe() const = 0;
  /// Writes back the value saved before the first write. Does nothing when nothing was written
  /// since the last restore (so it is idempotent), and succeeds when the thing itself is gone (a
  /// removed cgroup, an ended process group): nothing is left throttled there.
  virtual Status restore() = 0;
};

enum class CgroupVersion { v1, v2 };
/// "v1" / "v2".
std::string_view to_string(CgroupVersion version);

/// The cgroup directories of one job, made by JobCgroups::create_for (or by hand in tests).
/// Under v2 both name the same directory.
struct JobCgroup {
  CgroupVersion version = CgroupVersion::v2;
  std::filesystem::path cpu_dir;      ///< empty: no cpu controller, so no CPU quota
  std::filesystem::path freezer_dir;  ///< empty: no freezer, so JobPauser uses SIGSTOP
  /// The CPUs its cpuset confines it to (create_for's `cpus`), as the kernel has them; empty
  /// where it asked for none, or `cpuset_note` says why there is no cpuset.
  std::string cpuset_cpus;
  std::string cpuset_note;
  /// The GPUs (device minors) its device rules keep it off (create_for's `denied_gpus`), where
  /// they were set; `gpu_fence_note` says why not otherwise (gpu_fence.hpp).
  std::vector<unsigned> fenced_gpus;
  std::string gpu_fence_note;
};

/// Pauses and resumes a whole job. With a freezer (`cgroup` given and its `freezer_dir` set):
/// v2 writes `cgroup.freeze` 1/0 and waits for `frozen 1`/`frozen 0` in `cgroup.events`; v1
/// writes `freezer.state` FROZEN/THAWED and waits until it reads back so (it shows FREEZING
/// meanwhile). A frozen job cannot notice, and its children are frozen even if they left the
/// process group. Without one: SIGSTOP/SIGCONT to the process group `pgid` (a job process that
/// made its own group is missed, and the job can see SIGCONT).
///
/// restore() resumes the job, writing back the saved `cgroup.freeze`/`freezer.state` bytes when
/// they said "running". It never re-freezes: a cgroup found frozen before the first write (left by
/// a daemon that died mid-pause) is thawed too, since a job left frozen is a job stuck for good.
class JobPauser final : public RestorableControl {
 public:
  JobPauser(pid_t pgid, std::optional<JobCgroup> cgroup, ControlFiles files = ControlFiles::system(),
            std::chrono::milliseconds settle_timeout = std::chrono::milliseconds(1000));
  ~JobPauser() override;
  JobPauser(const JobPauser&) = delete;
  JobPauser& operator=(const JobPauser&) = delete;

  /// "freezer" or "sigstop".
  std::string_view mechanism() const;
  /// Freezes or stops the job. A freezer that has not settled within `settle_timeout` is an
  /// error (unavailable) naming the state it reported; the freeze stays requested and counts as
  /// paused, so resume() and restore() undo it.
  Status pause();
  /// Thaws or continues the job; also when this pauser did not pause it.
  Status resume();
  /// Whether the last pause() or resume() left the job paused (as far as this pauser knows).
  bool paused() const { return paused_; }

  std::string describe() const override;
  Status restore() override;

 private:
  Status set_frozen(bool frozen);
  Status wait_until(bool frozen) const;
  Result<bool> is_state(bool frozen) const;
  std::filesystem::path state_file() const;
  bool v2() const { return cgroup_->version == CgroupVersion::v2; }

  pid_t pgid_;
  std::optional<JobCgroup> cgroup_;  ///< set only when it has a freezer
  ControlFiles files_;
  std::chrono::milliseconds settle_timeout_;
  std::optional<std::string> original_;  ///< the freezer file's bytes before the first write
  bool paused_ = false;
  bool dirty_ = false;  ///< written (or signalled) since the last restore
};

/// A CPU-time cap on a job's cgroup, in CPUs (0.5 = half of one CPU, 2.0 = two CPUs' worth)
/// over the cgroup's current period (100 ms unless someone changed it). v2 writes `cpu.max`
/// ("QUOTA PERIOD", "max PERIOD" when unlimited); v1 writes `cpu.cfs_quota_us` (-1 when
/// unlimited) against `cpu.cfs_period_us`, which it only reads. Saves the quota file's bytes
/// before the first write; restore() writes exactly those bytes back.
class CpuQuota final : public RestorableControl {
 public:
  /// The kernel's smallest quota, in microseconds per period.
  static constexpr std::int64_t kMinQuotaUs = 1000;
  /// More than any machine has; keeps the quota arithmetic in range.
  static constexpr double kMaxCpus = 1e6;

  explicit CpuQuota(JobCgroup cgroup, ControlFiles files = ControlFiles::system());
  ~CpuQuota() override;
  CpuQuota(const CpuQuota&) = delete;
  CpuQuota& operator=(const CpuQuota&) = delete;

  /// Caps the job at `cpus` CPUs. Must be in (0, kMaxCpus] (invalid_argument otherwise), and give
  /// at least kMinQuotaUs per period (0.01 CPU at 100 ms). unavailable when the cgroup has no cpu
  /// controller.
  Status set_fraction(double cpus);
  /// Removes the cap (unlimited), still saving the original first.
  Status clear();
  /// The cap in CPUs now, or nothing when unlimited.
  Result<std::optional<double>> current() const;

  std::string describe() const override;
  Status restore() override;

 private:
  std::filesystem::path quota_file() const;
  Result<std::int64_t> period_us() const;
  Status write_quota(std::optional<std::int64_t> quota_us, std::int64_t period_us);

  JobCgroup cgroup_;
  ControlFiles files_;
  std::optional<std::string> original_;
  bool dirty_ = false;
};

/// Per-job cgroups under the daemon's own cgroup, and why there are none when there are none.
///
/// detect() reads `<proc_root>/<pid>/cgroup`. Lines for the v1 `cpu` or `freezer` controllers
/// ("4:cpu,cpuacct:/system.slice/jouled.service", "7:freezer:/") whose hierarchy is mounted under
/// `cgroup_root` (at the controller list, "cpu,cpuacct", or the controller's own name, "cpu") mean
/// v1, also on hybrid systems that add a controller-less "0::/..." line. Otherwise the unified
/// line "0::/path" with `cgroup_root/cgroup.controllers` present means v2. The daemon's cgroup is
/// usable when a child cgroup can be created in it (probed with mkdir + rmdir): under systemd
/// that takes Delegate=yes, elsewhere root or a chowned cgroup.
///
/// v2 and the "no internal processes" rule: a cgroup that hands a controller to its children may
/// hold no processes itself, and under systemd the daemon's own cgroup holds the daemon. So on
/// the first create_for every process in `<own>` moves to the leaf `<own>/daemon`, then "+cpu" is
/// written to `<own>/cgroup.subtree_control`, then jobs get `<own>/job-<id>`. (At the root of the
/// hierarchy, which is exempt, processes move only if enabling "+cpu" answers EBUSY, as in a
/// container's cgroup namespace.) When "cpu" is not delegated, or enabling it fails, job cgroups
/// still freeze and describe() says why there is no CPU quota. A daemon started inside
/// `<own>/daemon` counts `<own>` as its own. v1 has no such rule: `job-<id>` is made under the
/// daemon's cgroup in the cpu and in the freezer hierarchy.
///
/// When cgroups are not usable, create_for fails with the reason, and the daemon pauses jobs with
/// SIGSTOP and gives them no CPU quota; describe() is the line to log and show.
class JobCgroups {
 public:
  /// The name of the leaf the daemon's processes move to under v2.
  static constexpr std::string_view kDaemonLeaf = "daemon";

  explicit JobCgroups(std::filesystem::path cgroup_root = "/sys/fs/cgroup", std::filesystem::path proc_root = "/proc",
                      ControlFiles files = ControlFiles::system());

  /// Decides the version and whether the daemon's cgroup (that of `daemon_pid`) is usable.
  /// Creates and removes one probe cgroup; moves nothing. The error (unavailable or
  /// permission_denied) is the reason, which describe() keeps.
  Status detect(pid_t daemon_pid);
  bool usable() const { return usable_; }
  CgroupVersion version() const { return version_; }
  /// "cgroup v2: job cgroups under /sys/fs/cgroup/system.slice/jouled.service", or
  /// "unavailable: <why>; jobs are paused with SIGSTOP and get no CPU quota".
  std::string describe() const;

  /// Makes (or adopts, if it exists: a restarted daemon) the cgroup of `job_id` and moves `pid`
  /// into it, with every process of the process group `pid` leads (found under `proc_root`):
  /// the job runner may already have forked the command. Later children follow by inheritance.
  /// `job_id` is a directory name: letters, digits, '-', '_', '.', not starting with '.'.
  /// On failure the cgroups this call made are removed again. `cpus` (a job's own cores): under
  /// v2 with the cpuset controller delegated, written to its `cpuset.cpus` before anything moves
  /// in, so the kernel keeps the job on them whatever affinity it sets itself; where there is no
  /// cpuset, or the kernel refuses the list, the cgroup is made all the same and `cpuset_note`
  /// says why (the runner's affinity still holds the job to them).
  /// `denied_gpus` (the NVIDIA GPUs' minors the job does not hold) are fenced off before it moves
  /// in: v1 through its devices hierarchy, v2 with a device filter program (gpu_fence.hpp); where
  /// that fails, the cgroup is made all the same and `gpu_fence_note` says why.
  Result<JobCgroup> create_for(const std::string& job_id, pid_t pid, const std::vector<int>& cpus = {},
                               const std::vector<unsigned>& denied_gpus = {});
  /// Removes the job's cgroup(s): conflict while a process is still in one, success when gone.
  Status remove(const std::string& job_id);

 private:
  Status prepare_v2();
  Status move_all_to_leaf();
  Status move_job(pid_t pid, const std::filesystem::path& dir);
  std::vector<std::filesystem::path> job_dirs(const std::string& job_id) const;
  Status probe(const std::filesystem::path& dir) const;
  Status unusable(Error error);

  std::filesystem::path cgroup_root_;
  std::filesystem::path proc_root_;
  ControlFiles files_;
  bool usable_ = false;
  std::string reason_ = "cgroups not detected yet";
  CgroupVersion version_ = CgroupVersion::v2;
  std::filesystem::path v2_own_;
  bool v2_prepared_ = false;
  bool v2_cpu_ = false;
  std::string cpu_note_;  ///< why there is no CPU quota, when there is none
  bool v2_cpuset_ = false;
  std::string cpuset_note_;  ///< why jobs' cores get no cpuset, when they get none
  std::string gpu_fence_note_;  ///< why jobs' GPUs get no device rules, when they cannot
  std::filesystem::path v1_cpu_;
  std::filesystem::path v1_freezer_;
  std::filesystem::path v1_devices_;  ///< empty: no v1 devices hierarchy (GPUs unfenced under v1)
};

/// What set_watts did: the limit asked for and the one applied, which differ when the request
/// fell outside the GPU's allowed range.
struct PowerLimitSetting {
  double requested_watts = 0;
  double applied_watts = 0;
  double min_watts = 0;  ///< the allowed range, from NVML's constraints
  double max_watts = 0;
  bool clamped = false;
  /// "set 200 W", or "asked 50 W, set 100 W (GPU allows 100-300 W)".
  std::string describe() const;
};

/// A GPU's power limit through NVML. The limit is the GPU's, not a job's: it holds for every
/// process on that GPU until restored. Saves the limit before the first write; restore() sets it
/// back. Setting needs root or CAP_SYS_ADMIN (permission_denied says so).
class GpuPowerLimit final : public RestorableControl {
 public:
  /// `index` only names the GPU in messages.
  GpuPowerLimit(std::shared_ptr<NvmlLibrary> nvml, nvml::Device device, unsigned index);
  /// The GPU a meter offers (EnergyMeter::gpu_power_control).
  GpuPowerLimit(const GpuPowerControl& gpu, unsigned index) : GpuPowerLimit(gpu.library(), gpu.device(), index) {}
  ~GpuPowerLimit() override;
  GpuPowerLimit(const GpuPowerLimit&) = delete;
  GpuPowerLimit& operator=(const GpuPowerLimit&) = delete;

  /// From now on the limit before the first write is also noted in `journal` (kept alive by the
  /// caller), so that a jouled killed with -9 puts it back at its next start; the setting is not
  /// changed when it cannot be noted.
  void keep_original_in(ControlJournal* journal) { journal_ = journal; }
  /// The journal key of GPU `index`'s limit ("nvml:0:power_limit").
  static std::string journal_key(unsigned index);

  /// Sets the limit to `watts` (finite, > 0), clamped into the GPU's allowed range.
  Result<PowerLimitSetting> set_watts(double watts);
  Result<double> current_watts() const;

  std::string describe() const override;
  Status restore() override;

 private:
  Error gpu_error(const Error& error, std::string_view action) const;

  std::shared_ptr<NvmlLibrary> nvml_;
  nvml::Device device_;
  unsigned index_;
  std::optional<std::uint32_t> original_mw_;
  bool dirty_ = false;
  ControlJournal* journal_ = nullptr;
};

}  // namespace joule::adapters
