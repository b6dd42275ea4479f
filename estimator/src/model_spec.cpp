#include "joule/estimator/model_spec.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include <fmt/format.h>

namespace joule::estimator {
namespace {

using nlohmann::json;

enum class ArgKind {
  positive_int,
  non_negative_int,
  integer,
  boolean,
  probability,
  number,
  positive_number,
  output_mode,
  activation
};

struct ArgRule {
  ArgKind kind;
  bool required;
};

std::map<std::string, ArgRule> convolution_rules() {
  return {{"out_channels", {ArgKind::positive_int, true}},
          {"kernel_size", {ArgKind::positive_int, true}},
          {"stride", {ArgKind::positive_int, false}},
          {"padding", {ArgKind::non_negative_int, false}},
          {"dilation", {ArgKind::positive_int, false}},
          {"groups", {ArgKind::positive_int, false}},
          {"bias", {ArgKind::boolean, false}}};
}

std::map<std::string, ArgRule> pooling_rules() {
  return {{"kernel_size", {ArgKind::positive_int, true}},
          {"stride", {ArgKind::positive_int, false}},
          {"padding", {ArgKind::non_negative_int, false}}};
}

// Arguments each layer type accepts; anything else is rejected so typos do not pass silently.
const std::map<std::string, std::map<std::string, ArgRule>>& layer_rules() {
  static const std::map<std::string, std::map<std::string, ArgRule>> rules = {
      {"conv2d", convolution_rules()},
      {"conv1d", convolution_rules()},
      {"linear", {{"out_features", {ArgKind::positive_int, true}}, {"bias", {ArgKind::boolean, false}}}},
      {"relu", {}},
      {"gelu", {}},
      {"tanh", {}},
      {"sigmoid", {}},
      {"silu", {}},
      {"hardswish", {}},
      {"relu6", {}},
      {"leaky_relu", {{"negative_slope", {ArgKind::number, false}}}},
      {"elu", {{"alpha", {ArgKind::number, false}}}},
      {"softplus", {{"beta", {ArgKind::positive_number, false}}, {"threshold", {ArgKind::number, false}}}},
      {"mish", {}},
      {"identity", {}},
      {"softmax", {{"dim", {ArgKind::integer, false}}}},
      {"maxpool2d", pooling_rules()},
      {"avgpool2d", pooling_rules()},
      {"adaptive_avgpool2d", {{"output_size", {ArgKind::positive_int, false}}}},
      {"mean", {{"dim", {ArgKind::integer, true}}}},
      {"batchnorm1d", {}},
      {"batchnorm2d", {}},
      {"layernorm", {}},
      {"dropout", {{"p", {ArgKind::probability, false}}}},
      {"flatten", {}},
      {"embedding",
       {{"num_embeddings", {ArgKind::positive_int, true}}, {"embedding_dim", {ArgKind::positive_int, true}}}},
      {"lstm",
       {{"hidden_size", {ArgKind::positive_int, true}},
        {"num_layers", {ArgKind::positive_int, false}},
        {"output", {ArgKind::output_mode, false}},
        {"bidirectional", {ArgKind::boolean, false}}}},
      {"gru",
       {{"hidden_size", {ArgKind::positive_int, true}},
        {"num_layers", {ArgKind::positive_int, false}},
        {"output", {ArgKind::output_mode, false}},
        {"bidirectional", {ArgKind::boolean, false}}}},
      {"multihead_attention", {{"num_heads", {ArgKind::positive_int, true}}}},
      {"transformer_encoder_layer",
       {{"nhead", {ArgKind::positive_int, true}},
        {"dim_feedforward", {ArgKind::positive_int, true}},
        {"norm_first", {ArgKind::boolean, false}},
        {"activation", {ArgKind::activation, false}}}},
      {"add", {}},
      {"mul", {}},
      {"concat", {{"dim", {ArgKind::integer, false}}}},
  };
  return rules;
}

bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > 128 || name == kModelInput) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
           c == ':' || c == '-';
  });
}

