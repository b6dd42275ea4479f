#include "network_builder.hpp"

#include <fmt/format.h>

namespace joule::worker {
namespace {

namespace nn = torch::nn;
using estimator::AnalyzedLayer;
using estimator::LayerSpec;

std::int64_t arg(const LayerSpec& layer, const char* key, std::int64_t fallback) {
  const auto it = layer.args.find(key);
  return it != layer.args.end() && it->is_number_integer() ? it->get<std::int64_t>() : fallback;
}

double number_arg(const LayerSpec& layer, const char* key, double fallback) {
  const auto it = layer.args.find(key);
  return it != layer.args.end() && it->is_number() ? it->get<double>() : fallback;
}

bool flag(const LayerSpec& layer, const char* key, bool fallback) {
  const auto it = layer.args.find(key);
  return it != layer.args.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

// lstm / gru over a batch-first [B, seq, features] input; "last" keeps the final time step.
class RecurrentImpl : public nn::Module {
 public:
  RecurrentImpl(bool lstm, std::int64_t input_size, std::int64_t hidden_size, std::int64_t num_layers, bool sequence)
      : sequence_(sequence) {
    if (lstm)
      lstm_ = register_module(
          "lstm", nn::LSTM(nn::LSTMOptions(input_size, hidden_size).num_layers(num_layers).batch_first(true)));
    else
      gru_ = register_module("gru",
                             nn::GRU(nn::GRUOptions(input_size, hidden_size).num_layers(num_layers).batch_first(true)));
  }

  torch::Tensor forward(const torch::Tensor& input) {
    torch::Tensor output = lstm_ ? std::get<0>(lstm_->forward(input)) : std::get<0>(gru_->forward(input));
    return sequence_ ? output : output.select(1, -1);
  }

 private:
  bool sequence_;
  nn::LSTM lstm_{nullptr};
  nn::GRU gru_{nullptr};
};
TORCH_MODULE(Recurrent);

// Self-attention over [B, seq, E]; torch's module is sequence-first, so transpose around it.
class SelfAttentionImpl : public nn::Module {
 public:
  SelfAttentionImpl(std::int64_t embed_dim, std::int64_t num_heads)
      : attention_(register_module("attention",
                                   nn::MultiheadAttention(nn::MultiheadAttentionOptions(embed_dim, num_heads)))) {}

  torch::Tensor forward(const torch::Tensor& input) {
    const torch::Tensor x = input.transpose(0, 1);
    // need_weights = false: the estimator counts no averaged attention map.
    return std::get<0>(attention_->forward(x, x, x, {}, false)).transpose(0, 1);
  }

 private:
  nn::MultiheadAttention attention_;
};
TORCH_MODULE(SelfAttention);

class EncoderLayerImpl : public nn::Module {
 public:
  EncoderLayerImpl(std::int64_t d_model, std::int64_t nhead, std::int64_t dim_feedforward)
      : layer_(register_module(
            "layer", nn::TransformerEncoderLayer(
                         nn::TransformerEncoderLayerOptions(d_model, nhead).dim_feedforward(dim_feedforward)))) {}

  torch::Tensor forward(const torch::Tensor& input) { return layer_->forward(input.transpose(0, 1)).transpose(0, 1); }

 private:
  nn::TransformerEncoderLayer layer_;
};
TORCH_MODULE(EncoderLayer);

nn::AnyModule make_layer(const LayerSpec& spec, const AnalyzedLayer& layer) {
  const auto& in = layer.input_shape;
  const std::string& type = spec.type;
  if (type == "conv2d") {
    const std::int64_t kernel = arg(spec, "kernel_size", 1);
    return nn::AnyModule(nn::Conv2d(nn::Conv2dOptions(in.at(0), arg(spec, "out_channels", 1), kernel)
                                        .stride(arg(spec, "stride", 1))
                                        .padding(arg(spec, "padding", 0))
                                        .bias(flag(spec, "bias", true))));
  }
  if (type == "linear")
    return nn::AnyModule(
        nn::Linear(nn::LinearOptions(in.back(), arg(spec, "out_features", 1)).bias(flag(spec, "bias", true))));
  if (type == "relu") return nn::AnyModule(nn::ReLU());
  if (type == "gelu") return nn::AnyModule(nn::GELU());
  if (type == "tanh") return nn::AnyModule(nn::Tanh());
  if (type == "sigmoid") return nn::AnyModule(nn::Sigmoid());
  if (type == "maxpool2d" || type == "avgpool2d") {
    const std::int64_t kernel = arg(spec, "kernel_size", 1);
    const std::int64_t stride = arg(spec, "stride", kernel);
    if (type == "maxpool2d") return nn::AnyModule(nn::MaxPool2d(nn::MaxPool2dOptions(kernel).stride(stride)));
    return nn::AnyModule(nn::AvgPool2d(nn::AvgPool2dOptions(kernel).stride(stride)));
  }
  if (type == "batchnorm2d") return nn::AnyModule(nn::BatchNorm2d(nn::BatchNorm2dOptions(in.at(0))));
  if (type == "layernorm") return nn::AnyModule(nn::LayerNorm(nn::LayerNormOptions({in.back()})));
  if (type == "dropout") return nn::AnyModule(nn::Dropout(nn::DropoutOptions(number_arg(spec, "p", 0.5))));
  if (type == "flatten") return nn::AnyModule(nn::Flatten(nn::FlattenOptions().start_dim(1)));
  if (type == "embedding")
    return nn::AnyModule(
        nn::Embedding(nn::EmbeddingOptions(arg(spec, "num_embeddings", 1), arg(spec, "embedding_dim", 1))));
  if (type == "lstm" || type == "gru") {
    const auto output = spec.args.find("output");
    const bool sequence = output != spec.args.end() && *output == "sequence";
    return nn::AnyModule(
        Recurrent(type == "lstm", in.back(), arg(spec, "hidden_size", 1), arg(spec, "num_layers", 1), sequence));
  }
  if (type == "multihead_attention") return nn::AnyModule(SelfAttention(in.back(), arg(spec, "num_heads", 1)));
  if (type == "transformer_encoder_layer")
    return nn::AnyModule(EncoderLayer(in.back(), arg(spec, "nhead", 1), arg(spec, "dim_feedforward", 1)));
  // parse_model_spec admits only the types above; a new one must be added here too.
  throw std::logic_error(fmt::format("layer {}: no LibTorch module for type \"{}\"", layer.index, type));
}

std::vector<std::int64_t> batched(std::int64_t batch_size, const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> sizes{batch_size};
  sizes.insert(sizes.end(), shape.begin(), shape.end());
  return sizes;
}

}  // namespace

Result<BuiltNetwork> build_network(const estimator::ModelSpec& spec, std::int64_t batch_size,
                                   const std::string& pointer) {
  auto analyzed = estimator::analyze_model(spec, batch_size, pointer);
  if (!analyzed) return analyzed.error();
  BuiltNetwork network{spec, std::move(analyzed).value(), nn::Sequential()};
  for (const auto& layer : network.layers) {
    const LayerSpec& layer_spec = spec.layers.at(layer.index);
    try {
      network.module->push_back(fmt::format("{}_{}", layer.index, layer_spec.type), make_layer(layer_spec, layer));
    } catch (const std::exception& e) {
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("layer {} {}: cannot build: {}", layer.index, layer_spec.type, e.what()),
                        fmt::format("{}/layers/{}", pointer, layer.index));
    }
  }
  return network;
}

SyntheticBatch make_synthetic_batch(const BuiltNetwork& network, std::int64_t batch_size, torch::Device device) {
  const estimator::ModelSpec& spec = network.spec;
  SyntheticBatch batch;
  if (spec.input_dtype == "token") {
    std::int64_t vocabulary = 1;
    for (const auto& layer : spec.layers) {
      if (layer.type == "embedding") {
        vocabulary = arg(layer, "num_embeddings", 1);
        break;
      }
    }
    batch.inputs = torch::randint(0, vocabulary, batched(batch_size, spec.input_shape), torch::kLong);
  } else {
    batch.inputs = torch::randn(batched(batch_size, spec.input_shape));
  }
  const auto& output = network.layers.back().output_shape;
  if (spec.loss == "mse") {
    batch.targets = torch::randn(batched(batch_size, output));
  } else {
    std::int64_t rows = batch_size;
    for (std::size_t i = 0; i + 1 < output.size(); ++i) rows *= output[i];
    batch.targets = torch::randint(0, output.back(), {rows}, torch::kLong);
  }
  batch.inputs = batch.inputs.to(device);
  batch.targets = batch.targets.to(device);
  return batch;
}

torch::Tensor compute_loss(const std::string& loss, const torch::Tensor& output, const torch::Tensor& targets) {
  if (loss == "mse") return torch::mse_loss(output, targets);
  return torch::nn::functional::cross_entropy(output.reshape({-1, output.size(-1)}), targets);
}

Result<TrainingSession> TrainingSession::create(const estimator::ModelSpec& spec, const SessionOptions& options,
                                                const std::string& pointer) {
  torch::manual_seed(options.seed);
  auto network = build_network(spec, options.batch_size, pointer);
  if (!network) return network.error();
  if (network->module->parameters().empty())
    return make_error(ErrorCode::invalid_argument,
                      "the model has no trainable parameters: add a layer with weights (linear, conv2d...)",
                      pointer + "/layers");
  network->module->to(options.device);
  SyntheticBatch batch = make_synthetic_batch(*network, options.batch_size, options.device);
  std::shared_ptr<torch::optim::Optimizer> optimizer;
  if (options.optimizer == "sgd")
    optimizer = std::make_shared<torch::optim::SGD>(network->module->parameters(), torch::optim::SGDOptions(0.01));
  else if (options.optimizer == "adam")
    optimizer = std::make_shared<torch::optim::Adam>(network->module->parameters(), torch::optim::AdamOptions(1e-3));
  else
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("optimizer must be \"sgd\" or \"adam\", got \"{}\"", options.optimizer));
  return TrainingSession(std::move(network).value(), std::move(batch), std::move(optimizer));
}

TrainingSession::TrainingSession(BuiltNetwork network, SyntheticBatch batch,
                                 std::shared_ptr<torch::optim::Optimizer> optimizer)
    : network_(std::move(network)), batch_(std::move(batch)), optimizer_(std::move(optimizer)) {}

torch::Tensor TrainingSession::step() {
  network_.module->train();
  optimizer_->zero_grad();
  const torch::Tensor output = network_.module->forward(batch_.inputs);
  torch::Tensor loss = compute_loss(network_.spec.loss, output, batch_.targets);
  loss.backward();
  optimizer_->step();
  return loss.detach();
}

}  // namespace joule::worker
