#pragma once
// Choosing a device's meter: an ordered preference list per device kind, walked until one
// candidate opens and gives a first reading. Every candidate's verdict (taken, or passed over
// and why) is kept so the daemon can log it and show it in GET /v1/devices.
//
// Preference (the most direct measurement first, the model last):
//   cpu     rapl -> ina3221 (Jetson module input rail) -> battery -> modelled
//   cuda:N  nvml -> ina3221 (GPU rail) -> none (an error that says what was tried)
//   mig:G.I nvml: GPU G's counter, shared among its MIG devices (MigMeter) with scope "device";
//           the whole counter with scope "process" (a probe, run while its siblings idle)
// A forced meter ("rapl", "nvml", "ina3221", "hwmon", "battery", "modelled") is tried alone.
// A candidate is taken only after it opened and gave a first reading; the meter returned has
// had that read() (its readings count from there).
// "modelled" for cpu is ModelledCpuMeter over `<proc>/stat` (the whole node) with scope
// "device", ProcessModelledMeter (this process's CPU time: joule-worker's probes) with scope
// "process". rapl, battery and modelled meter the cpu device only, nvml cuda:N only.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "joule/adapters/energy_meter.hpp"
#include "joule/adapters/meter_clocks.hpp"
#include "joule/adapters/modelled_cpu_meter.hpp"
#include "joule/adapters/sysfs.hpp"

namespace joule::adapters {

class MigPartitions;

/// Where the meters read from: the real roots by default, fixture trees and a fake NVML in tests.
struct MeterRoots {
  std::filesystem::path sys = "/sys";
  std::filesystem::path proc = "/proc";
  std::string nvml_library = "libnvidia-ml.so.1";
  /// How sysfs/procfs files are read (tests simulate EACCES with it).
  FileReader reader = read_sysfs_file;
  /// The clocks of the integrating meters and of the process-scoped model.
  SecondsClock monotonic_seconds = joule::adapters::monotonic_seconds;
  SecondsClock process_cpu_seconds = joule::adapters::process_cpu_seconds;
  /// The node's GPUs in MIG mode: the meters of one GPU's MIG devices share its partition, so
  /// every device of a node is selected with the same roots.
  std::shared_ptr<MigPartitions> mig_partitions;
};

/// What a device asks for.
struct MeterRequest {
  std::string device = "cpu";  ///< "cpu", "cuda:0", "mig:0.1" ...
  std::string meter = "auto";  ///< "auto" or one source name to force
  ModelledCpuParams modelled;  ///< coefficients when the modelled meter is used
  /// "device" (the whole device; default) or "process": the modelled fallback of cpu counts
  /// only this process's CPU time (joule-worker's probes). Hardware meters are unaffected.
  std::string scope = "device";
  /// INA3221 rail to meter ("VDD_IN"); empty: the module input rail for cpu, a GPU rail for
  /// cuda:N. For a forced "hwmon" meter: the channel label ("Esocket0").
  std::string rail;
};

/// One candidate's verdict.
struct MeterCandidate {
  std::string source;  ///< "rapl", "nvml", ...
  bool taken = false;
  std::string reason;  ///< "intel-rapl:0 package-0 readable" or "energy_uj: permission denied (run ...)"
};

struct SelectedMeter {
  std::unique_ptr<EnergyMeter> meter;
  std::vector<MeterCandidate> considered;  ///< in preference order, the taken one last
};

/// Walks the preference list; fails (listing every candidate and why it was passed over) only
/// when nothing at all can meter the device: unavailable for "auto", the forced meter's own
/// error code otherwise (permission_denied for an unreadable energy_uj), invalid_argument for
/// an unknown device, meter or scope, or a meter that cannot meter that device.
Result<SelectedMeter> select_meter(const MeterRequest& request, const MeterRoots& roots = {});

}  // namespace joule::adapters
