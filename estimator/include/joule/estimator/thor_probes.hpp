#pragma once
// THOR's profiling (seed 001), made general: which small networks to train to learn what one
// layer costs in one position, and how their measured per-step energies decompose into that
// layer's energy by subtraction.
//
// Positions: a layer is "input" when no earlier layer has parameters (its backward skips the
// input gradient), "hidden" when one does, "output" when it is the last layer; the output
// position also carries the loss and the per-step overhead (optimizer, data), so that
//   E_step = Σ_input,hidden E(layer) + E_output(last layer)            (THOR equation 1)
//
// Probe networks for a target layer L with per-sample input shape S:
//   output: [L]                                    E_out(L)   = m([L])
//   input:  [L, H] and [H]                         E_in(L)    = m([L, H]) − m([H])
//   hidden: [R, L, H], [R, H'], [H'] and [H]       E_hid(L)   = m([R, L, H]) − (m([R, H']) − m([H'])) − m([H])
// H is the output head on L's output (a linear classifier, after a flatten when needed), H' the
// same head on S, and R a shape-preserving reference layer with parameters whose cost is linear
// in its input (batchnorm2d on [C, H, W], layernorm otherwise) that puts L in the hidden position. A join layer (add,
// mul, concat) reads the tensor before it as every one of its inputs; in a network, positions
// come from the graph (layer_analysis.hpp: "hidden" when an ancestor has parameters).
//
// The model of a layer is keyed by model_kind(), not the type: grouped convolutions and
// bidirectional recurrences have models of their own.
//
// Optimizers: every probe trains with sgd, so a layer's samples include sgd's update of its
// parameters. Another optimizer O costs its difference on top, a function of the parameter
// count (and O's state per parameter), learnt like a layer under the key "optimizer:O@output":
//   E_O(P) = m([linear], O) − m([linear], sgd)
// for one linear classifier of P parameters, measured twice in one worker run.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "joule/common/result.hpp"
#include "joule/estimator/layer_analysis.hpp"
#include "joule/estimator/model_spec.hpp"

namespace joule::estimator {

enum class LayerPosition { input, hidden, output };
std::string_view to_string(LayerPosition position);

/// Which energy model a layer belongs to: its kind (layer type) and its position.
struct LayerKey {
  std::string kind;
  LayerPosition position = LayerPosition::hidden;
  std::string name() const;  ///< "conv2d@hidden"
  auto operator<=>(const LayerKey&) const = default;
};

/// Whether a layer costs nothing of its own (a view such as flatten): it needs no model and
/// is not probed; an output layer is never free (it carries the loss and the step overhead).
bool is_free_layer(const AnalyzedLayer& layer);

/// The key of every layer of an analysed network (the last one is the output).
std::vector<LayerKey> layer_keys(const std::vector<AnalyzedLayer>& layers);

/// One layer configuration to learn: the layer, what it receives, the batch, the position.
struct ProbeTarget {
  LayerSpec layer;                        ///< its name is ignored; a join's `inputs` count how many it joins
  std::vector<std::int64_t> input_shape;  ///< per sample (a join's first input)
  std::string input_dtype = "float";
  std::int64_t batch_size = 32;
  LayerPosition position = LayerPosition::hidden;
  std::string loss = "cross_entropy";
  /// Non-empty: not a layer but this optimizer's cost over sgd's for `layer` (a linear
  /// classifier) on `input_shape`: an optimizer target (optimizer_target()).
  std::string optimizer;
};

/// The key kind of an optimizer's model: "optimizer:adam".
std::string optimizer_kind(const std::string& optimizer);
/// The optimizer target for a network of `parameters` parameters: a linear classifier of about
/// that many on 1,024 features, at batch 16 (its forward and backward cancel out).
ProbeTarget optimizer_target(const std::string& optimizer, std::int64_t parameters);
/// A layer-like configuration of an optimizer step over `parameters` parameters: its features
/// ({"parameters": P}) and counts (4 bytes per parameter, no FLOPs), as samples and estimates use.
AnalyzedLayer optimizer_step(std::int64_t parameters);

/// The networks to measure for one target; networks[0] contains the target.
struct ProbePlan {
  ProbeTarget target;
  std::vector<ModelSpec> networks;
  /// +1 or −1 per network: E_target = Σ sign_i × m(networks[i]).
  std::vector<int> signs;
  /// Per network, the optimizer it trains with; empty: sgd for every one.
  std::vector<std::string> optimizers;
  /// The target layer as analysed inside networks[0] (its features and counts).
  AnalyzedLayer analyzed;
};

/// Builds the probe networks of a target; fails if the layer cannot take that input or cannot
/// sit in that position (an embedding cannot be hidden).
Result<ProbePlan> plan_probe(const ProbeTarget& target, int head_classes = 10);

/// A measured per-step cost of one network (the median of its repetitions).
struct NetworkMeasurement {
  double joules_per_step = 0.0;
  double seconds_per_step = 0.0;
};

/// What the subtraction says about the target: one training sample for its energy model.
struct LayerSample {
  LayerKey key;
  std::map<std::string, double> features;  ///< the layer's configuration incl. batch_size
  LayerCost cost;                          ///< counts of the layer in its position
  double joules_per_step = 0.0;
  double seconds_per_step = 0.0;
};

/// Applies the plan's signs to the measurements of its networks (same order).
Result<LayerSample> decompose(const ProbePlan& plan, const std::vector<NetworkMeasurement>& measured);

}  // namespace joule::estimator
