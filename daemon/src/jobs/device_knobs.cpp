#include "joule/daemon/device_knobs.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>

#include <fmt/format.h>

#include "joule/adapters/job_process.hpp"

namespace joule::daemon {

namespace {

// Where below the top of a knob's range the choices lie: far enough apart that a few steps of
// a network read them apart, few enough that measuring every queued network at each stays cheap.
constexpr double kPowerFractions[] = {0.85, 0.70, 0.55};
constexpr double kClockFractions[] = {0.80, 0.60, 0.45};

// A clock cap at `fraction` of `max_mhz`: a table's highest frequency not above it (its lowest
// where none is), else rounded to 100 MHz; within [min_mhz, max_mhz), nothing otherwise.
std::optional<double> clock_choice(double fraction, double min_mhz, double max_mhz, const std::vector<double>& table) {
  const double target = fraction * max_mhz;
  double mhz = std::round(target / 100.0) * 100.0;
  if (!table.empty()) {
    mhz = table.front();
    for (const double entry : table)
      if (entry <= target) mhz = entry;
  }
  mhz = std::max(mhz, min_mhz);
  if (!(mhz < max_mhz) || !(mhz > 0.0)) return std::nullopt;
  return mhz;
}

void add_unique(std::vector<estimator::KnobSetting>& out, estimator::KnobSetting setting) {
  if (std::find(out.begin(), out.end(), setting) == out.end()) out.push_back(std::move(setting));
}

// The CPUs a policy clocks (its affected_cpus, "0 1 2"); empty where they cannot be read.
std::vector<int> cpus_of(const adapters::CpuFrequencyPolicy& policy) {
  std::vector<int> out;
  std::istringstream words(policy.cpus);
  for (std::string word; words >> word;) {
    int cpu = -1;
    const auto [end, error] = std::from_chars(word.data(), word.data() + word.size(), cpu);
    if (error != std::errc{} || end != word.data() + word.size() || cpu < 0) return {};
    out.push_back(cpu);
  }
  return out;
}

}  // namespace

bool clocks_per_cpu(const adapters::CpuFrequencyKnob& knob) {
  return !knob.policies.empty() && std::all_of(knob.policies.begin(), knob.policies.end(),
                                               [](const auto& policy) { return cpus_of(policy).size() == 1; });
}

Result<adapters::CpuFrequencyKnob> clocks_of_cpus(const adapters::CpuFrequencyKnob& knob,
                                                  const std::vector<int>& cpus) {
  adapters::CpuFrequencyKnob narrowed = knob;
  narrowed.policies.clear();
  std::vector<int> covered;
  for (const auto& policy : knob.policies) {
    const std::vector<int> clocked = cpus_of(policy);
    const auto mine = [&](int cpu) { return std::find(cpus.begin(), cpus.end(), cpu) != cpus.end(); };
    const bool any = std::any_of(clocked.begin(), clocked.end(), mine);
    if (!any) continue;
    if (!std::all_of(clocked.begin(), clocked.end(), mine))
      return make_error(ErrorCode::conflict,
                        fmt::format("{} clocks CPUs {} together, and the job holds only {} of them: a cap would reach "
                                    "the jobs beside it",
                                    policy.directory.filename().string(), policy.cpus, adapters::cpu_list_text(cpus)));
    covered.insert(covered.end(), clocked.begin(), clocked.end());
    narrowed.policies.push_back(policy);
  }
  for (const int cpu : cpus)
    if (std::find(covered.begin(), covered.end(), cpu) == covered.end())
      return make_error(ErrorCode::unavailable, fmt::format("CPU {} has no cpufreq policy to cap", cpu));
  // The device's range stays: a job's cap was checked against it, and each policy clamps it.
  return narrowed;
}

std::vector<estimator::KnobSetting> knob_choices(const Device& device) {
  std::vector<estimator::KnobSetting> out;
  if (!device.node.empty() || !device.runs_jobs) return out;
  if (device.can_limit_gpu && device.gpu_max_watts > 0.0) {
    for (const double fraction : kPowerFractions) {
      const double watts = std::max(device.gpu_min_watts, std::round(fraction * device.gpu_max_watts));
      if (watts < device.gpu_max_watts) add_unique(out, {"gpu_power_limit_watts", watts, fmt::format("{:g} W", watts)});
    }
  }
  if (device.cpu_frequency) {
    const auto& knob = *device.cpu_frequency;
    const std::vector<double> table =
        knob.policies.size() == 1 ? knob.policies.front().available_mhz : std::vector<double>{};
    for (const double fraction : kClockFractions)
      if (const auto mhz = clock_choice(fraction, knob.min_mhz, knob.max_mhz, table))
        add_unique(out, {"cpu_max_frequency_mhz", *mhz, fmt::format("{:g} MHz", *mhz)});
  }
  if (device.gpu_frequency) {
    const auto& knob = *device.gpu_frequency;
    std::vector<double> table;
    for (const auto hz : knob.available_hz) table.push_back(static_cast<double>(hz) / 1e6);
    for (const double fraction : kClockFractions)
      if (const auto mhz = clock_choice(fraction, knob.min_mhz, knob.max_mhz, table))
        add_unique(out, {"gpu_max_frequency_mhz", *mhz, fmt::format("{:g} MHz", *mhz)});
  }
  return out;
}

schedulers::Knobs knobs_of(const estimator::KnobSetting& setting) {
  schedulers::Knobs knobs;
  if (setting.knob == "gpu_power_limit_watts") knobs.gpu_power_limit_watts = setting.value;
  if (setting.knob == "cpu_max_frequency_mhz") knobs.cpu_max_frequency_mhz = setting.value;
  if (setting.knob == "gpu_max_frequency_mhz") knobs.gpu_max_frequency_mhz = setting.value;
  if (setting.knob == "power_mode") knobs.power_mode = fmt::format("{:g}", setting.value);
  return knobs;
}

std::optional<estimator::KnobSetting> setting_of(const schedulers::Knobs& knobs) {
  if (knobs.cpu_energy_preference || knobs.power_mode) return std::nullopt;
  const int set = (knobs.gpu_power_limit_watts ? 1 : 0) + (knobs.cpu_max_frequency_mhz ? 1 : 0) +
                  (knobs.gpu_max_frequency_mhz ? 1 : 0);
  if (set != 1) return std::nullopt;
  if (knobs.gpu_power_limit_watts)
    return estimator::KnobSetting{"gpu_power_limit_watts", *knobs.gpu_power_limit_watts, ""};
  if (knobs.cpu_max_frequency_mhz)
    return estimator::KnobSetting{"cpu_max_frequency_mhz", *knobs.cpu_max_frequency_mhz, ""};
  return estimator::KnobSetting{"gpu_max_frequency_mhz", *knobs.gpu_max_frequency_mhz, ""};
}

std::unique_ptr<adapters::GpuPowerLimit> gpu_power_limit_of(const Device& device, adapters::ControlJournal* journal) {
  const auto* gpu = device.meter ? device.meter->gpu_power_control() : nullptr;
  if (!gpu || device.name.rfind("cuda:", 0) != 0) return nullptr;
  auto limit =
      std::make_unique<adapters::GpuPowerLimit>(*gpu, static_cast<unsigned>(std::stoul(device.name.substr(5))));
  limit->keep_original_in(journal);
  return limit;
}

DeviceKnobs::DeviceKnobs(adapters::ControlJournal* journal, adapters::CommandRunner run_tool)
    : journal_(journal), run_tool_(run_tool ? std::move(run_tool) : adapters::system_command_runner()) {}

Result<std::vector<std::string>> DeviceKnobs::apply(const schedulers::Knobs& knobs, const Device& device,
                                                    const std::function<adapters::GpuPowerLimit*()>& gpu_limit,
                                                    bool skip_gpu_limit, const std::vector<int>& cpus) {
  std::vector<std::string> set;
  std::optional<Error> refused;
  adapters::GpuPowerLimit* limit = nullptr;
  if (knobs.power_mode) {
    const auto mode = device.power_modes ? device.power_modes->find(*knobs.power_mode) : std::nullopt;
    if (!mode) {
      refused = make_error(ErrorCode::unavailable,
                           fmt::format("{} has no power mode \"{}\"", device.name, *knobs.power_mode));
    } else {
      power_mode_ = std::make_unique<adapters::JetsonPowerMode>(*device.power_modes, journal_, run_tool_);
      if (auto applied = power_mode_->set(*mode))
        set.push_back("power_mode " + *applied);
      else
        refused = applied.error();
    }
  }
  if (!refused && knobs.wants_cpu()) {
    auto knob = device.cpu_frequency
                    ? Result<adapters::CpuFrequencyKnob>(*device.cpu_frequency)
                    : Result<adapters::CpuFrequencyKnob>(
                          make_error(ErrorCode::unavailable, fmt::format("{} has no CPU frequency knob", device.name)));
    if (knob && !cpus.empty()) knob = clocks_of_cpus(*knob, cpus);
    if (!knob) {
      refused = knob.error();
    } else {
      cpu_frequency_ = std::make_unique<adapters::CpuFrequencyLimit>(std::move(*knob), journal_);
      if (knobs.cpu_max_frequency_mhz) {
        if (auto applied = cpu_frequency_->set_max_mhz(*knobs.cpu_max_frequency_mhz))
          set.push_back(fmt::format("cpu_max_frequency_mhz {:g} ({})", *knobs.cpu_max_frequency_mhz, *applied));
        else
          refused = applied.error();
      }
      if (!refused && knobs.cpu_energy_preference) {
        if (auto applied = cpu_frequency_->set_energy_preference(*knobs.cpu_energy_preference))
          set.push_back("cpu_energy_preference " + *knobs.cpu_energy_preference);
        else
          refused = applied.error();
      }
    }
  }
  if (!refused && knobs.gpu_max_frequency_mhz) {
    if (!device.gpu_frequency) {
      refused = make_error(ErrorCode::unavailable, fmt::format("{} has no GPU clock limit", device.name));
    } else {
      gpu_frequency_ = std::make_unique<adapters::DevfreqLimit>(*device.gpu_frequency, journal_);
      if (auto applied = gpu_frequency_->set_max_mhz(*knobs.gpu_max_frequency_mhz))
        set.push_back(fmt::format("gpu_max_frequency_mhz {:g} ({})", *knobs.gpu_max_frequency_mhz, *applied));
      else
        refused = applied.error();
    }
  }
  if (!refused && knobs.gpu_power_limit_watts && !skip_gpu_limit) {
    if (limit = gpu_limit ? gpu_limit() : nullptr; !limit) {
      refused = make_error(ErrorCode::unavailable, fmt::format("{} has no NVML power limit", device.name));
    } else if (auto applied = limit->set_watts(*knobs.gpu_power_limit_watts)) {
      set.push_back(fmt::format("gpu_power_limit_watts {:g} ({})", *knobs.gpu_power_limit_watts, applied->describe()));
    } else {
      refused = applied.error();
    }
  }
  if (refused) {
    (void)restore(limit);
    return *refused;
  }
  return set;
}

std::vector<std::string> DeviceKnobs::restore(adapters::RestorableControl* gpu_limit) {
  std::vector<std::string> failures;
  for (adapters::RestorableControl* control : std::initializer_list<adapters::RestorableControl*>{
           cpu_frequency_.get(), gpu_frequency_.get(), gpu_limit, power_mode_.get()}) {
    if (!control) continue;
    if (auto restored = control->restore(); !restored) failures.push_back(restored.error().message);
  }
  cpu_frequency_.reset();
  gpu_frequency_.reset();
  power_mode_.reset();
  return failures;
}

}  // namespace joule::daemon
