#include "local_executor.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>

#include "../job_record.hpp"
#include "../progress_token.hpp"
#include "joule/common/sha256.hpp"
#include "joule/daemon/meter_shares.hpp"
#include "joule/daemon/thread_settings.hpp"
#include "joule/worker/datasets.hpp"

extern char** environ;

namespace joule::daemon {

namespace asio = boost::asio;
using schedulers::JobState;

namespace {

std::string daemon_path() {
  const char* path = std::getenv("PATH");
  return path && *path ? path : "/usr/local/bin:/usr/bin:/bin";
}

Error invalid(std::string message, std::string where) {
  return make_error(ErrorCode::invalid_argument, std::move(message), std::move(where));
}

bool is_executable_file(const std::filesystem::path& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// A TCP port on loopback that nothing listens on now, for a job's processes to meet at (DDP's
// rendezvous); another program may take it before the job does, which fails that job's start
// only, as torchrun --standalone's own choice would. nullopt: the kernel gave none.
std::optional<int> free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  std::optional<int> port;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0)
    port = ntohs(address.sin_port);
  ::close(fd);
  return port;
}

}  // namespace

LocalExecutor::LocalExecutor(asio::io_context& io, ExecutorHost& host, const LocalRunOptions& options)
    : io_(io), host_(host), options_(options), lease_timer_(io) {}

LocalExecutor::~LocalExecutor() { *alive_ = false; }

Status LocalExecutor::check(const schedulers::JobSpec& spec,
                            const std::optional<adapters::JobIdentity>& identity) const {
  if (spec.resources.cores) {
    // A range needs its least: placement chooses a count the node has.
    const auto cpus = adapters::usable_cpus();
    if (static_cast<std::size_t>(*spec.resources.cores) > cpus.size())
      return invalid(fmt::format("resources.cores asks for {}{} cores; this node has {} (CPUs {})",
                                 spec.resources.cores_max ? "at least " : "", *spec.resources.cores, cpus.size(),
                                 adapters::cpu_list_text(cpus)),
                     "/resources/cores");
  }
  std::filesystem::path workdir = spec.run.workdir;
  if (!workdir.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_directory(workdir, ec))
      return invalid(fmt::format("run.workdir {} does not exist or is not a directory", workdir.string()),
                     "/run/workdir");
    if (::access(workdir.c_str(), X_OK) != 0)
      return invalid(fmt::format("run.workdir {} is not accessible to jouled", workdir.string()), "/run/workdir");
  }
  // Jobs run under accounts of their own: a workdir or program in a private home or temp
  // directory is refused now, with the directory in the way, rather than failing at start.
  auto reachable = [&](const std::filesystem::path& path, const char* what, const char* pointer,
                       mode_t access = S_IXOTH) -> Status {
    if (!identity) return {};
    if (auto why = adapters::unreachable_by(path, *identity, access)) {
      return invalid(
          fmt::format("{} {} is out of reach of the job's account (uid {}): {}; give others access "
                      "(chmod o+x on directories{}) or use another directory",
                      what, path.string(), identity->uid, *why, access == S_IROTH ? ", o+r on the file" : ""),
          pointer);
    }
    return {};
  };
  if (!workdir.empty()) {
    if (auto status = reachable(workdir, "run.workdir", "/run/workdir"); !status) return status;
  }
  if (spec.run.builtin) {
    if (options_.worker.empty())
      return invalid("run.builtin trains with joule-worker, which this jouled did not find (set [probing] worker)",
                     "/run/builtin");
    // The trainer runs as the job's account: a worker in a private directory (a build tree under
    // a 0700 home) would fail every built-in job at its start.
    if (auto status = reachable(options_.worker, "joule-worker", "/run/builtin"); !status) return status;
    // The files' contents are read off the loop (inspect_builtin_dataset); here, only where they are.
    auto dataset = worker::parse_dataset_spec(spec.run.builtin->dataset, "/run/builtin/dataset", workdir);
    if (!dataset) return dataset.error();
    for (const auto& file : dataset->files) {
      if (file.is_relative())
        return invalid(fmt::format("dataset file {} is a relative path: give an absolute one, or run.workdir to "
                                   "read it from",
                                   file.string()),
                       "/run/builtin/dataset");
      if (auto status = reachable(file, "dataset file", "/run/builtin/dataset", S_IROTH); !status) return status;
    }
    if (const std::filesystem::path dir = spec.run.builtin->checkpoint_directory; !dir.empty()) {
      std::error_code ec;
      if (!std::filesystem::is_directory(dir.parent_path(), ec))
        return invalid(
            fmt::format("run.builtin.checkpoint {}: {} does not exist", dir.string(), dir.parent_path().string()),
            "/run/builtin/checkpoint");
      return reachable(dir.parent_path(), "run.builtin.checkpoint's parent", "/run/builtin/checkpoint");
    }
    return {};
  }
  const std::string& program = spec.run.argv.front();
  if (program.find('/') != std::string::npos) {
    std::filesystem::path path = program;
    if (path.is_relative()) path = (workdir.empty() ? work_directory("_") : workdir) / path;
    if (workdir.empty() && std::filesystem::path(program).is_relative())
      return invalid("a relative program path needs run.workdir", "/run/command/0");
    if (!is_executable_file(path))
      return invalid(fmt::format("program {} does not exist or is not executable", path.string()), "/run/command/0");
    return reachable(path, "program", "/run/command/0");
  }
  const auto env_path = spec.run.env.find("PATH");
  const std::string search = env_path != spec.run.env.end() ? env_path->second : daemon_path();
  std::size_t start = 0;
  while (start <= search.size()) {
    const auto end = search.find(':', start);
    const std::string dir = search.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!dir.empty() && is_executable_file(std::filesystem::path(dir) / program)) return {};
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return invalid(fmt::format("program \"{}\" is not found in PATH ({})", program, search), "/run/command/0");
}

