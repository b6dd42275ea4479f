#include "node_setup.hpp"

#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "joule/adapters/board_power.hpp"
#include "joule/adapters/jetson_power_mode.hpp"
#include "joule/adapters/job_controls.hpp"
#include "joule/adapters/job_process.hpp"
#include "joule/adapters/meter_selection.hpp"
#include "joule/adapters/mig_meter.hpp"
#include "joule/adapters/modelled_cpu_meter.hpp"
#include "joule/adapters/nvml_meter.hpp"
#include "joule/adapters/simulated_meter.hpp"
#include "joule/config/device_names.hpp"
#include "joule/config/policy_config.hpp"
#include "joule/daemon/budget_service.hpp"
#include "joule/daemon/thread_settings.hpp"
#include "joule/estimator/runtime_cost.hpp"
#include "joule/estimator/simulated_device.hpp"

namespace joule::daemon {

namespace {

// Each connection is a descriptor. With max_connections above the descriptor limit, accept
// fails with EMFILE while the server still believes it has room; the soft limit is raised to
// the hard one, and the connection limit lowered to fit what is left after jouled's own
// descriptors (database, meters, pidfds of running jobs).
std::size_t usable_connection_limit(std::size_t wanted) {
  constexpr rlim_t kReserved = 256;
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return wanted;
  if (limit.rlim_cur < limit.rlim_max && limit.rlim_cur < wanted + kReserved) {
    rlimit raised = limit;
    raised.rlim_cur = std::min<rlim_t>(limit.rlim_max, wanted + kReserved);
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= wanted + kReserved) return wanted;
  const std::size_t usable = limit.rlim_cur > 2 * kReserved ? limit.rlim_cur - kReserved : limit.rlim_cur / 2;
  spdlog::warn(
      "server.max_connections = {} does not fit the descriptor limit ({}); serving at most {} connections "
      "(raise LimitNOFILE)",
      wanted, limit.rlim_cur, usable);
  return usable;
}

// How many held long polls fit beside `connections` in the descriptor limit (raised towards
// what they need where the hard limit allows), at most `wanted`.
std::size_t long_poll_room(std::size_t connections, std::size_t wanted) {
  constexpr rlim_t kReserved = 256;
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return wanted;
  const rlim_t needed = connections + wanted + kReserved;
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < needed && limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = std::min<rlim_t>(limit.rlim_max, needed);
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= needed) return wanted;
  const std::size_t room = limit.rlim_cur > connections + kReserved ? limit.rlim_cur - connections - kReserved : 0;
  spdlog::warn(
      "the descriptor limit ({}) leaves room for {} held agent syncs beside {} connections (raise LimitNOFILE)",
      limit.rlim_cur, room, connections);
  return room;
}

// Whether jouled may run jobs as other accounts: as root, or holding CAP_SETUID and CAP_SETGID
// (to switch), CAP_CHOWN (to hand a job its directory) and CAP_KILL (to signal it), as the
// systemd unit grants them.
bool can_switch_users() {
  if (::geteuid() == 0) return true;
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (::syscall(SYS_capget, &header, data) != 0) return false;
  const auto has = [&](int capability) { return (data[capability / 32].effective & (1u << (capability % 32))) != 0; };
  return has(CAP_SETUID) && has(CAP_SETGID) && has(CAP_CHOWN) && has(CAP_KILL);
}

gid_t group_id(const std::string& name) {
  if (const group* entry = ::getgrnam(name.c_str())) return entry->gr_gid;
  throw std::runtime_error(fmt::format("jobs.groups: there is no group {}", name));
}

// An account's groups as login would set them (its primary group included).
std::vector<gid_t> groups_of(const char* name, gid_t primary) {
  int count = 64;
  std::vector<gid_t> groups(static_cast<std::size_t>(count));
  if (::getgrouplist(name, primary, groups.data(), &count) < 0) {
    groups.resize(static_cast<std::size_t>(count));
    ::getgrouplist(name, primary, groups.data(), &count);
  }
  groups.resize(static_cast<std::size_t>(std::max(count, 0)));
  return groups;
}

// The account of a local user who submitted a job over loopback, for the job to run as them.
// Root's and jouled's own jobs get accounts of their own instead: they must not reach the state.
std::optional<adapters::JobIdentity> local_user_identity(std::int64_t uid) {
  if (uid <= 0 || uid >= 0xFFFFFFFF || static_cast<uid_t>(uid) == ::geteuid()) return std::nullopt;
  const auto id = static_cast<uid_t>(uid);
  passwd entry{};
  passwd* found = nullptr;
  std::vector<char> buffer(16384);
  if (::getpwuid_r(id, &entry, buffer.data(), buffer.size(), &found) != 0 || !found)
    return adapters::JobIdentity{id, static_cast<gid_t>(id), {}, {}};  // a uid without a passwd entry
  return adapters::JobIdentity{id, entry.pw_gid, groups_of(entry.pw_name, entry.pw_gid), entry.pw_name};
}

// [jobs] run_as made concrete for this process.
JobAccounts resolve_job_accounts(const config::DaemonConfig& config) {
  JobAccounts accounts;
  if (config.job_run_as == "jouled") {
    accounts.mode = JobAccounts::Mode::daemon;
    spdlog::warn("jobs run as jouled itself ([jobs] run_as = \"jouled\"): they can read and change its state in {}",
                 config.state_directory.string());
    return accounts;
  }
  if (!can_switch_users()) {
    accounts.mode = JobAccounts::Mode::daemon;
    spdlog::warn(
        "jobs run as jouled's own user (uid {}) and can reach its state in {}: jouled switches users only as "
        "root or with CAP_SETUID, CAP_SETGID, CAP_CHOWN and CAP_KILL (the systemd unit grants them); "
        "[jobs] run_as = \"jouled\" says this is meant",
        ::geteuid(), config.state_directory.string());
    return accounts;
  }
  for (const auto& name : config.job_groups) accounts.extra_groups.push_back(group_id(name));
  if (config.job_run_as == "per-job") {
    accounts.mode = JobAccounts::Mode::per_job;
    spdlog::info("jobs run each as an account of its own (uid and gid {} + the job's number)", accounts.uid_base);
    return accounts;
  }
  const passwd* entry = ::getpwnam(config.job_run_as.c_str());
  if (!entry) {
    throw std::runtime_error(
        fmt::format("jobs.run_as: there is no account {} (create it, e.g. useradd --system --no-create-home {}, or use "
                    "\"per-job\")",
                    config.job_run_as, config.job_run_as));
  }
  if (entry->pw_uid == 0 || entry->pw_uid == ::geteuid())
    throw std::runtime_error(
        fmt::format("jobs.run_as: {} is root or jouled's own account; jobs must not run as either", config.job_run_as));
  accounts.mode = JobAccounts::Mode::account;
  accounts.account_name = config.job_run_as;
  accounts.account.uid = entry->pw_uid;
  accounts.account.gid = entry->pw_gid;
  accounts.account.user_name = config.job_run_as;
  accounts.account.groups = groups_of(entry->pw_name, entry->pw_gid);
  accounts.account.groups.insert(accounts.account.groups.end(), accounts.extra_groups.begin(),
                                 accounts.extra_groups.end());
  spdlog::info("jobs run as {} (uid {})", config.job_run_as, entry->pw_uid);
  return accounts;
}

// Jobs get their directories beside the state directory, never inside it: "/var/lib/jouled"
// gives "/var/lib/jouled-jobs" (the unit's second StateDirectory=).
std::filesystem::path job_work_directory(const config::DaemonConfig& config) {
  if (!config.job_work_directory.empty()) return config.job_work_directory;
  auto state = config.state_directory;
  if (state.filename().empty()) state = state.parent_path();
  return state.parent_path() / (state.filename().string() + "-jobs");
}

// The state directory is jouled's alone: others lose any access a umask left them.
void keep_state_private(const std::filesystem::path& state) {
  struct stat info {};
  if (::stat(state.c_str(), &info) != 0 || info.st_uid != ::geteuid() || (info.st_mode & 0007) == 0) return;
  if (::chmod(state.c_str(), info.st_mode & 07770) == 0)
    spdlog::info("state directory {}: access for others removed", state.string());
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  std::string text = name;
  return text.substr(0, text.find('.'));
}

int utc_offset_minutes() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  ::localtime_r(&now, &local);
  return static_cast<int>(local.tm_gmtoff / 60);
}

