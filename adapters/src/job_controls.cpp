#include "joule/adapters/job_controls.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "control_files.hpp"
#include "joule/adapters/control_journal.hpp"
#include "joule/adapters/gpu_fence.hpp"
#include "joule/adapters/job_process.hpp"
#include "joule/adapters/sysfs.hpp"

namespace joule::adapters {
namespace {

using detail::complete;
using detail::file_error;
using detail::read_file;
using detail::with_prefix;
using std::filesystem::path;

constexpr std::string_view kDelegateHint = "jouled needs a delegated cgroup: Delegate=yes in its unit, or root";

int system_read(const path& file, std::string& text) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  text.clear();
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      ::close(fd);
      return err;
    }
    text.append(buffer, static_cast<std::size_t>(n));
  }
}

int system_write(const path& file, std::string_view text) {
  // O_TRUNC so that a plain file holds exactly the value, as the kernel's attribute would.
  const int fd = ::open(file.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) return errno;
  ssize_t n = 0;
  do {
    n = ::write(fd, text.data(), text.size());
  } while (n < 0 && errno == EINTR);
  // cgroupfs rejects a value (EINVAL, EBUSY...) in write(2) itself.
  const int err = n < 0 ? errno : (static_cast<std::size_t>(n) == text.size() ? 0 : EIO);
  ::close(fd);
  return err;
}

// The value of `key` in a flat-keyed file ("frozen 1" in cgroup.events).
std::optional<std::string> keyed_value(std::string_view text, std::string_view key) {
  std::istringstream lines{std::string(text)};
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string name, value;
    if (words >> name >> value && name == key) return value;
  }
  return std::nullopt;
}

std::vector<pid_t> parse_pids(std::string_view text) {
  std::vector<pid_t> pids;
  std::istringstream words{std::string(text)};
  for (pid_t pid = 0; words >> pid;) pids.push_back(pid);
  return pids;
}

// The members of process group `pgid`: fields 3-5 of /proc/PID/stat, after the command name, are
// state, ppid and pgrp.
std::vector<pid_t> group_members(const path& proc_root, pid_t pgid) {
  std::vector<pid_t> members;
  for (const auto& entry : sorted_entries(proc_root)) {
    const std::string name = entry.filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry / "stat");
    std::string line;
    if (!std::getline(in, line)) continue;
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(line.substr(close + 1));
    std::string state;
    long parent = 0, group = 0;
    if (fields >> state >> parent >> group && group == pgid) members.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return members;
}

bool valid_job_id(const std::string& id) {
  return !id.empty() && id.size() <= 200 && id.front() != '.' && std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

std::string watts_text(double watts) { return fmt::format("{:g} W", watts); }

// `base/relative`, without the trailing separator an empty relative part would add (the root
// cgroup "/"), so that paths compare equal.
path under(const path& base, const path& relative) { return relative.empty() ? base : base / relative; }

}  // namespace