Error invalid(std::string message, std::string where) {
  return make_error(ErrorCode::invalid_argument, std::move(message), std::move(where));
}

std::optional<Error> check_arg(const json& value, ArgKind kind, const std::string& what, const std::string& where) {
  switch (kind) {
    case ArgKind::positive_int:
      if (!value.is_number_integer() || value.get<std::int64_t>() < 1)
        return invalid(fmt::format("{} must be an integer >= 1", what), where);
      break;
    case ArgKind::non_negative_int:
      if (!value.is_number_integer() || value.get<std::int64_t>() < 0)
        return invalid(fmt::format("{} must be an integer >= 0", what), where);
      break;
    case ArgKind::integer:
      if (!value.is_number_integer()) return invalid(fmt::format("{} must be an integer", what), where);
      break;
    case ArgKind::boolean:
      if (!value.is_boolean()) return invalid(fmt::format("{} must be true or false", what), where);
      break;
    case ArgKind::probability:
      if (!value.is_number() || value.get<double>() < 0.0 || value.get<double>() >= 1.0)
        return invalid(fmt::format("{} must be a number in [0, 1)", what), where);
      break;
    case ArgKind::number:
      if (!value.is_number() || !std::isfinite(value.get<double>()))
        return invalid(fmt::format("{} must be a finite number", what), where);
      break;
    case ArgKind::positive_number:
      if (!value.is_number() || value.get<double>() <= 0.0)
        return invalid(fmt::format("{} must be a number > 0", what), where);
      break;
    case ArgKind::activation:
      if (!value.is_string() || (value != "relu" && value != "gelu"))
        return invalid(fmt::format("{} must be \"relu\" or \"gelu\"", what), where);
      break;
    case ArgKind::output_mode:
      if (!value.is_string() || (value != "last" && value != "sequence"))
        return invalid(fmt::format("{} must be \"last\" or \"sequence\"", what), where);
      break;
  }
  return std::nullopt;
}

Result<LayerSpec> parse_layer(const json& layer, std::size_t index, const std::string& where) {
  if (!layer.is_object()) return invalid(fmt::format("layer {}: must be an object with a \"type\"", index), where);
  const auto type_it = layer.find("type");
  if (type_it == layer.end() || !type_it->is_string())
    return invalid(fmt::format("layer {}: \"type\" is missing or not a string", index), where + "/type");
  const std::string type = type_it->get<std::string>();
  const auto& rules = layer_rules();
  const auto rule_it = rules.find(type);
  if (rule_it == rules.end())
    return invalid(fmt::format("layer {}: unknown type \"{}\"", index, type), where + "/type");

  LayerSpec spec{type, json::object(), {}, {}};
  if (const auto name = layer.find("name"); name != layer.end()) {
    if (!name->is_string() || !valid_name(name->get<std::string>()))
      return invalid(fmt::format("layer {} {}: \"name\" must be 1-128 letters, digits or _.:- and not \"{}\"", index,
                                 type, kModelInput),
                     where + "/name");
    spec.name = name->get<std::string>();
  }
  if (const auto inputs = layer.find("inputs"); inputs != layer.end()) {
    if (!inputs->is_array() || inputs->empty())
      return invalid(fmt::format("{}: \"inputs\" must be a non-empty array of layer names", layer_label(index, spec)),
                     where + "/inputs");
    for (std::size_t i = 0; i < inputs->size(); ++i) {
      if (!(*inputs)[i].is_string())
        return invalid(fmt::format("{}: inputs are layer names (strings)", layer_label(index, spec)),
                       fmt::format("{}/inputs/{}", where, i));
      spec.inputs.push_back((*inputs)[i].get<std::string>());
    }
  }
  for (const auto& [key, value] : layer.items()) {
    if (key == "type" || key == "name" || key == "inputs") continue;
    const auto arg_it = rule_it->second.find(key);
    if (arg_it == rule_it->second.end())
      return invalid(fmt::format("layer {} {}: unknown argument \"{}\"", index, type, key), where + "/" + key);
    if (auto error =
            check_arg(value, arg_it->second.kind, fmt::format("layer {} {}: {}", index, type, key), where + "/" + key))
      return *error;
    spec.args[key] = value;
  }
  for (const auto& [key, rule] : rule_it->second) {
    if (rule.required && !spec.args.contains(key))
      return invalid(fmt::format("layer {} {}: \"{}\" is required", index, type, key), where + "/" + key);
  }
  return spec;
}

}  // namespace