LocalExecutor::Run& LocalExecutor::run_of(const JobRecord& job) { return runs_[job.row.id]; }

std::vector<int> LocalExecutor::choose_cpus(int count) const {
  std::map<int, int> holders;  // CPU -> running jobs of ours on it
  for (const int cpu : adapters::usable_cpus()) holders[cpu] = 0;
  for (const auto& [id, run] : runs_)
    for (const int cpu : run.cpus)
      if (const auto it = holders.find(cpu); it != holders.end()) ++it->second;
  std::vector<std::pair<int, int>> ranked;  // (holders, cpu): free ones first, lowest first
  for (const auto& [cpu, held] : holders) ranked.emplace_back(held, cpu);
  std::sort(ranked.begin(), ranked.end());
  std::vector<int> out;
  for (std::size_t i = 0; i < ranked.size() && static_cast<int>(out.size()) < count; ++i)
    out.push_back(ranked[i].second);
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<adapters::JobIdentity> LocalExecutor::job_identity(std::int64_t sequence,
                                                                 const std::optional<std::int64_t>& owner_uid) const {
  if (options_.accounts.mode == JobAccounts::Mode::daemon) return std::nullopt;
  // A local user's job runs as that user: it reaches what they may, and no more.
  if (owner_uid && options_.user_identity) {
    if (auto own = options_.user_identity(*owner_uid)) return own;
  }
  return options_.accounts.identity_for(sequence);
}

std::filesystem::path LocalExecutor::job_directory(const std::string& id) const {
  return options_.state_directory / "jobs" / id;
}

std::filesystem::path LocalExecutor::work_directory(const std::string& id) const {
  return options_.work_directory.empty() ? job_directory(id) : options_.work_directory / id;
}

Status LocalExecutor::prepare_work_directory(const std::string& id,
                                             const std::optional<adapters::JobIdentity>& identity,
                                             const std::function<Status()>& fill) const {
  const auto dir = work_directory(id);
  const std::filesystem::path paths[] = {dir, dir / "tmp"};
  for (const auto& path : paths) {
    // mkdir, not create_directories: an existing entry (a job id's leftover, or a link
    // planted by someone) is checked below rather than followed.
    if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
      return make_error(ErrorCode::io, fmt::format("cannot create {}: {}", path.string(), std::strerror(errno)));
    struct stat info {};
    if (::lstat(path.c_str(), &info) != 0 || !S_ISDIR(info.st_mode))
      return make_error(ErrorCode::io, fmt::format("{} is not a directory", path.string()));
    // A run before (a requeued or restarted job) left it the job account's: under the unit jouled
    // has no CAP_DAC_OVERRIDE, so it takes it back (CAP_CHOWN, as for handing it over) to make or
    // write anything in it, and closes it to others again whatever mode the job gave it.
    if (identity && info.st_uid != ::geteuid()) {
      if (::lchown(path.c_str(), ::geteuid(), ::getegid()) != 0 || ::chmod(path.c_str(), 0700) != 0)
        return make_error(ErrorCode::io, fmt::format("cannot take {} back from uid {}: {}", path.string(), info.st_uid,
                                                     std::strerror(errno)));
    }
  }
  if (fill)
    if (auto filled = fill(); !filled) return filled;
  // Handed over innermost first: once `dir` is the job account's (0700) jouled can no longer
  // make or reach anything in it.
  for (auto path = std::rbegin(paths); identity && path != std::rend(paths); ++path) {
    if (::lchown(path->c_str(), identity->uid, identity->gid) != 0)
      return make_error(ErrorCode::io, fmt::format("cannot hand {} to uid {}: {}", path->string(), identity->uid,
                                                   std::strerror(errno)));
  }
  return {};
}

std::vector<std::string> LocalExecutor::job_environment(const JobRecord& job, const Device& device) const {
  std::map<std::string, std::string> env;
  // A small, predictable base: what programs need to run, plus the BLAS/OpenMP settings that
  // decide how (and on some CPUs whether correctly) numerical code runs.
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string text = *entry;
    const auto eq = text.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = text.substr(0, eq);
    if (name == "PATH" || name == "HOME" || name == "USER" || name == "LOGNAME" || name == "LANG" || name == "LC_ALL" ||
        name == "TZ" || name.rfind("OPENBLAS_", 0) == 0 || name.rfind("OMP_", 0) == 0 || name.rfind("MKL_", 0) == 0)
      env[name] = text.substr(eq + 1);
  }
  if (!env.contains("PATH")) env["PATH"] = daemon_path();
  // systemd removes the service's private /tmp when jouled stops, but jobs outlive it.
  env["TMPDIR"] = (work_directory(job.row.id) / "tmp").string();
  if (const auto identity = job_identity(job.row.sequence, job.row.owner_uid)) {
    // The daemon's HOME is not the job's to read or write.
    env["HOME"] = work_directory(job.row.id).string();
    env["USER"] = env["LOGNAME"] =
        identity->user_name.empty() ? options_.accounts.user_name(*identity) : identity->user_name;
  }
  // Its own cores' count where it asks for cores, else the device's count, the one its model is
  // learnt at; the job's own run.env may ask otherwise (its estimate then says so).
  set_thread_variables(env, job.run_cores() > 0 ? job.run_cores() : device.threads);
  // The allocator the probes ran under, for the same reason; run.env may ask otherwise (a node
  // short of memory: a trim threshold of 1 GiB keeps up to that much freed memory in the job).
  set_allocator_variables(env);
  // CUDA numbers GPUs fastest first unless told otherwise; NVML (and so jouled's cuda:N) by PCI
  // bus: on a server with GPUs of two kinds "1" would be another GPU than the one held.
  if (!device.cuda_visible.empty()) env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID";
  for (const auto& [name, value] : job.spec.run.env) env[name] = value;
  if (!options_.python_path.empty()) {
    // Before the job's own entries: the package that speaks this jouled's API comes first.
    const auto own = env.find("PYTHONPATH");
    env["PYTHONPATH"] =
        options_.python_path.string() + (own != env.end() && !own->second.empty() ? ":" + own->second : "");
  }
  env["JOULE_JOB_ID"] = job.row.id;
  env["JOULE_DEVICE"] = device.name;
  if (!device.cuda_visible.empty()) env["CUDA_VISIBLE_DEVICES"] = device.cuda_visible;
  if (!job.row.companions.empty()) {
    // Its GPUs, its own device first: what `torchrun` and DDP need to start one process per GPU
    // on this node (torchrun reads its options from PET_*; a program that spawns its own
    // processes reads MASTER_ADDR, MASTER_PORT and WORLD_SIZE).
    const int gpus = static_cast<int>(job.row.companions.size()) + 1;
    std::string visible = env["CUDA_VISIBLE_DEVICES"];
    for (const auto& name : job.row.companions)
      if (const Device* other = host_.find_device(name); other && !other->cuda_visible.empty())
        visible += "," + other->cuda_visible;
    env["CUDA_VISIBLE_DEVICES"] = visible;
    env["JOULE_DEVICES"] = fmt::format("{},{}", device.name, fmt::join(job.row.companions, ","));
    env["JOULE_GPUS"] = env["WORLD_SIZE"] = env["LOCAL_WORLD_SIZE"] = env["PET_NPROC_PER_NODE"] = std::to_string(gpus);
    env["MASTER_ADDR"] = env["PET_MASTER_ADDR"] = "127.0.0.1";
    env["PET_NNODES"] = "1";
    if (const auto port = free_loopback_port()) env["MASTER_PORT"] = env["PET_MASTER_PORT"] = std::to_string(*port);
  }
  if (!api_url_.empty()) env["JOULE_URL"] = api_url_;
  std::vector<std::string> out;
  for (const auto& [name, value] : env) out.push_back(name + "=" + value);
  return out;
}

