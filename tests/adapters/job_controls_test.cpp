#include "joule/adapters/job_controls.hpp"

#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "joule/adapters/control_journal.hpp"
#include "joule/adapters/gpu_fence.hpp"
#include "joule/adapters/sysfs.hpp"
#include "temp_dir.hpp"

extern char** environ;

using joule::ErrorCode;
using joule::Status;
using joule::testing::TempDir;
using namespace joule::adapters;  // NOLINT: the whole module under test
using std::filesystem::path;

namespace {

std::string slurp(const path& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Plays the kernel over a temp tree (<tmp>/cgroup, <tmp>/proc): mkdir makes a cgroup's files, a
// pid written to cgroup.procs leaves every other cgroup, "+cpu" is refused (EBUSY) while a
// non-root cgroup has processes, freezing updates cgroup.events, rmdir refuses a cgroup with
// processes. Calls are logged relative to the cgroup root; `fail_name` or the `fail_at`-th
// change fails with `fail_errno`.
class FakeKernel {
 public:
  TempDir dir;
  std::vector<std::string> log;
  std::string fail_name;
  int fail_at = 0;
  int fail_errno = EACCES;
  std::string failed;  ///< the call that failed
  bool stuck = false;  ///< the freezer never settles

  path root() const { return dir / "cgroup"; }
  path cg(const std::string& relative) const { return root() / relative; }
  void write(const std::string& relative, const std::string& text) const { dir.write("cgroup/" + relative, text); }

  ControlFiles files() {
    ControlFiles files;
    files.write = [this](const path& file, std::string_view text) { return write_call(file, std::string(text)); };
    files.make_dir = [this](const path& d) { return mkdir_call(d); };
    files.remove_dir = [this](const path& d) { return rmdir_call(d); };
    return files;
  }

 private:
  std::string rel(const path& p) const { return p.lexically_relative(root()).string(); }
  static std::string trimmed(std::string_view text) { return std::string(trim(text)); }
  int fault(const path& p) {
    const bool by_name = !fail_name.empty() && p.filename().string().starts_with(fail_name);
    const bool by_step = fail_at > 0 && --fail_at == 0;
    if (!by_name && !by_step) return 0;
    failed = log.back();
    return fail_errno;
  }
  static void put(const path& file, const std::string& text) { std::ofstream(file) << text; }

  int write_call(const path& file, const std::string& text) {
    log.push_back("write " + rel(file) + " " + trimmed(text));
    if (const int err = fault(file)) return err;
    if (!std::filesystem::exists(file)) return ENOENT;
    const std::string name = file.filename().string();
    if (name == "cgroup.procs") {
      // A pid is in one cgroup per hierarchy: v2 has one, v1 one per mount.
      const bool v1 = !std::filesystem::exists(root() / "cgroup.controllers");
      for (const auto& entry :
           std::filesystem::recursive_directory_iterator(v1 ? root() / *path(rel(file)).begin() : root())) {
        if (entry.path().filename() != "cgroup.procs") continue;
        std::istringstream pids(slurp(entry.path()));
        std::string kept;
        for (std::string pid; pids >> pid;)
          if (pid != trimmed(text)) kept += pid + "\n";
        put(entry.path(), kept);
      }
      put(file, slurp(file) + text);
    } else if (name == "cgroup.subtree_control") {
      if (file.parent_path() != root() && !slurp(file.parent_path() / "cgroup.procs").empty()) return EBUSY;
      put(file, slurp(file) + text.substr(1));
    } else if (name == "cgroup.freeze") {
      put(file, text);
      if (!stuck) put(file.parent_path() / "cgroup.events", "populated 1\nfrozen " + text);
    } else {
      put(file, stuck && text == "FROZEN\n" ? "FREEZING\n" : text);
    }
    return 0;
  }

  int mkdir_call(const path& d) {
    log.push_back("mkdir " + rel(d));
    if (const int err = fault(d)) return err;
    if (std::filesystem::exists(d)) return EEXIST;
    std::filesystem::create_directory(d);
    put(d / "cgroup.procs", "");
    const std::string parent_control = slurp(d.parent_path() / "cgroup.subtree_control");
    if (std::filesystem::exists(root() / "cgroup.controllers")) {
      put(d / "cgroup.subtree_control", "");
      put(d / "cgroup.freeze", "0\n");
      put(d / "cgroup.controllers", parent_control);
      put(d / "cgroup.events", "populated 0\nfrozen 0\n");
      if (has(parent_control, "cpu")) put(d / "cpu.max", "max 100000\n");
      if (has(parent_control, "cpuset")) put(d / "cpuset.cpus", "");
    } else if (rel(d).starts_with("cpu")) {
      put(d / "cpu.cfs_quota_us", "-1\n");
      put(d / "cpu.cfs_period_us", "100000\n");
    } else if (rel(d).starts_with("devices")) {
      put(d / "devices.deny", "");
    } else {
      put(d / "freezer.state", "THAWED\n");
    }
    return 0;
  }

  int rmdir_call(const path& d) {
    log.push_back("rmdir " + rel(d));
    if (const int err = fault(d)) return err;
    if (!std::filesystem::exists(d)) return ENOENT;
    if (!slurp(d / "cgroup.procs").empty()) return EBUSY;
    std::filesystem::remove_all(d);
    return 0;
  }
};

// A systemd v2 host: jouled (pid 100) and a helper (101) in jouled.service, `controllers` delegated.
void write_v2_host(const FakeKernel& kernel, const std::string& controllers = "cpu memory pids") {
  kernel.write("cgroup.controllers", "cpu io memory pids\n");
  kernel.write("cgroup.subtree_control", "cpu memory pids\n");
  const std::string own = "system.slice/jouled.service/";
  kernel.write(own + "cgroup.controllers", controllers + "\n");
  kernel.write(own + "cgroup.subtree_control", "");
  kernel.write(own + "cgroup.procs", "100\n101\n");
  kernel.dir.write("proc/100/cgroup", "0::/system.slice/jouled.service\n");
}

// The job's runner (200) leads group 200 and has forked its command (201); 300 is someone else.
void write_job_group(const FakeKernel& kernel) {
  kernel.dir.write("proc/200/stat", "200 (jouled) S 100 200 200 0 -1\n");
  kernel.dir.write("proc/201/stat", "201 (python (train)) R 200 200 200 0 -1\n");
  kernel.dir.write("proc/300/stat", "300 (bash) S 1 300 300 0 -1\n");
}

JobCgroups detected(FakeKernel& kernel, pid_t pid = 100) {
  JobCgroups cgroups(kernel.root(), kernel.dir / "proc", kernel.files());
  const Status status = cgroups.detect(pid);
  EXPECT_TRUE(status) << status.error().message;
  kernel.log.clear();
  return cgroups;
}

pid_t spawn_sleep_in_own_group() {
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = 0;
  char* argv[] = {const_cast<char*>("sleep"), const_cast<char*>("30"), nullptr};
  EXPECT_EQ(::posix_spawnp(&pid, "sleep", nullptr, &attr, argv, environ), 0);
  posix_spawnattr_destroy(&attr);
  return pid;
}

void kill_and_reap(pid_t pid) {
  ::kill(-pid, SIGCONT);
  ::kill(-pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

// Field 3 of /proc/PID/stat, polled until it is (or is not) 'T': signals arrive asynchronously.
bool reaches_stopped(pid_t pid, bool stopped) {
  for (int i = 0; i < 2000; ++i) {
    const std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
    const auto close = stat.rfind(')');
    if (close != std::string::npos && (stat.at(close + 2) == 'T') == stopped) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

}  // namespace

TEST(CgroupTest, detects_v1_and_prefers_it_on_hybrid_hosts) {
  for (const std::string extra : {"", "0::/system.slice/jouled.service\n"}) {
    FakeKernel kernel;
    kernel.write("cpu,cpuacct/system.slice/jouled.service/cgroup.procs", "100\n");
    kernel.write("freezer/cgroup.procs", "100\n");
    kernel.write("unified/cgroup.controllers", "");
    kernel.dir.write("proc/100/cgroup",
                     "9:freezer:/\n4:cpu,cpuacct:/system.slice/jouled.service\n1:name=systemd:/x\n" + extra);
    JobCgroups cgroups = detected(kernel);
    EXPECT_EQ(cgroups.version(), CgroupVersion::v1);
    EXPECT_EQ(cgroups.describe(),
              "cgroup v1: job cgroups under " + kernel.cg("cpu,cpuacct/system.slice/jouled.service").string() + ", " +
                  kernel.cg("freezer").string() + " (GPUs not fenced: cgroup v1: no devices hierarchy is mounted)");
  }
}

TEST(CgroupTest, v2_delegated_cgroup_moves_daemon_to_leaf_first) {
  FakeKernel kernel;
  write_v2_host(kernel);
  write_job_group(kernel);
  JobCgroups cgroups = detected(kernel);
  const std::string own = "system.slice/jouled.service/";
  EXPECT_EQ(cgroups.version(), CgroupVersion::v2);
  EXPECT_EQ(cgroups.describe(), "cgroup v2: job cgroups under " + kernel.cg(own).parent_path().string());
  EXPECT_FALSE(std::filesystem::exists(kernel.cg(own + "daemon")));  // detect moves nothing
  auto job = cgroups.create_for("7", 200);
  ASSERT_TRUE(job) << job.error().message;
  const std::vector<std::string> expected = {
      "mkdir " + own + "daemon",  // the fake refuses "+cpu" while jouled.service has processes
      "write " + own + "daemon/cgroup.procs 100",
      "write " + own + "daemon/cgroup.procs 101",
      "write " + own + "cgroup.subtree_control +cpu",
      "mkdir " + own + "job-7",
      "write " + own + "job-7/cgroup.procs 200",
      "write " + own + "job-7/cgroup.procs 201",  // forked before the runner moved
  };
  EXPECT_EQ(kernel.log, expected);
  EXPECT_EQ(slurp(kernel.cg(own + "cgroup.procs")), "");
  EXPECT_EQ(slurp(kernel.cg(own + "daemon/cgroup.procs")), "100\n101\n");
  EXPECT_EQ(job->cpu_dir, kernel.cg(own + "job-7"));
  EXPECT_EQ(job->freezer_dir, kernel.cg(own + "job-7"));
  kernel.log.clear();
  ASSERT_TRUE(cgroups.create_for("8", 300));
  EXPECT_EQ(kernel.log.front(), "mkdir " + own + "job-8");  // prepared once
}

TEST(CgroupTest, v2_with_the_cpuset_controller_confines_a_job_to_its_cores_before_it_moves_in) {
  FakeKernel kernel;
  write_v2_host(kernel, "cpu cpuset memory pids");
  write_job_group(kernel);
  JobCgroups cgroups = detected(kernel);
  auto job = cgroups.create_for("7", 200, {2, 3, 5});
  ASSERT_TRUE(job) << job.error().message;
  EXPECT_EQ(job->cpuset_cpus, "2-3,5");
  EXPECT_EQ(job->cpuset_note, "");
  const std::string own = "system.slice/jouled.service/";
  EXPECT_EQ(slurp(kernel.cg(own + "job-7/cpuset.cpus")), "2-3,5\n");
  const auto at = [&](const std::string& entry) {
    return std::find(kernel.log.begin(), kernel.log.end(), entry) - kernel.log.begin();
  };
  EXPECT_LT(at("write " + own + "cgroup.subtree_control +cpuset"), at("mkdir " + own + "job-7"));
  EXPECT_LT(at("write " + own + "job-7/cpuset.cpus 2-3,5"), at("write " + own + "job-7/cgroup.procs 200"))
      << "no process of the job runs outside its cores";
  // A job that asks for no cores gets no cpuset written.
  kernel.log.clear();
  ASSERT_TRUE(cgroups.create_for("8", 300));
  for (const auto& entry : kernel.log) EXPECT_FALSE(has(entry, "cpuset")) << entry;
}

TEST(CgroupTest, without_a_cpuset_a_jobs_cores_are_kept_by_affinity_and_it_says_why) {
  FakeKernel kernel;
  write_v2_host(kernel);  // cpu memory pids
  write_job_group(kernel);
  JobCgroups cgroups = detected(kernel);
  auto job = cgroups.create_for("7", 200, {1});
  ASSERT_TRUE(job) << job.error().message;
  EXPECT_EQ(job->cpuset_cpus, "");
  EXPECT_TRUE(has(job->cpuset_note, "the cpuset controller is not delegated to")) << job->cpuset_note;
}

TEST(CgroupTest, v2_without_the_cpu_controller_still_freezes_but_has_no_quota) {
  FakeKernel kernel;
  write_v2_host(kernel, "memory pids");
  JobCgroups cgroups = detected(kernel);
  EXPECT_TRUE(has(cgroups.describe(), "(no CPU quota: the cpu controller is not delegated to ")) << cgroups.describe();
  auto job = cgroups.create_for("7", 100);
  ASSERT_TRUE(job);
  EXPECT_TRUE(job->cpu_dir.empty());
  EXPECT_EQ(JobPauser(100, *job, kernel.files()).mechanism(), "freezer");
  auto quota = CpuQuota(*job, kernel.files()).set_fraction(0.5);
  ASSERT_FALSE(quota);
  EXPECT_EQ(quota.error().code, ErrorCode::unavailable);
}

TEST(CgroupTest, v1_creates_job_cgroups_in_both_hierarchies_and_removes_them) {
  FakeKernel kernel;
  kernel.write("cpu/cgroup.procs", "100\n200\n201\n300\n");  // mounted alone, as on this CI host
  kernel.write("freezer/cgroup.procs", "100\n200\n201\n300\n");
  kernel.dir.write("proc/100/cgroup", "2:cpuacct:/\n1:cpu:/\n6:freezer:/\n0::/\n");
  write_job_group(kernel);
  JobCgroups cgroups = detected(kernel);
  auto job = cgroups.create_for("a1-b2", 200);
  ASSERT_TRUE(job) << job.error().message;
  EXPECT_EQ(job->version, CgroupVersion::v1);
  EXPECT_EQ(job->cpu_dir, kernel.cg("cpu/job-a1-b2"));
  EXPECT_EQ(job->freezer_dir, kernel.cg("freezer/job-a1-b2"));
  EXPECT_EQ(slurp(kernel.cg("cpu/job-a1-b2/cgroup.procs")), "200\n201\n");
  EXPECT_EQ(slurp(kernel.cg("freezer/job-a1-b2/cgroup.procs")), "200\n201\n");
  EXPECT_EQ(slurp(kernel.cg("cpu/cgroup.procs")), "100\n300\n");

  auto busy = cgroups.remove("a1-b2");
  ASSERT_FALSE(busy);
  EXPECT_EQ(busy.error().code, ErrorCode::conflict);
  EXPECT_TRUE(has(busy.error().message, "a process of the job is still in it"));
  kernel.write("cpu/job-a1-b2/cgroup.procs", "");
  kernel.write("freezer/job-a1-b2/cgroup.procs", "");
  EXPECT_TRUE(cgroups.remove("a1-b2"));
  EXPECT_FALSE(std::filesystem::exists(kernel.cg("cpu/job-a1-b2")));
  EXPECT_TRUE(cgroups.remove("a1-b2"));  // already gone
  EXPECT_EQ(cgroups.create_for("../x", 200).error().code, ErrorCode::invalid_argument);
}

// The GPUs a job does not hold are denied in its devices cgroup before it moves in; a host without
// the devices hierarchy makes the job's cgroups all the same and says why its GPUs are not fenced.
TEST(CgroupTest, v1_denies_the_gpus_a_job_does_not_hold_before_it_moves_in) {
  FakeKernel kernel;
  for (const std::string hierarchy : {"cpu", "freezer", "devices"})
    kernel.write(hierarchy + "/cgroup.procs", "100\n200\n201\n300\n");
  kernel.dir.write("proc/100/cgroup", "1:cpu:/\n6:freezer:/\n5:devices:/\n0::/\n");
  write_job_group(kernel);
  JobCgroups cgroups = detected(kernel);
  auto job = cgroups.create_for("gpu-1", 200, {}, {0, 2});
  ASSERT_TRUE(job) << job.error().message;
  EXPECT_EQ(job->fenced_gpus, (std::vector<unsigned>{0, 2}));
  const auto at = [&](const std::string& line) {
    return std::find(kernel.log.begin(), kernel.log.end(), line) - kernel.log.begin();
  };
  const auto deny0 = at("write devices/job-gpu-1/devices.deny c 195:0 rwm");
  const auto deny2 = at("write devices/job-gpu-1/devices.deny c 195:2 rwm");
  const auto moved = at("write devices/job-gpu-1/cgroup.procs 200");
  ASSERT_LT(moved, static_cast<long>(kernel.log.size())) << fmt::format("{}", fmt::join(kernel.log, "\n"));
  EXPECT_LT(deny0, moved);
  EXPECT_LT(deny2, moved);
  kernel.write("cpu/job-gpu-1/cgroup.procs", "");
  kernel.write("freezer/job-gpu-1/cgroup.procs", "");
  kernel.write("devices/job-gpu-1/cgroup.procs", "");
  EXPECT_TRUE(cgroups.remove("gpu-1"));
  EXPECT_FALSE(std::filesystem::exists(kernel.cg("devices/job-gpu-1")));

  FakeKernel plain;
  plain.write("cpu/cgroup.procs", "100\n200\n201\n");
  plain.dir.write("proc/100/cgroup", "1:cpu:/\n0::/\n");
  write_job_group(plain);
  JobCgroups without = detected(plain);
  auto unfenced = without.create_for("gpu-2", 200, {}, {1});
  ASSERT_TRUE(unfenced) << unfenced.error().message;
  EXPECT_TRUE(unfenced->fenced_gpus.empty());
  EXPECT_EQ(unfenced->gpu_fence_note, "cgroup v1: no devices hierarchy is mounted");
}

TEST(CgroupTest, unusable_cgroups_give_a_reason_to_log_and_sigstop_only) {
  FakeKernel kernel;
  JobCgroups missing(kernel.root(), kernel.dir / "proc", kernel.files());
  EXPECT_FALSE(missing.detect(100));
  EXPECT_TRUE(has(missing.describe(), "cannot read " + (kernel.dir / "proc/100/cgroup").string()))
      << missing.describe();
  kernel.dir.write("proc/100/cgroup", "0::/\n");
  EXPECT_FALSE(missing.detect(100));
  EXPECT_TRUE(has(missing.describe(), "no cgroup v2 at " + kernel.root().string())) << missing.describe();

  write_v2_host(kernel);
  kernel.fail_name = "joule-probe";
  JobCgroups cgroups(kernel.root(), kernel.dir / "proc", kernel.files());
  auto status = cgroups.detect(100);
  ASSERT_FALSE(status);
  EXPECT_EQ(status.error().code, ErrorCode::permission_denied);
  EXPECT_FALSE(cgroups.usable());
  EXPECT_EQ(cgroups.describe(), "unavailable: cannot create a cgroup in " +
                                    kernel.cg("system.slice/jouled.service").string() +
                                    ": permission denied (jouled needs a delegated cgroup: Delegate=yes in its unit, "
                                    "or root); jobs are paused with SIGSTOP and get no CPU quota");
  auto job = cgroups.create_for("7", 100);
  ASSERT_FALSE(job);
  EXPECT_EQ(job.error().code, ErrorCode::unavailable);
  EXPECT_EQ(JobPauser(100, std::nullopt).mechanism(), "sigstop");
}

TEST(CgroupTest, read_only_tree_is_unavailable) {
  if (::geteuid() == 0)
    GTEST_SKIP() << "running as root, where file modes do not deny (the injected EACCES tests cover it)";
  FakeKernel kernel;
  write_v2_host(kernel);
  std::vector<path> dirs;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(kernel.root())) {
    if (entry.is_directory()) dirs.push_back(entry.path());
    ::chmod(entry.path().c_str(), entry.is_directory() ? 0555 : 0444);
  }
  JobCgroups cgroups(kernel.root(), kernel.dir / "proc");  // the real calls
  auto status = cgroups.detect(100);
  for (const path& d : dirs) ::chmod(d.c_str(), 0755);  // so TempDir can clean up
  ASSERT_FALSE(status);
  EXPECT_EQ(status.error().code, ErrorCode::permission_denied);
  EXPECT_TRUE(has(cgroups.describe(), "Delegate=yes")) << cgroups.describe();
}

TEST(CgroupTest, failing_at_each_step_names_the_file_and_leaves_no_job_cgroup) {
  for (int step = 1;; ++step) {
    FakeKernel kernel;
    write_v2_host(kernel);
    write_job_group(kernel);
    JobCgroups cgroups = detected(kernel);
    kernel.fail_at = step;
    auto job = cgroups.create_for("7", 200);
    if (kernel.failed.empty()) {
      ASSERT_TRUE(job) << job.error().message;
      EXPECT_GT(step, 5);
      break;
    }
    const bool quota_only = has(kernel.failed, "cgroup.subtree_control");  // cpu given up, freezer kept
    if (quota_only) {
      ASSERT_TRUE(job) << step;
      EXPECT_TRUE(job->cpu_dir.empty());
      EXPECT_TRUE(has(cgroups.describe(), "no CPU quota: cannot write ")) << cgroups.describe();
      continue;
    }
    ASSERT_FALSE(job) << "step " << step;
    EXPECT_TRUE(job.error().message.starts_with("cannot ")) << job.error().message;
    EXPECT_TRUE(has(job.error().message, "permission denied (jouled needs a delegated cgroup")) << job.error().message;
    EXPECT_FALSE(std::filesystem::exists(kernel.cg("system.slice/jouled.service/job-7"))) << "step " << step;
  }
}

TEST(CgroupCpuQuotaTest, v2_writes_cpu_max_and_restores_the_original_bytes) {
  FakeKernel kernel;
  kernel.write("job/cpu.max", "max 100000\n");
  const JobCgroup job{CgroupVersion::v2, kernel.cg("job"), kernel.cg("job")};
  {
    CpuQuota quota(job, kernel.files());
    ASSERT_TRUE(quota.set_fraction(0.5));
    EXPECT_EQ(slurp(kernel.cg("job/cpu.max")), "50000 100000\n");
    EXPECT_DOUBLE_EQ(quota.current()->value(), 0.5);
    ASSERT_TRUE(quota.set_fraction(2.0));
    EXPECT_EQ(slurp(kernel.cg("job/cpu.max")), "200000 100000\n");
    ASSERT_TRUE(quota.clear());
    EXPECT_FALSE(quota.current()->has_value());
    ASSERT_TRUE(quota.set_fraction(0.25));
    ASSERT_TRUE(quota.restore());
    EXPECT_EQ(slurp(kernel.cg("job/cpu.max")), "max 100000\n");
    const auto writes = kernel.log.size();
    ASSERT_TRUE(quota.restore());
    EXPECT_EQ(kernel.log.size(), writes);  // idempotent: nothing written twice
    ASSERT_TRUE(quota.set_fraction(1.5));
  }
  EXPECT_EQ(slurp(kernel.cg("job/cpu.max")), "max 100000\n");  // the destructor restores
}

TEST(CgroupCpuQuotaTest, v1_writes_cfs_quota_against_the_period) {
  FakeKernel kernel;
  kernel.write("cpu/job/cpu.cfs_quota_us", "-1\n");
  kernel.write("cpu/job/cpu.cfs_period_us", "50000\n");
  CpuQuota quota(JobCgroup{CgroupVersion::v1, kernel.cg("cpu/job"), {}}, kernel.files());
  ASSERT_TRUE(quota.set_fraction(0.5));
  EXPECT_EQ(slurp(kernel.cg("cpu/job/cpu.cfs_quota_us")), "25000\n");
  EXPECT_DOUBLE_EQ(quota.current()->value(), 0.5);
  ASSERT_TRUE(quota.clear());
  EXPECT_EQ(slurp(kernel.cg("cpu/job/cpu.cfs_quota_us")), "-1\n");
  ASSERT_TRUE(quota.set_fraction(3));
  ASSERT_TRUE(quota.restore());
  EXPECT_EQ(slurp(kernel.cg("cpu/job/cpu.cfs_quota_us")), "-1\n");
  EXPECT_EQ(slurp(kernel.cg("cpu/job/cpu.cfs_period_us")), "50000\n");  // only read
}

TEST(CgroupCpuQuotaTest, rejects_nonsense_and_names_the_file_when_denied) {
  FakeKernel kernel;
  kernel.write("job/cpu.max", "max 100000\n");
  CpuQuota quota(JobCgroup{CgroupVersion::v2, kernel.cg("job"), kernel.cg("job")}, kernel.files());
  for (double bad : {0.0, -1.0, std::nan(""), HUGE_VAL, 0.001}) {
    auto status = quota.set_fraction(bad);
    ASSERT_FALSE(status) << bad;
    EXPECT_EQ(status.error().code, ErrorCode::invalid_argument);
  }
  EXPECT_TRUE(has(quota.set_fraction(0.005).error().message, "minimum quota of 1000 µs per 100000 µs period"));
  kernel.fail_name = "cpu.max";
  auto denied = quota.set_fraction(0.5);
  ASSERT_FALSE(denied);
  EXPECT_EQ(denied.error().code, ErrorCode::permission_denied);
  EXPECT_EQ(denied.error().message, "cannot write " + kernel.cg("job/cpu.max").string() +
                                        ": permission denied (jouled needs a delegated cgroup: Delegate=yes in its "
                                        "unit, or root)");
  EXPECT_EQ(slurp(kernel.cg("job/cpu.max")), "max 100000\n");
}

TEST(JobControlPauseTest, v2_freezer_waits_for_frozen_and_restore_puts_the_bytes_back) {
  FakeKernel kernel;
  kernel.write("job/cgroup.freeze", "0\n");
  kernel.write("job/cgroup.events", "populated 1\nfrozen 0\n");
  JobPauser pauser(200, JobCgroup{CgroupVersion::v2, {}, kernel.cg("job")}, kernel.files());
  EXPECT_EQ(pauser.mechanism(), "freezer");
  ASSERT_TRUE(pauser.pause());
  EXPECT_TRUE(pauser.paused());
  EXPECT_EQ(slurp(kernel.cg("job/cgroup.events")), "populated 1\nfrozen 1\n");
  ASSERT_TRUE(pauser.resume());
  EXPECT_EQ(slurp(kernel.cg("job/cgroup.freeze")), "0\n");
  ASSERT_TRUE(pauser.pause());
  ASSERT_TRUE(pauser.restore());
  EXPECT_FALSE(pauser.paused());
  EXPECT_EQ(slurp(kernel.cg("job/cgroup.freeze")), "0\n");
  EXPECT_EQ(slurp(kernel.cg("job/cgroup.events")), "populated 1\nfrozen 0\n");
  const auto writes = kernel.log.size();
  ASSERT_TRUE(pauser.restore());
  EXPECT_EQ(kernel.log.size(), writes);
}

TEST(JobControlPauseTest, v1_freezer_state_and_a_freezer_that_never_settles) {
  FakeKernel kernel;
  kernel.write("freezer/job/freezer.state", "THAWED\n");
  kernel.stuck = true;
  {
    JobPauser pauser(200, JobCgroup{CgroupVersion::v1, {}, kernel.cg("freezer/job")}, kernel.files(),
                     std::chrono::milliseconds(0));
    auto status = pauser.pause();
    ASSERT_FALSE(status);
    EXPECT_EQ(status.error().code, ErrorCode::unavailable);
    EXPECT_TRUE(has(status.error().message, "did not report frozen within 0 ms (it reads \"FREEZING\")"))
        << status.error().message;
    EXPECT_TRUE(pauser.paused());  // requested: restore must undo it
    kernel.stuck = false;
    ASSERT_TRUE(pauser.pause());
    EXPECT_EQ(slurp(kernel.cg("freezer/job/freezer.state")), "FROZEN\n");
  }
  EXPECT_EQ(slurp(kernel.cg("freezer/job/freezer.state")), "THAWED\n");  // the destructor thaws
}

TEST(JobControlPauseTest, sigstop_stops_and_continues_a_real_process_group) {
  const pid_t pid = spawn_sleep_in_own_group();
  ASSERT_GT(pid, 0);
  {
    JobPauser pauser(pid, JobCgroup{CgroupVersion::v1, "/nonexistent/cpu", {}});  // no freezer: signals
    EXPECT_EQ(pauser.mechanism(), "sigstop");
    ASSERT_TRUE(pauser.pause());
    EXPECT_TRUE(reaches_stopped(pid, true));
    ASSERT_TRUE(pauser.resume());
    EXPECT_TRUE(reaches_stopped(pid, false));
    ASSERT_TRUE(pauser.pause());
    EXPECT_TRUE(reaches_stopped(pid, true));
  }
  EXPECT_TRUE(reaches_stopped(pid, false));  // the destructor continues it
  kill_and_reap(pid);
}

namespace {

class FakeNvmlScript {
 public:
  explicit FakeNvmlScript(const std::string& text) {
    ::setenv("JOULE_FAKE_NVML_SCRIPT", dir_.write("nvml.script", text + "log " + log().string() + "\n").c_str(), 1);
  }
  ~FakeNvmlScript() { ::unsetenv("JOULE_FAKE_NVML_SCRIPT"); }
  path log() const { return dir_ / "nvml.log"; }

 private:
  TempDir dir_;
};

}  // namespace

TEST(GpuPowerLimitTest, sets_clamps_and_restores_the_saved_limit) {
  FakeNvmlScript script("limit_mw 250000\nlimit_constraints_mw 100000 300000\n");
  auto nvml = NvmlLibrary::open(JOULE_FAKE_NVML);
  ASSERT_TRUE(nvml) << nvml.error().message;
  {
    GpuPowerLimit limit(*nvml, *(*nvml)->device(0), 0);
    auto set = limit.set_watts(200);
    ASSERT_TRUE(set) << set.error().message;
    EXPECT_EQ(set->describe(), "set 200 W");
    auto low = limit.set_watts(50);
    ASSERT_TRUE(low && low->clamped);
    EXPECT_EQ(low->describe(), "asked 50 W, set 100 W (GPU allows 100-300 W)");
    EXPECT_DOUBLE_EQ(limit.set_watts(400)->applied_watts, 300);
    EXPECT_DOUBLE_EQ(*limit.current_watts(), 300);
    ASSERT_TRUE(limit.restore());
    EXPECT_DOUBLE_EQ(*limit.current_watts(), 250);
    ASSERT_TRUE(limit.restore());
    EXPECT_EQ(slurp(script.log()), "init\nset_limit 200000\nset_limit 100000\nset_limit 300000\nset_limit 250000\n");
    EXPECT_FALSE(limit.set_watts(0));
    EXPECT_FALSE(limit.set_watts(std::nan("")));
    ASSERT_TRUE(limit.set_watts(150));
  }
  EXPECT_TRUE(slurp(script.log()).ends_with("set_limit 150000\nset_limit 250000\n"));  // the destructor restores
}

TEST(GpuPowerLimitTest, notes_the_original_in_the_journal_before_the_first_write_and_drops_it_once_back) {
  FakeNvmlScript script("limit_mw 250000\nlimit_constraints_mw 100000 300000\n");
  TempDir state;
  auto journal = ControlJournal::open(state / "controls.json");
  ASSERT_TRUE(journal);
  auto nvml = NvmlLibrary::open(JOULE_FAKE_NVML);
  ASSERT_TRUE(nvml) << nvml.error().message;
  GpuPowerLimit limit(*nvml, *(*nvml)->device(0), 2);
  limit.keep_original_in(&*journal);
  ASSERT_TRUE(limit.set_watts(150));
  ASSERT_TRUE(limit.set_watts(120));
  auto on_disk = ControlJournal::open(state / "controls.json");
  ASSERT_TRUE(on_disk && on_disk->entries().size() == 1u);
  EXPECT_EQ(on_disk->entries()[0].key, "nvml:2:power_limit");
  EXPECT_EQ(on_disk->entries()[0].kind, "nvml_power_limit");
  EXPECT_EQ(on_disk->entries()[0].original, "250000");
  EXPECT_EQ(on_disk->entries()[0].index, 2u);
  ASSERT_TRUE(limit.restore());
  EXPECT_TRUE(ControlJournal::open(state / "controls.json")->entries().empty());

  // A journal that cannot be written: the limit is not touched.
  std::filesystem::remove_all(state.path());
  GpuPowerLimit unjournalled(*nvml, *(*nvml)->device(0), 2);
  unjournalled.keep_original_in(&*journal);
  auto refused = unjournalled.set_watts(150);
  ASSERT_FALSE(refused);
  EXPECT_TRUE(has(refused.error().message, "cannot note (before changing it) the power limit of GPU 2"))
      << refused.error().message;
  EXPECT_FALSE(has(slurp(script.log()), "set_limit 150000\nset_limit 120000\nset_limit 250000\nset_limit 150000"));
}

TEST(GpuPowerLimitTest, permission_error_says_root_is_needed) {
  FakeNvmlScript script("set_limit_return 4\n");
  auto nvml = NvmlLibrary::open(JOULE_FAKE_NVML);
  ASSERT_TRUE(nvml);
  GpuPowerLimit limit(*nvml, *(*nvml)->device(0), 3);
  auto denied = limit.set_watts(200);
  ASSERT_FALSE(denied);
  EXPECT_EQ(denied.error().code, ErrorCode::permission_denied);
  EXPECT_EQ(denied.error().message,
            "cannot set the power limit to 200 W of GPU 3: nvmlDeviceSetPowerManagementLimit: Insufficient "
            "Permissions (4) (needs root or CAP_SYS_ADMIN)");
  EXPECT_TRUE(limit.restore());  // nothing was changed
}

TEST(CgroupRealV1Test, freezes_and_caps_a_real_process_in_a_child_cgroup) {
  JobCgroups cgroups;  // the real /sys/fs/cgroup and /proc
  if (!cgroups.detect(::getpid()) || cgroups.version() != CgroupVersion::v1)
    GTEST_SKIP() << "needs writable cgroup v1 cpu and freezer hierarchies; here: " << cgroups.describe();
  const pid_t pid = spawn_sleep_in_own_group();
  ASSERT_GT(pid, 0);
  const std::string id = "joule-test-" + std::to_string(::getpid());
  struct Cleanup {  // always, even after a failed assertion: thaw, kill, remove
    JobCgroups& cgroups;
    std::string id;
    pid_t pid;
    ~Cleanup() {
      std::ofstream("/sys/fs/cgroup/freezer/job-" + id + "/freezer.state") << "THAWED\n";
      kill_and_reap(pid);
      (void)cgroups.remove(id);
    }
  } cleanup{cgroups, id, pid};
  auto job = cgroups.create_for(id, pid);
  ASSERT_TRUE(job) << job.error().message;
  if (job->freezer_dir.empty() || job->cpu_dir.empty())
    GTEST_SKIP() << "no v1 cpu or freezer here: " << cgroups.describe();
  EXPECT_TRUE(has(slurp(job->freezer_dir / "cgroup.procs"), std::to_string(pid)));
  JobPauser pauser(pid, *job);
  ASSERT_EQ(pauser.mechanism(), "freezer");
  ASSERT_TRUE(pauser.pause());
  EXPECT_EQ(slurp(job->freezer_dir / "freezer.state"), "FROZEN\n");
  ASSERT_TRUE(pauser.restore());
  EXPECT_EQ(slurp(job->freezer_dir / "freezer.state"), "THAWED\n");
  CpuQuota quota(*job);
  ASSERT_TRUE(quota.set_fraction(0.5));
  EXPECT_DOUBLE_EQ(quota.current()->value(), 0.5);
  ASSERT_TRUE(quota.restore());
  EXPECT_EQ(slurp(job->cpu_dir / "cpu.cfs_quota_us"), "-1\n");
}

// The kernel itself keeps a fenced job off a GPU node it does not hold: a character device of
// NVIDIA's major made here (no driver behind it) opens with ENXIO, unless the job's cgroup denies
// it (EPERM). v1 through JobCgroups on this host's devices hierarchy; v2 through the device filter
// program on the unified hierarchy of a hybrid host (the program is checked at every open).
namespace {

struct GpuNodes {
  joule::testing::TempDir dir;
  bool made = ::mknod((dir / "nvidia1").c_str(), S_IFCHR | 0666, makedev(195, 1)) == 0 &&
              ::mknod((dir / "nvidia2").c_str(), S_IFCHR | 0666, makedev(195, 2)) == 0;
  // A process in its own group that waits `delay` seconds, then opens both nodes and writes the
  // errno of each (0: opened) to `out`.
  pid_t spawn_opener(double delay) const {
    const std::string script = fmt::format(
        "import os, sys, time\ntime.sleep({})\nout = []\nfor node in ('nvidia1', 'nvidia2'):\n"
        "    try:\n        os.close(os.open(os.path.join(sys.argv[1], node), os.O_RDONLY))\n        out.append(0)\n"
        "    except OSError as e:\n        out.append(e.errno)\nopen(sys.argv[2], 'w').write(' '.join(map(str, "
        "out)))\n",
        delay);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    pid_t pid = 0;
    const std::string where = dir.path().string(), out = (dir / "errnos").string();
    char* argv[] = {const_cast<char*>("python3"),     const_cast<char*>("-c"),        const_cast<char*>(script.c_str()),
                    const_cast<char*>(where.c_str()), const_cast<char*>(out.c_str()), nullptr};
    EXPECT_EQ(::posix_spawnp(&pid, "python3", nullptr, &attr, argv, environ), 0);
    posix_spawnattr_destroy(&attr);
    return pid;
  }
  std::string errnos_after(pid_t pid) const {
    ::waitpid(pid, nullptr, 0);
    return slurp(dir / "errnos");
  }
};

}  // namespace

TEST(CgroupRealV1Test, a_job_fenced_off_a_gpu_cannot_open_its_node) {
  JobCgroups cgroups;
  if (!cgroups.detect(::getpid()) || cgroups.version() != CgroupVersion::v1)
    GTEST_SKIP() << "needs writable cgroup v1 hierarchies; here: " << cgroups.describe();
  const GpuNodes nodes;
  if (!nodes.made) GTEST_SKIP() << "cannot make device nodes here (needs root on a filesystem without nodev)";
  const pid_t pid = nodes.spawn_opener(0.5);
  ASSERT_GT(pid, 0);
  const std::string id = "joule-fence-" + std::to_string(::getpid());
  auto job = cgroups.create_for(id, pid, {}, {1});
  ASSERT_TRUE(job) << job.error().message;
  if (job->fenced_gpus.empty()) {
    kill_and_reap(pid);
    (void)cgroups.remove(id);
    GTEST_SKIP() << "no devices hierarchy: " << job->gpu_fence_note;
  }
  const std::string errnos = nodes.errnos_after(pid);
  (void)cgroups.remove(id);
  EXPECT_EQ(errnos, fmt::format("{} {}", EPERM, ENXIO)) << "GPU 1 denied, GPU 2 (no driver) not";
}

TEST(CgroupRealV2Test, the_device_filter_program_keeps_a_process_off_the_gpus_it_lists) {
  const std::filesystem::path unified =
      std::filesystem::exists("/sys/fs/cgroup/cgroup.controllers") ? "/sys/fs/cgroup" : "/sys/fs/cgroup/unified";
  const auto dir = unified / ("joule-fence-" + std::to_string(::getpid()));
  if (::mkdir(dir.c_str(), 0755) != 0)
    GTEST_SKIP() << "cannot make a cgroup under " << unified << ": " << std::strerror(errno);
  struct Cleanup {
    std::filesystem::path dir;
    ~Cleanup() { ::rmdir(dir.c_str()); }
  } cleanup{dir};
  const GpuNodes nodes;
  if (!nodes.made) GTEST_SKIP() << "cannot make device nodes here (needs root on a filesystem without nodev)";
  const Status fenced = joule::adapters::fence_gpus_v2(dir, {1});
  if (!fenced) GTEST_SKIP() << fenced.error().message;
  const pid_t pid = nodes.spawn_opener(0.5);
  ASSERT_GT(pid, 0);
  std::ofstream(dir / "cgroup.procs") << pid << "\n";
  const std::string errnos = nodes.errnos_after(pid);
  EXPECT_EQ(errnos, fmt::format("{} {}", EPERM, ENXIO)) << "GPU 1 denied, GPU 2 (no driver) not";
}
