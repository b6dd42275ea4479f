#include "joule/daemon/daemon_app.hpp"

#include "joule/common/text.hpp"

#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <chrono>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include "joule/adapters/control_journal.hpp"
#include "joule/adapters/database.hpp"
#include "joule/adapters/heap_release.hpp"
#include "joule/adapters/job_process.hpp"
#include "joule/adapters/meter_selection.hpp"
#include "joule/adapters/modelled_cpu_meter.hpp"
#include "joule/adapters/simulated_meter.hpp"
#include "joule/adapters/storage_writer.hpp"
#include "joule/config/policy_config.hpp"
#include "joule/daemon/api.hpp"
#include "joule/daemon/cluster_service.hpp"
#include "joule/daemon/estimate_service.hpp"
#include "joule/daemon/http_server.hpp"
#include "joule/daemon/job_service.hpp"
#include "joule/daemon/metrics.hpp"
#include "joule/daemon/model_service.hpp"
#include "joule/daemon/outcome_service.hpp"
#include "joule/daemon/probe_service.hpp"
#include "joule/daemon/slurm_executor.hpp"
#include "joule/daemon/systemd_notify.hpp"
#include "joule/daemon/thread_settings.hpp"
#include "joule/estimator/runtime_cost.hpp"
#include "joule/estimator/simulated_device.hpp"

#ifndef JOULE_VERSION
#define JOULE_VERSION "0.0.0"
#endif

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

// [auth] and [cluster] agent tokens as the API checks them. Root and jouled's own account
// administer jouled without a token when they call from this machine.
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

}  // namespace

namespace asio = boost::asio;
using namespace std::chrono_literals;

namespace {

std::filesystem::path default_state_directory() {
  // systemd's StateDirectory= hands us the path (several, colon-separated, take the first).
  if (const char* from_systemd = std::getenv("STATE_DIRECTORY"); from_systemd && *from_systemd) {
    const std::string all = from_systemd;
    return all.substr(0, all.find(':'));
  }
  if (::geteuid() == 0) return "/var/lib/jouled";
  if (const char* xdg = std::getenv("XDG_STATE_HOME"); xdg && *xdg) return std::filesystem::path(xdg) / "jouled";
  if (const char* home = std::getenv("HOME"); home && *home) return std::filesystem::path(home) / ".local/state/jouled";
  return "/var/lib/jouled";
}

std::chrono::steady_clock::duration seconds(double value) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(value));
}

}  // namespace

config::DaemonConfig resolve_config(const CommandLine& command_line, std::vector<config::ConfigProblem>* warnings) {
  config::DaemonConfig defaults;
  defaults.state_directory = default_state_directory();
  config::DaemonConfig resolved = defaults;
  if (command_line.config_file) {
    auto loaded = config::load_config_file(*command_line.config_file, defaults);
    if (!loaded) throw std::runtime_error(loaded.error().message);
    resolved = loaded->config;
    if (warnings) *warnings = loaded->warnings;
  }
  if (command_line.listen) {
    auto address = config::parse_listen_address(*command_line.listen);
    if (!address) throw std::runtime_error("--listen: " + address.error().message);
    resolved.server.host = address->first;
    resolved.server.port = address->second;
  }
  if (command_line.state_directory) resolved.state_directory = std::filesystem::absolute(*command_line.state_directory);
  if (command_line.log_level) {
    if (!config::is_valid_log_level(*command_line.log_level))
      throw std::runtime_error(
          fmt::format("--log-level {}: use trace, debug, info, warn, error, critical or off", *command_line.log_level));
    resolved.log_level = *command_line.log_level;
  }
  if (!config::is_loopback_host(resolved.server.host) && resolved.token_sha256.empty() && resolved.tokens.empty()) {
    throw std::runtime_error(
        fmt::format("refusing to listen on {} (not loopback) without API tokens: add [auth] token_sha256 to the config "
                    "(joulectl token new prints a token and its hash)",
                    resolved.server.host));
  }
  return resolved;
}