std::filesystem::path LocalExecutor::checkpoint_directory(const JobRecord& job) const {
  const auto& builtin = job.spec.run.builtin;
  if (!builtin || !builtin->checkpoints) return {};
  if (!builtin->checkpoint_directory.empty()) return builtin->checkpoint_directory;
  return work_directory(job.row.id) / "checkpoint";
}

Result<std::vector<std::string>> LocalExecutor::builtin_command(
    const JobRecord& job, const Device& device, const std::optional<adapters::JobIdentity>& identity) const {
  // The device's own worker where it has one (a GPU's, built with CUDA), else the node's.
  const std::filesystem::path& worker = device.worker.empty() ? options_.worker : device.worker;
  if (worker.empty())
    return make_error(ErrorCode::unavailable, "run.builtin needs joule-worker, which this jouled did not find");
  if (identity && !device.worker.empty())
    if (const auto why = adapters::unreachable_by(worker, *identity, S_IXOTH))
      return make_error(ErrorCode::permission_denied, fmt::format("{}'s worker {} is out of the job's reach: {}",
                                                                  device.name, worker.string(), *why));
  // CUDA_VISIBLE_DEVICES leaves the job one GPU, its first; a simulated device's job runs on the CPU.
  const std::string torch_device = device.cuda_visible.empty() ? "cpu" : "cuda:0";
  std::vector<std::string> argv = {
      worker.string(), "train",
      "--job",         (work_directory(job.row.id) / "builtin-job.json").string(),
      "--device",      torch_device,
      "--threads",     std::to_string(std::max(1, job.run_cores() > 0 ? job.run_cores() : device.threads))};
  if (const auto checkpoints = checkpoint_directory(job); !checkpoints.empty())
    argv.insert(argv.end(), {"--checkpoint", checkpoints.string()});
  return argv;
}

Status LocalExecutor::write_builtin_job(const JobRecord& job,
                                        const std::optional<adapters::JobIdentity>& identity) const {
  // The stored spec (model, training, run.builtin.dataset): what the trainer reads. Rewritten at
  // each start, so a requeued job trains what was submitted whatever the job did to the file.
  const auto file = work_directory(job.row.id) / "builtin-job.json";
  // The directory was the job account's: whatever a run left there (a link to a file of jouled's,
  // say) is removed, never followed, and the file is created anew.
  if (::unlink(file.c_str()) != 0 && errno != ENOENT)
    return make_error(ErrorCode::io, fmt::format("cannot replace {}: {}", file.string(), std::strerror(errno)));
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return make_error(ErrorCode::io, fmt::format("cannot create {}: {}", file.string(), std::strerror(errno)));
  const std::string text = job.row.spec_json + "\n";
  bool written = true;
  for (std::size_t done = 0; written && done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    written = n > 0;
    if (written) done += static_cast<std::size_t>(n);
  }
  const bool handed = !identity || ::fchown(fd, identity->uid, identity->gid) == 0;
  const int saved = errno;
  ::close(fd);
  if (!written) return make_error(ErrorCode::io, fmt::format("cannot write {}", file.string()));
  if (!handed)
    return make_error(ErrorCode::io,
                      fmt::format("cannot hand {} to uid {}: {}", file.string(), identity->uid, std::strerror(saved)));
  return {};
}

std::string LocalExecutor::prepare(JobRecord& job, Device&) {
  runs_.erase(job.row.id);
  return "";
}

