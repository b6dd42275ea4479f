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

std::string text(const LayerSpec& layer, const char* key, const std::string& fallback) {
  const auto it = layer.args.find(key);
  return it != layer.args.end() && it->is_string() ? it->get<std::string>() : fallback;
}

// lstm / gru over a batch-first [B, seq, features] input; "last" keeps the final time step (both
// directions' outputs there, where bidirectional).
class RecurrentImpl : public nn::Module {
 public:
  RecurrentImpl(bool lstm, std::int64_t input_size, std::int64_t hidden_size, std::int64_t num_layers, bool sequence,
                bool bidirectional)
      : sequence_(sequence) {
    if (lstm)
      lstm_ = register_module("lstm", nn::LSTM(nn::LSTMOptions(input_size, hidden_size)
                                                   .num_layers(num_layers)
                                                   .batch_first(true)
                                                   .bidirectional(bidirectional)));
    else
      gru_ = register_module("gru", nn::GRU(nn::GRUOptions(input_size, hidden_size)
                                                .num_layers(num_layers)
                                                .batch_first(true)
                                                .bidirectional(bidirectional)));
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

// torch's post-norm encoder layer (relu or gelu), over batch-first input.
class EncoderLayerImpl : public nn::Module {
 public:
  EncoderLayerImpl(std::int64_t d_model, std::int64_t nhead, std::int64_t dim_feedforward, bool gelu)
      : layer_(register_module(
            "layer", nn::TransformerEncoderLayer(
                         nn::TransformerEncoderLayerOptions(d_model, nhead)
                             .dim_feedforward(dim_feedforward)
                             .activation(gelu ? nn::activation_t(torch::kGELU) : nn::activation_t(torch::kReLU))))) {}

  torch::Tensor forward(const torch::Tensor& input) { return layer_->forward(input.transpose(0, 1)).transpose(0, 1); }

 private:
  nn::TransformerEncoderLayer layer_;
};
TORCH_MODULE(EncoderLayer);

// torch.nn.TransformerEncoderLayer(norm_first=True), which LibTorch 1.13 lacks, from the same
// parts: x = x + dropout1(attn(norm1(x))); x = x + dropout2(linear2(dropout(act(linear1(norm2(x)))))),
// dropout 0.1 everywhere, the attention's on its weights too.
class PreNormEncoderLayerImpl : public nn::Module {
 public:
  PreNormEncoderLayerImpl(std::int64_t d_model, std::int64_t nhead, std::int64_t dim_feedforward, bool gelu)
      : attention_(register_module("self_attn",
                                   nn::MultiheadAttention(nn::MultiheadAttentionOptions(d_model, nhead).dropout(0.1)))),
        linear1_(register_module("linear1", nn::Linear(d_model, dim_feedforward))),
        linear2_(register_module("linear2", nn::Linear(dim_feedforward, d_model))),
        norm1_(register_module("norm1", nn::LayerNorm(nn::LayerNormOptions({d_model})))),
        norm2_(register_module("norm2", nn::LayerNorm(nn::LayerNormOptions({d_model})))),
        dropout_(register_module("dropout", nn::Dropout(0.1))),
        dropout1_(register_module("dropout1", nn::Dropout(0.1))),
        dropout2_(register_module("dropout2", nn::Dropout(0.1))),
        gelu_(gelu) {}

  torch::Tensor forward(const torch::Tensor& input) {
    torch::Tensor x = input.transpose(0, 1);  // the attention is sequence-first
    const torch::Tensor normed = norm1_(x);
    x = x + dropout1_(std::get<0>(attention_->forward(normed, normed, normed, {}, false)));
    const torch::Tensor hidden = linear1_(norm2_(x));
    x = x + dropout2_(linear2_(dropout_(gelu_ ? torch::gelu(hidden) : torch::relu(hidden))));
    return x.transpose(0, 1);
  }

 private:
  nn::MultiheadAttention attention_;
  nn::Linear linear1_, linear2_;
  nn::LayerNorm norm1_, norm2_;
  nn::Dropout dropout_, dropout1_, dropout2_;
  bool gelu_;
};
TORCH_MODULE(PreNormEncoderLayer);

// A per-sample dim (negative counts from the end) as a dim of the batched tensor.
std::int64_t batched_dim(const LayerSpec& spec, std::int64_t fallback) {
  const std::int64_t dim = arg(spec, "dim", fallback);
  return dim < 0 ? dim : dim + 1;
}

// conv1d and conv2d take the same arguments (square kernels: one size for every dim).
template <typename Convolution, typename Options>
nn::AnyModule convolution(const LayerSpec& spec, std::int64_t in_channels) {
  return nn::AnyModule(Convolution(Options(in_channels, arg(spec, "out_channels", 1), arg(spec, "kernel_size", 1))
                                       .stride(arg(spec, "stride", 1))
                                       .padding(arg(spec, "padding", 0))
                                       .dilation(arg(spec, "dilation", 1))
                                       .groups(arg(spec, "groups", 1))
                                       .bias(flag(spec, "bias", true))));
}

nn::AnyModule make_layer(const LayerSpec& spec, const AnalyzedLayer& layer) {
  const auto& in = layer.input_shape;
  const std::string& type = spec.type;
  if (type == "conv2d") return convolution<nn::Conv2d, nn::Conv2dOptions>(spec, in.at(0));
  if (type == "conv1d") return convolution<nn::Conv1d, nn::Conv1dOptions>(spec, in.at(0));
  if (type == "relu6") return nn::AnyModule(nn::ReLU6());
  if (type == "silu") return nn::AnyModule(nn::SiLU());
  // LibTorch 1.13 has no Hardswish module; the function is the same kernel torch.nn's calls.
  if (type == "hardswish")
    return nn::AnyModule(nn::Functional([](const torch::Tensor& x) { return torch::hardswish(x); }));
  if (type == "leaky_relu")
    return nn::AnyModule(
        nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(number_arg(spec, "negative_slope", 0.01))));
  if (type == "elu") return nn::AnyModule(nn::ELU(nn::ELUOptions().alpha(number_arg(spec, "alpha", 1.0))));
  if (type == "softplus")
    return nn::AnyModule(nn::Softplus(
        nn::SoftplusOptions().beta(number_arg(spec, "beta", 1.0)).threshold(number_arg(spec, "threshold", 20.0))));
  if (type == "mish") return nn::AnyModule(nn::Mish());
  if (type == "identity") return nn::AnyModule(nn::Identity());
  if (type == "softmax") return nn::AnyModule(nn::Softmax(nn::SoftmaxOptions(batched_dim(spec, -1))));
  if (type == "adaptive_avgpool2d")
    return nn::AnyModule(nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions(arg(spec, "output_size", 1))));
  if (type == "batchnorm1d") return nn::AnyModule(nn::BatchNorm1d(nn::BatchNorm1dOptions(in.at(0))));
  if (type == "mean") {
    const std::int64_t dim = batched_dim(spec, 0);
    return nn::AnyModule(nn::Functional([dim](const torch::Tensor& x) { return x.mean(dim); }));
  }
  // Joins have no module: GraphNetwork applies them to their inputs; a parameter-free placeholder
  // keeps layer i at position i.
  if (estimator::is_join_layer(type)) return nn::AnyModule(nn::Identity());
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
    const std::int64_t padding = arg(spec, "padding", 0);
    if (type == "maxpool2d")
      return nn::AnyModule(nn::MaxPool2d(nn::MaxPool2dOptions(kernel).stride(stride).padding(padding)));
    return nn::AnyModule(nn::AvgPool2d(nn::AvgPool2dOptions(kernel).stride(stride).padding(padding)));
  }
  if (type == "batchnorm2d") return nn::AnyModule(nn::BatchNorm2d(nn::BatchNorm2dOptions(in.at(0))));
  if (type == "layernorm") return nn::AnyModule(nn::LayerNorm(nn::LayerNormOptions({in.back()})));
  if (type == "dropout") return nn::AnyModule(nn::Dropout(nn::DropoutOptions(number_arg(spec, "p", 0.5))));
  if (type == "flatten") return nn::AnyModule(nn::Flatten(nn::FlattenOptions().start_dim(1)));
  if (type == "embedding")
    return nn::AnyModule(
        nn::Embedding(nn::EmbeddingOptions(arg(spec, "num_embeddings", 1), arg(spec, "embedding_dim", 1))));
  if (type == "lstm" || type == "gru") {
    return nn::AnyModule(Recurrent(type == "lstm", in.back(), arg(spec, "hidden_size", 1), arg(spec, "num_layers", 1),
                                   text(spec, "output", "last") == "sequence", flag(spec, "bidirectional", false)));
  }
  if (type == "multihead_attention") return nn::AnyModule(SelfAttention(in.back(), arg(spec, "num_heads", 1)));
  if (type == "transformer_encoder_layer") {
    const bool gelu = text(spec, "activation", "relu") == "gelu";
    if (flag(spec, "norm_first", false))
      return nn::AnyModule(
          PreNormEncoderLayer(in.back(), arg(spec, "nhead", 1), arg(spec, "dim_feedforward", 1), gelu));
    return nn::AnyModule(EncoderLayer(in.back(), arg(spec, "nhead", 1), arg(spec, "dim_feedforward", 1), gelu));
  }
  // parse_model_spec admits only the types above; a new one must be added here too.
  throw std::logic_error(fmt::format("layer {}: no LibTorch module for type \"{}\"", layer.index, type));
}

}  // namespace