bool is_executable(const std::filesystem::path& path) { return ::access(path.c_str(), X_OK) == 0; }

// joule-worker: as configured, else beside jouled (an install), else in the build tree's
// worker/ beside daemon/, else on $PATH. Empty when there is none.
std::filesystem::path find_worker(const config::ProbingConfig& probing, const std::filesystem::path& self) {
  if (!probing.worker.empty()) return probing.worker;
  for (const auto& candidate :
       {self.parent_path() / "joule-worker", self.parent_path() / ".." / "worker" / "joule-worker"})
    if (is_executable(candidate)) return std::filesystem::weakly_canonical(candidate);
  if (const char* path = std::getenv("PATH")) {
    std::stringstream dirs(path);
    std::string dir;
    while (std::getline(dirs, dir, ':'))
      if (!dir.empty() && is_executable(std::filesystem::path(dir) / "joule-worker"))
        return std::filesystem::path(dir) / "joule-worker";
  }
  return {};
}

// The Python package `joule` for jobs' PYTHONPATH: installed beside jouled
// (<prefix>/share/joule/python for <prefix>/bin/jouled), else the source tree this jouled was
// built from. Empty when neither has it.
std::filesystem::path find_python_package(const std::filesystem::path& self) {
  std::vector<std::filesystem::path> candidates = {self.parent_path() / ".." / "share" / "joule" / "python"};
#ifdef JOULE_PYTHON_SOURCE_DIR
  candidates.emplace_back(JOULE_PYTHON_SOURCE_DIR);
#endif
  for (const auto& candidate : candidates) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(candidate / "joule" / "__init__.py", ec))
      return std::filesystem::weakly_canonical(candidate, ec);
  }
  return {};
}

