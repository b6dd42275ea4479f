#include "trainer.hpp"

#include "joule/adapters/measurement_window.hpp"
#include "joule/common/allocator_settings.hpp"
#include "joule/common/energy_source.hpp"

#include <dlfcn.h>
#include <malloc.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <regex>
#include <string_view>

#include <fmt/format.h>

#include "environment.hpp"
#include "network_builder.hpp"

namespace joule::worker {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

}  // namespace

void pin_allocator() {
  ::mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMallocMmapThresholdBytes));
  ::mallopt(M_TRIM_THRESHOLD, static_cast<int>(kMallocTrimThresholdBytes));
  ::mallopt(M_MMAP_MAX, kMallocMmapMax);
}

void set_worker_threads(int threads) {
  torch::set_num_threads(threads);
  static std::once_flag interop;
  std::call_once(interop, [] {
    try {
      torch::set_num_interop_threads(1);
    } catch (const c10::Error&) {
      // Inter-op work already started in this process (a test binary): the pool keeps its size.
    }
  });
  using SetThreads = void (*)(int);
  if (auto* set_blas = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads")))
    set_blas(threads);
}

std::string torch_device(const std::string& device) { return device.rfind("mig:", 0) == 0 ? "cuda:0" : device; }

Status check_device(const std::string& requested) {
  if (requested == "cpu") return {};
  static const std::regex cuda("cuda:(0|[1-9][0-9]{0,3})");
  static const std::regex mig("mig:(0|[1-9][0-9]{0,2})\\.(0|[1-9][0-9]?)");
  if (!std::regex_match(requested, cuda) && !std::regex_match(requested, mig))
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("device must be \"cpu\", \"cuda:N\" or \"mig:G.I\", got \"{}\"", requested));
  if (requested.rfind("mig:", 0) == 0) {
    // A process sees one MIG device, as cuda:0: the one CUDA_VISIBLE_DEVICES names.
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    if (!visible || std::string_view(visible).rfind("MIG-", 0) != 0)
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("device {} needs CUDA_VISIBLE_DEVICES naming its MIG device (MIG-...; jouled sets "
                                    "it): without it CUDA would pick whichever MIG device comes first",
                                    requested));
  }
  const std::string device = torch_device(requested);
  if (!torch::cuda::is_available())
    return make_error(ErrorCode::unavailable,
                      fmt::format("device {} asked for, but CUDA is not available (a CPU-only LibTorch, no NVIDIA "
                                  "driver or no visible GPU); use --device cpu",
                                  device));
  const auto index = static_cast<std::size_t>(std::stoul(device.substr(device.find(':') + 1)));
  if (index >= torch::cuda::device_count())
    return make_error(ErrorCode::unavailable, fmt::format("device {} asked for, but only {} CUDA device(s) are visible",
                                                          device, torch::cuda::device_count()));
  return {};
}

double default_min_reading_seconds(std::string_view source) {
  // RAPL is updated every ~1 ms in 61 µJ units and the modelled meter reads the process's CPU
  // clock, but a reading also averages what the machine does meanwhile (other processes, cache
  // and frequency changes): a quarter second keeps one reading's spread within a few per cent.
  if (source == "rapl" || source == "modelled") return 0.25;
  return 2.0;  // nvml, ina3221, hwmon, battery: power or energy updated every 10-100 ms or slower
}

