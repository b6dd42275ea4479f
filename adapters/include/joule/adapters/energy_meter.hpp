#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "joule/adapters/nvml_library.hpp"
#include "joule/common/result.hpp"
#include "joule/common/units.hpp"

namespace joule::adapters {

// What a meter's device lets jouled do beyond reading joules. A meter offers each capability it
// has through EnergyMeter's accessors (null where it has none), so the daemon asks for a
// capability instead of asking which kind of meter it holds.

/// The power limit of the GPU a meter reads (NVML), for throttling by power cap.
class GpuPowerControl {
 public:
  virtual ~GpuPowerControl() = default;
  /// The lowest and highest limit the GPU accepts, in watts; an error where it cannot be read.
  virtual Result<std::pair<double, double>> power_limit_range_watts() const = 0;
  /// The NVML library and device handle that a GpuPowerLimit (job_controls.hpp) sets and
  /// restores the limit through.
  virtual const std::shared_ptr<NvmlLibrary>& library() const = 0;
  virtual nvml::Device device() const = 0;
};

/// The battery behind a meter (a laptop, an edge board), for battery floors.
class BatteryGauge {
 public:
  virtual ~BatteryGauge() = default;
  /// The charge left, 0-100.
  virtual Result<double> capacity_percent() const = 0;
};

/// A device whose draw is modelled, not read (a simulated device): jouled tells it the power a
/// job adds while the job runs, and its joules stay labelled as modelled.
class ModelledLoad {
 public:
  virtual ~ModelledLoad() = default;
  /// The power a job adds from now on (0 when it ends).
  virtual void set_load_watts(double watts) = 0;
};

/// A meter that models power from CPU time (the `modelled` CPU meter) can model one job's own
/// energy the same way: the job's share is its wall time at idle power plus its own CPU time,
/// not whatever else the node ran meanwhile. This is also how joule-worker meters probes
/// (ProcessModelledMeter), so jobs and the probes their estimates come from are metered alike.
class CpuTimeModel {
 public:
  virtual ~CpuTimeModel() = default;
  /// Joules of a process tree that ran `wall_seconds` and used `cpu_seconds` of CPU time.
  virtual double joules(double wall_seconds, double cpu_seconds) const = 0;
  /// How the figure is made, for the job's energy "scope".
  virtual std::string describe() const = 0;
};

/// A meter whose readings another node makes and reports (an agent's device, as its
/// coordinator sees it): the reports are fed in, and read() answers with what they said.
class ReportedReadings {
 public:
  virtual ~ReportedReadings() = default;
  /// The agent's cumulative joules under its meter's `source`, or why its meter failed.
  virtual void report(const std::string& source, double joules, std::optional<std::string> error) = 0;
  /// Nothing is heard from the agent: readings fail with `why` until it reports again.
  virtual void silence(std::string why) = 0;
};

/// A meter whose counter other devices share (a MIG device's: its GPU's counter, mig_meter.hpp):
/// jouled says when its device has work, so each interval goes to the devices that had; probes,
/// which read the counter whole, wait until the others have none.
class SharedGpuCounter {
 public:
  virtual ~SharedGpuCounter() = default;
  /// Its device has work (a job or a probe) from now on, or none.
  virtual void set_busy(bool busy) = 0;
  /// Whether a device sharing the counter has work.
  virtual bool others_busy() const = 0;
  /// What CUDA_VISIBLE_DEVICES names the device by ("MIG-...").
  virtual const std::string& cuda_visible() const = 0;
  /// How its joules are made from the shared counter, for a job's energy scope.
  virtual std::string share_rule() const = 0;
};

/// A cumulative energy counter of one device (RAPL package, GPU, INA3221 rail, a model...).
/// Readings are monotonic joules since the meter was opened; wraparound and resets of the
/// underlying counter are handled inside. Not thread-safe: each meter is sampled from one
/// strand.
class EnergyMeter {
 public:
  virtual ~EnergyMeter() = default;
  /// Where the joules come from: "rapl", "nvml", "ina3221", "battery", "modelled", "simulated".
  /// Only the first four are measurements; callers must show the source beside every figure.
  virtual std::string_view source() const = 0;
  /// Total energy since the meter was opened.
  virtual Result<Joules> read() = 0;

  virtual const GpuPowerControl* gpu_power_control() const { return nullptr; }
  virtual const BatteryGauge* battery_gauge() const { return nullptr; }
  virtual ModelledLoad* modelled_load() { return nullptr; }
  virtual const CpuTimeModel* cpu_time_model() const { return nullptr; }
  virtual ReportedReadings* reported_readings() { return nullptr; }
  virtual SharedGpuCounter* shared_gpu_counter() { return nullptr; }
  const SharedGpuCounter* shared_gpu_counter() const { return const_cast<EnergyMeter*>(this)->shared_gpu_counter(); }
};

}  // namespace joule::adapters