// Gives `mode` to `path` and, for a directory, 0755 to it and its directories and `mode` to its
// files; Python's caches are left out.
void open_to_jobs(const std::filesystem::path& path, mode_t mode, std::error_code& ec) {
  if (!std::filesystem::is_directory(path, ec)) {
    std::filesystem::permissions(path, static_cast<std::filesystem::perms>(mode), ec);
    return;
  }
  std::filesystem::permissions(path, static_cast<std::filesystem::perms>(0755), ec);
  std::vector<std::filesystem::path> caches;
  for (auto it = std::filesystem::recursive_directory_iterator(path, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->path().filename() == "__pycache__") {
      caches.push_back(it->path());
      it.disable_recursion_pending();
      continue;
    }
    std::filesystem::permissions(it->path(), static_cast<std::filesystem::perms>(it->is_directory() ? 0755 : mode), ec);
  }
  for (const auto& cache : caches) std::filesystem::remove_all(cache, ec);
}

// What jobs run from jouled's own tree (the Python package joule, joule-worker), where the jobs'
// accounts cannot reach it (a build tree under a 0700 home): copied into `copy` in the jobs'
// directory, which they reach, at every start, and given to them from there. Returns the path
// jobs get: `original` where they reach it (or it is empty), else the copy (the original where
// it cannot be made, which check() then refuses with the directory in the way).
std::filesystem::path within_jobs_reach(const std::filesystem::path& original, const std::filesystem::path& reached,
                                        mode_t access, const std::filesystem::path& copy, mode_t mode,
                                        const adapters::JobIdentity& identity, const char* what) {
  if (original.empty()) return original;
  const auto why = adapters::unreachable_by(reached, identity, access);
  if (!why) return original;
  std::error_code ec;
  std::filesystem::remove_all(copy, ec);
  std::filesystem::create_directories(copy.parent_path(), ec);
  if (!ec) std::filesystem::permissions(copy.parent_path(), static_cast<std::filesystem::perms>(0755), ec);
  if (!ec) std::filesystem::copy(original, copy, std::filesystem::copy_options::recursive, ec);
  if (!ec) open_to_jobs(copy, mode, ec);
  if (ec) {
    spdlog::warn("{} at {} is out of reach of the jobs' accounts ({}) and could not be copied to {}: {}", what,
                 original.string(), *why, copy.string(), ec.message());
    return original;
  }
  spdlog::info("{} at {} is out of reach of the jobs' accounts ({}): jobs are given a copy at {}", what,
               original.string(), *why, copy.string());
  return copy;
}

}  // namespace