void LocalExecutor::start(JobRecord& job, Device& device) {
  const std::string id = job.row.id;
  // The job's logs and status stay in the state directory, which only jouled may enter; what
  // the job itself may write is its work directory, owned by its own account.
  const auto dir = job_directory(id);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return host_.ended(job, JobState::failed, fmt::format("cannot create {}: {}", dir.string(), ec.message()),
                       std::nullopt);
  const auto identity = job_identity(job.row.sequence, job.row.owner_uid);
  adapters::LaunchSpec spec;
  if (job.spec.run.builtin) {
    auto command = builtin_command(job, device, identity);
    if (!command) return host_.ended(job, JobState::failed, command.error().message, std::nullopt);
    spec.argv = std::move(command).value();
  } else {
    spec.argv = job.spec.run.argv;
  }
  // A built-in job's file is written before the directory is handed over: jouled cannot write
  // into it afterwards under the unit.
  const auto write_job = [&] { return write_builtin_job(job, identity); };
  if (auto prepared =
          prepare_work_directory(id, identity, job.spec.run.builtin ? std::function<Status()>(write_job) : nullptr);
      !prepared)
    return host_.ended(job, JobState::failed, prepared.error().message, std::nullopt);

  spec.identity = identity;
  spec.workdir = job.spec.run.workdir.empty() ? work_directory(id) : std::filesystem::path(job.spec.run.workdir);
  spec.env = job_environment(job, device);
  // The job's own token for POST /v1/jobs/{id}/progress: only its hash is stored.
  if (const auto token = new_progress_token()) {
    job.row.token_sha256 = token->sha256;
    spec.env.push_back("JOULE_JOB_TOKEN=" + token->token);
  }
  spec.stdout_path = dir / "stdout.log";
  spec.stderr_path = dir / "stderr.log";
  spec.status_path = dir / "status";
  spec.runner = options_.runner;
  Run& run = run_of(job);
  if (!job.row.origin.empty() && lease_seconds_ > 0) {
    // Created before the runner starts: its first look sees a lease that is already held.
    run.lease = dir / "lease";
    if (auto held = adapters::renew_lease(run.lease); !held)
      return host_.ended(job, JobState::failed, held.error().message, std::nullopt);
    spec.lease_path = run.lease;
    spec.lease_seconds = lease_seconds_;
  }
  if (const int cores = job.run_cores(); cores > 0) {
    run.cpus = choose_cpus(cores);
    spec.cpus = run.cpus;
    const auto& resources = job.spec.resources;
    host_.note(job, resources.cores_max && job.row.cores > 0
                        ? fmt::format("on CPUs {} ({} of resources.cores {}-{}, placement's choice)",
                                      adapters::cpu_list_text(run.cpus), cores, *resources.cores, *resources.cores_max)
                        : fmt::format("on CPUs {} (resources.cores = {})", adapters::cpu_list_text(run.cpus), cores));
  }
  attach_companions(job, run);  // before the knobs: a power limit is set on each of its GPUs
  apply_knobs(job, device, run);
  run.window = open_window(device, /*partial=*/false);
  open_companion_windows(job, run, /*partial=*/false);
  auto child = ChildProcess::launch(io_, spec, "job " + id,
                                    [this, id](std::optional<adapters::ExitStatus> exit) { on_exit(id, exit); });
  if (!child) return host_.ended(job, JobState::failed, child.error().message, std::nullopt);
  run.child = std::move(*child);
  const adapters::ProcessIdentity& process = run.child->process();
  if (auto* modelled = device.meter->modelled_load()) {
    // A simulated device that runs jobs draws, while this one runs, the power its model
    // expects of it (estimated joules over estimated seconds): simulated joules, labelled so.
    const auto estimate = host_.estimate_for(job, device.name);
    modelled->set_load_watts(estimate && estimate->seconds_mean > 0 ? estimate->joules_mean / estimate->seconds_mean
                                                                    : 0.0);
  }
  job.row.pid = process.pid;
  job.row.pid_start_ticks = process.start_ticks;
  job.row.boot_id = options_.boot_id;
  job.row.started_ms = host_.clock().unix_ms();
  job.started_steady = host_.clock().steady();
  job.row.energy_shared = false;
  if (options_.cgroups && options_.cgroups->usable()) {
    // Off the node's GPUs it does not hold (all of them for a job on the CPU).
    std::vector<std::string> own = job.row.companions;
    own.push_back(device.name);
    const std::vector<unsigned> denied = host_.gpus_not_of(own);
    if (auto cgroup = options_.cgroups->create_for(id, process.pid, run.cpus, denied)) {
      run.cgroup = *cgroup;
      if (!cgroup->fenced_gpus.empty())
        host_.note(job, fmt::format("its cgroup's device rules keep it off GPU node(s) /dev/nvidia{}",
                                    fmt::join(cgroup->fenced_gpus, ", /dev/nvidia")));
      else if (!denied.empty() && !cgroup->gpu_fence_note.empty())
        host_.note(job, fmt::format("the node's other GPUs are hidden by CUDA_VISIBLE_DEVICES alone (no device rules: "
                                    "{})",
                                    cgroup->gpu_fence_note));
      if (!cgroup->cpuset_cpus.empty())
        host_.note(job, fmt::format("its cpuset cgroup keeps it on CPUs {}", cgroup->cpuset_cpus));
      else if (!run.cpus.empty() && !cgroup->cpuset_note.empty())
        host_.note(job, fmt::format("its cores are kept by CPU affinity alone (no cpuset: {})", cgroup->cpuset_note));
    } else
      spdlog::warn("job {}: no cgroup of its own ({}); it can be paused (SIGSTOP) but gets no CPU quota", id,
                   cgroup.error().message);
  }
  host_.running(job, fmt::format("started as process group {}", process.pid));
}

adapters::GpuPowerLimit* LocalExecutor::gpu_limit_of(Run& run, Device& device) {
  if (!run.gpu_limit) run.gpu_limit = gpu_power_limit_of(device, options_.control_journal);
  return run.gpu_limit.get();
}