namespace detail {

// The hint says what to do; callers pass their own where the default would mislead.
Error file_error(int err, std::string_view action, const path& file, std::string_view hint) {
  ErrorCode code = ErrorCode::io;
  std::string why = std::strerror(err);
  std::string_view fallback;
  switch (err) {
    case EACCES:
    case EPERM:
      code = ErrorCode::permission_denied;
      why = "permission denied";
      fallback = kDelegateHint;
      break;
    case EROFS:
      code = ErrorCode::permission_denied;
      why = "read-only file system";
      fallback = "cgroupfs is mounted read-only here, as in most containers";
      break;
    case ENOENT:
      code = ErrorCode::unavailable;
      why = "no such file or directory";
      break;
    case EBUSY:
      code = ErrorCode::conflict;
      why = "device or resource busy";
      break;
    case EINVAL:
      code = ErrorCode::invalid_argument;
      why = "invalid argument";
      break;
    case ESRCH:
      code = ErrorCode::not_found;
      why = "no such process";
      break;
    default:
      break;
  }
  if (hint.empty()) hint = fallback;
  return make_error(code, fmt::format("cannot {} {}: {}{}", action, file.string(), why,
                                      hint.empty() ? std::string() : fmt::format(" ({})", hint)));
}

Error with_prefix(const Error& error, std::string_view prefix) {
  return make_error(error.code, fmt::format("{}: {}", prefix, error.message), error.where);
}

Result<std::string> read_file(const ControlFiles& files, const path& file) {
  std::string text;
  if (const int err = files.read(file, text)) return file_error(err, "read", file);
  return text;
}

// Fills what a caller left out with the real calls.
ControlFiles complete(ControlFiles files) {
  const ControlFiles real = ControlFiles::system();
  if (!files.read) files.read = real.read;
  if (!files.write) files.write = real.write;
  if (!files.make_dir) files.make_dir = real.make_dir;
  if (!files.remove_dir) files.remove_dir = real.remove_dir;
  return files;
}

}  // namespace detail

ControlFiles ControlFiles::system() {
  return ControlFiles{system_read, system_write,
                      [](const path& dir) { return ::mkdir(dir.c_str(), 0755) == 0 ? 0 : errno; },
                      [](const path& dir) { return ::rmdir(dir.c_str()) == 0 ? 0 : errno; }};
}

std::string_view to_string(CgroupVersion version) { return version == CgroupVersion::v1 ? "v1" : "v2"; }

// ---------------------------------------------------------------------------------------------
// JobPauser

JobPauser::JobPauser(pid_t pgid, std::optional<JobCgroup> cgroup, ControlFiles files,
                     std::chrono::milliseconds settle_timeout)
    : pgid_(pgid), files_(complete(std::move(files))), settle_timeout_(settle_timeout) {
  if (cgroup && !cgroup->freezer_dir.empty()) cgroup_ = std::move(cgroup);
}

JobPauser::~JobPauser() { (void)restore(); }

std::string_view JobPauser::mechanism() const { return cgroup_ ? "freezer" : "sigstop"; }

std::string JobPauser::describe() const {
  if (cgroup_) return fmt::format("{} of {}", state_file().filename().string(), cgroup_->freezer_dir.string());
  return fmt::format("SIGSTOP of process group {}", pgid_);
}

path JobPauser::state_file() const { return cgroup_->freezer_dir / (v2() ? "cgroup.freeze" : "freezer.state"); }

Status JobPauser::pause() {
  if (cgroup_) return set_frozen(true);
  if (auto sent = signal_process_group(pgid_, SIGSTOP); !sent) return with_prefix(sent.error(), "cannot pause the job");
  paused_ = dirty_ = true;
  return {};
}

Status JobPauser::resume() {
  if (cgroup_) return set_frozen(false);
  if (auto sent = signal_process_group(pgid_, SIGCONT); !sent)
    return with_prefix(sent.error(), "cannot resume the job");
  paused_ = false;
  return {};
}

Status JobPauser::set_frozen(bool frozen) {
  const path file = state_file();
  if (!original_) {
    auto text = read_file(files_, file);
    if (!text) return text.error();
    original_ = std::move(*text);
  }
  const char* value = v2() ? (frozen ? "1\n" : "0\n") : (frozen ? "FROZEN\n" : "THAWED\n");
  if (const int err = files_.write(file, value)) return file_error(err, "write", file);
  dirty_ = true;
  paused_ = frozen;
  return wait_until(frozen);
}

Result<bool> JobPauser::is_state(bool frozen) const {
  if (v2()) {
    const path events = cgroup_->freezer_dir / "cgroup.events";
    auto text = read_file(files_, events);
    if (!text) return text.error();
    const auto value = keyed_value(*text, "frozen");
    if (!value)
      return make_error(ErrorCode::unavailable,
                        fmt::format("{} has no \"frozen\" key (kernel < 5.2?)", events.string()));
    return *value == (frozen ? "1" : "0");
  }
  auto text = read_file(files_, state_file());
  if (!text) return text.error();
  return trim(*text) == (frozen ? "FROZEN" : "THAWED");
}

