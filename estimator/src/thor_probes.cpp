#include "joule/estimator/thor_probes.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace joule::estimator {
namespace {

LayerSpec make_layer(const std::string& type, nlohmann::json args = nlohmann::json::object()) {
  return LayerSpec{type, std::move(args), {}, {}};
}

// The classifier head on a per-sample shape: flatten when needed, then a linear layer.
std::vector<LayerSpec> head_on(const std::vector<std::int64_t>& shape, int classes) {
  std::vector<LayerSpec> head;
  if (shape.size() != 1) head.push_back(make_layer("flatten"));
  head.push_back(make_layer("linear", {{"out_features", classes}}));
  return head;
}

// A shape-preserving layer with parameters, so the next layer computes its input gradient. A
// normalisation, whose cost is linear in the tensor: a 1×1 convolution or a square linear layer
// costs C² per position, and on wide inputs (6,144 features, batch 128) it made one probe last
// minutes while adding only noise to the subtraction.
LayerSpec reference_layer(const std::vector<std::int64_t>& shape) {
  if (shape.size() == 3) return make_layer("batchnorm2d");
  return make_layer("layernorm");
}

ModelSpec network(const std::vector<std::int64_t>& input_shape, const std::string& dtype,
                  std::vector<LayerSpec> layers, const std::string& loss) {
  ModelSpec spec;
  spec.name = "probe";
  spec.input_shape = input_shape;
  spec.input_dtype = dtype;
  spec.layers = std::move(layers);
  spec.loss = loss;
  return spec;
}

}  // namespace

std::string_view to_string(LayerPosition position) {
  switch (position) {
    case LayerPosition::input: return "input";
    case LayerPosition::hidden: return "hidden";
    case LayerPosition::output: return "output";
  }
  return "hidden";
}

std::string LayerKey::name() const { return fmt::format("{}@{}", kind, to_string(position)); }

bool is_free_layer(const AnalyzedLayer& layer) {
  return layer.cost.parameters == 0 && layer.cost.forward_flops == 0.0 && layer.cost.backward_flops == 0.0 &&
         layer.cost.activation_bytes == 0.0;
}

std::vector<LayerKey> layer_keys(const std::vector<AnalyzedLayer>& layers) {
  std::vector<LayerKey> keys;
  keys.reserve(layers.size());
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const auto& layer = layers[i];
    const auto position = i + 1 == layers.size() ? LayerPosition::output
                          : layer.input_gradient ? LayerPosition::hidden
                                                 : LayerPosition::input;
    keys.push_back(LayerKey{model_kind(layer), position});
  }
  return keys;
}

std::string optimizer_kind(const std::string& optimizer) { return "optimizer:" + optimizer; }

ProbeTarget optimizer_target(const std::string& optimizer, std::int64_t parameters) {
  constexpr std::int64_t kFeatures = 1024;
  ProbeTarget target;
  target.optimizer = optimizer;
  target.input_shape = {kFeatures};
  target.batch_size = 16;
  target.position = LayerPosition::output;
  const std::int64_t classes = std::max<std::int64_t>(2, (parameters + kFeatures) / (kFeatures + 1));
  target.layer = make_layer("linear", {{"out_features", classes}});
  return target;
}

AnalyzedLayer optimizer_step(std::int64_t parameters) {
  AnalyzedLayer step;
  step.type = "optimizer";
  step.features = {{"parameters", static_cast<double>(parameters)}};
  step.cost.parameters = parameters;
  step.cost.parameter_bytes = 4.0 * static_cast<double>(parameters);
  return step;
}

