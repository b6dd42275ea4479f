#pragma once
// Model specs and training configs: the JSON of a job's `model` and `training`, parsed and checked.
//
// This stage checks structure (known layer types, argument types and ranges, a usable input,
// the graph's wiring); shape inference and FLOPs counting build on it in the estimator proper.
//
// A spec is a graph written in order: each layer reads the previous layer's output unless it
// names its "inputs" (earlier layers by "name", or "input" for the model's input). The join
// layers add, mul (both broadcast like torch) and concat take two or more inputs; every other
// layer takes one. The last layer is the network's output, and every other layer must feed a
// later one. A spec without names or inputs is the plain list it always was.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "joule/common/result.hpp"

namespace joule::estimator {

/// One layer as the user wrote it: its torch.nn-like type and its arguments, kept verbatim.
struct LayerSpec {
  std::string type;
  nlohmann::json args;  ///< the layer object without "type", "name" and "inputs"
  std::string name;     ///< optional; how later layers refer to this one
  /// Layer names (or "input") this layer reads; empty: the previous layer (the input for the first).
  std::vector<std::string> inputs;
};

/// The name that means the model's input in a layer's "inputs".
inline constexpr const char* kModelInput = "input";

/// Whether layers of this type take two or more inputs (add, mul, concat).
bool is_join_layer(const std::string& type);

/// How messages name a layer: `layer 3 conv2d`, or `layer 3 conv2d "block1.conv"` when named.
std::string layer_label(std::size_t index, const LayerSpec& layer);

/// Where each layer's inputs come from: per layer, the indices of the layers it reads, -1 for
/// the model's input. Fails, naming the layer and its pointer ("<pointer>/layers/4/inputs/1"),
/// on a duplicate or malformed name, an input that is not an earlier layer, the wrong number of
/// inputs, or a layer whose output nothing uses.
Result<std::vector<std::vector<std::int64_t>>> resolve_inputs(const std::vector<LayerSpec>& layers,
                                                              const std::string& pointer);

/// A network description: per-sample input shape, layers in order, and the loss.
struct ModelSpec {
  std::string name;
  std::vector<std::int64_t> input_shape;
  std::string input_dtype = "float";  ///< "float" or "token" (ids for an embedding)
  std::vector<LayerSpec> layers;
  std::string loss = "cross_entropy";
};

/// How the network is trained: what turns per-step energy into per-job energy.
/// EAT (energy-aware training, seed 004): the loss gains λ times a differentiable count of the
/// activations that fire, the mean over every layer's outputs (all but the last) of
/// x² / (x² + σ). σ sets how sharp the count is; λ = 0 trains as usual and still reports the
/// firing rates.
struct EatConfig {
  double lambda = 0.0;
  double sigma = 1e-3;
};

struct TrainingConfig {
  std::int64_t batch_size = 32;
  std::int64_t epochs = 1;
  std::int64_t samples_per_epoch = 0;
  std::string optimizer = "sgd";
  std::optional<EatConfig> eat;  ///< `training.eat`: trained by the built-in trainer with EAT's penalty
};

/// The layer types a model spec may use, in the spelling users write.
const std::vector<std::string>& known_layer_types();

/// The optimizers a job's training may name, as torch.optim spells them in lower case:
/// sgd (no momentum), sgd_momentum (momentum 0.9), adam, adamw, rmsprop.
const std::vector<std::string>& known_optimizers();
bool is_known_optimizer(std::string_view optimizer);
/// "sgd", "adam" or … in quotes, joined with commas, for error messages.
std::string known_optimizer_list();

/// Parses and checks a model spec. `pointer` is the JSON pointer of `json` inside the request,
/// so errors name the exact field (e.g. "/model/layers/3/out_channels").
Result<ModelSpec> parse_model_spec(const nlohmann::json& json, const std::string& pointer);

/// The most training steps a config may describe (2^40, as layer_analysis bounds its counts):
/// far beyond any real job, and small enough that steps × per-step figures stay exact.
inline constexpr std::int64_t kMaxTrainingSteps = std::int64_t{1} << 40;

/// Parses and checks a training config; see parse_model_spec for `pointer`. A config of more
/// than kMaxTrainingSteps steps is refused (at `pointer` itself).
Result<TrainingConfig> parse_training_config(const nlohmann::json& json, const std::string& pointer);

/// Training steps of a job: epochs × ceil(samples_per_epoch / batch_size); 0 when a count is
/// not positive, INT64_MAX where the product would overflow (configs built in code).
std::int64_t steps_of(const TrainingConfig& training);

nlohmann::json to_json(const LayerSpec& layer);
nlohmann::json to_json(const ModelSpec& spec);
nlohmann::json to_json(const TrainingConfig& training);

}  // namespace joule::estimator