AccessConfig access_config(const config::DaemonConfig& config) {
  AccessConfig access;
  for (const auto& hash : config.token_sha256) access.tokens.push_back({hash, "admin", kAdminScopes});
  for (const auto& token : config.tokens) {
    auto scopes = scopes_from_names(token.scopes);
    access.tokens.push_back({token.sha256, token.name, scopes ? *scopes : kReadScopes});
  }
  for (const auto& hash : config.cluster.agent_token_sha256)
    access.agent_tokens.push_back({hash, "agent", kAgentScopes});
  access.local_user_scopes = config.local_users == "submit" ? kSubmitScopes
                             : config.local_users == "read" ? kReadScopes
                                                            : Scopes{0};
  access.admin_uids = {0};
  if (::geteuid() != 0) access.admin_uids.push_back(::geteuid());
  return access;
}

// A GPU's own joule-worker: as configured, else a joule-worker-cuda beside jouled (one built
// against the node's PyTorch LibTorch with CUDA); empty: the node's worker.
std::filesystem::path device_worker(const config::DeviceConfig& device) {
  if (!device.worker.empty()) return device.worker;
  if (!config::is_gpu_device_name(device.name)) return {};
  std::error_code ec;
  const auto beside = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path() / "joule-worker-cuda";
  return !ec && is_executable(beside) ? beside : std::filesystem::path();
}