bool is_join_layer(const std::string& type) { return type == "add" || type == "mul" || type == "concat"; }

std::string layer_label(std::size_t index, const LayerSpec& layer) {
  if (layer.name.empty()) return fmt::format("layer {} {}", index, layer.type);
  return fmt::format("layer {} {} \"{}\"", index, layer.type, layer.name);
}

Result<std::vector<std::vector<std::int64_t>>> resolve_inputs(const std::vector<LayerSpec>& layers,
                                                              const std::string& pointer) {
  std::map<std::string, std::int64_t> by_name;
  std::vector<std::vector<std::int64_t>> sources(layers.size());
  std::vector<bool> used(layers.size(), false);
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& layer = layers[i];
    const std::string where = fmt::format("{}/layers/{}", pointer, i);
    const bool join = is_join_layer(layer.type);
    if (layer.inputs.empty()) {
      if (join)
        return invalid(fmt::format("{}: joins two or more layers; name them in \"inputs\"", layer_label(i, layer)),
                       where + "/inputs");
      sources[i] = {static_cast<std::int64_t>(i) - 1};
    } else {
      if (join && layer.inputs.size() < 2)
        return invalid(
            fmt::format("{}: joins two or more layers, got {} input", layer_label(i, layer), layer.inputs.size()),
            where + "/inputs");
      if (!join && layer.inputs.size() != 1)
        return invalid(fmt::format("{}: takes one input, got {}; join branches with add, mul or concat",
                                   layer_label(i, layer), layer.inputs.size()),
                       where + "/inputs");
      for (std::size_t k = 0; k < layer.inputs.size(); ++k) {
        const std::string& input = layer.inputs[k];
        const std::string input_where = fmt::format("{}/inputs/{}", where, k);
        if (input == kModelInput) {
          sources[i].push_back(-1);
          continue;
        }
        const auto found = by_name.find(input);
        if (found != by_name.end()) {
          sources[i].push_back(found->second);
          continue;
        }
        const bool later = std::any_of(layers.begin() + static_cast<std::ptrdiff_t>(i), layers.end(),
                                       [&](const LayerSpec& other) { return other.name == input; });
        return invalid(later ? fmt::format("{}: input \"{}\" is not an earlier layer; a layer reads only layers "
                                           "above it",
                                           layer_label(i, layer), input)
                             : fmt::format("{}: no earlier layer is named \"{}\" (the model's input is \"{}\")",
                                           layer_label(i, layer), input, kModelInput),
                       input_where);
      }
    }
    for (const auto source : sources[i])
      if (source >= 0) used[static_cast<std::size_t>(source)] = true;
    if (!layer.name.empty() && !by_name.emplace(layer.name, static_cast<std::int64_t>(i)).second)
      return invalid(
          fmt::format("{}: the name is already used by layer {}", layer_label(i, layer), by_name[layer.name]),
          where + "/name");
  }
  for (std::size_t i = 0; i + 1 < layers.size(); ++i) {
    if (!used[i])
      return invalid(fmt::format("{}: its output is never used; name it in a later layer's \"inputs\" or remove it",
                                 layer_label(i, layers[i])),
                     fmt::format("{}/layers/{}", pointer, i));
  }
  return sources;
}

const std::vector<std::string>& known_optimizers() {
  static const std::vector<std::string> names = {"sgd", "sgd_momentum", "adam", "adamw", "rmsprop"};
  return names;
}

