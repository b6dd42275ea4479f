#pragma once
// `joule-worker runtime`: what a Python training loop costs on this device beyond the same loop
// in LibTorch, and what starting the interpreter and importing torch costs
// (estimator/runtime_cost.hpp says how jouled uses it). Torch-free header.
//
// For each network of `blocks` Linear + ReLU blocks (tiny: their arithmetic is negligible, so
// what differs is the loop's own work), a fresh interpreter runs worker/runtime_probe.py (built
// into this program) and the two alternate reading by reading: the interpreter's loop for about
// `reading_seconds`, then the same network in this process for as long; the runtime's cost is
// the median over these pairs of their difference (back to back, the machine's drift cancels:
// on a 2-vCPU VM the sides' own readings spread by 36-70 %). Each side first warms up for a
// reading's length. Each phase is one
// window of the meter: a device meter (RAPL, NVML...) as it is; for the `modelled` meter the
// interpreter's phases count the interpreter's CPU clock (clock_getcpuclockid) and this
// process's phases its own. Each interpreter's time from spawn to `import torch` done is one
// start-up reading.

#include <cstdint>
#include <string>
#include <vector>

#include "joule/common/result.hpp"
#include "joule/worker/protocol.hpp"

namespace joule::worker {

struct RuntimeProbeRequest {
  std::string python = "python3";  ///< the interpreter: a path, or a name looked up in PATH
  std::string device = "cpu";
  int threads = 1;
  std::vector<int> blocks = {1, 4, 16};  ///< one network per entry: this many Linear + ReLU blocks
  int width = 16;
  std::int64_t batch_size = 8;
  int readings = 5;              ///< per network and side, in pairs; medians are kept
  double reading_seconds = 0.0;  ///< 0: by meter (default_min_reading_seconds)
  std::string meter = "auto";
  double idle_watts = 10.0;
  double watts_per_busy_core = 12.0;
  double import_timeout_seconds = 180.0;  ///< an interpreter that has not imported torch by then fails
};

/// The network of `blocks` blocks, as the interpreter builds it: its module count is
/// 2 × blocks + 1 (its spec's layers).
estimator::ModelSpec runtime_probe_network(int blocks, int width);

/// Runs the probe. Errors: invalid_argument for a request out of range, unavailable for an
/// interpreter that cannot start or import torch (the message carries its last line of
/// stderr), io for a meter that cannot be read, internal for an interpreter that breaks the
/// protocol or times out.
Result<RuntimeProbeResult> run_runtime_probe(const RuntimeProbeRequest& request);

}  // namespace joule::worker