std::vector<Device> open_devices(const config::DaemonConfig& config) {
  std::vector<Device> devices;
  // One set of roots for every device: the MIG devices of a GPU share its partition.
  adapters::MeterRoots roots;
  roots.mig_partitions = std::make_shared<adapters::MigPartitions>();
  for (const auto& device_config : config.devices) {
    Device device;
    device.name = device_config.name;
    device.config = device_config;
    if (device_config.meter == "simulated") {
      const auto profile = estimator::find_simulated_profile(device.name.substr(4));
      const double idle_watts = profile ? profile->static_watts : 0.0;
      device.meter = std::make_unique<adapters::SimulatedMeter>(idle_watts, [] {
        return std::chrono::duration<double>(joule::system_clock().steady().time_since_epoch()).count();
      });
      device.runs_jobs = device_config.runs_jobs;
      if (device.runs_jobs) device.threads = config::device_threads(device_config, config.probing);
      device.meter_note = device.runs_jobs
                              ? fmt::format(
                                    "simulated {} ({}): jobs run on this host's CPU while the meter adds the power the "
                                    "device's model expects of them; idles at {} W",
                                    device.name.substr(4), profile ? profile->description : "?", idle_watts)
                              : fmt::format("simulated {} ({}): estimation only, it runs no jobs; idles at {} W",
                                            device.name.substr(4), profile ? profile->description : "?", idle_watts);
      spdlog::info("device {}: meter simulated ({})", device.name, device.meter_note);
      devices.push_back(std::move(device));
      continue;
    }
    device.threads = config::device_threads(device_config, config.probing);
    device.worker = device_worker(device_config);
    if (!device.worker.empty())
      spdlog::info("device {}: probes and built-in jobs run {}", device.name, device.worker.string());
    adapters::MeterRequest request;
    request.device = device.name;
    request.meter = device_config.meter;
    if (device.name == "cpu" && !device_config.modelled_figures_set) {
      // The modelled meter's figures: the board's published ones where the table has them. The
      // device's own copy of its config carries them, so its probes model the same power.
      device.board_model = device_config.board.empty() ? adapters::read_board_model() : device_config.board;
      const auto board = adapters::board_defaults(device.board_model);
      device.board_figures_published = board.from_table;
      device.board_note = board.note;
      device.config->idle_watts = board.params.idle_watts;
      device.config->watts_per_busy_core = board.params.watts_per_busy_core;
      spdlog::info("device cpu: modelled meter's figures: {}", board.note);
    }
    request.modelled = adapters::ModelledCpuParams{device.config->idle_watts, device.config->watts_per_busy_core};
    auto selected = adapters::select_meter(request, roots);
    if (!selected) throw std::runtime_error(fmt::format("device {}: {}", device.name, selected.error().message));
    device.meter = std::move(selected->meter);
    std::string note;
    for (const auto& candidate : selected->considered) {
      spdlog::info("device {}: meter {} {}: {}", device.name, candidate.source,
                   candidate.taken ? "taken" : "passed over", candidate.reason);
      if (!note.empty()) note += "; ";
      note += fmt::format("{} {}: {}", candidate.source, candidate.taken ? "taken" : "passed over", candidate.reason);
    }
    device.meter_note = note;
    spdlog::info("device {}: meter {} ({})", device.name, device.meter->source(), device.meter_note);
    if (device.name == "cpu") {
      // Jobs that ask for cores (resources.cores) run side by side on cores of their own.
      if (const auto cpus = adapters::usable_cpus(); cpus.size() > 1)
        device.shared_cores = static_cast<int>(cpus.size());
      if (device_config.cpufreq.empty()) {
        device.knob_note = "cpufreq = \"off\" in its [[devices]] table";
      } else if (auto knob = adapters::CpuFrequencyKnob::discover(device_config.cpufreq)) {
        device.cpu_frequency = std::move(knob).value();
        device.knob_note = "cpufreq: " + device.cpu_frequency->describe();
      } else {
        device.knob_note = knob.error().message;
      }
      spdlog::info("device cpu: CPU frequency knob {}",
                   device.cpu_frequency ? device.knob_note : "unavailable: " + device.knob_note);
    }
    if (device.name.rfind("cuda:", 0) == 0) {
      // Jobs asking for several GPUs (resources.gpus) hold GPUs of one model together.
      const auto* nvml = dynamic_cast<const adapters::NvmlMeter*>(device.meter.get());
      device.gpu_group = nvml && !nvml->name().empty() ? nvml->name() : "GPU";
      device.cuda_visible = device.name.substr(5);
      if (nvml)
        if (auto minor = nvml->library()->minor_number(nvml->device())) device.gpu_minor = *minor;
    }
    if (const auto mig = adapters::parse_mig_name(device.name)) {
      // A MIG device: the one CUDA device its jobs see, metered by a share of its GPU's counter.
      // A process sees one MIG device, so it gangs with none (a group of its own).
      const auto* meter = dynamic_cast<const adapters::MigMeter*>(device.meter.get());
      device.mig_gpu = mig->gpu;
      device.cuda_visible = device.meter->shared_gpu_counter()->cuda_visible();
      device.gpu_group = fmt::format("{} ({})", meter ? meter->name() : "MIG device", device.name);
      if (meter) device.gpu_minor = meter->gpu_minor();
    }
    if (device.name.rfind("cuda:", 0) == 0 && !device_config.devfreq.empty()) {
      // A Jetson's integrated GPU: its clock limit is a knob. A discrete GPU has none here (its
      // knob is NVML's power limit), so that is logged at debug only.
      if (auto knob = adapters::DevfreqKnob::discover_gpu(device_config.devfreq)) {
        device.gpu_frequency = std::move(knob).value();
        device.knob_note = "devfreq: " + device.gpu_frequency->describe();
        spdlog::info("device {}: GPU clock knob {}", device.name, device.knob_note);
      } else {
        device.knob_note = knob.error().message;
        spdlog::debug("device {}: no GPU clock knob: {}", device.name, device.knob_note);
      }
    }
    devices.push_back(std::move(device));
  }
  // A Jetson's power mode is the whole module's: every local device offers it.
  if (!config.nvpmodel.empty() && std::filesystem::exists(config.nvpmodel_conf)) {
    auto modes =
        adapters::JetsonPowerModes::discover(config.nvpmodel, config.nvpmodel_conf, adapters::system_command_runner());
    if (modes) {
      spdlog::info("power modes: {}", modes->describe());
      auto shared = std::make_shared<const adapters::JetsonPowerModes>(std::move(modes).value());
      for (auto& device : devices)
        if (device.runs_jobs && device.meter->source() != "simulated") device.power_modes = shared;
    } else {
      spdlog::warn("power modes unavailable: {}", modes.error().message);
    }
  }
  return devices;
}