Status JobPauser::wait_until(bool frozen) const {
  // Freezing waits for every task to reach a safe point: usually well under a millisecond, longer
  // for a task in uninterruptible sleep (D state, NFS, a GPU driver call).
  const auto deadline = std::chrono::steady_clock::now() + settle_timeout_;
  for (;;) {
    auto reached = is_state(frozen);
    if (!reached) return reached.error();
    if (*reached) return {};
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      std::string last;
      (void)files_.read(v2() ? cgroup_->freezer_dir / "cgroup.events" : state_file(), last);
      return make_error(ErrorCode::unavailable,
                        fmt::format("{} did not report {} within {} ms (it reads \"{}\"); a task in uninterruptible "
                                    "sleep holds it up, and resume() undoes the request",
                                    cgroup_->freezer_dir.string(), frozen ? "frozen" : "thawed",
                                    settle_timeout_.count(), trim(last)));
    }
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(std::chrono::milliseconds(2), deadline - now));
  }
}

Status JobPauser::restore() {
  if (!dirty_) return {};
  if (!cgroup_) {
    if (auto sent = signal_process_group(pgid_, SIGCONT); !sent) return sent.error();
  } else {
    const path file = state_file();
    const bool original_runs = original_ && trim(*original_) == (v2() ? "0" : "THAWED");
    const std::string value = original_runs ? *original_ : (v2() ? "0\n" : "THAWED\n");
    const int err = files_.write(file, value);
    if (err != 0 && err != ENOENT) return file_error(err, "write", file);
    if (err == 0) {
      if (auto settled = wait_until(false); !settled) return settled;
    }
  }
  dirty_ = paused_ = false;
  return {};
}

// ---------------------------------------------------------------------------------------------
// CpuQuota

CpuQuota::CpuQuota(JobCgroup cgroup, ControlFiles files)
    : cgroup_(std::move(cgroup)), files_(complete(std::move(files))) {}

CpuQuota::~CpuQuota() { (void)restore(); }

path CpuQuota::quota_file() const {
  return cgroup_.cpu_dir / (cgroup_.version == CgroupVersion::v2 ? "cpu.max" : "cpu.cfs_quota_us");
}

std::string CpuQuota::describe() const {
  return fmt::format("{} of {}", quota_file().filename().string(), cgroup_.cpu_dir.string());
}

Result<std::int64_t> CpuQuota::period_us() const {
  if (cgroup_.version == CgroupVersion::v1) {
    const path file = cgroup_.cpu_dir / "cpu.cfs_period_us";
    auto text = read_file(files_, file);
    if (!text) return text.error();
    return parse_signed(*text, file);
  }
  auto text = read_file(files_, quota_file());
  if (!text) return text.error();
  std::istringstream words{std::string(*text)};
  std::string quota, period;
  if (!(words >> quota >> period))
    return make_error(ErrorCode::io,
                      fmt::format("{}: not \"QUOTA PERIOD\": \"{}\"", quota_file().string(), trim(*text)));
  return parse_signed(period, quota_file());
}

Status CpuQuota::write_quota(std::optional<std::int64_t> quota_us, std::int64_t period_us) {
  const path file = quota_file();
  if (!original_) {
    auto text = read_file(files_, file);
    if (!text) return text.error();
    original_ = std::move(*text);
  }
  const std::string quota =
      quota_us ? std::to_string(*quota_us) : (cgroup_.version == CgroupVersion::v2 ? "max" : "-1");
  const std::string value =
      cgroup_.version == CgroupVersion::v2 ? fmt::format("{} {}\n", quota, period_us) : quota + "\n";
  if (const int err = files_.write(file, value))
    return file_error(err, "write", file,
                      err == EINVAL
                          ? "the kernel refused " + std::string(trim(value)) + "; a v1 parent's own quota may be lower"
                          : "");
  dirty_ = true;
  return {};
}

