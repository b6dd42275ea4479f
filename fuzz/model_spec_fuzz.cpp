// libFuzzer target: a model and its training config as a client sends them (POST /v1/estimate,
// a job's "model"/"training"), through parsing, shape and cost analysis, and the THOR probe
// networks jouled would build to learn each layer.

#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_support.hpp"
#include "joule/estimator/layer_analysis.hpp"
#include "joule/estimator/model_spec.hpp"
#include "joule/estimator/thor_probes.hpp"

namespace {

using joule::fuzz::require;
namespace est = joule::estimator;

// A model accepted once must be accepted again from its own JSON form: jouled stores it with a
// job and re-analyses it after a restart and when planning probes.
void check_round_trip(const est::ModelSpec& model) {
  const nlohmann::json json = est::to_json(model);
  auto again = est::parse_model_spec(nlohmann::json::parse(json.dump()), "/model");
  require(again.ok(), "the JSON form of an accepted model is refused", again ? "" : again.error().message);
  require(est::to_json(*again) == json, "a model does not round-trip through JSON", json.dump());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const nlohmann::json body = joule::fuzz::parse_json(data, size);
  if (!body.is_object()) return 0;
  // Either an estimate request {"model": ..., "training": ...} or a bare model (examples/models).
  const bool request = body.contains("model");
  const nlohmann::json& model_json = request ? body["model"] : body;
  est::TrainingConfig training;
  if (request && body.contains("training")) {
    auto parsed = est::parse_training_config(body["training"], "/training");
    if (!parsed) return 0;
    training = *parsed;
    (void)est::steps_of(training);
    auto again = est::parse_training_config(est::to_json(training), "/training");
    require(again.ok(), "the JSON form of an accepted training config is refused");
  }
  auto model = est::parse_model_spec(model_json, "/model");
  if (!model) return 0;
  check_round_trip(*model);

  auto layers = est::analyze_model(*model, training.batch_size);
  if (!layers) return 0;
  (void)est::total_cost(*layers);
  (void)est::total_flops(*layers);
  const auto keys = est::layer_keys(*layers);
  require(keys.size() == layers->size(), "layer_keys does not give one key per layer");
  // The probe planner builds these for every layer of a queued job's model.
  for (std::size_t i = 0; i < layers->size(); ++i) {
    const auto& layer = (*layers)[i];
    if (est::is_free_layer(layer)) continue;
    est::ProbeTarget target;
    target.layer = model->layers.at(layer.index);
    target.input_shape = layer.input_shape;
    target.input_dtype = i == 0 ? model->input_dtype : "float";
    target.batch_size = training.batch_size;
    target.position = keys[i].position;
    target.loss = model->loss;
    auto plan = est::plan_probe(target);
    if (!plan) continue;
    require(plan->networks.size() == plan->signs.size(), "a probe plan has a sign per network");
    for (const auto& network : plan->networks) check_round_trip(network);
  }
  return 0;
}