void LocalExecutor::apply_knobs(JobRecord& job, Device& device, Run& run) {
  const schedulers::Knobs knobs = job.effective_knobs();
  if (knobs.empty()) return;
  run.knobs = std::make_unique<DeviceKnobs>(options_.control_journal, options_.run_tool);
  // A job on cores of its own (a setting chosen for it) caps those cores' clocks alone; one
  // holding the device whole, every core's.
  const std::vector<int> own_cpus = device.shared_cores > 0 && job.held_cores() > 0 ? run.cpus : std::vector<int>{};
  // Under a power cap the cap's limit stands (a job resumed while capped).
  auto applied = run.knobs->apply(
      knobs, device, [&] { return gpu_limit_of(run, device); }, job.gpu_limit_watts.has_value(), own_cpus);
  if (applied && knobs.gpu_power_limit_watts && !job.gpu_limit_watts && !run.companions.empty()) {
    // A job on several GPUs: the same limit on each (they run in step), or on none.
    if (auto others = limit_companions_to_knob(run, *knobs.gpu_power_limit_watts)) {
      applied->insert(applied->end(), others->begin(), others->end());
    } else {
      for (const auto& failure : run.knobs->restore(run.gpu_limit.get()))
        spdlog::warn("job {}: {}", job.row.id, failure);
      limit_companions(job, run, std::nullopt);
      applied = others.error();
    }
  }
  if (!applied) {
    // Nothing stays half set (apply put back what it wrote): the job runs as the device is.
    run.knobs.reset();
    spdlog::warn("job {}: knobs refused, it runs at the device's defaults: {}", job.row.id, applied.error().message);
    host_.note(job, "knobs refused, it runs at the device's defaults: " + applied.error().message);
    host_.count_knobs(device.name, "refused");
    return;
  }
  job.knobs_in_force = fmt::format("{}", fmt::join(*applied, "; "));
  host_.note(job, "knobs set: " + *job.knobs_in_force);
  host_.count_knobs(device.name, "set");
}

void LocalExecutor::restore_knobs(JobRecord& job, Run& run) {
  // The GPU's limit is also the power cap's: while a cap holds it, it stays (on every GPU).
  put_back(job, run, job.gpu_limit_watts ? nullptr : run.gpu_limit.get());
  if (!job.gpu_limit_watts) limit_companions(job, run, std::nullopt);
  job.knobs_in_force.reset();
}

Result<std::vector<std::string>> LocalExecutor::limit_companions_to_knob(Run& run, double watts) {
  std::vector<std::string> set;
  for (auto& companion : run.companions) {
    if (!companion.limit) companion.limit = gpu_power_limit_of(*companion.device, options_.control_journal);
    if (!companion.limit)
      return make_error(ErrorCode::unavailable,
                        fmt::format("{} (one of the job's GPUs) has no NVML power limit", companion.device->name));
    auto applied = companion.limit->set_watts(watts);
    if (!applied)
      return make_error(applied.error().code, fmt::format("{}: {}", companion.device->name, applied.error().message));
    set.push_back(
        fmt::format("gpu_power_limit_watts {:g} on {} ({})", watts, companion.device->name, applied->describe()));
  }
  return set;
}

void LocalExecutor::put_back(const JobRecord& job, Run& run, adapters::RestorableControl* gpu) {
  if (run.knobs) {
    for (const auto& failure : run.knobs->restore(gpu)) spdlog::warn("job {}: {}", job.row.id, failure);
  } else if (gpu) {
    if (auto restored = gpu->restore(); !restored) spdlog::warn("job {}: {}", job.row.id, restored.error().message);
  }
  run.knobs.reset();
}

void LocalExecutor::switch_setting(JobRecord& job, Device& device, bool at_defaults) {
  const auto it = runs_.find(job.row.id);
  if (it == runs_.end() || it->second.knobs_held_back) return;  // paused: its knobs are back already
  if (at_defaults)
    restore_knobs(job, it->second);
  else
    apply_knobs(job, device, it->second);
}

void LocalExecutor::put_knobs_back(JobRecord& job, Run& run) {
  if (!job.knobs_in_force) return;
  restore_knobs(job, run);
  run.knobs_held_back = true;
  host_.note(job, "knobs put back while it is paused: the device is at its defaults until it resumes");
}

void LocalExecutor::set_lease_seconds(double seconds) {
  const bool was_renewing = lease_seconds_ > 0;
  lease_seconds_ = seconds;
  if (!was_renewing && seconds > 0) renew_leases();
}

void LocalExecutor::renew_leases() {
  for (auto& [id, run] : runs_) {
    if (run.lease.empty()) continue;
    if (auto renewed = adapters::renew_lease(run.lease); !renewed)
      spdlog::warn("job {}: {}", id, renewed.error().message);
  }
  // Four renewals per lease: one late tick of a busy loop does not pause a job.
  // Before the coordinator has said how long leases are (an adopted run after a restart), often.
  const double every = lease_seconds_ > 0 ? std::clamp(lease_seconds_ / 4.0, 0.05, 1.0) : 0.25;
  lease_timer_.expires_after(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(every)));
  lease_timer_.async_wait([this, alive = alive_](boost::system::error_code ec) {
    if (!ec && *alive) renew_leases();
  });
}

void LocalExecutor::on_exit(const std::string& id, const std::optional<adapters::ExitStatus>& exit) {
  JobRecord* found = host_.find_job(id);
  if (!found || schedulers::is_terminal(found->state)) return;
  JobRecord& job = *found;
  // `run` is gone once the book has settled the job: nothing below may touch it.
  if (exit && exit->fenced) {
    host_.ended(job, JobState::cancelled,
                std::string(kFencedReason) + "jouled did not renew its lease, so its runner ended it (" +
                    exit->describe() + ")",
                exit);
  } else if (job.cancel_requested) {
    host_.ended(job, JobState::cancelled, exit ? "cancelled; the job ended with " + exit->describe() : "cancelled",
                exit);
  } else if (!exit) {
    host_.ended(job, JobState::failed, "the job's process ended but left no exit status", std::nullopt);
  } else if (exit->success()) {
    host_.ended(job, JobState::succeeded, "exit code 0", exit);
  } else {
    host_.ended(job, JobState::failed, exit->describe(), exit);
  }
}

