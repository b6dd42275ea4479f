#include "joule/adapters/meter_selection.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <optional>

#include <fmt/format.h>

#include "joule/adapters/battery_meter.hpp"
#include "joule/adapters/hwmon_meter.hpp"
#include "joule/adapters/ina3221_meter.hpp"
#include "joule/adapters/mig_meter.hpp"
#include "joule/adapters/nvml_meter.hpp"
#include "joule/adapters/rapl_meter.hpp"

namespace joule::adapters {

namespace {

struct Opened {
  std::unique_ptr<EnergyMeter> meter;
  std::string description;
};

// Takes a meter only once it has given a first reading.
template <class M, class Describe>
Result<Opened> first_read(Result<std::unique_ptr<M>> opened, Describe describe) {
  if (!opened) return opened.error();
  std::unique_ptr<M> meter = std::move(opened).value();
  if (auto reading = meter->read(); !reading) return reading.error();
  std::string description = describe(*meter);
  return Opened{std::move(meter), std::move(description)};
}

std::optional<unsigned> gpu_index(const std::string& device) {
  constexpr std::string_view kPrefix = "cuda:";
  if (device.rfind(kPrefix, 0) != 0 || device.size() == kPrefix.size()) return std::nullopt;
  unsigned index = 0;
  const char* begin = device.data() + kPrefix.size();
  const char* end = device.data() + device.size();
  const auto [ptr, ec] = std::from_chars(begin, end, index);
  if (ec != std::errc{} || ptr != end) return std::nullopt;
  return index;
}

// A GPU in MIG mode cannot run a CUDA job whole (a process sees one MIG device): its MIG devices
// are the devices then, and the error names them.
std::optional<Error> whole_gpu_in_mig_mode(const NvmlLibrary& library, unsigned gpu) {
  auto handle = library.device(gpu);
  if (!handle) return std::nullopt;  // the meter's own open says so
  auto enabled = library.mig_enabled(*handle);
  if (!enabled || !*enabled) return std::nullopt;
  std::string names;
  if (auto devices = library.mig_devices(*handle))
    for (const auto& device : *devices)
      names += fmt::format("{}mig:{}.{} ({})", names.empty() ? "" : ", ", gpu, device.index, device.name);
  return make_error(ErrorCode::invalid_argument,
                    fmt::format("GPU {} is in MIG mode: a job cannot use it whole; name its MIG devices as devices "
                                "instead: {}",
                                gpu, names.empty() ? "it has none yet" : names));
}

std::string model_note(const ModelledCpuParams& params, bool process) {
  return fmt::format("{} modelled as {:.4g} W idle + {:.4g} W per busy core: an estimate, not a measurement",
                     process ? "this process's CPU time" : "CPU time of the whole node (/proc/stat)", params.idle_watts,
                     params.watts_per_busy_core);
}

Result<Opened> try_source(const std::string& source, const MeterRequest& request, const MeterRoots& roots,
                          std::optional<unsigned> gpu, std::optional<MigName> mig) {
  if (source == "rapl")
    return first_read(RaplMeter::open(RaplOptions{roots.sys, roots.proc, roots.reader}),
                      [](const RaplMeter& m) { return m.description(); });
  if (source == "nvml" && mig) {
    if (request.scope == "process") {
      // A probe on a MIG device reads its GPU's counter whole: jouled runs it while the GPU's
      // other MIG devices have no work.
      auto library = NvmlLibrary::open(roots.nvml_library);
      if (!library) return library.error();
      auto partition = MigPartition::open(*library, mig->gpu, roots.monotonic_seconds);
      if (!partition) return partition.error();
      if (!(*partition)->device(mig->index))
        return make_error(ErrorCode::not_found, fmt::format("GPU {} has no MIG device {}", mig->gpu, mig->index));
      return first_read(NvmlMeter::open(*library, mig->gpu, roots.monotonic_seconds), [&](const NvmlMeter& m) {
        return m.description() + fmt::format(", whole, for mig:{}.{} while the GPU's other MIG devices have no work",
                                             mig->gpu, mig->index);
      });
    }
    // Roots without a node's partitions (a tool metering one MIG device): a partition of its own.
    const auto partitions = roots.mig_partitions ? roots.mig_partitions : std::make_shared<MigPartitions>();
    auto partition = partitions->of(roots.nvml_library, mig->gpu, roots.monotonic_seconds);
    if (!partition) return partition.error();
    return first_read(MigMeter::open(*partition, mig->index), [](const MigMeter& m) { return m.description(); });
  }
  if (source == "nvml") {
    auto library = NvmlLibrary::open(roots.nvml_library);
    if (!library) return library.error();
    if (auto problem = whole_gpu_in_mig_mode(**library, *gpu)) return *problem;
    return first_read(NvmlMeter::open(*library, *gpu, roots.monotonic_seconds),
                      [](const NvmlMeter& m) { return m.description(); });
  }
  if (source == "ina3221") {
    std::vector<std::string> rails = gpu ? kJetsonGpuRails : kJetsonInputRails;
    if (!request.rail.empty()) rails = {request.rail};
    return first_read(Ina3221Meter::open(Ina3221Options{roots.sys, rails, roots.reader, roots.monotonic_seconds}),
                      [](const Ina3221Meter& m) { return m.description(); });
  }
  if (source == "hwmon")
    return first_read(
        HwmonMeter::open(HwmonOptions{roots.sys, "", request.rail, roots.reader, roots.monotonic_seconds}),
        [](const HwmonMeter& m) { return m.description(); });
  if (source == "battery")
    return first_read(BatteryMeter::open(BatteryOptions{roots.sys, "", roots.reader, roots.monotonic_seconds}),
                      [](const BatteryMeter& m) { return m.description(); });
  // "modelled"
  const bool process = request.scope == "process";
  const std::string note = model_note(request.modelled, process);
  if (process)
    return first_read(Result<std::unique_ptr<ProcessModelledMeter>>(std::make_unique<ProcessModelledMeter>(
                          request.modelled, roots.process_cpu_seconds, roots.monotonic_seconds)),
                      [&](const ProcessModelledMeter&) { return note; });
  return first_read(Result<std::unique_ptr<ModelledCpuMeter>>(
                        std::make_unique<ModelledCpuMeter>(request.modelled, roots.proc, ::sysconf(_SC_CLK_TCK))),
                    [&](const ModelledCpuMeter&) { return note; });
}

}  // namespace

Result<SelectedMeter> select_meter(const MeterRequest& request, const MeterRoots& roots) {
  const std::optional<MigName> mig = parse_mig_name(request.device);
  const std::optional<unsigned> gpu = mig ? std::optional(mig->gpu) : gpu_index(request.device);
  if (request.device != "cpu" && !gpu)
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("device \"{}\": expected \"cpu\", \"cuda:N\" or \"mig:G.I\"", request.device));
  if (request.scope != "device" && request.scope != "process")
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("meter scope \"{}\": expected \"device\" or \"process\"", request.scope));

  static const std::vector<std::string> kCpu = {"rapl", "ina3221", "battery", "modelled"};
  static const std::vector<std::string> kGpu = {"nvml", "ina3221"};
  static const std::vector<std::string> kKnown = {"rapl", "nvml", "ina3221", "hwmon", "battery", "modelled"};
  std::vector<std::string> order;
  if (mig && request.meter != "auto" && request.meter != "nvml")
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("meter \"{}\" cannot meter MIG device {}: only nvml (its GPU's counter, shared)",
                                  request.meter, request.device));
  if (request.meter == "auto") {
    order = mig ? std::vector<std::string>{"nvml"} : gpu ? kGpu : kCpu;
  } else if (std::find(kKnown.begin(), kKnown.end(), request.meter) != kKnown.end()) {
    const bool cpu_only = request.meter == "rapl" || request.meter == "battery" || request.meter == "modelled";
    if ((gpu && cpu_only) || (!gpu && request.meter == "nvml"))
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("meter \"{}\" cannot meter device {}", request.meter, request.device));
    order = {request.meter};
  } else {
    return make_error(
        ErrorCode::invalid_argument,
        fmt::format("meter \"{}\": expected auto, rapl, nvml, ina3221, hwmon, battery or modelled", request.meter));
  }

  SelectedMeter selected;
  std::string why_not;
  ErrorCode last_code = ErrorCode::unavailable;
  for (const auto& source : order) {
    auto opened = try_source(source, request, roots, gpu, mig);
    if (opened) {
      selected.meter = std::move(opened->meter);
      selected.considered.push_back(MeterCandidate{source, true, std::move(opened->description)});
      return selected;
    }
    selected.considered.push_back(MeterCandidate{source, false, opened.error().message});
    why_not += fmt::format("{}{}: {}", why_not.empty() ? "" : "; ", source, opened.error().message);
    last_code = opened.error().code;
  }
  return make_error(request.meter == "auto" ? ErrorCode::unavailable : last_code,
                    fmt::format("no meter for {}: {}", request.device, why_not));
}

}  // namespace joule::adapters
