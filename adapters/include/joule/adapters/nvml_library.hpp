#pragma once
// NVML loaded at run time: the build needs no NVIDIA package, and a node without a driver
// simply has no `nvml` meter. The few NVML types and entry points used are declared here.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "joule/common/result.hpp"

namespace joule::adapters {

/// NVML's C ABI, as in nvml.h (only what Joule calls).
namespace nvml {
using Return = int;  ///< nvmlReturn_t
inline constexpr Return kSuccess = 0;
inline constexpr Return kErrorUninitialized = 1;
inline constexpr Return kErrorInvalidArgument = 2;
inline constexpr Return kErrorNotSupported = 3;
inline constexpr Return kErrorNoPermission = 4;
inline constexpr Return kErrorNotFound = 6;
inline constexpr Return kErrorDriverNotLoaded = 9;
inline constexpr Return kErrorGpuIsLost = 15;
inline constexpr unsigned kDeviceNameBufferSize = 96;  ///< NVML_DEVICE_NAME_V2_BUFFER_SIZE
inline constexpr unsigned kDeviceUuidBufferSize = 96;  ///< NVML_DEVICE_UUID_V2_BUFFER_SIZE
inline constexpr unsigned kMigEnabled = 1;             ///< NVML_DEVICE_MIG_ENABLE
struct Device_st;
using Device = Device_st*;  ///< nvmlDevice_t
/// nvmlDeviceAttributes_t (nvmlDeviceGetAttributes_v2): what a MIG device has of its GPU.
struct DeviceAttributes {
  unsigned multiprocessorCount = 0;
  unsigned sharedCopyEngineCount = 0;
  unsigned sharedDecoderCount = 0;
  unsigned sharedEncoderCount = 0;
  unsigned sharedJpegCount = 0;
  unsigned sharedOfaCount = 0;
  unsigned gpuInstanceSliceCount = 0;
  unsigned computeInstanceSliceCount = 0;
  unsigned long long memorySizeMB = 0;
};
}  // namespace nvml

/// One MIG device (a compute instance of a GPU instance) of a GPU in MIG mode.
struct MigDevice {
  unsigned index = 0;  ///< nvmlDeviceGetMigDeviceHandleByIndex's index, as nvidia-smi -L numbers them
  nvml::Device handle = nullptr;
  std::string uuid;  ///< "MIG-..." what CUDA_VISIBLE_DEVICES names it by
  std::string name;  ///< "NVIDIA A100-SXM4-40GB MIG 3g.20gb"
  unsigned compute_slices = 0;
  unsigned long long memory_mb = 0;
};

/// Allowed range of a GPU's power limit, in milliwatts as NVML gives it.
struct PowerLimitConstraints {
  std::uint32_t min_mw = 0;
  std::uint32_t max_mw = 0;
};

/// One loaded and initialised NVML: dlopen + nvmlInit_v2 on open, nvmlShutdown + dlclose on
/// destruction. Shared (std::shared_ptr) by the meters of all GPUs of a node. Methods are
/// thin: each maps an NVML return code to a Result whose message carries nvmlErrorString.
/// NVML_ERROR_NOT_SUPPORTED -> unavailable, NO_PERMISSION -> permission_denied,
/// INVALID_ARGUMENT -> invalid_argument, NOT_FOUND -> not_found, others -> io.
/// Thread-safe as NVML itself is.
class NvmlLibrary {
 public:
  /// `path` is what dlopen gets: "libnvidia-ml.so.1" (the driver's soname) or, in tests, the
  /// fake library's path. Fails (unavailable) when the library or a required symbol is missing,
  /// or nvmlInit_v2 fails (message names the NVML error).
  static Result<std::shared_ptr<NvmlLibrary>> open(const std::string& path = "libnvidia-ml.so.1");
  ~NvmlLibrary();
  NvmlLibrary(const NvmlLibrary&) = delete;
  NvmlLibrary& operator=(const NvmlLibrary&) = delete;

  /// nvmlDeviceGetHandleByIndex_v2.
  Result<nvml::Device> device(unsigned index) const;
  /// nvmlDeviceGetName: "NVIDIA A100-SXM4-40GB".
  Result<std::string> name(nvml::Device device) const;
  /// nvmlDeviceGetTotalEnergyConsumption: mJ since the driver was last (re)loaded; Volta and
  /// newer (unavailable = not supported on Pascal and older and in many vGPU setups).
  Result<std::uint64_t> total_energy_mj(nvml::Device device) const;
  /// nvmlDeviceGetMinorNumber: N of the GPU's /dev/nvidiaN (what its jobs' device rules name).
  Result<unsigned> minor_number(nvml::Device device) const;
  /// nvmlDeviceGetMigMode's current mode: whether the GPU is partitioned into MIG devices
  /// (false where the library or the GPU has no MIG).
  Result<bool> mig_enabled(nvml::Device device) const;
  /// The MIG devices of a GPU in MIG mode, in index order, with their UUIDs, names and slices.
  Result<std::vector<MigDevice>> mig_devices(nvml::Device device) const;
  /// nvmlDeviceGetPowerUsage: mW (a 1 s average on Ampere except GA100 and newer).
  Result<std::uint32_t> power_usage_mw(nvml::Device device) const;

  /// nvmlDeviceGetPowerManagementLimit: the current power cap, mW.
  Result<std::uint32_t> power_limit_mw(nvml::Device device) const;
  /// nvmlDeviceGetPowerManagementLimitConstraints.
  Result<PowerLimitConstraints> power_limit_constraints(nvml::Device device) const;
  /// nvmlDeviceSetPowerManagementLimit (needs root; the caller must save the old limit first
  /// and restore it at shutdown).
  Status set_power_limit_mw(nvml::Device device, std::uint32_t limit_mw) const;

  /// nvmlErrorString, or "NVML error N" when the library gives none.
  std::string error_string(nvml::Return code) const;
  const std::string& path() const { return path_; }

 private:
  struct Api;
  NvmlLibrary(std::string path, void* handle, std::unique_ptr<Api> api);
  Error error_of(nvml::Return code, const char* call) const;

  std::string path_;
  void* handle_;
  std::unique_ptr<Api> api_;
};

}  // namespace joule::adapters