void LocalExecutor::stop(JobRecord& job) {
  host_.note(job, "cancel requested");
  // A job still being placed ends when its placement is stored (the book sees cancel_requested).
  if (job.state != JobState::running && job.state != JobState::throttled) return;
  if (Run& run = run_of(job); run.child)
    run.child->terminate(std::chrono::duration<double>(options_.kill_grace_seconds));
}

Status LocalExecutor::throttle(JobRecord& job, Device& device, const schedulers::ThrottleAction& action) {
  const auto pgid = static_cast<pid_t>(job.row.pid);
  Run& run = run_of(job);
  using Kind = schedulers::ThrottleAction::Kind;
  Status done;
  switch (action.kind) {
    case Kind::pause:
      // SIGSTOP, not the cgroup freezer: a jouled killed with -9 while a job is paused leaves
      // only a SIGCONT for the next one to send on adoption, which needs no cgroup path.
      if (!run.pauser) run.pauser = std::make_unique<adapters::JobPauser>(pgid, std::nullopt);
      done = run.pauser->pause();
      if (done) {
        job.paused = true;
        put_knobs_back(job, run);
      }
      break;
    case Kind::resume:
      done = run.pauser ? run.pauser->resume() : adapters::signal_process_group(pgid, SIGCONT);
      if (done) {
        job.paused = false;
        // Only what was in force before the pause: knobs refused at start are not tried again.
        if (run.knobs_held_back) apply_knobs(job, device, run);
        run.knobs_held_back = false;
      }
      break;
    case Kind::cpu_quota:
      if (!run.cgroup) {
        done = make_error(ErrorCode::unavailable, "the job has no cgroup of its own");
        break;
      }
      if (!run.quota) run.quota = std::make_unique<adapters::CpuQuota>(*run.cgroup);
      done = run.quota->set_fraction(action.value);
      if (done) job.cpu_quota = action.value;
      break;
    case Kind::clear_cpu_quota:
      done = run.quota ? run.quota->clear() : Status{};
      if (done) job.cpu_quota.reset();
      break;
    case Kind::gpu_power_limit: {
      auto* limit = gpu_limit_of(run, device);
      if (!limit) {
        done = make_error(ErrorCode::unavailable, fmt::format("{} has no NVML to set a power limit with", device.name));
        break;
      }
      auto set = limit->set_watts(action.value);
      if (!set) {
        done = set.error();
        break;
      }
      job.gpu_limit_watts = set->applied_watts;
      limit_companions(job, run, set->applied_watts);
      break;
    }
    case Kind::clear_gpu_power_limit: {
      // Back to the job's own limit (its knob, or the setting chosen for it) where it runs at
      // one, on each of its GPUs, else to the GPUs' original limits.
      const auto own = job.knobs_in_force ? job.effective_knobs().gpu_power_limit_watts : std::nullopt;
      if (run.gpu_limit && own) {
        auto set = run.gpu_limit->set_watts(*own);
        done = set ? Status{} : Status{set.error()};
      } else {
        done = run.gpu_limit ? run.gpu_limit->restore() : Status{};
      }
      if (done) {
        job.gpu_limit_watts.reset();
        limit_companions(job, run, own);
      }
      break;
    }
  }
  return done;
}

void LocalExecutor::limit_companions(const JobRecord& job, Run& run, std::optional<double> watts) {
  for (auto& companion : run.companions) {
    if (!watts) {
      if (!companion.limit) continue;
      if (auto restored = companion.limit->restore(); !restored)
        spdlog::warn("job {}: {}", job.row.id, restored.error().message);
      continue;
    }
    if (!companion.limit) companion.limit = gpu_power_limit_of(*companion.device, options_.control_journal);
    if (!companion.limit) {
      spdlog::warn("job {}: {} has no NVML to set a power limit with", job.row.id, companion.device->name);
      continue;
    }
    if (auto set = companion.limit->set_watts(*watts); !set)
      spdlog::warn("job {}: {}: {}", job.row.id, companion.device->name, set.error().message);
  }
}

bool LocalExecutor::can_limit_cpu(const JobRecord& job) const {
  const auto it = runs_.find(job.row.id);
  return it != runs_.end() && it->second.cgroup && !it->second.cgroup->cpu_dir.empty();
}

std::optional<adapters::MeasurementWindow> LocalExecutor::open_window(Device& device, bool partial) const {
  auto window = adapters::MeasurementWindow::begin(*device.meter, host_.clock().steady(), partial);
  if (!window) {
    device.meter_error = window.error().message;
    return std::nullopt;
  }
  device.meter_error.reset();
  return std::move(window).value();
}

std::optional<double> LocalExecutor::energy_so_far(JobRecord& job, Device& device, const adapters::ExitStatus* exit) {
  Run& run = run_of(job);
  if (const auto* model = device.meter->cpu_time_model(); model && job.row.started_ms && job.row.pid > 0) {
    // The runner's wait4 at the end counts every descendant it waited for; while running, the
    // group's live processes are read.
    read_cpu_seconds(job, run, exit);
    // Its run on the monotonic clock where this daemon started it; an adopted run has only
    // its stored start.
    const auto until = job.row.finished_ms.value_or(host_.clock().unix_ms());
    const double wall = job.started_steady
                            ? std::chrono::duration<double>(host_.clock().steady() - *job.started_steady).count()
                            : static_cast<double>(std::max<std::int64_t>(0, until - *job.row.started_ms)) / 1000.0;
    return model->joules(std::max(0.0, wall - run.idle_seconds_to_others), run.cpu_seconds.value_or(0.0));
  }
  if (!run.window) return std::nullopt;
  auto measured = run.window->read(*device.meter, host_.clock().steady());
  if (!measured) {
    device.meter_error = measured.error().message;
    return std::nullopt;
  }
  device.meter_error.reset();
  const auto others = companions_energy(run, /*sampled=*/false);
  if (!others) return std::nullopt;
  return std::max(0.0, measured->joules - run.joules_to_others) + *others;
}