std::unique_ptr<adapters::ControlJournal> open_control_journal(const std::filesystem::path& file,
                                                               const DeviceTable& devices,
                                                               const std::string& nvpmodel) {
  auto journal = adapters::ControlJournal::open(file);
  if (!journal) {
    const auto aside = std::filesystem::path(file.string() + ".unreadable");
    std::error_code ec;
    std::filesystem::rename(file, aside, ec);
    spdlog::error("{}; moved to {}: check the CPU frequency limits and GPU power limits it names by hand",
                  journal.error().message, aside.string());
    journal = adapters::ControlJournal::open(file);
    if (!journal) throw std::runtime_error(journal.error().message);
  }
  const auto restore_other = [&](const adapters::ControlJournal::Entry& entry) -> Status {
    if (entry.kind == "nvpmodel") {
      if (nvpmodel.empty()) return make_error(ErrorCode::unavailable, "[node] nvpmodel is off");
      return adapters::restore_power_mode(nvpmodel, std::atoi(entry.original.c_str()),
                                          adapters::system_command_runner());
    }
    if (entry.kind != "nvml_power_limit")
      return make_error(ErrorCode::unavailable, fmt::format("unknown kind of setting \"{}\"", entry.kind));
    const std::string name = fmt::format("cuda:{}", entry.index);
    const Device* device = devices.find(name);
    const auto* gpu = device ? device->meter->gpu_power_control() : nullptr;
    if (!gpu) return make_error(ErrorCode::unavailable, fmt::format("{} is not a device metered by NVML here", name));
    unsigned milliwatts = 0;
    try {
      milliwatts = static_cast<unsigned>(std::stoul(entry.original));
    } catch (const std::exception&) {
      return make_error(ErrorCode::invalid_argument, fmt::format("\"{}\" is not a power limit", entry.original));
    }
    return gpu->library()->set_power_limit_mw(gpu->device(), milliwatts);
  };
  for (const auto& line : adapters::restore_journalled(*journal, adapters::ControlFiles::system(), restore_other))
    spdlog::warn("knobs left by the last jouled: {}", line);
  return std::make_unique<adapters::ControlJournal>(std::move(journal).value());
}

void apply_log_level(const std::string& level) { spdlog::set_level(spdlog::level::from_str(level)); }

std::filesystem::path policy_directory(const config::DaemonConfig& config, const CommandLine& command_line) {
  if (!config.policy_directory.empty()) return config.policy_directory;
  if (command_line.config_file)
    return std::filesystem::absolute(*command_line.config_file).parent_path() / "policies.d";
  return {};
}

Result<schedulers::Policy> load_policy(const std::filesystem::path& directory) {
  if (directory.empty()) return schedulers::Policy{};
  auto loaded = config::load_policy_directory(directory);
  if (!loaded) return loaded.error();
  for (const auto& warning : loaded->warnings) spdlog::warn("{}", warning.describe());
  return loaded->policy;
}

