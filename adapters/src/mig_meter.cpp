#include "joule/adapters/mig_meter.hpp"

#include <charconv>

#include <fmt/format.h>

namespace joule::adapters {

std::optional<MigName> parse_mig_name(const std::string& device) {
  constexpr std::string_view kPrefix = "mig:";
  if (device.rfind(kPrefix, 0) != 0) return std::nullopt;
  const char* begin = device.data() + kPrefix.size();
  const char* end = device.data() + device.size();
  MigName name;
  auto [dot, gpu_ec] = std::from_chars(begin, end, name.gpu);
  if (gpu_ec != std::errc{} || dot == begin || dot == end || *dot != '.') return std::nullopt;
  auto [last, index_ec] = std::from_chars(dot + 1, end, name.index);
  if (index_ec != std::errc{} || last != end || last == dot + 1) return std::nullopt;
  return name;
}

Result<std::shared_ptr<MigPartition>> MigPartition::open(std::shared_ptr<NvmlLibrary> library, unsigned gpu,
                                                         SecondsClock now_seconds) {
  auto handle = library->device(gpu);
  if (!handle) return make_error(handle.error().code, fmt::format("GPU {}: {}", gpu, handle.error().message));
  auto enabled = library->mig_enabled(*handle);
  if (!enabled) return enabled.error();
  if (!*enabled)
    return make_error(
        ErrorCode::unavailable,
        fmt::format("GPU {} is not in MIG mode (nvidia-smi -i {} -mig 1 enables it): name it cuda:{}", gpu, gpu, gpu));
  auto devices = library->mig_devices(*handle);
  if (!devices) return devices.error();
  if (devices->empty())
    return make_error(ErrorCode::unavailable,
                      fmt::format("GPU {} is in MIG mode but has no MIG devices yet (nvidia-smi mig -cgi ... -C "
                                  "creates them)",
                                  gpu));
  auto gpu_meter = NvmlMeter::open(library, gpu, std::move(now_seconds));
  if (!gpu_meter) return gpu_meter.error();
  auto partition =
      std::shared_ptr<MigPartition>(new MigPartition(gpu, std::move(gpu_meter).value(), std::move(devices).value()));
  // The first reading: the counter counts from here.
  auto first = partition->gpu_meter_->read();
  if (!first) return first.error();
  partition->last_gpu_joules_ = first->value;
  return partition;
}

MigPartition::MigPartition(unsigned gpu, std::unique_ptr<NvmlMeter> gpu_meter, std::vector<MigDevice> devices)
    : gpu_(gpu), gpu_meter_(std::move(gpu_meter)), devices_(std::move(devices)) {
  for (const auto& device : devices_) joules_[device.index] = 0.0;
}

std::optional<unsigned> MigPartition::gpu_minor() const {
  auto minor = gpu_meter_->library()->minor_number(gpu_meter_->device());
  return minor ? std::optional(*minor) : std::nullopt;
}

const MigDevice* MigPartition::device(unsigned index) const {
  for (const auto& device : devices_)
    if (device.index == index) return &device;
  return nullptr;
}

double MigPartition::slices(unsigned index) const {
  const MigDevice* found = device(index);
  // A driver without nvmlDeviceGetAttributes_v2: every MIG device counts as one slice.
  return found && found->compute_slices > 0 ? found->compute_slices : 1.0;
}

Status MigPartition::advance() {
  auto reading = gpu_meter_->read();
  if (!reading) return reading.error();
  const double gained = std::max(0.0, reading->value - last_gpu_joules_);
  last_gpu_joules_ = reading->value;
  if (gained <= 0.0) return {};
  double weight = 0.0;
  for (const unsigned index : busy_) weight += slices(index);
  const bool none_busy = weight <= 0.0;
  if (none_busy)
    for (const auto& device : devices_) weight += slices(device.index);
  for (auto& [index, joules] : joules_)
    if (none_busy || busy_.contains(index)) joules += gained * slices(index) / weight;
  return {};
}

void MigPartition::set_busy(unsigned index, bool busy) {
  if (busy == busy_.contains(index) || !device(index)) return;
  (void)advance();  // what came before was shared as things stood then; a failed read is the next's
  if (busy)
    busy_.insert(index);
  else
    busy_.erase(index);
}

bool MigPartition::others_busy(unsigned index) const {
  for (const unsigned other : busy_)
    if (other != index) return true;
  return false;
}

Result<Joules> MigPartition::read(unsigned index) {
  if (!device(index)) return make_error(ErrorCode::not_found, fmt::format("GPU {} has no MIG device {}", gpu_, index));
  if (auto status = advance(); !status) return status.error();
  return Joules{joules_.at(index)};
}

std::string MigPartition::rule(unsigned index) const {
  double total = 0.0;
  for (const auto& device : devices_) total += slices(device.index);
  return fmt::format(
      "its share of GPU {}'s energy counter (NVML meters no MIG device alone): each interval goes to the MIG devices "
      "with work by their compute slices ({:g} of the {:g} its {} MIG devices have), to all by slices while none has "
      "work",
      gpu_, slices(index), total, devices_.size());
}

Result<std::shared_ptr<MigPartition>> MigPartitions::of(const std::string& nvml_library, unsigned gpu,
                                                        SecondsClock now_seconds) {
  const auto key = std::pair{nvml_library, gpu};
  if (auto open = open_[key].lock()) return open;
  auto library = NvmlLibrary::open(nvml_library);
  if (!library) return library.error();
  auto partition = MigPartition::open(std::move(library).value(), gpu, std::move(now_seconds));
  if (!partition) return partition.error();
  open_[key] = *partition;
  return partition;
}

Result<std::unique_ptr<MigMeter>> MigMeter::open(std::shared_ptr<MigPartition> partition, unsigned index) {
  const MigDevice* device = partition->device(index);
  if (!device) {
    std::string known;
    for (const auto& other : partition->devices())
      known += fmt::format("{}mig:{}.{} ({})", known.empty() ? "" : ", ", partition->gpu(), other.index, other.name);
    return make_error(ErrorCode::not_found,
                      fmt::format("GPU {} has no MIG device {}; it has {}", partition->gpu(), index, known));
  }
  std::string uuid = device->uuid;
  std::string name = device->name;
  return std::unique_ptr<MigMeter>(new MigMeter(std::move(partition), index, std::move(uuid), std::move(name)));
}

std::string MigMeter::description() const {
  return fmt::format("{} ({}) of GPU {} {}: {}", name_, uuid_, partition_->gpu(), partition_->gpu_name(),
                     partition_->rule(index_));
}

}  // namespace joule::adapters