void LocalExecutor::attach_companions(const JobRecord& job, Run& run) {
  if (!run.companions.empty()) return;
  for (const auto& name : job.row.companions) {
    Device* other = host_.find_device(name);
    if (!other) continue;  // gone from the configuration since: its joules are not counted
    run.companions.push_back(Run::Companion{other, std::nullopt, nullptr});
  }
}

void LocalExecutor::open_companion_windows(const JobRecord& job, Run& run, bool partial) {
  attach_companions(job, run);
  for (auto& companion : run.companions) companion.window = open_window(*companion.device, partial);
}

std::optional<double> LocalExecutor::companions_energy(const Run& run, bool sampled) const {
  double joules = 0.0;
  for (const auto& companion : run.companions) {
    Device* other = companion.device;
    const auto& window = companion.window;
    if (!window || (sampled && other->meter_error)) return std::nullopt;
    if (sampled) {
      joules += window->at(other->energy_joules, host_.clock().steady()).joules;
      continue;
    }
    auto measured = window->read(*other->meter, host_.clock().steady());
    if (!measured) {
      other->meter_error = measured.error().message;
      return std::nullopt;
    }
    other->meter_error.reset();
    joules += measured->joules;
  }
  return joules;
}

void LocalExecutor::begin_sample(const std::function<bool(const std::string& device)>& reads_cpu_time) {
  std::vector<pid_t> groups;
  for (const auto& [id, run] : runs_) {
    const JobRecord* job = host_.find_job(id);
    if (job && job->row.pid > 0 && job->row.started_ms && reads_cpu_time(job->row.device))
      groups.push_back(static_cast<pid_t>(job->row.pid));
  }
  sample_cpu_ = adapters::process_groups_cpu_seconds(groups, options_.proc_root);
}

void LocalExecutor::read_cpu_seconds(const JobRecord& job, Run& run, const adapters::ExitStatus* exit) const {
  const auto group = static_cast<pid_t>(job.row.pid);
  std::optional<double> cpu;
  if (exit && exit->cpu_seconds) {
    cpu = exit->cpu_seconds;
  } else if (sample_cpu_) {
    // This sample's walk asked for every group a sample reads; one it did not find has no live process.
    if (const auto read = sample_cpu_->find(group); read != sample_cpu_->end()) cpu = read->second;
  } else {
    cpu = adapters::process_group_cpu_seconds(group, options_.proc_root);
  }
  // CPU time never goes back (an exited child leaves the group's live count): the largest stands.
  if (cpu) run.cpu_seconds = std::max(run.cpu_seconds.value_or(0.0), *cpu);
}

void LocalExecutor::share_sample(const Device& device, double joules, double seconds) {
  struct Sharer {
    JobRecord* job;
    Run* run;
    double cpu_now;
  };
  std::vector<Sharer> sharers;
  for (const DeviceHold& hold : device.holds) {
    const auto it = runs_.find(hold.job);
    JobRecord* job = host_.find_job(hold.job);
    if (it == runs_.end() || !job || job->row.pid <= 0 || !job->row.started_ms) continue;
    Run& run = it->second;
    read_cpu_seconds(*job, run, nullptr);
    sharers.push_back(Sharer{job, &run, run.cpu_seconds.value_or(0.0)});
  }
  std::vector<double> used;
  for (const Sharer& sharer : sharers) used.push_back(sharer.cpu_now - sharer.run->cpu_at_last_sample.value_or(0.0));
  const bool several = sharers.size() > 1;
  const std::vector<double> shares = shares_by_cpu_time(used);
  for (std::size_t i = 0; i < sharers.size(); ++i) {
    Run& run = *sharers[i].run;
    run.cpu_at_last_sample = sharers[i].cpu_now;
    if (!several) continue;
    run.joules_to_others += joules * (1.0 - shares[i]);
    run.idle_seconds_to_others += seconds * (1.0 - shares[i]);
    if (!run.shared) {
      run.shared = true;
      sharers[i].job->row.energy_shared = true;
      host_.note(*sharers[i].job, fmt::format("shares {} with {} other job{} {}", device.name, sharers.size() - 1,
                                              sharers.size() > 2 ? "s" : "", kSharedEnergyNote));
    }
  }
}

std::optional<double> LocalExecutor::energy_as_sampled(JobRecord& job, Device& device) {
  // A CPU-time model has no device reading to reuse: the job's own CPU time is read.
  if (device.meter->cpu_time_model()) return energy_so_far(job, device, nullptr);
  return sampled_energy(job, device);
}

std::optional<double> LocalExecutor::sampled_energy(const JobRecord& job, const Device& device) const {
  const auto it = runs_.find(job.row.id);
  if (it == runs_.end() || !it->second.window || device.meter_error) return std::nullopt;
  const auto others = companions_energy(it->second, /*sampled=*/true);
  if (!others) return std::nullopt;
  return std::max(0.0, it->second.window->at(device.energy_joules, host_.clock().steady()).joules -
                           it->second.joules_to_others) +
         *others;
}

bool LocalExecutor::settle_energy(JobRecord& job, Device* device, const adapters::ExitStatus* exit) {
  if (!device) return false;
  if (auto* modelled = device->meter->modelled_load()) modelled->set_load_watts(0.0);
  const auto it = runs_.find(job.row.id);
  if (!job.row.started_ms || it == runs_.end() || !it->second.window) return false;
  const auto used = energy_so_far(job, *device, exit);
  if (!used) return false;
  job.row.energy_joules = *used;
  job.row.energy_source = std::string(device->meter->source());
  return true;
}