std::string read_token_file(const std::filesystem::path& path) {
  if (path.empty()) return {};
  std::ifstream in(path);
  if (!in) throw std::runtime_error(fmt::format("cluster.token_file {}: cannot read it", path.string()));
  std::string token;
  std::getline(in, token);
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  if (token.empty()) throw std::runtime_error(fmt::format("cluster.token_file {}: it is empty", path.string()));
  return token;
}

StateAtStart open_state(const config::DaemonConfig& config) {
  std::error_code ec;
  std::filesystem::create_directories(config.state_directory / "jobs", ec);
  if (ec)
    throw std::runtime_error(
        fmt::format("cannot create the state directory {}: {}", config.state_directory.string(), ec.message()));
  keep_state_private(config.state_directory);
  const auto check = [](auto result) {
    if (!result) throw std::runtime_error(result.error().message);
    return std::move(result).value();
  };
  const auto db_path = config.state_directory / "jouled.db";
  StateAtStart state;
  state.database = check(adapters::Database::open(db_path));
  adapters::Database& db = *state.database;
  // Memory holds the jobs not finished and the latest finished ones; the others stay in the
  // database, which the job book reads back through a connection of its own when asked.
  state.jobs = check(db.load_current_jobs(JobService::kFinishedKept));
  for (const auto& job : state.jobs) {
    auto events = check(db.load_job_events(job.id));
    state.events.insert(state.events.end(), std::make_move_iterator(events.begin()),
                        std::make_move_iterator(events.end()));
  }
  state.archive = check(adapters::Database::open_reader(db_path));
  state.models = check(db.load_model_snapshots());
  state.probes.snapshots = state.models;
  // Each device resumes the samples of its saved model's fingerprint, or, before any model was
  // saved, those of its newest sample (the environment check at start vets them either way).
  for (const auto& device : config.devices) {
    std::optional<std::string> fingerprint;
    for (const auto& snapshot : state.models) {
      const auto meta = nlohmann::json::parse(snapshot.meta_json, nullptr, false);
      if (snapshot.device == device.name && meta.is_object() && meta.contains("environment"))
        fingerprint = meta["environment"].get<std::string>() + "; meter " + snapshot.source;
    }
    if (!fingerprint) fingerprint = check(db.latest_probe_fingerprint(device.name));
    if (!fingerprint) continue;
    state.probes.samples[device.name] = check(db.load_probe_samples(device.name, *fingerprint));
  }
  state.energy_uses = check(db.load_energy_uses(BudgetService::history_needed(joule::system_clock().unix_ms())));
  state.probes.runs = check(db.load_probe_runs(200));
  // What the reads above cached is not what the writer needs next.
  if (auto released = db.release_memory(); !released) throw std::runtime_error(released.error().message);
  spdlog::info("state: {} (schema {}, {} jobs)", db_path.string(), db.schema_version(), state.jobs.size());
  return state;
}

std::string node_name(const config::DaemonConfig& config) {
  return config.node_name.empty() ? host_name() : config.node_name;
}

