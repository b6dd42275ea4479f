#include "joule/adapters/nvml_library.hpp"

#include <dlfcn.h>

#include <fmt/format.h>

namespace joule::adapters {

// Signatures as in nvml.h; nvmlReturn_t is an int-sized enum.
struct NvmlLibrary::Api {
  nvml::Return (*init)() = nullptr;
  nvml::Return (*shutdown)() = nullptr;
  const char* (*error_string)(nvml::Return) = nullptr;
  nvml::Return (*handle_by_index)(unsigned, nvml::Device*) = nullptr;
  nvml::Return (*name)(nvml::Device, char*, unsigned) = nullptr;
  nvml::Return (*total_energy)(nvml::Device, unsigned long long*) = nullptr;
  nvml::Return (*power_usage)(nvml::Device, unsigned*) = nullptr;
  // Optional: a missing one only makes its method fail.
  nvml::Return (*get_limit)(nvml::Device, unsigned*) = nullptr;
  nvml::Return (*get_limit_constraints)(nvml::Device, unsigned*, unsigned*) = nullptr;
  nvml::Return (*set_limit)(nvml::Device, unsigned) = nullptr;
  // MIG (R450 and newer): without them no GPU is in MIG mode.
  nvml::Return (*mig_mode)(nvml::Device, unsigned*, unsigned*) = nullptr;
  nvml::Return (*max_mig_count)(nvml::Device, unsigned*) = nullptr;
  nvml::Return (*mig_handle)(nvml::Device, unsigned, nvml::Device*) = nullptr;
  nvml::Return (*uuid)(nvml::Device, char*, unsigned) = nullptr;
  nvml::Return (*attributes)(nvml::Device, nvml::DeviceAttributes*) = nullptr;
  nvml::Return (*minor_number)(nvml::Device, unsigned*) = nullptr;
};

namespace {

template <class F>
bool resolve(void* handle, const char* symbol, F& into) {
  into = reinterpret_cast<F>(::dlsym(handle, symbol));
  return into != nullptr;
}

}  // namespace

Result<std::shared_ptr<NvmlLibrary>> NvmlLibrary::open(const std::string& path) {
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = ::dlerror();
    return make_error(ErrorCode::unavailable,
                      fmt::format("cannot load {} (no NVIDIA driver?): {}", path, why ? why : "dlopen failed"));
  }
  auto api = std::make_unique<Api>();
  const char* missing = nullptr;
  if (!resolve(handle, "nvmlInit_v2", api->init)) missing = "nvmlInit_v2";
  if (!resolve(handle, "nvmlShutdown", api->shutdown)) missing = "nvmlShutdown";
  if (!resolve(handle, "nvmlErrorString", api->error_string)) missing = "nvmlErrorString";
  if (!resolve(handle, "nvmlDeviceGetHandleByIndex_v2", api->handle_by_index))
    missing = "nvmlDeviceGetHandleByIndex_v2";
  if (!resolve(handle, "nvmlDeviceGetName", api->name)) missing = "nvmlDeviceGetName";
  if (!resolve(handle, "nvmlDeviceGetTotalEnergyConsumption", api->total_energy))
    missing = "nvmlDeviceGetTotalEnergyConsumption";
  if (!resolve(handle, "nvmlDeviceGetPowerUsage", api->power_usage)) missing = "nvmlDeviceGetPowerUsage";
  resolve(handle, "nvmlDeviceGetPowerManagementLimit", api->get_limit);
  resolve(handle, "nvmlDeviceGetPowerManagementLimitConstraints", api->get_limit_constraints);
  resolve(handle, "nvmlDeviceSetPowerManagementLimit", api->set_limit);
  resolve(handle, "nvmlDeviceGetMigMode", api->mig_mode);
  resolve(handle, "nvmlDeviceGetMaxMigDeviceCount", api->max_mig_count);
  resolve(handle, "nvmlDeviceGetMigDeviceHandleByIndex", api->mig_handle);
  resolve(handle, "nvmlDeviceGetUUID", api->uuid);
  resolve(handle, "nvmlDeviceGetAttributes_v2", api->attributes);
  resolve(handle, "nvmlDeviceGetMinorNumber", api->minor_number);
  if (missing) {
    ::dlclose(handle);
    return make_error(ErrorCode::unavailable, fmt::format("{}: no symbol {}", path, missing));
  }
  if (const nvml::Return rc = api->init(); rc != nvml::kSuccess) {
    const char* text = api->error_string(rc);
    auto error = make_error(ErrorCode::unavailable,
                            fmt::format("{}: nvmlInit_v2 failed: {} ({})", path, text ? text : "unknown error", rc));
    ::dlclose(handle);
    return error;
  }
  return std::shared_ptr<NvmlLibrary>(new NvmlLibrary(path, handle, std::move(api)));
}