std::vector<std::int64_t> batched(std::int64_t batch_size, const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> sizes{batch_size};
  sizes.insert(sizes.end(), shape.begin(), shape.end());
  return sizes;
}

void GraphNetworkImpl::add(const std::string& name, torch::nn::AnyModule module, std::vector<std::int64_t> inputs,
                           std::string join) {
  modules_.push_back(module);
  register_module(name, module.ptr());
  inputs_.push_back(std::move(inputs));
  joins_.push_back(std::move(join));
}

std::shared_ptr<torch::nn::Module> GraphNetworkImpl::ptr(std::size_t index) const { return modules_.at(index).ptr(); }

torch::Tensor GraphNetworkImpl::forward_layer(std::size_t index, const std::vector<torch::Tensor>& inputs) {
  const std::string& join = joins_.at(index);
  if (join.empty()) return modules_[index].forward(inputs.at(0));
  if (join == "concat") return torch::cat(inputs, concat_dims_.at(index));
  torch::Tensor out = inputs.at(0);
  for (std::size_t k = 1; k < inputs.size(); ++k) out = join == "add" ? out + inputs[k] : out * inputs[k];
  return out;
}

torch::Tensor GraphNetworkImpl::forward(const torch::Tensor& input) { return forward_observed(input, {}); }