Result<ProbePlan> plan_probe(const ProbeTarget& target, int head_classes) {
  ProbePlan plan;
  plan.target = target;
  if (!target.optimizer.empty()) {
    if (!is_known_optimizer(target.optimizer) || target.optimizer == "sgd")
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("no optimizer probe for \"{}\": every probe trains with sgd", target.optimizer));
    const ModelSpec classifier = network(target.input_shape, target.input_dtype, {target.layer}, target.loss);
    auto analyzed = analyze_model(classifier, target.batch_size, "/probe");
    if (!analyzed) return analyzed.error();
    plan.networks = {classifier, classifier};
    plan.optimizers = {target.optimizer, "sgd"};
    plan.signs = {+1, -1};
    plan.analyzed = optimizer_step(analyzed->front().cost.parameters);
    return plan;
  }
  const auto& shape = target.input_shape;
  const auto& dtype = target.input_dtype;
  // The target comes out of some network's graph: in a probe it reads only what comes before
  // it, a join all its inputs from that one tensor (x + x): the backward then sums the
  // gradients of a tensor read twice, as it does for the skip connection a join closes.
  auto reading = [&](const std::string& from) {
    LayerSpec layer = target.layer;
    layer.name.clear();
    if (is_join_layer(layer.type))
      layer.inputs.assign(std::max<std::size_t>(2, target.layer.inputs.size()), from);
    else
      layer.inputs.clear();
    return layer;
  };
  const LayerSpec first = reading(kModelInput);
  // The target's output shape decides its head: analyse it alone first.
  auto alone = analyze_model(network(shape, dtype, {first}, target.loss), target.batch_size, "/probe");
  if (!alone) return alone.error();
  const auto out_shape = alone->front().output_shape;
  auto with = [](std::vector<LayerSpec> first, const std::vector<LayerSpec>& rest) {
    first.insert(first.end(), rest.begin(), rest.end());
    return first;
  };
  std::size_t target_index = 0;
  switch (target.position) {
    case LayerPosition::output:
      plan.networks = {network(shape, dtype, {first}, target.loss)};
      plan.signs = {+1};
      break;
    case LayerPosition::input:
      plan.networks = {network(shape, dtype, with({first}, head_on(out_shape, head_classes)), target.loss),
                       network(out_shape, "float", head_on(out_shape, head_classes), target.loss)};
      plan.signs = {+1, -1};
      break;
    case LayerPosition::hidden: {
      if (dtype == "token")
        return make_error(ErrorCode::invalid_argument,
                          fmt::format("{} takes token ids, so it can only be an input layer", target.layer.type));
      LayerSpec reference = reference_layer(shape);
      reference.name = "reference";
      plan.networks = {
          network(shape, dtype, with({reference, reading(reference.name)}, head_on(out_shape, head_classes)),
                  target.loss),
          network(shape, dtype, with({reference}, head_on(shape, head_classes)), target.loss),
          network(shape, dtype, head_on(shape, head_classes), target.loss),
          network(out_shape, "float", head_on(out_shape, head_classes), target.loss)};
      plan.signs = {+1, -1, +1, -1};
      target_index = 1;
      break;
    }
  }
  auto analyzed = analyze_model(plan.networks.front(), target.batch_size, "/probe");
  if (!analyzed) return analyzed.error();
  plan.analyzed = (*analyzed)[target_index];
  return plan;
}

Result<LayerSample> decompose(const ProbePlan& plan, const std::vector<NetworkMeasurement>& measured) {
  if (measured.size() != plan.networks.size()) {
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("{} measurements for a plan of {} networks", measured.size(), plan.networks.size()));
  }
  LayerSample sample;
  sample.cost = plan.analyzed.cost;
  if (!plan.target.optimizer.empty()) {
    // An optimizer step does not depend on the batch: parameters are its only feature.
    sample.key = LayerKey{optimizer_kind(plan.target.optimizer), LayerPosition::output};
    sample.features = plan.analyzed.features;
  } else {
    sample.key = LayerKey{model_kind(plan.analyzed), plan.target.position};
    sample.features = plan.analyzed.features;
    sample.features["batch_size"] = static_cast<double>(plan.target.batch_size);
  }
  for (std::size_t i = 0; i < measured.size(); ++i) {
    sample.joules_per_step += plan.signs[i] * measured[i].joules_per_step;
    sample.seconds_per_step += plan.signs[i] * measured[i].seconds_per_step;
  }
  return sample;
}

}  // namespace joule::estimator