Status CpuQuota::set_fraction(double cpus) {
  if (!(cpus > 0) || !(cpus <= kMaxCpus))
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("a CPU quota must be a number of CPUs in (0, {:g}], not {}", kMaxCpus, cpus));
  if (cgroup_.cpu_dir.empty())
    return make_error(ErrorCode::unavailable, "the job's cgroup has no cpu controller: no CPU quota");
  auto period = period_us();
  if (!period) return period.error();
  const auto quota = static_cast<std::int64_t>(std::llround(cpus * static_cast<double>(*period)));
  if (quota < kMinQuotaUs)
    return make_error(
        ErrorCode::invalid_argument,
        fmt::format("{} CPU is under the kernel's minimum quota of {} µs per {} µs period ({:g} CPU)", cpus,
                    kMinQuotaUs, *period, static_cast<double>(kMinQuotaUs) / static_cast<double>(*period)));
  return write_quota(quota, *period);
}

Status CpuQuota::clear() {
  if (cgroup_.cpu_dir.empty())
    return make_error(ErrorCode::unavailable, "the job's cgroup has no cpu controller: no CPU quota");
  auto period = period_us();
  if (!period) return period.error();
  return write_quota(std::nullopt, *period);
}

Result<std::optional<double>> CpuQuota::current() const {
  if (cgroup_.cpu_dir.empty())
    return make_error(ErrorCode::unavailable, "the job's cgroup has no cpu controller: no CPU quota");
  auto text = read_file(files_, quota_file());
  if (!text) return text.error();
  auto period = period_us();
  if (!period) return period.error();
  std::istringstream words{std::string(*text)};
  std::string quota;
  words >> quota;
  if (quota == "max" || quota == "-1") return std::optional<double>();
  auto value = parse_signed(quota, quota_file());
  if (!value) return value.error();
  return std::optional<double>(static_cast<double>(*value) / static_cast<double>(*period));
}

Status CpuQuota::restore() {
  if (!dirty_ || !original_) return {};
  const path file = quota_file();
  const int err = files_.write(file, *original_);
  if (err != 0 && err != ENOENT) return file_error(err, "write", file);
  dirty_ = false;
  return {};
}

// ---------------------------------------------------------------------------------------------
// JobCgroups

JobCgroups::JobCgroups(path cgroup_root, path proc_root, ControlFiles files)
    : cgroup_root_(std::move(cgroup_root)), proc_root_(std::move(proc_root)), files_(complete(std::move(files))) {}

Status JobCgroups::unusable(Error error) {
  usable_ = false;
  reason_ = error.message;
  return error;
}

Status JobCgroups::probe(const path& dir) const {
  const path child = dir / fmt::format("joule-probe-{}", ::getpid());
  const int err = files_.make_dir(child);
  if (err != 0 && err != EEXIST) return file_error(err, "create a cgroup in", dir);
  (void)files_.remove_dir(child);
  return {};
}