torch::Tensor GraphNetworkImpl::forward_observed(const torch::Tensor& input, const LayerObserver& observe) {
  // Outputs are kept only while some later layer still reads them: a chain holds one at a time.
  std::vector<std::size_t> last_reader(modules_.size(), 0);
  for (std::size_t i = 0; i < modules_.size(); ++i)
    for (const auto source : inputs_[i])
      if (source >= 0) last_reader[static_cast<std::size_t>(source)] = i;
  std::vector<torch::Tensor> outputs(modules_.size());
  for (std::size_t i = 0; i < modules_.size(); ++i) {
    std::vector<torch::Tensor> ins;
    ins.reserve(inputs_[i].size());
    for (const auto source : inputs_[i]) ins.push_back(source < 0 ? input : outputs[static_cast<std::size_t>(source)]);
    outputs[i] = forward_layer(i, ins);
    if (observe) observe(i, outputs[i]);
    for (const auto source : inputs_[i])
      if (source >= 0 && last_reader[static_cast<std::size_t>(source)] == i)
        outputs[static_cast<std::size_t>(source)] = torch::Tensor();
  }
  return outputs.back();
}

Result<BuiltNetwork> build_network(const estimator::ModelSpec& spec, std::int64_t batch_size,
                                   const std::string& pointer) {
  auto analyzed = estimator::analyze_model(spec, batch_size, pointer);
  if (!analyzed) return analyzed.error();
  BuiltNetwork network{spec, std::move(analyzed).value(), GraphNetwork()};
  for (const auto& layer : network.layers) {
    const LayerSpec& layer_spec = spec.layers.at(layer.index);
    try {
      const std::string join = estimator::is_join_layer(layer_spec.type) ? layer_spec.type : std::string();
      network.module->add(fmt::format("{}_{}", layer.index, layer_spec.type), make_layer(layer_spec, layer),
                          layer.inputs, join);
      if (join == "concat") network.module->set_concat_dim(layer.index, batched_dim(layer_spec, 0));
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
  // torch.optim's defaults but for the learning rate (and SGD's momentum in sgd_momentum): the
  // cost of a step depends on the state each keeps per parameter, not on its hyperparameters.
  auto parameters = network->module->parameters();
  if (options.optimizer == "sgd")
    optimizer = std::make_shared<torch::optim::SGD>(parameters, torch::optim::SGDOptions(0.01));
  else if (options.optimizer == "sgd_momentum")
    optimizer = std::make_shared<torch::optim::SGD>(parameters, torch::optim::SGDOptions(0.01).momentum(0.9));
  else if (options.optimizer == "adam")
    optimizer = std::make_shared<torch::optim::Adam>(parameters, torch::optim::AdamOptions(1e-3));
  else if (options.optimizer == "adamw")
    optimizer = std::make_shared<torch::optim::AdamW>(parameters, torch::optim::AdamWOptions(1e-3));
  else if (options.optimizer == "rmsprop")
    optimizer = std::make_shared<torch::optim::RMSprop>(parameters, torch::optim::RMSpropOptions(1e-3));
  else
    return make_error(ErrorCode::invalid_argument, fmt::format("optimizer must be one of {}, got \"{}\"",
                                                               estimator::known_optimizer_list(), options.optimizer));
  return TrainingSession(std::move(network).value(), std::move(batch), std::move(optimizer));
}

TrainingSession::TrainingSession(BuiltNetwork network, SyntheticBatch batch,
                                 std::shared_ptr<torch::optim::Optimizer> optimizer)
    : network_(std::move(network)), batch_(std::move(batch)), optimizer_(std::move(optimizer)) {}

bool is_sparsity_layer(const BuiltNetwork& network, std::size_t index) {
  if (index + 1 >= network.layers.size()) return false;
  const std::string& type = network.spec.layers.at(network.layers.at(index).index).type;
  return type != "flatten" && type != "identity";
}

torch::Tensor TrainingSession::step() { return step(batch_.inputs, batch_.targets); }

std::pair<torch::Tensor, torch::Tensor> TrainingSession::step(const torch::Tensor& inputs, const torch::Tensor& targets,
                                                              const estimator::EatConfig& eat) {
  network_.module->train();
  optimizer_->zero_grad();
  torch::Tensor penalty_sum = torch::zeros({}, inputs.options().dtype(torch::kFloat));
  std::int64_t counted = 0;
  const torch::Tensor output =
      network_.module->forward_observed(inputs, [&](std::size_t index, const torch::Tensor& activations) {
        if (!is_sparsity_layer(network_, index) || !activations.is_floating_point()) return;
        const torch::Tensor squared = activations.square();
        penalty_sum = penalty_sum + (squared / (squared + eat.sigma)).sum();
        counted += activations.numel();
      });
  const torch::Tensor loss = compute_loss(network_.spec.loss, output, targets);
  const torch::Tensor penalty = counted > 0 ? penalty_sum / static_cast<double>(counted) : penalty_sum;
  (loss + eat.lambda * penalty).backward();
  optimizer_->step();
  return {loss.detach(), penalty.detach()};
}

torch::Tensor TrainingSession::step(const torch::Tensor& inputs, const torch::Tensor& targets) {
  network_.module->train();
  optimizer_->zero_grad();
  const torch::Tensor output = network_.module->forward(inputs);
  torch::Tensor loss = compute_loss(network_.spec.loss, output, targets);
  loss.backward();
  optimizer_->step();
  return loss.detach();
}

}  // namespace joule::worker
