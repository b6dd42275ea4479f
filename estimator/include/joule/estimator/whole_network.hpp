#pragma once
// Whole networks measured on a device, and what they teach about the networks that were not.
//
// THOR estimates a network as the sum of its layers, each learnt from small probe networks. On
// convolutional graphs the sum holds within a few per cent; on attention, recurrent and
// small-step networks the whole costs more than its layers (a transformer encoder's layer lines
// summed to about two thirds of what the worker measured): buffers, dispatch and cache effects
// live between the layers, where subtraction cannot see them. So a device may also measure the
// workload's own networks whole, for a few steps, and the model
//   - estimates a network measured whole (same spec, batch size and optimizer) from that
//     measurement, its layer lines apportioning it;
//   - learns, per network family, the log ratio of whole to layer sum over the networks it
//     measured, and scales the layer sum of a network it did not measure by it, with the
//     ratio's spread in the estimate's.
// Pure: the caller measures; this names networks, groups them and plans which to measure.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "joule/common/result.hpp"
#include "joule/estimator/knob_response.hpp"
#include "joule/estimator/layer_analysis.hpp"
#include "joule/estimator/model_spec.hpp"

namespace joule::estimator {

/// A stable identity of a network's architecture: the same layers, wiring, input and loss give
/// the same signature whatever the model or job is called (16 hex digits of a SHA-256).
std::string network_signature(const ModelSpec& model);

/// What kind of composition a network is, for learning the whole-to-layers gap: "attention"
/// (multihead attention or transformer layers), "recurrent" (LSTM, GRU), "convolutional", or
/// "dense" (everything else), the first that applies.
std::string network_family(const std::vector<AnalyzedLayer>& layers);

/// One network trained whole on the device for a few metered steps (joule-worker probe with the
/// network itself as the probe network).
struct WholeNetworkSample {
  std::string signature;  ///< network_signature(model)
  std::string family;     ///< network_family of its layers
  ModelSpec model;        ///< kept so the gap can be recomputed at each refit
  std::int64_t batch_size = 32;
  std::string optimizer = "sgd";
  double joules_per_step = 0.0;   ///< median of the readings
  double seconds_per_step = 0.0;  ///< median of the readings
  /// (max − min) / median of the readings: how far the same network read apart in one run.
  double joules_spread = 0.0;
  double seconds_spread = 0.0;
  std::int64_t measured_ms = 0;  ///< Unix ms
  /// The knob setting it ran at; nullopt: the device's defaults. A measurement at a setting
  /// teaches what the setting does to the network (its ratios to the one at the defaults), not
  /// the network's cost: it joins no gap and estimates nothing at the defaults.
  std::optional<KnobSetting> setting;
};

nlohmann::json to_json(const WholeNetworkSample& sample);
/// Errors name the JSON pointer of the bad field (under `pointer`).
Result<WholeNetworkSample> whole_network_sample_from_json(const nlohmann::json& json, const std::string& pointer = "");

/// The log ratio of whole to layer sum learnt for one family (energy and time apart).
struct WholeNetworkGap {
  std::size_t samples = 0;
  double log_joules_mean = 0.0;
  double log_joules_std = 0.0;  ///< of the samples around their mean (n − 1)
  double log_seconds_mean = 0.0;
  double log_seconds_std = 0.0;
};

/// Families need this many networks measured whole before their gap is applied: one network's
/// ratio says nothing of its family's spread.
inline constexpr std::size_t kGapMinSamples = 2;
/// The least relative σ (log units) a gap's spread is taken to have, however alike its networks
/// came out: two or three ratios cannot show a smaller one.
inline constexpr double kGapFloorSigma = 0.1;
/// The least relative σ of an estimate from a measurement of the network itself: the run-to-run
/// drift of the machine between the measurement and the job (measured on the 2-vCPU VMs the
/// project runs on: the same network read 11.1 and 9.3 J/step 15 minutes apart).
inline constexpr double kMeasuredWholeSigma = 0.1;

/// The most networks a device model keeps measured whole (the oldest measurement goes first).
inline constexpr std::size_t kMaxWholeNetworks = 48;

/// The gap of each family, from the samples' log ratios (whole / layer sum); families with
/// fewer than kGapMinSamples get none.
struct GapReading {
  std::string family;
  double log_joules_ratio = 0.0;
  double log_seconds_ratio = 0.0;
};
std::vector<std::pair<std::string, WholeNetworkGap>> learn_gaps(const std::vector<GapReading>& readings);

/// A queued (or requested) network the device might measure whole.
struct WholeNetworkCandidate {
  std::string signature;  ///< network_signature of its spec
  std::int64_t batch_size = 32;
  std::string optimizer = "sgd";
  double flops_per_step = 0.0;
  double relative_std = 0.0;      ///< of its current estimate on the device (σ / mean)
  double seconds_per_step = 0.0;  ///< its current estimate's time per step
  double share = 0.0;             ///< of the workload's items that train it, 0..1
  /// Measured at this knob setting (its ratios to the defaults are what is learnt); nullopt:
  /// at the defaults.
  std::optional<KnobSetting> setting;
  /// Its relative σ once measured (the fall is relative_std − this).
  double measured_std = kMeasuredWholeSigma;
};

/// What measuring one candidate whole is worth, in the layer planner's terms (PlannedProbe): the
/// expected fall of the workload's relative estimate error, its share × (its relative σ −
/// kMeasuredWholeSigma), and its cost in units of one small probe network's measuring time
/// (0.5 for the worker's start + max(1, FLOPs per step / 2e9), as plan_cost counts a network).
struct PlannedWholeNetwork {
  std::size_t index = 0;  ///< into the candidates
  double error_reduction = 0.0;
  double cost = 1.0;
};

/// The candidate worth most per √cost (the layer planner's rule), skipping those already
/// measured or tried (`done`: whole_network_key of each) and those whose measurement would take
/// longer than `max_seconds` (`measuring_steps` of them at its estimated time per step); nothing
/// when none is left or none would cut the error.
std::optional<PlannedWholeNetwork> plan_whole_network(const std::vector<WholeNetworkCandidate>& candidates,
                                                      const std::vector<std::string>& done, int measuring_steps,
                                                      double max_seconds);

/// The key a whole measurement is found by: its signature, batch size and optimizer, and the
/// knob setting it ran at (none: the defaults).
std::string whole_network_key(const std::string& signature, std::int64_t batch_size, const std::string& optimizer,
                              const KnobSetting* setting = nullptr);
std::string whole_network_key(const WholeNetworkSample& sample);

}  // namespace joule::estimator