Status JobCgroups::detect(pid_t daemon_pid) {
  usable_ = false;
  v2_prepared_ = v2_cpu_ = v2_cpuset_ = false;
  cpu_note_.clear();
  cpuset_note_ = "cgroup v1: the cpuset hierarchy is not used";
  v1_cpu_.clear();
  v1_freezer_.clear();
  v1_devices_.clear();
  gpu_fence_note_.clear();
  const path list = proc_root_ / std::to_string(daemon_pid) / "cgroup";
  auto text = read_file(files_, list);
  if (!text) return unusable(text.error());

  std::optional<std::string> unified;
  std::istringstream lines(*text);
  for (std::string line; std::getline(lines, line);) {
    const auto first = line.find(':');
    const auto second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const path relative = path(line.substr(second + 1)).relative_path();
    if (controllers.empty()) {
      unified = relative.string();
      continue;
    }
    std::istringstream names(controllers);
    for (std::string name; std::getline(names, name, ',');) {
      if (name != "cpu" && name != "freezer" && name != "devices") continue;
      // "cpu,cpuacct" is mounted at <root>/cpu,cpuacct on most distributions, at <root>/cpu alone.
      for (const std::string& mount : {controllers, name}) {
        std::error_code ec;
        if (std::filesystem::is_directory(cgroup_root_ / mount, ec)) {
          (name == "cpu"       ? v1_cpu_
           : name == "freezer" ? v1_freezer_
                               : v1_devices_) = under(cgroup_root_ / mount, relative);
          break;
        }
      }
    }
  }

  if (!v1_cpu_.empty() || !v1_freezer_.empty()) {
    version_ = CgroupVersion::v1;
    std::vector<Error> dropped;
    std::vector<std::string> dropped_dirs;
    for (path* dir : {&v1_cpu_, &v1_freezer_}) {
      if (dir->empty()) continue;
      if (auto ok = probe(*dir); !ok) {
        dropped.push_back(ok.error());
        dropped_dirs.push_back(dir->string());
        dir->clear();
      }
    }
    if (v1_cpu_.empty() && v1_freezer_.empty()) {
      Error why = dropped.front();
      if (dropped.size() > 1) why.message += fmt::format("; {} likewise", dropped_dirs.back());
      return unusable(why);
    }
    if (v1_cpu_.empty()) cpu_note_ = dropped.empty() ? "no v1 cpu hierarchy is mounted" : dropped.front().message;
    // The devices hierarchy only fences GPUs: without it, jobs are made as before.
    if (!v1_devices_.empty()) {
      if (auto ok = probe(v1_devices_); !ok) {
        gpu_fence_note_ = ok.error().message;
        v1_devices_.clear();
      }
    } else {
      gpu_fence_note_ = "cgroup v1: no devices hierarchy is mounted";
    }
    usable_ = true;
    return {};
  }

  std::error_code ec;
  if (!unified || !std::filesystem::exists(cgroup_root_ / "cgroup.controllers", ec)) {
    return unusable(
        make_error(ErrorCode::unavailable,
                   fmt::format("no cgroup v2 at {} and no v1 cpu or freezer hierarchy there for pid {} ({})",
                               cgroup_root_.string(), daemon_pid, list.string())));
  }
  version_ = CgroupVersion::v2;
  v2_own_ = under(cgroup_root_, *unified);
  if (v2_own_ != cgroup_root_ && v2_own_.filename().string() == kDaemonLeaf)
    v2_own_ = v2_own_.parent_path();  // already moved there
  if (auto ok = probe(v2_own_); !ok) return unusable(ok.error());
  auto controllers = read_file(files_, v2_own_ / "cgroup.controllers");
  if (!controllers) return unusable(controllers.error());
  std::istringstream names(*controllers);
  for (std::string name; names >> name;) {
    v2_cpu_ = v2_cpu_ || name == "cpu";
    v2_cpuset_ = v2_cpuset_ || name == "cpuset";
  }
  if (!v2_cpuset_) cpuset_note_ = fmt::format("the cpuset controller is not delegated to {}", v2_own_.string());
  if (!v2_cpu_)
    cpu_note_ = fmt::format("the cpu controller is not delegated to {} (cgroup.controllers: \"{}\")", v2_own_.string(),
                            trim(*controllers));
  usable_ = true;
  return {};
}