NvmlLibrary::NvmlLibrary(std::string path, void* handle, std::unique_ptr<Api> api)
    : path_(std::move(path)), handle_(handle), api_(std::move(api)) {}

NvmlLibrary::~NvmlLibrary() {
  api_->shutdown();
  ::dlclose(handle_);
}

std::string NvmlLibrary::error_string(nvml::Return code) const {
  const char* text = api_->error_string(code);
  return text ? std::string(text) : fmt::format("NVML error {}", code);
}

Error NvmlLibrary::error_of(nvml::Return code, const char* call) const {
  ErrorCode kind = ErrorCode::io;
  if (code == nvml::kErrorNotSupported) kind = ErrorCode::unavailable;
  if (code == nvml::kErrorNoPermission) kind = ErrorCode::permission_denied;
  if (code == nvml::kErrorInvalidArgument) kind = ErrorCode::invalid_argument;
  if (code == nvml::kErrorNotFound) kind = ErrorCode::not_found;
  return make_error(kind, fmt::format("{}: {} ({})", call, error_string(code), code));
}

Result<nvml::Device> NvmlLibrary::device(unsigned index) const {
  nvml::Device device = nullptr;
  if (const auto rc = api_->handle_by_index(index, &device); rc != nvml::kSuccess)
    return error_of(rc, "nvmlDeviceGetHandleByIndex_v2");
  return device;
}

Result<std::string> NvmlLibrary::name(nvml::Device device) const {
  char buffer[nvml::kDeviceNameBufferSize] = {};
  if (const auto rc = api_->name(device, buffer, sizeof buffer); rc != nvml::kSuccess)
    return error_of(rc, "nvmlDeviceGetName");
  buffer[sizeof buffer - 1] = '\0';
  return std::string(buffer);
}

Result<std::uint64_t> NvmlLibrary::total_energy_mj(nvml::Device device) const {
  unsigned long long energy_mj = 0;
  if (const auto rc = api_->total_energy(device, &energy_mj); rc != nvml::kSuccess)
    return error_of(rc, "nvmlDeviceGetTotalEnergyConsumption");
  return static_cast<std::uint64_t>(energy_mj);
}

Result<std::uint32_t> NvmlLibrary::power_usage_mw(nvml::Device device) const {
  unsigned power_mw = 0;
  if (const auto rc = api_->power_usage(device, &power_mw); rc != nvml::kSuccess)
    return error_of(rc, "nvmlDeviceGetPowerUsage");
  return static_cast<std::uint32_t>(power_mw);
}

Result<unsigned> NvmlLibrary::minor_number(nvml::Device device) const {
  if (!api_->minor_number) return make_error(ErrorCode::unavailable, path_ + ": no symbol nvmlDeviceGetMinorNumber");
  unsigned minor = 0;
  if (const auto rc = api_->minor_number(device, &minor); rc != nvml::kSuccess)
    return error_of(rc, "nvmlDeviceGetMinorNumber");
  return minor;
}