Result<ProbeResult> run_probe(const ProbeRequest& request, adapters::EnergyMeter& meter) {
  const auto started = Clock::now();
  if (auto status = check_device(request.device); !status) return status.error();
  set_worker_threads(request.threads);
  const torch::Device device(torch_device(request.device));

  std::vector<TrainingSession> sessions;
  for (std::size_t i = 0; i < request.networks.size(); ++i) {
    SessionOptions options{request.batch_size, request.optimizer_of(i), device, request.seed};
    auto session = TrainingSession::create(request.networks[i], options, fmt::format("/networks/{}", i));
    if (!session) return session.error();
    sessions.push_back(std::move(session).value());
  }

  // Warm-up, timing its last steps: a reading must last long enough for the meter to resolve it.
  const double min_reading = request.min_reading_seconds > 0.0 ? request.min_reading_seconds
                                                                : default_min_reading_seconds(meter.source());
  // Steps that make a reading last min_reading at this pace, at least steps_per_repetition.
  auto steps_lasting = [&](double step_seconds) {
    const double needed = std::ceil(min_reading / std::max(1e-6, step_seconds));
    return static_cast<int>(std::clamp(needed, static_cast<double>(request.steps_per_repetition), 1e6));
  };
  std::vector<torch::Tensor> last_loss(sessions.size());
  std::vector<int> steps_per_reading(sessions.size(), request.steps_per_repetition);
  for (std::size_t i = 0; i < sessions.size(); ++i) {
    // The first step allocates what the later ones reuse: it is never timed when there are more.
    const int timed = std::max(1, std::min(5, request.warmup_steps - 1));
    for (int step = 0; step < request.warmup_steps - timed; ++step) last_loss[i] = sessions[i].step();
    synchronize(device);
    const auto before = Clock::now();
    for (int step = 0; step < timed; ++step) last_loss[i] = sessions[i].step();
    synchronize(device);
    steps_per_reading[i] = steps_lasting(seconds_between(before, Clock::now()) / timed);
  }

  ProbeResult result;
  result.meter_source = std::string(meter.source());
  result.measured = joule::is_measurement(result.meter_source);
  result.batch_size = request.batch_size;
  result.optimizer = request.optimizer;
  result.warmup_steps = request.warmup_steps;
  result.steps_per_repetition = request.steps_per_repetition;
  result.networks.resize(sessions.size());

  for (int round = 0; round < request.repetitions; ++round) {
    for (std::size_t i = 0; i < sessions.size(); ++i) {
      const double steps = static_cast<double>(steps_per_reading[i]);
      synchronize(device);
      auto window = joule::adapters::MeasurementWindow::begin(meter, Clock::now());
      if (!window) return window.error();
      for (int step = 0; step < steps_per_reading[i]; ++step) last_loss[i] = sessions[i].step();
      synchronize(device);
      auto measured = window->read(meter, Clock::now());
      if (!measured) return measured.error();
      const double step_seconds = measured->seconds / steps;
      result.networks[i].repetitions.push_back(
          Repetition{measured->joules / steps, step_seconds, steps_per_reading[i]});
      // The next reading is sized by this one's pace: warm-up steps timed on a busy machine (or
      // before caches settle) were off by 10x, and readings meant to last 0.25 s lasted 2.5 s.
      steps_per_reading[i] = steps_lasting(step_seconds);
    }
  }

  for (std::size_t i = 0; i < sessions.size(); ++i) {
    NetworkResult& network = result.networks[i];
    network.name = request.networks[i].name.empty() ? fmt::format("network-{}", i) : request.networks[i].name;
    std::vector<double> joules;
    std::vector<double> seconds;
    for (const auto& repetition : network.repetitions) {
      joules.push_back(repetition.joules_per_step);
      seconds.push_back(repetition.seconds_per_step);
    }
    network.steps_per_repetition = network.repetitions.empty() ? steps_per_reading[i] : network.repetitions[0].steps;
    network.joules_per_step = median_of(joules);
    network.seconds_per_step = median_of(seconds);
    network.joules_spread = spread_of(joules);
    network.seconds_spread = spread_of(seconds);
    network.final_loss = last_loss[i].defined() ? last_loss[i].item<double>() : 0.0;
    if (!std::isfinite(network.final_loss))
      return make_error(ErrorCode::internal,
                        fmt::format("network {} ({}): the loss became {}; its timings are not trustworthy", i,
                                    network.name, network.final_loss),
                        fmt::format("/networks/{}", i));
  }
  result.environment = detect_environment(request.device);
  result.wall_seconds = seconds_between(started, Clock::now());
  return result;
}

}  // namespace joule::worker