std::string JobCgroups::describe() const {
  if (!usable_) return fmt::format("unavailable: {}; jobs are paused with SIGSTOP and get no CPU quota", reason_);
  std::string notes = cpu_note_.empty() ? std::string() : fmt::format(" (no CPU quota: {})", cpu_note_);
  if (version_ == CgroupVersion::v1 && v1_freezer_.empty()) notes += " (no freezer: pauses use SIGSTOP)";
  if (version_ == CgroupVersion::v2) return fmt::format("cgroup v2: job cgroups under {}{}", v2_own_.string(), notes);
  std::vector<std::string> dirs;
  for (const path& dir : {v1_cpu_, v1_freezer_, v1_devices_})
    if (!dir.empty()) dirs.push_back(dir.string());
  if (v1_devices_.empty() && !gpu_fence_note_.empty()) notes += fmt::format(" (GPUs not fenced: {})", gpu_fence_note_);
  return fmt::format("cgroup v1: job cgroups under {}{}", fmt::join(dirs, ", "), notes);
}

Status JobCgroups::move_all_to_leaf() {
  const path leaf = v2_own_ / kDaemonLeaf;
  if (const int err = files_.make_dir(leaf); err != 0 && err != EEXIST) return file_error(err, "create", leaf);
  auto procs = read_file(files_, v2_own_ / "cgroup.procs");
  if (!procs) return procs.error();
  for (const pid_t pid : parse_pids(*procs)) {
    const int err = files_.write(leaf / "cgroup.procs", std::to_string(pid) + "\n");
    if (err != 0 && err != ESRCH) return file_error(err, fmt::format("move process {} to", pid), leaf / "cgroup.procs");
  }
  return {};
}

Status JobCgroups::prepare_v2() {
  if (v2_prepared_) return {};
  // The root is exempt from the "no internal processes" rule; a cgroup namespace's root is not,
  // which the EBUSY below finds out.
  if (v2_own_ != cgroup_root_) {
    if (auto moved = move_all_to_leaf(); !moved) return unusable(moved.error());
  }
  if (v2_cpu_) {
    const path control = v2_own_ / "cgroup.subtree_control";
    int err = files_.write(control, "+cpu\n");
    if (err == EBUSY) {  // a process appeared in <own> meanwhile (or <own> is a namespace root)
      if (auto moved = move_all_to_leaf(); !moved) return unusable(moved.error());
      err = files_.write(control, "+cpu\n");
    }
    if (err != 0) {
      v2_cpu_ = false;
      cpu_note_ =
          file_error(err, "write", control, err == EBUSY ? "processes keep appearing in the daemon's own cgroup" : "")
              .message;
    }
  }
  if (v2_cpuset_) {
    const path control = v2_own_ / "cgroup.subtree_control";
    if (const int err = files_.write(control, "+cpuset\n"); err != 0) {
      v2_cpuset_ = false;
      cpuset_note_ = file_error(err, "write", control).message;
    }
  }
  v2_prepared_ = true;
  return {};
}

Status JobCgroups::move_job(pid_t pid, const path& dir) {
  const path procs = dir / "cgroup.procs";
  if (const int err = files_.write(procs, std::to_string(pid) + "\n"))
    return file_error(err, fmt::format("move process {} to", pid), procs);
  // The runner may have forked the command before it moved; a process forked by one that did
  // move is born inside. So a few passes catch the group even while it forks.
  std::vector<pid_t> moved = {pid};
  for (int pass = 0; pass < 3; ++pass) {
    bool found = false;
    for (const pid_t member : group_members(proc_root_, pid)) {
      if (std::find(moved.begin(), moved.end(), member) != moved.end()) continue;
      found = true;
      const int err = files_.write(procs, std::to_string(member) + "\n");
      if (err == ESRCH) continue;
      if (err == 0) {
        moved.push_back(member);
        continue;
      }
      // Half a job in its cgroup is worse than none: back to where the daemon started it.
      const path home = version_ == CgroupVersion::v1 ? dir.parent_path()
                        : v2_own_ == cgroup_root_     ? v2_own_
                                                      : v2_own_ / kDaemonLeaf;
      for (const pid_t back : moved) (void)files_.write(home / "cgroup.procs", std::to_string(back) + "\n");
      return file_error(err, fmt::format("move process {} to", member), procs);
    }
    if (!found) break;
  }
  return {};
}