bool is_known_optimizer(std::string_view optimizer) {
  const auto& names = known_optimizers();
  return std::find(names.begin(), names.end(), optimizer) != names.end();
}

std::string known_optimizer_list() {
  std::string out;
  for (const auto& name : known_optimizers()) out += (out.empty() ? "\"" : ", \"") + name + "\"";
  return out;
}

const std::vector<std::string>& known_layer_types() {
  static const std::vector<std::string> types = [] {
    std::vector<std::string> names;
    for (const auto& [name, rules] : layer_rules()) names.push_back(name);
    return names;
  }();
  return types;
}

Result<ModelSpec> parse_model_spec(const json& model, const std::string& pointer) {
  if (!model.is_object()) return invalid("model must be an object", pointer);
  ModelSpec spec;
  if (auto it = model.find("name"); it != model.end()) {
    if (!it->is_string()) return invalid("model name must be a string", pointer + "/name");
    spec.name = it->get<std::string>();
  }
  const auto input = model.find("input");
  if (input == model.end() || !input->is_object())
    return invalid("model input is missing; give {\"shape\": [...]}", pointer + "/input");
  const auto shape = input->find("shape");
  if (shape == input->end() || !shape->is_array() || shape->empty())
    return invalid("input shape must be a non-empty array of integers", pointer + "/input/shape");
  for (std::size_t i = 0; i < shape->size(); ++i) {
    const auto& dim = (*shape)[i];
    if (!dim.is_number_integer() || dim.get<std::int64_t>() < 1)
      return invalid("input shape dimensions must be integers >= 1", fmt::format("{}/input/shape/{}", pointer, i));
    spec.input_shape.push_back(dim.get<std::int64_t>());
  }
  if (auto it = input->find("dtype"); it != input->end()) {
    if (!it->is_string() || (*it != "float" && *it != "token"))
      return invalid("input dtype must be \"float\" or \"token\"", pointer + "/input/dtype");
    spec.input_dtype = it->get<std::string>();
  }
  const auto layers = model.find("layers");
  if (layers == model.end() || !layers->is_array() || layers->empty())
    return invalid("layers must be a non-empty array", pointer + "/layers");
  for (std::size_t i = 0; i < layers->size(); ++i) {
    auto layer = parse_layer((*layers)[i], i, fmt::format("{}/layers/{}", pointer, i));
    if (!layer) return layer.error();
    spec.layers.push_back(std::move(layer).value());
  }
  if (auto wiring = resolve_inputs(spec.layers, pointer); !wiring) return wiring.error();
  if (auto it = model.find("loss"); it != model.end()) {
    if (!it->is_string() || (*it != "cross_entropy" && *it != "mse"))
      return invalid("loss must be \"cross_entropy\" or \"mse\"", pointer + "/loss");
    spec.loss = it->get<std::string>();
  }
  return spec;
}

namespace {

// training.eat: {"lambda": λ >= 0, "sigma": σ > 0}. The ranges are wide (the seed sweeps λ over
// 0.01-10 and σ over 1e-7-0.1); what they refuse is what cannot train (negative, not finite).
Result<EatConfig> parse_eat(const json& value, const std::string& pointer) {
  if (!value.is_object())
    return invalid("training.eat must be an object: {\"lambda\": 0.1, \"sigma\": 0.001}", pointer);
  EatConfig eat;
  for (const auto& [key, field] : value.items()) {
    const std::string where = pointer + "/" + key;
    const bool finite = field.is_number() && std::isfinite(field.get<double>());
    if (key == "lambda") {
      if (!finite || field.get<double>() < 0.0 || field.get<double>() > 1e6)
        return invalid("training.eat.lambda (the penalty's weight) must be a number between 0 and 1e6", where);
      eat.lambda = field.get<double>();
    } else if (key == "sigma") {
      if (!finite || field.get<double>() < 1e-12 || field.get<double>() > 1e6)
        return invalid(
            "training.eat.sigma (how sharply the penalty counts an activation) must be a number between "
            "1e-12 and 1e6",
            where);
      eat.sigma = field.get<double>();
    } else {
      return invalid(fmt::format("training.eat: unknown field \"{}\" (lambda, sigma)", key), where);
    }
  }
  if (!value.contains("lambda")) return invalid("training.eat.lambda is required", pointer + "/lambda");
  return eat;
}

}  // namespace

