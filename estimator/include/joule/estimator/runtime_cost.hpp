#pragma once
// What a job's runtime costs beyond its model's steps as LibTorch runs them, measured on the
// device before any job ends (`joule-worker runtime`): starting the interpreter and importing
// torch once per job, and per step the training loop's own work in the runtime's language
// (Python dispatching every module call, the optimizer's loop over parameters, loss.item()).
//
// The layer probes train in LibTorch (C++), so a step they estimate has none of Python's cost;
// a job written in Python pays it every step. On a 2-vCPU VM that is ~0.1-0.3 ms per step and
// ~1 s of start-up: 1.4-4× the steps of small networks (issue 30's small-step misses).
//
// The per-step cost is learnt as a line in the network's module count, from tiny networks (L
// blocks of Linear + ReLU at a width and batch where their arithmetic is negligible) trained
// the same way in the runtime and in joule-worker, interleaved reading by reading:
//   overhead(L) = step_runtime(L) − step_worker(L) ≈ base + per_module × modules(L)
// (the median of paired differences, each pair read back to back),
// and applied to a job as base + per_module × (its spec's module calls, python_module_calls).
// What one call costs differs by kind by more than tenfold (a ReLU ~1 µs, a Linear ~14, a batch
// norm ~20, a Conv2d ~28 on a 2-vCPU VM: forward logic in Python, and each parameter tensor in
// the optimizer's and zero_grad's loops), so the probe also reads the workload's own layer kinds,
// each on a network of several layers of that kind; a layer of a kind read costs its own figure,
// any other its module calls on the line.
// Start-up is the median
// of the probe's fresh processes from spawn to `import torch` done.
// Pure: readings in, the fitted cost and the lines it adds out.

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "joule/common/result.hpp"

namespace joule::estimator {

/// One tiny network trained both ways, per step: in the runtime (a Python loop) and in LibTorch,
/// each the median of its readings.
struct RuntimeStepReading {
  std::int64_t modules = 0;  ///< modules the network calls per step (its spec's layers)
  double runtime_joules = 0.0;
  double runtime_seconds = 0.0;
  double worker_joules = 0.0;
  double worker_seconds = 0.0;
  /// (max − min) / median of either side's readings, the larger: how steady the machine was.
  double spread = 0.0;
  /// The runtime's cost beyond LibTorch's: the median over reading pairs of (runtime − worker),
  /// each pair taken back to back so that the machine's drift cancels. Unset (NaN): the
  /// difference of the medians.
  double difference_joules = std::numeric_limits<double>::quiet_NaN();
  double difference_seconds = std::numeric_limits<double>::quiet_NaN();
  /// When the probe run that read it ended (ms since the epoch; 0: not said): which run it is.
  std::int64_t measured_ms = 0;
  /// The layer kind its network was built to read ("": the line's Linear + ReLU blocks): it holds
  /// `kind_layers` layers of that kind, and its other modules (modules − their calls) are priced
  /// on the line.
  std::string kind;
  std::int64_t kind_layers = 0;

  double extra_joules() const {
    return std::isnan(difference_joules) ? runtime_joules - worker_joules : difference_joules;
  }
  double extra_seconds() const {
    return std::isnan(difference_seconds) ? runtime_seconds - worker_seconds : difference_seconds;
  }
};

/// One fresh process from spawn to its framework imported.
struct RuntimeStartReading {
  double joules = 0.0;
  double seconds = 0.0;
  std::int64_t measured_ms = 0;  ///< the probe run's end, as RuntimeStepReading's
};

/// The least relative σ a runtime's per-step line claims on a job: the probe's tiny networks
/// call a handful of module kinds, a job's network others (convolutions, attention) whose
/// Python-side cost per call differs by tens of per cent.
inline constexpr double kRuntimeStepSigmaFloor = 0.25;
/// The least relative σ of the start-up: imports are read from the page cache or from disk.
inline constexpr double kRuntimeStartSigmaFloor = 0.15;

/// What one layer of a kind costs the runtime per step beyond LibTorch: its forward's own work in
/// the runtime's language, and its parameters in the optimizer's and zero_grad's loops. The
/// median over its readings of (difference − the line's cost of the network's other modules) /
/// its layers of the kind; at least 0.
struct RuntimeKindCost {
  double joules_per_layer = 0.0;
  double seconds_per_layer = 0.0;
  std::int64_t readings = 0;
};

/// A network's runtime cost per step, and how it was priced.
struct RuntimeStepCost {
  double joules = 0.0;
  double seconds = 0.0;
  std::int64_t modules = 0;             ///< module calls in all (python_module_calls)
  std::vector<std::string> kinds_read;  ///< layer kinds priced by their own readings
  std::int64_t modules_on_line = 0;     ///< module calls priced on the line instead
};

/// The fitted cost of one runtime on one device.
struct RuntimeCost {
  std::string runtime;      ///< "python"
  std::string interpreter;  ///< the program the probe ran ("/usr/bin/python3")
  std::string version;      ///< what it said it was ("Python 3.11.2, torch 1.13.1")
  std::string source;       ///< meter source of the joules ("rapl", "modelled"...)
  std::int64_t measured_ms = 0;
  /// Start-up per job: median of the readings, σ their spread (at least the floor).
  double start_joules = 0.0;
  double start_seconds = 0.0;
  double start_sigma = kRuntimeStartSigmaFloor;  ///< relative
  /// Per step: base + per_module × modules, each at least 0.
  double step_joules_base = 0.0;
  double step_joules_per_module = 0.0;
  double step_seconds_base = 0.0;
  double step_seconds_per_module = 0.0;
  double step_sigma = kRuntimeStepSigmaFloor;  ///< relative, of the line at any module count
  /// Layer kinds read on their own networks (by spec type: "conv2d", "batchnorm1d"...).
  std::map<std::string, RuntimeKindCost> kinds;
  std::vector<RuntimeStepReading> steps;
  std::vector<RuntimeStartReading> starts;

