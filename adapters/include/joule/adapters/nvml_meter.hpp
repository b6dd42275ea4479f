#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "joule/adapters/energy_meter.hpp"
#include "joule/adapters/meter_clocks.hpp"
#include "joule/adapters/nvml_library.hpp"

namespace joule::adapters {

/// The `nvml` meter of one NVIDIA GPU.
///
/// Uses nvmlDeviceGetTotalEnergyConsumption (mJ since the driver was loaded, Volta and newer).
/// A decrease means the driver was reloaded: the counter restarted, so the interval counts the
/// energy since the restart (a lower bound), never a wrap. When the counter is not supported
/// (Pascal and older, many vGPUs) the meter falls back, for good, to nvmlDeviceGetPowerUsage
/// (mW) integrated by the trapezoid rule over the injected monotonic clock; sample at >= 1 Hz.
class NvmlMeter final : public EnergyMeter, public GpuPowerControl {
 public:
  /// Gets the handle and name of GPU `index`; fails when NVML has no such device.
  static Result<std::unique_ptr<NvmlMeter>> open(std::shared_ptr<NvmlLibrary> library, unsigned index,
                                                 SecondsClock now_seconds = monotonic_seconds);

  std::string_view source() const override { return "nvml"; }
  /// Joules since the first read() (which returns 0).
  Result<Joules> read() override;

  /// True once the energy counter was found unsupported and power is integrated instead.
  bool integrates_power() const { return integrates_power_; }
  /// "GPU 0 NVIDIA A100-SXM4-40GB, total energy counter" (or "..., power integrated").
  std::string description() const;
  const std::string& name() const { return name_; }
  const GpuPowerControl* gpu_power_control() const override { return this; }
  Result<std::pair<double, double>> power_limit_range_watts() const override;
  const std::shared_ptr<NvmlLibrary>& library() const override { return library_; }
  nvml::Device device() const override { return device_; }

 private:
  NvmlMeter(std::shared_ptr<NvmlLibrary> library, unsigned index, nvml::Device device, std::string name,
            SecondsClock now_seconds);
  Result<Joules> read_power();

  std::shared_ptr<NvmlLibrary> library_;
  unsigned index_;
  nvml::Device device_;
  std::string name_;
  SecondsClock now_seconds_;
  bool integrates_power_ = false;
  std::optional<std::uint64_t> last_mj_;
  std::uint64_t total_mj_ = 0;
  PowerIntegrator integrator_;
};

}  // namespace joule::adapters