std::vector<path> JobCgroups::job_dirs(const std::string& job_id) const {
  const std::string name = "job-" + job_id;
  if (version_ == CgroupVersion::v2) return {v2_own_ / name};
  std::vector<path> dirs;
  for (const path& parent : {v1_cpu_, v1_freezer_, v1_devices_})
    if (!parent.empty()) dirs.push_back(parent / name);
  return dirs;
}

Result<JobCgroup> JobCgroups::create_for(const std::string& job_id, pid_t pid, const std::vector<int>& cpus,
                                         const std::vector<unsigned>& denied_gpus) {
  if (!valid_job_id(job_id))
    return make_error(ErrorCode::invalid_argument, fmt::format("\"{}\" cannot name a cgroup", job_id));
  if (!usable_) return make_error(ErrorCode::unavailable, "no job cgroups: " + reason_);
  if (version_ == CgroupVersion::v2) {
    if (auto prepared = prepare_v2(); !prepared) return prepared.error();
  }
  std::vector<path> made;
  auto undo = [&](Error error) -> Error {
    for (const path& dir : made) (void)files_.remove_dir(dir);
    return error;
  };
  std::string cpuset_cpus, cpuset_note, gpu_fence_note;
  std::vector<unsigned> fenced_gpus;
  for (const path& dir : job_dirs(job_id)) {
    const int err = files_.make_dir(dir);
    if (err != 0 && err != EEXIST) return undo(file_error(err, "create", dir));
    if (err == 0) made.push_back(dir);
    if (!cpus.empty() && version_ == CgroupVersion::v2) {
      // Before anything moves in: no process of the job ever runs outside its cores.
      const std::string list = cpu_list_text(cpus);
      if (!v2_cpuset_)
        cpuset_note = cpuset_note_;
      else if (const int refused = files_.write(dir / "cpuset.cpus", list + "\n"); refused != 0)
        cpuset_note = file_error(refused, "write", dir / "cpuset.cpus").message;
      else
        cpuset_cpus = list;
    } else if (!cpus.empty()) {
      cpuset_note = "cgroup v1: the cpuset hierarchy is not used";
    }
    // Before it moves in too: no process of the job opens a GPU it does not hold.
    if (!denied_gpus.empty() && (version_ == CgroupVersion::v2 || dir.parent_path() == v1_devices_)) {
      const Status fenced =
          version_ == CgroupVersion::v2 ? fence_gpus_v2(dir, denied_gpus) : fence_gpus_v1(dir, denied_gpus, files_);
      if (fenced)
        fenced_gpus = denied_gpus;
      else
        gpu_fence_note = fenced.error().message;
    }
    if (auto moved = move_job(pid, dir); !moved) return undo(moved.error());
  }
  if (!denied_gpus.empty() && fenced_gpus.empty() && gpu_fence_note.empty()) gpu_fence_note = gpu_fence_note_;
  const auto dirs = job_dirs(job_id);
  if (version_ == CgroupVersion::v2) {
    JobCgroup cgroup{CgroupVersion::v2, v2_cpu_ ? dirs[0] : path(), dirs[0]};
    cgroup.cpuset_cpus = cpuset_cpus;
    cgroup.cpuset_note = cpuset_note;
    cgroup.fenced_gpus = fenced_gpus;
    cgroup.gpu_fence_note = gpu_fence_note;
    return cgroup;
  }
  JobCgroup cgroup{CgroupVersion::v1, v1_cpu_.empty() ? path() : v1_cpu_ / ("job-" + job_id),
                   v1_freezer_.empty() ? path() : v1_freezer_ / ("job-" + job_id)};
  cgroup.cpuset_note = cpuset_note;
  cgroup.fenced_gpus = fenced_gpus;
  cgroup.gpu_fence_note = gpu_fence_note;
  return cgroup;
}

