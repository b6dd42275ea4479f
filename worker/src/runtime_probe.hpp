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
//
// Each of `kinds` (estimator::runtime_kind_readable: conv2d, batchnorm1d, lstm...) is read the
// same way on a network of kRuntimeKindLayers layers of it, at shapes where its arithmetic is
// small: what a layer of it costs beyond the line (estimator::RuntimeKindCost).

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
  std::vector<std::string> kinds;        ///< one network per layer kind, after the blocks
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

/// Layers of its kind in a kind's network: enough that the kind's cost stands out from the
/// network's own base by several times on a 2-vCPU VM (a ReLU's ~1 µs stays in the noise).
inline constexpr int kRuntimeKindLayers = 8;

/// The network that reads one layer kind: `layers` layers of it at a small input (channels 4 of
/// 4 × 4 for 2-d kinds, 4 × 8 for conv1d, a sequence of 4 × 16 for recurrent and attention kinds,
/// 16 features for the rest), then flatten and Linear(…, 10). Fails (invalid_argument) for a kind
/// estimator::runtime_kind_readable refuses.
Result<estimator::ModelSpec> runtime_probe_kind_network(const std::string& kind, int layers);

/// Runs the probe. Errors: invalid_argument for a request out of range, unavailable for an
/// interpreter that cannot start or import torch (the message carries its last line of
/// stderr), io for a meter that cannot be read, internal for an interpreter that breaks the
/// protocol or times out.
Result<RuntimeProbeResult> run_runtime_probe(const RuntimeProbeRequest& request);

}  // namespace joule::worker
