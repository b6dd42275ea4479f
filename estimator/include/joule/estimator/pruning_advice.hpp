#pragma once
// Energy-aware pruning advice (THOR's case study, seeds 000/001): rank a network's layers by
// their share of a device's estimated energy and propose width multipliers (channels, features,
// hidden sizes) that reach a target saving with the smallest loss of parameters.
//
// Widths move in groups: layers whose outputs meet in an add or mul must keep one width, a
// depthwise convolution follows its input, and a group that reaches the model's input or output
// (the classes) cannot shrink. Each step lowers one group's multiplier by a notch, the one that
// saves the most estimated joules per parameter lost, until the estimate reaches the target.
// Pure: a spec, a model and a target in; the advice (a new spec and its estimate) out.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "joule/common/result.hpp"
#include "joule/estimator/device_energy_model.hpp"
#include "joule/estimator/model_spec.hpp"

namespace joule::estimator {

/// One layer's part of the estimate, and the width the advice gives it.
struct LayerAdvice {
  std::size_t index = 0;
  std::string type;
  std::string name;
  double energy_share = 0.0;  ///< of the original network's estimated joules per step
  /// The layer's own width argument ("out_channels", "out_features", "hidden_size",
  /// "embedding_dim", "dim_feedforward"), empty for layers without one.
  std::string width_argument;
  std::int64_t width = 0;
  std::int64_t advised_width = 0;
  double multiplier = 1.0;  ///< of its group
  /// Why its width cannot move, where it cannot ("the network's output: its classes"...).
  std::string fixed_because;
};

struct PruningAdvice {
  double target = 0.0;   ///< the saving asked for, a share of the estimated joules
  bool reached = false;  ///< whether the advised network's estimate saves at least that
  std::string detail;    ///< when not reached: how far it got and what held it back
  Estimate original;     ///< the whole job, as given
  Estimate advised;      ///< the whole job with the advised widths
  double saving = 0.0;   ///< 1 − advised joules / original joules (means)
  std::int64_t original_parameters = 0;
  std::int64_t advised_parameters = 0;
  ModelSpec model;                  ///< the advised spec
  std::vector<LayerAdvice> layers;  ///< in the spec's order
};

struct PruningOptions {
  /// The multipliers a group may take, from the largest below 1 down to the smallest. The
  /// default stops at ×½: probes vary widths from ×½ to ×2 around the workload's own, so below
  /// that the model extrapolates (measured on the simulator: a stem cut to ×¼ was predicted to
  /// save 61 % where the device saved 43 %).
  std::vector<double> ladder = {0.875, 0.75, 0.625, 0.5};
  /// The ladder in eighths from ×⅞ down to `smallest` (at least ⅛).
  static PruningOptions down_to(double smallest);
};

/// Advises widths for `spec` trained with `training` that save `target` (0 < target < 1) of
/// its estimated joules on the device of `model`. Fails where the network or a candidate cannot
/// be estimated on that model; a target no pruning reaches gives reached = false, the most the
/// ladder reaches and why.
Result<PruningAdvice> advise_pruning(const ModelSpec& spec, const TrainingConfig& training,
                                     const DeviceEnergyModel& model, double target, const PruningOptions& options = {});

}  // namespace joule::estimator