Status JobCgroups::remove(const std::string& job_id) {
  if (!usable_ || !valid_job_id(job_id)) return {};
  Status first;
  for (const path& dir : job_dirs(job_id)) {
    const int err = files_.remove_dir(dir);
    if (err == 0 || err == ENOENT || !first.ok()) continue;
    first = file_error(err, "remove", dir, err == EBUSY ? "a process of the job is still in it" : "");
  }
  return first;
}

// ---------------------------------------------------------------------------------------------
// GpuPowerLimit

std::string PowerLimitSetting::describe() const {
  if (!clamped) return "set " + watts_text(applied_watts);
  return fmt::format("asked {}, set {} (GPU allows {:g}-{:g} W)", watts_text(requested_watts),
                     watts_text(applied_watts), min_watts, max_watts);
}

GpuPowerLimit::GpuPowerLimit(std::shared_ptr<NvmlLibrary> nvml, nvml::Device device, unsigned index)
    : nvml_(std::move(nvml)), device_(device), index_(index) {}

GpuPowerLimit::~GpuPowerLimit() { (void)restore(); }

std::string GpuPowerLimit::journal_key(unsigned index) { return fmt::format("nvml:{}:power_limit", index); }

std::string GpuPowerLimit::describe() const { return fmt::format("power limit of GPU {}", index_); }

Error GpuPowerLimit::gpu_error(const Error& error, std::string_view action) const {
  std::string_view hint;
  if (error.code == ErrorCode::permission_denied) hint = " (needs root or CAP_SYS_ADMIN)";
  if (error.code == ErrorCode::unavailable) hint = " (this GPU or driver has no settable power limit)";
  return make_error(error.code, fmt::format("cannot {} of GPU {}: {}{}", action, index_, error.message, hint));
}

Result<double> GpuPowerLimit::current_watts() const {
  auto limit = nvml_->power_limit_mw(device_);
  if (!limit) return gpu_error(limit.error(), "read the power limit");
  return *limit / 1000.0;
}

Result<PowerLimitSetting> GpuPowerLimit::set_watts(double watts) {
  if (!(watts > 0) || !std::isfinite(watts))
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("a GPU power limit must be positive watts, not {}", watts));
  auto range = nvml_->power_limit_constraints(device_);
  if (!range) return gpu_error(range.error(), "read the power limit range");
  if (!original_mw_) {
    auto limit = nvml_->power_limit_mw(device_);
    if (!limit) return gpu_error(limit.error(), "save the power limit");
    if (journal_) {
      if (auto noted = journal_->remember({journal_key(index_), "nvml_power_limit", std::to_string(*limit), index_});
          !noted)
        return gpu_error(noted.error(), "note (before changing it) the power limit");
    }
    original_mw_ = *limit;
  }
  const double wanted_mw = std::clamp(watts * 1000.0, 0.0, 4.0e9);
  const auto applied_mw = std::clamp(static_cast<std::uint32_t>(std::llround(wanted_mw)), range->min_mw, range->max_mw);
  if (auto set = nvml_->set_power_limit_mw(device_, applied_mw); !set)
    return gpu_error(set.error(), "set the power limit to " + watts_text(applied_mw / 1000.0));
  dirty_ = true;
  return PowerLimitSetting{watts, applied_mw / 1000.0, range->min_mw / 1000.0, range->max_mw / 1000.0,
                           static_cast<double>(applied_mw) != std::round(wanted_mw)};
}

Status GpuPowerLimit::restore() {
  if (!dirty_ || !original_mw_) return {};
  if (auto set = nvml_->set_power_limit_mw(device_, *original_mw_); !set)
    return gpu_error(set.error(), "restore the power limit " + watts_text(*original_mw_ / 1000.0));
  dirty_ = false;
  if (journal_) (void)journal_->forget(journal_key(index_));
  return {};
}

}  // namespace joule::adapters
