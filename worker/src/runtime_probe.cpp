#include "runtime_probe.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "environment.hpp"
#include "joule/adapters/measurement_window.hpp"
#include "joule/adapters/meter_selection.hpp"
#include "joule/common/allocator_settings.hpp"
#include "joule/common/energy_source.hpp"
#include "joule/worker/runtime_probe_script.hpp"
#include "network_builder.hpp"
#include "trainer.hpp"

extern char** environ;

namespace joule::worker {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// The interpreter as a child with a pipe each way; killed and reaped if left running.
class Interpreter {
 public:
  static Result<Interpreter> spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                                   const std::filesystem::path& stderr_path) {
    int to_child[2], from_child[2];
    if (::pipe2(to_child, O_CLOEXEC) != 0) return make_error(ErrorCode::io, "pipe failed");
    if (::pipe2(from_child, O_CLOEXEC) != 0) {
      ::close(to_child[0]);
      ::close(to_child[1]);
      return make_error(ErrorCode::io, "pipe failed");
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
    posix_spawn_file_actions_addopen(&actions, 2, stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    std::vector<char*> args, envp;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    pid_t pid = 0;
    const int spawned = ::posix_spawnp(&pid, argv[0].c_str(), &actions, nullptr, args.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    ::close(to_child[0]);
    ::close(from_child[1]);
    if (spawned != 0) {
      ::close(to_child[1]);
      ::close(from_child[0]);
      return make_error(ErrorCode::unavailable, fmt::format("cannot start {}: {}", argv[0], std::strerror(spawned)));
    }
    Interpreter child;
    child.pid_ = pid;
    child.to_child_ = to_child[1];
    child.from_child_ = from_child[0];
    if (::clock_getcpuclockid(pid, &child.cpu_clock_) != 0) child.cpu_clock_ = -1;
    return child;
  }

  Interpreter() = default;
  Interpreter(Interpreter&& other) noexcept { *this = std::move(other); }
  Interpreter& operator=(Interpreter&& other) noexcept {
    std::swap(pid_, other.pid_);
    std::swap(to_child_, other.to_child_);
    std::swap(from_child_, other.from_child_);
    std::swap(cpu_clock_, other.cpu_clock_);
    std::swap(buffer_, other.buffer_);
    return *this;
  }
  ~Interpreter() {
    close_stdin();
    if (from_child_ >= 0) ::close(from_child_);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  /// The child's CPU seconds so far (all its threads); 0 once it cannot be read.
  double cpu_seconds() const {
    timespec ts{};
    if (cpu_clock_ == static_cast<clockid_t>(-1) || ::clock_gettime(cpu_clock_, &ts) != 0) return 0.0;
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  }

  /// The next line the child writes, without its newline; fails at end of output or after
  /// `timeout_seconds`.
  Result<std::string> read_line(double timeout_seconds) {
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_seconds));
    for (;;) {
      if (const auto end = buffer_.find('\n'); end != std::string::npos) {
        std::string line = buffer_.substr(0, end);
        buffer_.erase(0, end + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return make_error(ErrorCode::internal, fmt::format("no answer in {:.0f} s", timeout_seconds));
      pollfd fd{from_child_, POLLIN, 0};
      const int ready = ::poll(&fd, 1, static_cast<int>(std::min<long long>(left, 1000)));
      if (ready < 0 && errno != EINTR) return make_error(ErrorCode::io, "poll failed");
      if (ready <= 0) continue;
      char chunk[4096];
      const ssize_t got = ::read(from_child_, chunk, sizeof chunk);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return make_error(ErrorCode::unavailable, "it ended");
      buffer_.append(chunk, static_cast<std::size_t>(got));
    }
  }

  Status write_line(const std::string& line) {
    const std::string text = line + "\n";
    if (::write(to_child_, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
      return make_error(ErrorCode::unavailable, "it no longer reads its input");
    return {};
  }

  void close_stdin() {
    if (to_child_ >= 0) ::close(to_child_);
    to_child_ = -1;
  }

  /// Closes its input and waits for it to exit; whether it exited 0.
  bool finish() {
    close_stdin();
    int status = 0;
    const bool ok = pid_ > 0 && ::waitpid(pid_, &status, 0) == pid_ && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    pid_ = -1;
    return ok;
  }

 private:
  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  clockid_t cpu_clock_ = static_cast<clockid_t>(-1);
  std::string buffer_;
};

std::string last_line_of(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last;
}

// This process's environment with the job's thread and malloc settings: what jouled gives a job.
std::vector<std::string> child_environment(int threads) {
  std::vector<std::string> env;
  const std::vector<std::string> replaced = {"OMP_NUM_THREADS",        "MKL_NUM_THREADS",        "OPENBLAS_NUM_THREADS",
                                             "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_MAX_",
                                             "PYTHONDONTWRITEBYTECODE"};
  for (char** e = environ; e && *e; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    if (std::find(replaced.begin(), replaced.end(), name) == replaced.end()) env.push_back(entry);
  }
  for (const char* name : {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"})
    env.push_back(fmt::format("{}={}", name, threads));
  for (const auto& [name, value] : malloc_environment()) env.push_back(fmt::format("{}={}", name, value));
  return env;
}

Result<std::unique_ptr<adapters::EnergyMeter>> open_meter(const RuntimeProbeRequest& request,
                                                          adapters::SecondsClock cpu_seconds) {
  adapters::MeterRequest meter;
  meter.device = request.device;
  meter.meter = request.meter;
  meter.modelled = adapters::ModelledCpuParams{request.idle_watts, request.watts_per_busy_core};
  meter.scope = "process";
  adapters::MeterRoots roots;
  roots.process_cpu_seconds = std::move(cpu_seconds);
  auto selected = adapters::select_meter(meter, roots);
  if (!selected) return selected.error();
  return std::move(selected->meter);
}

}  // namespace

estimator::ModelSpec runtime_probe_network(int blocks, int width) {
  estimator::ModelSpec spec;
  spec.name = fmt::format("runtime-{}x{}", blocks, width);
  spec.input_shape = {width};
  for (int i = 0; i < blocks; ++i) {
    spec.layers.push_back({"linear", {{"out_features", width}}, "", {}});
    spec.layers.push_back({"relu", nlohmann::json::object(), "", {}});
  }
  spec.layers.push_back({"linear", {{"out_features", 10}}, "", {}});
  return spec;
}

Result<estimator::ModelSpec> runtime_probe_kind_network(const std::string& kind, int layers) {
  if (!estimator::runtime_kind_readable(kind))
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("the runtime probe reads no \"{}\" layers on their own (readable: layer types but "
                                  "relu, joins and embedding)",
                                  kind),
                      "--kinds");
  if (layers < 1 || layers > 64)
    return make_error(ErrorCode::invalid_argument, "a kind's network holds 1 to 64 layers", "--kinds");
  estimator::ModelSpec spec;
  spec.name = fmt::format("runtime-{}x{}", kind, layers);
  nlohmann::json args = nlohmann::json::object();
  if (kind == "conv2d" || kind == "batchnorm2d" || kind == "maxpool2d" || kind == "avgpool2d" ||
      kind == "adaptive_avgpool2d") {
    spec.input_shape = {4, 4, 4};
    if (kind == "conv2d") args = {{"out_channels", 4}, {"kernel_size", 3}, {"padding", 1}};
    if (kind == "maxpool2d" || kind == "avgpool2d") args = {{"kernel_size", 3}, {"stride", 1}, {"padding", 1}};
    if (kind == "adaptive_avgpool2d") args = {{"output_size", 4}};
  } else if (kind == "conv1d") {
    spec.input_shape = {4, 8};
    args = {{"out_channels", 4}, {"kernel_size", 3}, {"padding", 1}};
  } else if (kind == "lstm" || kind == "gru" || kind == "multihead_attention" || kind == "transformer_encoder_layer") {
    spec.input_shape = {4, 16};
    if (kind == "lstm" || kind == "gru") args = {{"hidden_size", 16}, {"output", "sequence"}};
    if (kind == "multihead_attention") args = {{"num_heads", 2}};
    if (kind == "transformer_encoder_layer") args = {{"nhead", 2}, {"dim_feedforward", 16}};
  } else {
    spec.input_shape = {16};
    if (kind == "linear") args = {{"out_features", 16}};
    if (kind == "dropout") args = {{"p", 0.1}};
  }
  for (int i = 0; i < layers; ++i) spec.layers.push_back({kind, args, "", {}});
  if (spec.input_shape.size() > 1) spec.layers.push_back({"flatten", nlohmann::json::object(), "", {}});
  spec.layers.push_back({"linear", {{"out_features", 10}}, "", {}});
  return spec;
}

Result<RuntimeProbeResult> run_runtime_probe(const RuntimeProbeRequest& request) {
  const auto started = Clock::now();
  if (request.blocks.size() < 2)
    return make_error(ErrorCode::invalid_argument, "at least two network sizes are needed", "--blocks");
  for (int b : request.blocks)
    if (b < 1 || b > 256) return make_error(ErrorCode::invalid_argument, "blocks must be in [1, 256]", "--blocks");
  if (request.readings < 1) return make_error(ErrorCode::invalid_argument, "readings must be 1 or more", "--readings");
  // Each network to read, and the kind it reads ("" for the line's).
  struct ProbeNetwork {
    estimator::ModelSpec spec;
    std::string kind;
    std::int64_t kind_layers = 0;
  };
  std::vector<ProbeNetwork> networks;
  for (const int blocks : request.blocks) networks.push_back({runtime_probe_network(blocks, request.width), "", 0});
  for (const auto& kind : request.kinds) {
    auto spec = runtime_probe_kind_network(kind, kRuntimeKindLayers);
    if (!spec) return spec.error();
    networks.push_back({std::move(spec).value(), kind, kRuntimeKindLayers});
  }
  if (auto status = check_device(request.device); !status) return status.error();
  if (request.device != "cpu")
    return make_error(ErrorCode::invalid_argument,
                      "the runtime probe measures Python's loop on the CPU; a GPU job's Python overhead is not "
                      "measured yet",
                      "--device");
  ::signal(SIGPIPE, SIG_IGN);  // an interpreter that died is an error here, not our end
  set_worker_threads(request.threads);

  // The interpreter's phases are metered on its CPU clock (the modelled meter), ours on ours.
  const Interpreter* current = nullptr;
  auto own_meter = open_meter(request, adapters::process_cpu_seconds);
  if (!own_meter) return own_meter.error();
  auto child_meter = open_meter(request, [&current] { return current ? current->cpu_seconds() : 0.0; });
  if (!child_meter) return child_meter.error();
  const double reading_seconds =
      request.reading_seconds > 0.0 ? request.reading_seconds : default_min_reading_seconds((*own_meter)->source());
  const double reading_timeout = reading_seconds * 20.0 + 30.0;

  RuntimeProbeResult result;
  result.interpreter = request.python;
  result.meter_source = std::string((*own_meter)->source());
  result.measured = joule::is_measurement(result.meter_source);
  const auto scratch = std::filesystem::temp_directory_path() / fmt::format("joule-runtime-{}", ::getpid());
  std::error_code ec;
  std::filesystem::create_directories(scratch, ec);
  const auto stderr_path = scratch / "python.stderr";
  struct Cleanup {
    std::filesystem::path path;
    ~Cleanup() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  } cleanup{scratch};
  const auto env = child_environment(request.threads);

  // One network read both ways: its step reading (its start-up reading and the joules it spent
  // are the result's on the way).
  auto read_network = [&](const ProbeNetwork& network) -> Result<estimator::RuntimeStepReading> {
    // The spec as the interpreter builds it: each layer with its per-sample input shape.
    auto analyzed = estimator::analyze_model(network.spec, request.batch_size, "");
    if (!analyzed) return analyzed.error();
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& layer : *analyzed) {
      nlohmann::json entry = network.spec.layers.at(layer.index).args;
      entry["type"] = network.spec.layers.at(layer.index).type;
      entry["in"] = layer.input_shape;
      layers.push_back(std::move(entry));
    }
    const std::string described = nlohmann::json{{"input", network.spec.input_shape}, {"layers", layers}}.dump();
    const std::vector<std::string> argv = {request.python,
                                           "-c",
                                           std::string(kRuntimeProbeScript),
                                           "--network",
                                           described,
                                           "--batch",
                                           std::to_string(request.batch_size),
                                           "--threads",
                                           std::to_string(request.threads),
                                           "--reading-seconds",
                                           fmt::format("{}", reading_seconds),
                                           "--readings",
                                           std::to_string(request.readings),
                                           "--warmup-seconds",
                                           fmt::format("{}", reading_seconds)};
    auto broken = [&](const std::string& what, const Error& error) {
      const std::string said = last_line_of(stderr_path);
      return make_error(error.code == ErrorCode::internal ? ErrorCode::internal : ErrorCode::unavailable,
                        fmt::format("{} ({}): {}{}", request.python, network.spec.name, what + ": " + error.message,
                                    said.empty() ? "" : "; it said: " + said));
    };
    current = nullptr;
    auto start_window = adapters::MeasurementWindow::begin(**child_meter, Clock::now());
    if (!start_window) return start_window.error();
    auto child = Interpreter::spawn(argv, env, stderr_path);
    if (!child) return child.error();
    current = &*child;
    auto imported = child->read_line(request.import_timeout_seconds);
    if (!imported) return broken("importing torch", imported.error());
    auto start = start_window->read(**child_meter, Clock::now());
    if (!start) return start.error();
    if (imported->rfind("imported", 0) != 0)
      return make_error(ErrorCode::internal, fmt::format("{}: unexpected \"{}\"", request.python, *imported));
    if (result.version.empty()) {
      std::istringstream words(imported->substr(8));
      std::string python, torch;
      words >> python >> torch;
      result.version = fmt::format("Python {}, torch {}", python, torch);
    }
    result.starts.push_back({start->joules, start->seconds});
    result.joules += start->joules;

    // The same network in LibTorch, warmed up as the interpreter warms up its own.
    SessionOptions options{request.batch_size, "sgd", torch::kCPU, 1};
    auto session = TrainingSession::create(network.spec, options);
    if (!session) return session.error();
    // Warm for as long as a reading lasts (and 20 steps at least): first steps allocate, and
    // caches and clocks settle; the interpreter does the same on its side.
    const auto warm_until =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(reading_seconds));
    for (int i = 0; i < 20 || Clock::now() < warm_until; ++i) session->step();
    auto before = Clock::now();
    for (int i = 0; i < 20; ++i) session->step();
    double worker_pace = seconds_between(before, Clock::now()) / 20.0;

    std::vector<double> runtime_joules, runtime_seconds, worker_joules, worker_seconds;
    std::vector<double> extra_joules, extra_seconds;  // per pair of readings, back to back
    for (int reading = 0; reading < request.readings; ++reading) {
      auto begin = child->read_line(reading_timeout);
      if (!begin || *begin != "begin")
        return broken("reading", begin ? make_error(ErrorCode::internal, *begin) : begin.error());
      auto window = adapters::MeasurementWindow::begin(**child_meter, Clock::now());
      if (!window) return window.error();
      if (auto sent = child->write_line("go"); !sent) return broken("reading", sent.error());
      auto end = child->read_line(reading_timeout);
      if (!end) return broken("reading", end.error());
      auto measured = window->read(**child_meter, Clock::now());
      if (!measured) return measured.error();
      long long steps = 0;
      double seconds = 0.0;
      if (std::sscanf(end->c_str(), "end %lld %lf", &steps, &seconds) != 2 || steps < 1)
        return make_error(ErrorCode::internal, fmt::format("{}: unexpected \"{}\"", request.python, *end));
      result.joules += measured->joules;
      runtime_joules.push_back(measured->joules / static_cast<double>(steps));
      runtime_seconds.push_back(measured->seconds / static_cast<double>(steps));

      const int worker_steps =
          static_cast<int>(std::clamp(std::ceil(reading_seconds / std::max(worker_pace, 1e-6)), 1.0, 1e7));
      auto own = adapters::MeasurementWindow::begin(**own_meter, Clock::now());
      if (!own) return own.error();
      for (int i = 0; i < worker_steps; ++i) session->step();
      auto ours = own->read(**own_meter, Clock::now());
      if (!ours) return ours.error();
      result.joules += ours->joules;
      worker_joules.push_back(ours->joules / worker_steps);
      worker_seconds.push_back(ours->seconds / worker_steps);
      worker_pace = worker_seconds.back();
      extra_joules.push_back(runtime_joules.back() - worker_joules.back());
      extra_seconds.push_back(runtime_seconds.back() - worker_seconds.back());
    }
    auto done = child->read_line(reading_timeout);
    if (!done || *done != "done") return broken("ending", done ? make_error(ErrorCode::internal, *done) : done.error());
    current = nullptr;
    if (!child->finish()) return broken("ending", make_error(ErrorCode::internal, "it did not exit 0"));

    estimator::RuntimeStepReading reading;
    for (const auto& layer : network.spec.layers) reading.modules += estimator::python_module_calls(layer.type);
    reading.kind = network.kind;
    reading.kind_layers = network.kind_layers;
    reading.runtime_joules = median_of(runtime_joules);
    reading.runtime_seconds = median_of(runtime_seconds);
    reading.worker_joules = median_of(worker_joules);
    reading.worker_seconds = median_of(worker_seconds);
    reading.spread = std::max(spread_of(runtime_joules), spread_of(worker_joules));
    reading.difference_joules = median_of(extra_joules);
    reading.difference_seconds = median_of(extra_seconds);
    return reading;
  };
  for (const auto& network : networks) {
    auto reading = read_network(network);
    if (reading) {
      result.steps.push_back(*reading);
      continue;
    }
    if (network.kind.empty()) return reading.error();
    // A kind that does not build or train here costs the probe that kind alone; jouled reads
    // its absence from the result and this line from stderr.
    fmt::print(stderr, "joule-worker runtime: {} layers not read: {}\n", network.kind, reading.error().message);
  }
  result.environment = detect_environment(request.device);
  result.wall_seconds = seconds_between(started, Clock::now());
  return result;
}

}  // namespace joule::worker