  /// How many probe runs its readings come from (distinct measured_ms; readings without one
  /// count as one run).
  std::int64_t runs() const;

  /// The line alone at a module count.
  double step_joules(std::int64_t modules) const;
  double step_seconds(std::int64_t modules) const;
  /// A network of these layer types (its spec's, in any order): base, plus each layer at its
  /// kind's own cost where read, else its module calls on the line.
  RuntimeStepCost step_cost(const std::vector<std::string>& layer_types) const;
};

/// Fits a runtime's cost from its readings: the line from the readings without a kind, then each
/// kind from its own. Fails (invalid_argument, saying what is missing) without a start-up
/// reading, without line readings at two module counts, with a kind reading of no layers of its
/// kind, or with a figure that is not positive and finite: nothing is learnt from a failed
/// measurement.
Result<RuntimeCost> fit_runtime_cost(std::string runtime, std::vector<RuntimeStepReading> steps,
                                     std::vector<RuntimeStartReading> starts);

/// How many of a runtime's latest probe runs its cost pools. One run is a few seconds of
/// readings, and what it reads moves between runs by more than within one: on the same kind of
/// 2-vCPU VM one run read Python's per-step cost at 15 µs, others at 65-170 µs (bench/README.md,
/// runs 13-16). Pooled, the line is fitted to every reading of these runs, and its σ includes
/// how far they disagree; the oldest run leaves as a new one comes, so a device whose speed
/// moves is followed.
inline constexpr int kRuntimeRunsPooled = 3;

/// `latest` (a run's fitted cost, its readings stamped with its measured_ms) refitted with the
/// readings of the `runs` − 1 latest runs of `earlier`. Where they are not the same runtime,
/// interpreter, version and meter source, `latest` stands alone: a changed interpreter is
/// measured afresh. Fails as fit_runtime_cost does.
Result<RuntimeCost> pool_runtime_runs(const RuntimeCost& earlier, const RuntimeCost& latest,
                                      int runs = kRuntimeRunsPooled);

nlohmann::json to_json(const RuntimeCost& cost);
/// Reads to_json's output; refuses (never throws on) anything else, naming the field.
Result<RuntimeCost> runtime_cost_from_json(const nlohmann::json& json);

/// How many module calls PyTorch makes for one layer of a spec, what the per-module line of a
/// Python runtime counts: 1 for a plain layer (a module or a functional op such as add), and for
/// a composite module its own call plus its submodules' as PyTorch 1.13's forward makes them
/// (transformer_encoder_layer: self_attn, dropout1, norm1, linear1, dropout, linear2, dropout2,
/// norm2, 9 in all). Counted from PyTorch's source, not fitted.
std::int64_t python_module_calls(const std::string& layer_type);

/// Whether the runtime probe reads a layer kind on its own network (joule-worker builds it for
/// the kinds this admits): every layer type but relu (the line's cheapest module, ~1 µs a call
/// here, where the line's per-module slope already prices it), joins (add, concat, multiply:
/// tensor operations, not modules) and embedding (its network would need tokens). Linear is read
/// on its own although the line is built of it: the line's slope is the average of Linear and
/// ReLU, and a Linear's call (and its two parameters in the optimizer's loop) costs more than
/// that, most where steps are small.
bool runtime_kind_readable(const std::string& layer_type);

/// How many layer kinds one runtime probe reads: each is a fresh interpreter and ~5 s of
/// readings at the modelled meter's 0.25 s (more at NVML's 2 s), beside the line's three networks.
inline constexpr std::size_t kRuntimeKindsPerRun = 6;

/// A workload's layer kinds the runtime probe can read (`layer_types`: every layer of its
/// networks, repeated as often as they occur): the readable ones, the most layers first (ties by
/// name).
std::vector<std::string> runtime_readable_kinds(const std::vector<std::string>& layer_types);

/// The kinds one runtime probe run reads, at most `most`: the `wanted` ones (ranked, as
/// runtime_readable_kinds gives them) that `read_before` lacks first, so that a workload of more
/// kinds than one run reads has them all read over a few runs; then the wanted ones read before,
/// read again; then kinds read before that the workload no longer holds (so that their readings
/// stay among the runs pooled).
std::vector<std::string> runtime_kinds_to_read(const std::vector<std::string>& wanted,
                                               const std::map<std::string, RuntimeKindCost>& read_before,
                                               std::size_t most = kRuntimeKindsPerRun);

/// The runtime a job's command runs its training loop in: "python" when the program (its
/// basename) is a Python interpreter (python, python3, python3.11...), else "" (unknown: a
/// shell script, a compiled trainer).
std::string runtime_of_command(const std::vector<std::string>& argv);

}  // namespace joule::estimator