Result<TrainingConfig> parse_training_config(const json& training, const std::string& pointer) {
  if (!training.is_object()) return invalid("training must be an object", pointer);
  TrainingConfig config;
  const std::map<std::string, std::int64_t*> counts = {
      {"batch_size", &config.batch_size}, {"epochs", &config.epochs}, {"samples_per_epoch", &config.samples_per_epoch}};
  for (const auto& [key, value] : training.items()) {
    const std::string where = pointer + "/" + key;
    if (auto it = counts.find(key); it != counts.end()) {
      if (!value.is_number_integer() || value.get<std::int64_t>() < 1)
        return invalid(fmt::format("training {} must be an integer >= 1", key), where);
      *it->second = value.get<std::int64_t>();
    } else if (key == "optimizer") {
      if (!value.is_string() || !is_known_optimizer(value.get<std::string>()))
        return invalid(fmt::format("training optimizer must be one of {}", known_optimizer_list()), where);
      config.optimizer = value.get<std::string>();
    } else if (key == "eat") {
      auto eat = parse_eat(value, where);
      if (!eat) return eat.error();
      config.eat = *eat;
    } else {
      return invalid(fmt::format("training: unknown field \"{}\"", key), where);
    }
  }
  if (!training.contains("samples_per_epoch"))
    return invalid("training samples_per_epoch is required", pointer + "/samples_per_epoch");
  // Each count is fine alone, but their product is what estimates multiply by: refused when
  // absurd, as layer_analysis refuses absurd layers, rather than saturated into a number.
  if (steps_of(config) > kMaxTrainingSteps) {
    return invalid(fmt::format("training is more than {} steps (epochs * ceil(samples_per_epoch / batch_size))",
                               kMaxTrainingSteps),
                   pointer);
  }
  return config;
}

std::int64_t steps_of(const TrainingConfig& training) {
  const std::int64_t samples = training.samples_per_epoch, batch = training.batch_size;
  if (samples <= 0 || batch <= 0 || training.epochs <= 0) return 0;
  // ceil(samples / batch) without samples + batch - 1, which overflows near INT64_MAX.
  const std::int64_t per_epoch = samples / batch + (samples % batch != 0 ? 1 : 0);
  std::int64_t steps = 0;
  if (__builtin_mul_overflow(training.epochs, per_epoch, &steps)) return std::numeric_limits<std::int64_t>::max();
  return steps;
}

json to_json(const LayerSpec& layer) {
  json entry = layer.args;
  entry["type"] = layer.type;
  if (!layer.name.empty()) entry["name"] = layer.name;
  if (!layer.inputs.empty()) entry["inputs"] = layer.inputs;
  return entry;
}

json to_json(const ModelSpec& spec) {
  json layers = json::array();
  for (const auto& layer : spec.layers) layers.push_back(to_json(layer));
  json out = {{"input", {{"shape", spec.input_shape}}}, {"layers", layers}, {"loss", spec.loss}};
  if (!spec.name.empty()) out["name"] = spec.name;
  if (spec.input_dtype != "float") out["input"]["dtype"] = spec.input_dtype;
  return out;
}

json to_json(const TrainingConfig& training) {
  json out = {{"batch_size", training.batch_size},
              {"epochs", training.epochs},
              {"samples_per_epoch", training.samples_per_epoch},
              {"optimizer", training.optimizer}};
  if (training.eat) out["eat"] = {{"lambda", training.eat->lambda}, {"sigma", training.eat->sigma}};
  return out;
}

}  // namespace joule::estimator