JobServiceOptions job_service_options(const config::DaemonConfig& config) {
  JobServiceOptions options;
  options.state_directory = config.state_directory;
  options.accounts = resolve_job_accounts(config);
  if (options.accounts.mode != JobAccounts::Mode::daemon) {
    options.work_directory = job_work_directory(config);
    std::error_code ec;
    std::filesystem::create_directories(options.work_directory, ec);
    // 0711: jobs reach their own directory (0700, theirs) but cannot list the others.
    if (ec || ::chmod(options.work_directory.c_str(), 0711) != 0)
      throw std::runtime_error(fmt::format("cannot prepare the jobs' directory {}: {}", options.work_directory.string(),
                                           ec ? ec.message() : std::strerror(errno)));
    if (const auto identity = options.accounts.identity_for(1)) {
      if (auto why = adapters::unreachable_by(options.work_directory, *identity)) {
        throw std::runtime_error(
            fmt::format("the jobs' directory {} is out of reach of the jobs' accounts ({}); set "
                        "[jobs] directory to a path others may enter",
                        options.work_directory.string(), *why));
      }
    }
  }
  options.user_identity = local_user_identity;
  std::error_code ec;
  options.runner = std::filesystem::read_symlink("/proc/self/exe", ec);
  options.python_path = find_python_package(options.runner);
  options.worker = find_worker(config.probing, options.runner);
  if (const auto identity = options.accounts.identity_for(1); identity && !options.work_directory.empty()) {
    // jouled's own copies live beside the jobs' directories (job ids never start with a dot).
    const auto shared = options.work_directory / ".jouled";
    if (!options.python_path.empty())
      options.python_path =
          within_jobs_reach(options.python_path / "joule", options.python_path / "joule" / "__init__.py", S_IROTH,
                            shared / "python" / "joule", 0644, *identity, "the Python package joule")
              .parent_path();
    options.worker = within_jobs_reach(options.worker, options.worker, S_IXOTH, shared / "joule-worker", 0755,
                                       *identity, "joule-worker");
  }
  if (options.python_path.empty())
    spdlog::info("the Python package joule was not found (share/joule/python beside jouled): jobs get no PYTHONPATH");
  else
    spdlog::info("jobs import the Python package joule from {}", options.python_path.string());
  options.kill_grace_seconds = config.kill_grace_seconds;
  options.keep_finished_days = config.keep_finished_days;
  options.max_queued_jobs = config.server.max_queued_jobs;
  options.boot_id = adapters::read_boot_id();
  options.node_name = node_name(config);
  options.utc_offset_minutes = utc_offset_minutes();
  options.current_utc_offset_minutes = utc_offset_minutes;
  if (config.job_cgroups) {
    auto cgroups = std::make_shared<adapters::JobCgroups>();
    (void)cgroups->detect(::getpid());
    spdlog::info("job cgroups: {}", cgroups->describe());
    options.cgroups = std::move(cgroups);
  } else {
    spdlog::info("job cgroups: off ([jobs] cgroups = false): jobs are paused with SIGSTOP and get no CPU quota");
  }
  if (config.cluster.role == "agent")
    options.refuse_submissions =
        fmt::format("this node is an agent of the coordinator at {}: submit jobs there (joulectl --url {})",
                    config.cluster.coordinator, config.cluster.coordinator);
  return options;
}

std::vector<ProbeableDevice> simulated_devices(const config::DaemonConfig& config) {
  std::vector<ProbeableDevice> probeable;
  for (const auto& device : config.devices)
    if (device.meter == "simulated") probeable.push_back({device.name, device.name.substr(4), device.probes});
  for (const auto& type : config.slurm.node_types)
    if (type.model.rfind("sim:", 0) == 0)
      probeable.push_back({"slurm:" + type.name, type.model.substr(4), type.probes});
  return probeable;
}

HttpServerOptions server_options(const config::DaemonConfig& config, bool coordinator) {
  HttpServerOptions options{config.server.max_body_bytes,
                            config.server.request_timeout_seconds,
                            usable_connection_limit(config.server.max_connections),
                            config.server.max_connections_per_client,
                            config.server.idle_timeout_seconds,
                            nullptr,
                            {},
                            16384};
  if (coordinator) {
    // Agents' syncs are long polls: held, they count apart from max_connections (up to 16,384,
    // as the descriptor limit allows), so the agents a coordinator serves are not capped by it.
    constexpr std::size_t kLongPolls = 16384;
    options.max_long_polls = long_poll_room(options.max_connections, kLongPolls);
    options.long_poll = [](const HttpRequest& request) {
      return request.method() == boost::beast::http::verb::post && request.target() == "/v1/cluster/sync";
    };
  }
  if (!config.server.tls_certificate.empty()) {
    auto tls = make_server_tls_context({config.server.tls_certificate, config.server.tls_private_key});
    if (!tls) throw std::runtime_error("TLS: " + tls.error().message);
    options.tls = std::move(tls).value();
  }
  return options;
}

}  // namespace joule::daemon