Result<bool> NvmlLibrary::mig_enabled(nvml::Device device) const {
  if (!api_->mig_mode) return false;
  unsigned current = 0, pending = 0;
  const auto rc = api_->mig_mode(device, &current, &pending);
  if (rc == nvml::kErrorNotSupported) return false;  // a GPU without MIG
  if (rc != nvml::kSuccess) return error_of(rc, "nvmlDeviceGetMigMode");
  return current == nvml::kMigEnabled;
}

Result<std::vector<MigDevice>> NvmlLibrary::mig_devices(nvml::Device device) const {
  if (!api_->max_mig_count || !api_->mig_handle || !api_->uuid)
    return make_error(ErrorCode::unavailable, path_ + ": no MIG device entry points (a driver older than R450?)");
  unsigned count = 0;
  if (const auto rc = api_->max_mig_count(device, &count); rc != nvml::kSuccess)
    return error_of(rc, "nvmlDeviceGetMaxMigDeviceCount");
  std::vector<MigDevice> out;
  for (unsigned index = 0; index < count; ++index) {
    MigDevice mig;
    mig.index = index;
    const auto rc = api_->mig_handle(device, index, &mig.handle);
    if (rc == nvml::kErrorNotFound || rc == nvml::kErrorInvalidArgument) continue;  // no instance at this index
    if (rc != nvml::kSuccess) return error_of(rc, "nvmlDeviceGetMigDeviceHandleByIndex");
    char uuid[nvml::kDeviceUuidBufferSize] = {};
    if (const auto got = api_->uuid(mig.handle, uuid, sizeof uuid); got != nvml::kSuccess)
      return error_of(got, "nvmlDeviceGetUUID");
    uuid[sizeof uuid - 1] = '\0';
    mig.uuid = uuid;
    if (auto named = name(mig.handle)) mig.name = std::move(named).value();
    nvml::DeviceAttributes attributes;
    if (api_->attributes && api_->attributes(mig.handle, &attributes) == nvml::kSuccess) {
      mig.compute_slices = attributes.computeInstanceSliceCount;
      mig.memory_mb = attributes.memorySizeMB;
    }
    out.push_back(std::move(mig));
  }
  return out;
}

Result<std::uint32_t> NvmlLibrary::power_limit_mw(nvml::Device device) const {
  if (!api_->get_limit)
    return make_error(ErrorCode::unavailable, path_ + ": no symbol nvmlDeviceGetPowerManagementLimit");
  unsigned limit_mw = 0;
  if (const auto rc = api_->get_limit(device, &limit_mw); rc != nvml::kSuccess)
    return error_of(rc, "nvmlDeviceGetPowerManagementLimit");
  return static_cast<std::uint32_t>(limit_mw);
}

Result<PowerLimitConstraints> NvmlLibrary::power_limit_constraints(nvml::Device device) const {
  if (!api_->get_limit_constraints)
    return make_error(ErrorCode::unavailable, path_ + ": no symbol nvmlDeviceGetPowerManagementLimitConstraints");
  unsigned min_mw = 0, max_mw = 0;
  if (const auto rc = api_->get_limit_constraints(device, &min_mw, &max_mw); rc != nvml::kSuccess)
    return error_of(rc, "nvmlDeviceGetPowerManagementLimitConstraints");
  return PowerLimitConstraints{min_mw, max_mw};
}

Status NvmlLibrary::set_power_limit_mw(nvml::Device device, std::uint32_t limit_mw) const {
  if (!api_->set_limit)
    return make_error(ErrorCode::unavailable, path_ + ": no symbol nvmlDeviceSetPowerManagementLimit");
  if (const auto rc = api_->set_limit(device, limit_mw); rc != nvml::kSuccess)
    return error_of(rc, "nvmlDeviceSetPowerManagementLimit");
  return {};
}

}  // namespace joule::adapters