namespace {

std::vector<Device> open_devices(const config::DaemonConfig& config) {
  std::vector<Device> devices;
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
    adapters::MeterRequest request;
    request.device = device.name;
    request.meter = device_config.meter;
    request.modelled = adapters::ModelledCpuParams{device_config.idle_watts, device_config.watts_per_busy_core};
    auto selected = adapters::select_meter(request);
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

// The settings a jouled that died without restoring them left behind (a kill -9 while a job ran
// at its knobs) are put back before anything runs, as a clean stop would have; a journal that
// cannot be read is moved aside, with an error naming it, so that the next one starts clean.
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

// policies.d: as configured, else beside the config file; none without a config file.
std::filesystem::path policy_directory(const config::DaemonConfig& config, const CommandLine& command_line) {
  if (!config.policy_directory.empty()) return config.policy_directory;
  if (command_line.config_file)
    return std::filesystem::absolute(*command_line.config_file).parent_path() / "policies.d";
  return {};
}

// The whole directory validates or nothing of it is used (the error lists file:line of each problem).
Result<schedulers::Policy> load_policy(const std::filesystem::path& directory) {
  if (directory.empty()) return schedulers::Policy{};
  auto loaded = config::load_policy_directory(directory);
  if (!loaded) return loaded.error();
  for (const auto& warning : loaded->warnings) spdlog::warn("{}", warning.describe());
  return loaded->policy;
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

// The agent's bearer token for its coordinator: the first line of [cluster] token_file.
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

}  // namespace

int run_daemon(const CommandLine& command_line) {
  auto logger = spdlog::stderr_logger_mt("jouled");
  spdlog::set_default_logger(logger);
  // Under systemd the journal stamps time and unit; elsewhere we do.
  spdlog::set_pattern(std::getenv("JOURNAL_STREAM") ? "%l: %v" : "%Y-%m-%dT%H:%M:%S.%e %l: %v");

  std::vector<config::ConfigProblem> warnings;
  config::DaemonConfig config = resolve_config(command_line, &warnings);
  apply_log_level(config.log_level);
  for (const auto& warning : warnings) spdlog::warn("{}", warning.describe());
  spdlog::info("jouled {} starting; effective config: {}", JOULE_VERSION, config::to_json(config).dump());

  std::error_code ec;
  std::filesystem::create_directories(config.state_directory / "jobs", ec);
  if (ec)
    throw std::runtime_error(
        fmt::format("cannot create the state directory {}: {}", config.state_directory.string(), ec.message()));
  keep_state_private(config.state_directory);
  const JobAccounts job_accounts = resolve_job_accounts(config);
  std::filesystem::path work_directory;
  if (job_accounts.mode != JobAccounts::Mode::daemon) {
    work_directory = job_work_directory(config);
    std::filesystem::create_directories(work_directory, ec);
    // 0711: jobs reach their own directory (0700, theirs) but cannot list the others.
    if (ec || ::chmod(work_directory.c_str(), 0711) != 0)
      throw std::runtime_error(fmt::format("cannot prepare the jobs' directory {}: {}", work_directory.string(),
                                           ec ? ec.message() : std::strerror(errno)));
    if (const auto identity = job_accounts.identity_for(1)) {
      if (auto why = adapters::unreachable_by(work_directory, *identity)) {
        throw std::runtime_error(
            fmt::format("the jobs' directory {} is out of reach of the jobs' accounts ({}); set "
                        "[jobs] directory to a path others may enter",
                        work_directory.string(), *why));
      }
    }
  }
  const auto db_path = config.state_directory / "jouled.db";
  auto database = adapters::Database::open(db_path);
  if (!database) throw std::runtime_error(database.error().message);
  // Memory holds the jobs not finished and the latest finished ones; the others stay in the
  // database, which the job book reads back through a connection of its own when asked.
  auto stored_jobs = (*database)->load_current_jobs(JobService::kFinishedKept);
  if (!stored_jobs) throw std::runtime_error(stored_jobs.error().message);
  Result<std::vector<adapters::StoredEvent>> stored_events = std::vector<adapters::StoredEvent>{};
  for (const auto& job : *stored_jobs) {
    auto events = (*database)->load_job_events(job.id);
    if (!events) throw std::runtime_error(events.error().message);
    stored_events->insert(stored_events->end(), std::make_move_iterator(events->begin()),
                          std::make_move_iterator(events->end()));
  }
  auto archive = adapters::Database::open_reader(db_path);
  if (!archive) throw std::runtime_error(archive.error().message);
  auto stored_models = (*database)->load_model_snapshots();
  if (!stored_models) throw std::runtime_error(stored_models.error().message);
  StoredProbeState stored_probe_state;
  stored_probe_state.snapshots = *stored_models;
  // Each device resumes the samples of its saved model's fingerprint, or, before any model was
  // saved, those of its newest sample (the environment check at start vets them either way).
  for (const auto& device : config.devices) {
    std::optional<std::string> fingerprint;
    for (const auto& snapshot : *stored_models) {
      const auto meta = nlohmann::json::parse(snapshot.meta_json, nullptr, false);
      if (snapshot.device == device.name && meta.is_object() && meta.contains("environment"))
        fingerprint = meta["environment"].get<std::string>() + "; meter " + snapshot.source;
    }
    if (!fingerprint) {
      auto latest = (*database)->latest_probe_fingerprint(device.name);
      if (!latest) throw std::runtime_error(latest.error().message);
      fingerprint = *latest;
    }
    if (!fingerprint) continue;
    auto samples = (*database)->load_probe_samples(device.name, *fingerprint);
    if (!samples) throw std::runtime_error(samples.error().message);
    stored_probe_state.samples[device.name] = std::move(samples).value();
  }
  const auto now_millis = joule::system_clock().unix_ms();
  auto stored_uses = (*database)->load_energy_uses(BudgetService::history_needed(now_millis));
  if (!stored_uses) throw std::runtime_error(stored_uses.error().message);
  auto stored_runs = (*database)->load_probe_runs(200);
  if (!stored_runs) throw std::runtime_error(stored_runs.error().message);
  stored_probe_state.runs = std::move(stored_runs).value();
  spdlog::info("state: {} (schema {}, {} jobs)", db_path.string(), (*database)->schema_version(), stored_jobs->size());
  adapters::StorageWriter storage(std::move(database).value());

  asio::io_context io(1);
  // Caught from here on, before READY=1: a signal that arrives before its handler is waiting is
  // queued by Asio instead of taking the default action (SIGHUP would terminate the daemon).
  asio::signal_set stop_signals(io, SIGTERM, SIGINT);
  asio::signal_set reload_signal(io, SIGHUP);
  Metrics metrics;
  metrics.set_up_info(JOULE_VERSION);
  metrics.set_node(config.node_name.empty() ? host_name() : config.node_name);
  SystemdNotifier notifier;

  JobServiceOptions job_options;
  job_options.state_directory = config.state_directory;
  job_options.work_directory = work_directory;
  job_options.accounts = job_accounts;
  job_options.user_identity = local_user_identity;
  job_options.runner = std::filesystem::read_symlink("/proc/self/exe", ec);
  job_options.python_path = find_python_package(job_options.runner);
  job_options.worker = find_worker(config.probing, job_options.runner);
  if (job_options.python_path.empty())
    spdlog::info("the Python package joule was not found (share/joule/python beside jouled): jobs get no PYTHONPATH");
  else
    spdlog::info("jobs import the Python package joule from {}", job_options.python_path.string());
  job_options.kill_grace_seconds = config.kill_grace_seconds;
  job_options.keep_finished_days = config.keep_finished_days;
  job_options.max_queued_jobs = config.server.max_queued_jobs;
  job_options.boot_id = adapters::read_boot_id();
  job_options.node_name = config.node_name.empty() ? host_name() : config.node_name;
  job_options.utc_offset_minutes = utc_offset_minutes();
  job_options.current_utc_offset_minutes = utc_offset_minutes;
  if (config.job_cgroups) {
    auto cgroups = std::make_shared<adapters::JobCgroups>();
    (void)cgroups->detect(::getpid());
    spdlog::info("job cgroups: {}", cgroups->describe());
    job_options.cgroups = std::move(cgroups);
  } else {
    spdlog::info("job cgroups: off ([jobs] cgroups = false): jobs are paused with SIGSTOP and get no CPU quota");
  }
  const bool is_agent = config.cluster.role == "agent";
  const bool is_coordinator = config.cluster.role == "coordinator";
  if (is_agent)
    job_options.refuse_submissions =
        fmt::format("this node is an agent of the coordinator at {}: submit jobs there (joulectl --url {})",
                    config.cluster.coordinator, config.cluster.coordinator);
  const std::string agent_token = is_agent ? read_token_file(config.cluster.token_file) : std::string();
  auto policy = load_policy(policy_directory(config, command_line));
  if (!policy) throw std::runtime_error("policies: " + policy.error().message);
  // Every service reads this one clock (tests give theirs a ManualClock).
  const Clock& clock = joule::system_clock();
  DeviceTable devices(open_devices(config));
  auto control_journal = open_control_journal(config.state_directory / "controls.json", devices, config.nvpmodel);
  job_options.control_journal = control_journal.get();
  JobService jobs(io, storage, metrics, devices, job_options, clock);
  jobs.keep_finished_in(**archive);
  jobs.budgets().set_policy(std::move(policy).value());
  jobs.budgets().load(*stored_uses);

  // The grid's carbon intensity ([carbon]): min-carbon placement and each job's grams.
  SignalService signals(io, metrics, config.carbon, clock);
  jobs.set_carbon_signal(&signals.carbon());
  signals.on_change([&jobs] { jobs.carbon_changed(); });
  const bool wants_carbon = jobs.budgets().policy().objective == schedulers::Objective::min_carbon;
  if (wants_carbon && !signals.configured())
    spdlog::warn(
        "placement.objective is min-carbon but jouled.toml has no [carbon] signal: jobs are placed as "
        "min-energy until one is set");
  Api api(jobs, metrics);
  api.set_access(access_config(config));
  api.set_signals(&signals);
  // Slurm's slot devices estimate with their node type's model (learnt here, or an agent's).
  std::unique_ptr<SlurmExecutor> slurm;
  if (!config.slurm.node_types.empty()) slurm = std::make_unique<SlurmExecutor>(io, jobs, config.slurm, clock);
  // What finished jobs teach: corrects and calibrates estimates (rows rebuilt after recovery).
  OutcomeService outcomes;
  const auto publish_calibration = [&] {
    for (const auto& [device, summary] : outcomes.summaries()) metrics.set_calibration(device, summary);
  };
  EstimateService estimates(devices, &outcomes, slurm ? slurm->model_sources() : std::map<std::string, std::string>{});
  api.set_estimates(&estimates);
  jobs.set_estimator(&estimates);
  std::unique_ptr<ModelService> models_holder;
  models_holder = std::make_unique<ModelService>(
      io, storage, metrics,
      [&] {
        estimates.set_models(models_holder->models());
        // A model learnt under a new environment is corrected by that environment's rows only.
        for (const auto& [device, model] : estimates.models())
          if (model) outcomes.set_environment(device, model->environment());
        publish_calibration();
        jobs.refresh_estimates();
      },
      clock);
  ModelService& models = *models_holder;
  estimates.set_model_descriptions([&models](const std::string& source) { return models.model_info(source); });
  ProbeServiceOptions probe_options;
  probe_options.probing = config.probing;
  probe_options.state_directory = config.state_directory;
  probe_options.runner = job_options.runner;
  probe_options.worker = job_options.worker;
  ProbeService probes(io, storage, metrics, models, jobs, devices, probe_options, clock);
  estimates.set_runtime_problem([&probes](const std::string& device) { return probes.runtime_problem(device); });
  api.set_probes(&probes);
  jobs.set_device_hooks([&](const std::string& device) { probes.preempt(device); },
                        [&](const JobService::Feedback& feedback) {
                          probes.feedback(feedback);
                          if (outcomes.record(feedback)) publish_calibration();
                        });
  std::unique_ptr<ClusterCoordinator> coordinator;
  std::unique_ptr<ClusterAgent> agent;
  if (is_coordinator) {
    coordinator = std::make_unique<ClusterCoordinator>(
        io, jobs, models, metrics,
        CoordinatorOptions{config.cluster.heartbeat_seconds, config.cluster.lost_after_seconds}, clock);
    coordinator->describe_models_with(&estimates);
  }
  if (is_agent) {
    agent = std::make_unique<ClusterAgent>(
        io, jobs, models,
        AgentOptions{job_options.node_name, config.cluster.coordinator, agent_token, config.cluster.ca_file,
                     JOULE_VERSION, config.cluster.lost_after_seconds},
        clock);
  }
  api.set_cluster(coordinator.get(), agent.get());
  api.set_slurm(slurm.get());
  HttpServerOptions server_options{config.server.max_body_bytes,
                                   config.server.request_timeout_seconds,
                                   usable_connection_limit(config.server.max_connections),
                                   config.server.max_connections_per_client,
                                   config.server.idle_timeout_seconds,
                                   nullptr,
                                   {},
                                   16384};
  if (is_coordinator) {
    // Agents' syncs are long polls: held, they count apart from max_connections (up to 16,384,
    // as the descriptor limit allows), so the agents a coordinator serves are not capped by it.
    constexpr std::size_t kLongPolls = 16384;
    server_options.max_long_polls = long_poll_room(server_options.max_connections, kLongPolls);
    server_options.long_poll = [](const HttpRequest& request) {
      return request.method() == boost::beast::http::verb::post && request.target() == "/v1/cluster/sync";
    };
  }
  if (!config.server.tls_certificate.empty()) {
    auto tls = make_server_tls_context({config.server.tls_certificate, config.server.tls_private_key});
    if (!tls) throw std::runtime_error("TLS: " + tls.error().message);
    server_options.tls = std::move(tls).value();
  }
  HttpServer server(
      io,
      [&api](HttpRequest&& request, const HttpPeer& peer, Reply reply) {
        api.handle(std::move(request), peer, std::move(reply));
      },
      server_options, [&metrics](unsigned status) { metrics.observe_request("refused", status, 0.0); });
  const char* scheme = server.uses_tls() ? "https" : "http";

  auto endpoint = server.listen(config.server.host, config.server.port);
  if (!endpoint) throw std::runtime_error(endpoint.error().message);
  const std::string address = fmt::format("{}:{}", endpoint->address().to_string(), endpoint->port());
  // Jobs reach the API at a loopback address when jouled listens on all interfaces.
  const std::string job_host = endpoint->address().is_unspecified()
                                   ? (endpoint->address().is_v6() ? "[::1]" : "127.0.0.1")
                                   : (endpoint->address().is_v6() ? "[" + endpoint->address().to_string() + "]"
                                                                  : endpoint->address().to_string());
  jobs.set_api_url(fmt::format("{}://{}:{}", scheme, job_host, endpoint->port()));
  if (auto recovered = jobs.recover(std::move(stored_jobs).value(), std::move(stored_events).value()); !recovered)
    throw std::runtime_error(recovered.error().message);
  const auto history = jobs.finished_feedback();
  if (const std::size_t learnt = outcomes.record_all(history); learnt > 0)
    spdlog::info("estimates: learnt from {} finished job{}", learnt, learnt == 1 ? "" : "s");
  publish_calibration();
  jobs.sample_meters();
  {
    std::vector<ProbeableDevice> probeable;
    for (const auto& device : config.devices)
      if (device.meter == "simulated") probeable.push_back({device.name, device.name.substr(4), device.probes});
    for (const auto& type : config.slurm.node_types)
      if (type.model.rfind("sim:", 0) == 0)
        probeable.push_back({"slurm:" + type.name, type.model.substr(4), type.probes});
    // The starter set for now; recent jobs' models join it once probing runs continuously.
    std::vector<estimator::WorkloadItem> workload;
    models.start(*stored_models, std::move(probeable), std::move(workload));
    if (probe_options.worker.empty()) {
      spdlog::warn(
          "joule-worker not found (beside jouled, in the build tree or on PATH; set [probing] worker): real "
          "devices get no energy model");
    } else {
      spdlog::info(
          "probing with {} ({})", probe_options.worker.string(),
          config.probing.enabled ? "enabled when a device is idle" : "only on request: [probing] enabled = false");
      probes.start(std::move(stored_probe_state));
      probes.remember_jobs(history);
    }
  }
  signals.start();
  if (coordinator) coordinator->start();
  if (slurm) slurm->start();
  if (agent) agent->start();
  api.set_ready(true);
  spdlog::info("listening on {}://{} ({})", scheme, address, config.cluster.role);
  notifier.ready(fmt::format("listening on {}", address));

  // Meters are sampled on a timer; each sample updates energy and power metrics.
  asio::steady_timer meter_timer(io);
  std::string last_status;
  std::function<void()> sample = [&] {
    meter_timer.expires_after(seconds(config.meter_interval_seconds));
    meter_timer.async_wait([&](boost::system::error_code ec) {
      if (ec) return;
      jobs.sample_meters();
      // STATUS= shows in `systemctl status jouled`; sent only when it changes.
      std::string status = fmt::format("listening on {}; {}", address, jobs.summary());
      if (status != last_status) notifier.status(status);
      last_status = std::move(status);
      sample();
    });
  };
  sample();

  // Freed memory back to the kernel once a queue has drained (adapters/heap_release.hpp): checked
  // every 10 s, released when 8 MiB more than before lie free (about 1,600 queued jobs' worth).
  asio::steady_timer heap_timer(io);
  adapters::HeapReleasePolicy heap_policy(8u << 20);
  std::function<void()> check_heap = [&] {
    heap_timer.expires_after(10s);
    heap_timer.async_wait([&](boost::system::error_code ec) {
      if (ec) return;
      const auto before = adapters::heap_usage();
      if (heap_policy.due(before.free_bytes)) {
        const auto started = std::chrono::steady_clock::now();
        adapters::release_free_heap();
        const auto after = adapters::heap_usage();
        heap_policy.released(after.free_bytes);
        spdlog::debug("released the heap's free memory to the kernel: {:.1f} MiB free, {:.1f} MiB in use; {:.1f} ms",
                      before.free_bytes / 1048576.0, after.in_use_bytes / 1048576.0,
                      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
      }
      check_heap();
    });
  };
  check_heap();

  // The watchdog is petted from the event loop itself, so a stuck loop stops the petting.
  asio::steady_timer watchdog_timer(io);
  std::function<void()> pet;
  if (auto period = SystemdNotifier::watchdog_period()) {
    pet = [&, every = std::chrono::duration_cast<std::chrono::steady_clock::duration>(*period / 4)] {
      notifier.watchdog();
      watchdog_timer.expires_after(every);
      watchdog_timer.async_wait([&](boost::system::error_code ec) {
        if (!ec) pet();
      });
    };
    pet();
  }

  asio::steady_timer drain_timer(io);
  bool stopping = false;
  const auto drain_deadline = std::make_shared<std::chrono::steady_clock::time_point>();
  std::function<void()> wait_drained = [&] {
    if ((jobs.writes_in_flight() == 0 && server.connections() == 0) ||
        std::chrono::steady_clock::now() > *drain_deadline) {
      io.stop();
      return;
    }
    drain_timer.expires_after(10ms);
    drain_timer.async_wait([&](boost::system::error_code ec) {
      if (!ec) wait_drained();
    });
  };

  stop_signals.async_wait([&](boost::system::error_code ec, int signal) {
    if (ec) return;
    stopping = true;
    spdlog::info("{}: draining (running jobs keep running and are adopted at the next start)",
                 signal == SIGTERM ? "SIGTERM" : "SIGINT");
    notifier.stopping("draining");
    api.set_ready(false);
    server.stop();
    if (coordinator) coordinator->stop();
    if (agent) agent->stop();
    if (slurm) slurm->stop();
    jobs.stop_scheduling();
    probes.stop();
    signals.stop();
    meter_timer.cancel();
    *drain_deadline = std::chrono::steady_clock::now() + 10s;
    wait_drained();
  });

  std::function<void()> on_reload = [&] {
    reload_signal.async_wait([&](boost::system::error_code ec, int) {
      if (ec || stopping) return;
      notifier.reloading();
      try {
        config::DaemonConfig next = resolve_config(command_line, &warnings);
        // Policies: a valid set replaces the running one whole; a bad one (or a bad config)
        // changes nothing.
        auto next_policy = load_policy(policy_directory(next, command_line));
        if (!next_policy) throw std::runtime_error("policies: " + next_policy.error().message);
        for (const auto& warning : warnings) spdlog::warn("{}", warning.describe());
        if (next.server.host != config.server.host || next.server.port != config.server.port ||
            next.state_directory != config.state_directory)
          spdlog::warn("reload: the listen address and state directory change only on restart");
        // A renewed certificate is read before anything changes: a bad one refuses the reload.
        std::shared_ptr<boost::asio::ssl::context> renewed;
        if (server.uses_tls() != !next.server.tls_certificate.empty())
          spdlog::warn("reload: switching between http and https happens only on restart");
        else if (server.uses_tls()) {
          auto tls = make_server_tls_context({next.server.tls_certificate, next.server.tls_private_key});
          if (!tls) throw std::runtime_error("TLS: " + tls.error().message);
          renewed = std::move(tls).value();
        }
        if (renewed) server.set_tls(std::move(renewed));
        apply_log_level(next.log_level);
        api.set_access(access_config(next));
        if (coordinator) coordinator->set_options({next.cluster.heartbeat_seconds, next.cluster.lost_after_seconds});
        if (next.cluster.role != config.cluster.role || next.cluster.coordinator != config.cluster.coordinator)
          spdlog::warn("reload: the cluster role and coordinator change only on restart");
        config.log_level = next.log_level;
        config.token_sha256 = next.token_sha256;
        config.tokens = next.tokens;
        config.local_users = next.local_users;
        config.meter_interval_seconds = next.meter_interval_seconds;
        config.probing = next.probing;
        probes.set_config(next.probing);
        signals.reconfigure(next.carbon);
        if (next_policy->objective == schedulers::Objective::min_carbon && !signals.configured())
          spdlog::warn(
              "placement.objective is min-carbon but jouled.toml has no [carbon] signal: jobs are placed as "
              "min-energy until one is set");
        jobs.set_policy(std::move(next_policy).value());
        spdlog::info("reloaded {}", next.source);
        notifier.ready(fmt::format("listening on {}; config reloaded", address));
      } catch (const std::exception& error) {
        spdlog::error("reload refused, the running config stays: {}", error.what());
        notifier.ready(fmt::format("listening on {}; last reload refused: {}", address, error.what()));
      }
      on_reload();
    });
  };
  on_reload();

  // Handlers do not throw by contract (running paths return Results, and the API turns a
  // route's exception into a 500). Should one throw all the same, Asio unwinds out of run():
  // the handler is logged and the loop resumes, rather than the daemon ending with every
  // running job orphaned.
  for (;;) {
    try {
      io.run();
      break;
    } catch (const std::exception& error) {
      spdlog::critical("an event handler threw, which is a bug; jouled goes on: {}", printable(error.what()));
    }
  }
  storage.stop();
  spdlog::info("stopped; {} commits for {} writes", storage.commits(), storage.writes());
  return 0;
}

}  // namespace joule::daemon