void LocalExecutor::release(JobRecord& job, bool ended) {
  const auto it = runs_.find(job.row.id);
  // Nothing stays throttled once jouled lets go of a job (it ends, or jouled stops).
  const bool has_pauser = it != runs_.end() && it->second.pauser;
  if (!has_pauser && job.paused && job.row.pid > 0)
    (void)adapters::signal_process_group(static_cast<pid_t>(job.row.pid), SIGCONT);
  if (it != runs_.end()) {
    Run& run = it->second;
    for (adapters::RestorableControl* control :
         std::initializer_list<adapters::RestorableControl*>{run.pauser.get(), run.quota.get()}) {
      if (!control) continue;
      if (auto restored = control->restore(); !restored)
        spdlog::warn("job {}: {}", job.row.id, restored.error().message);
    }
    // The knobs with the GPU's limit (a cap's too), the power mode last: the others narrowed it.
    put_back(job, run, run.gpu_limit.get());
    limit_companions(job, run, std::nullopt);
    run.companions.clear();
    run.pauser.reset();
    run.quota.reset();
    run.gpu_limit.reset();
    job.knobs_in_force.reset();
    run.child.reset();  // stops watching; the process itself is left alone
  }
  if (!ended) return;  // jouled stops: the next one adopts the process and its cgroup
  // Also for a job adopted after a restart, whose cgroup this daemon did not make.
  if (options_.cgroups && options_.cgroups->usable()) {
    if (auto removed = options_.cgroups->remove(job.row.id); !removed)
      spdlog::warn("job {}: its cgroup stays: {}", job.row.id, removed.error().message);
  }
  if (it != runs_.end()) runs_.erase(it);
}

void LocalExecutor::recover(JobRecord& job, Device* device) {
  const std::string id = job.row.id;
  const auto status_path = job_directory(id) / "status";
  std::optional<adapters::ProcessIdentity> process;
  const adapters::ProcessIdentity stored{static_cast<pid_t>(job.row.pid), job.row.pid_start_ticks};
  if (job.row.pid > 0 && job.row.boot_id == options_.boot_id && adapters::is_alive(stored, options_.proc_root))
    process = stored;
  else
    process = adapters::find_job_runner(status_path, options_.proc_root);

  const int cores = device ? device->cores_for(job.held_cores()) : 0;
  if (process) {
    if (!device || !device->can_hold(cores)) {
      spdlog::error("job {}: its process {} lives but device {} is unavailable; cancelling it", id, process->pid,
                    job.row.device);
      job.row.pid = process->pid;
      job.cancel_requested = true;
      (void)adapters::signal_process_group(process->pid, SIGKILL);
    }
    if (device && device->can_hold(cores)) {
      device->hold(id, cores);
      // A job on several GPUs holds its others again (they were its own when jouled stopped).
      for (const auto& name : job.row.companions)
        if (Device* other = host_.find_device(name)) other->hold(id, 0);
    }
    job.row.pid = process->pid;
    job.row.pid_start_ticks = process->start_ticks;
    job.row.boot_id = options_.boot_id;
    if (!job.row.started_ms) job.row.started_ms = host_.clock().unix_ms();
    job.row.energy_partial = true;
    Run& run = run_of(job);
    // Its cores stay its own: the next job is given others.
    if (job.run_cores() > 0)
      run.cpus = adapters::process_group_cpus(process->pid, options_.proc_root).value_or(std::vector<int>{});
    run.window = device ? open_window(*device, /*partial=*/true) : std::nullopt;
    open_companion_windows(job, run, /*partial=*/true);
    // Its runner holds a lease if the last jouled gave it one: renewing it goes on from here.
    if (std::error_code ec; std::filesystem::exists(job_directory(id) / "lease", ec)) {
      run.lease = job_directory(id) / "lease";
      renew_leases();
    }
    // Its reservation again, from its estimate there (the energy it used before is unknown).
    host_.reserve_again(job);
    // Its own knobs, or a setting chosen for it that was in force: jouled put them back at start.
    if (!job.spec.knobs.empty() || (job.chosen_setting && job.setting_was_in_force))
      host_.note(job, "its knobs were put back when jouled restarted: it runs at the device's defaults from now on");
    if (job.state == JobState::throttled) {
      // The last daemon released its controls when it stopped: it runs freely now.
      (void)adapters::signal_process_group(process->pid, SIGCONT);
      host_.running(job, "throttling released: jouled restarted");
    }
    const std::string note = fmt::format(
        "adopted process group {} after a daemon restart; energy is metered from now on only", process->pid);
    if (job.state == JobState::placed)
      host_.running(job, note);
    else
      host_.note(job, note);
    run.child = ChildProcess::watch(
        io_, *process, status_path, "job " + id,
        [this, id](std::optional<adapters::ExitStatus> exit) { on_exit(id, exit); }, options_.proc_root);
  } else if (auto exit = adapters::read_status_file(status_path)) {
    if (job.state == JobState::placed) host_.count_as_run(job);  // it did run
    if (exit->fenced) {
      // No jouled renewed its lease for too long: its runner ended it, as its node's coordinator
      // will have placed it elsewhere by now.
      host_.ended(job, JobState::cancelled,
                  fmt::format("{}no jouled renewed its lease, so its runner ended it ({}; energy not metered)",
                              kFencedReason, exit->describe()),
                  exit);
    } else {
      host_.ended(job, exit->success() ? JobState::succeeded : JobState::failed,
                  fmt::format("{} (finished while jouled was down; energy not metered)", exit->describe()), exit);
    }
  } else if (job.state == JobState::placed) {
    host_.requeue(job, "queued again: jouled stopped before starting it");
  } else if (job.spec.run.builtin && job.spec.run.builtin->checkpoints &&
             job.spec.restart == schedulers::RestartPolicy::requeue) {
    // The node went down with it (or something killed its runner): the built-in trainer picks up
    // after its last checkpoint, so running it again loses at most an epoch.
    host_.requeue(job,
                  "queued again: its process was gone after a daemon restart; the built-in trainer resumes from its "
                  "last checkpoint");
  } else {
    host_.ended(job, JobState::failed,
                "lost: its process was gone after a daemon restart and no exit status was recorded", std::nullopt);
  }
}

}  // namespace joule::daemon
